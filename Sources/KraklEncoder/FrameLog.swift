import FoundationEssentials
import KraklBase
import Glibc

/// `--frame-log FILE`: one CSV row per encoded frame, written as the frame is encoded (the
/// file is opened, and its header written, before capture starts, so a bad path fails the run
/// at once). A write error stops the run like one of the recording.
public final class FrameLog {
    private let file: OutputFile
    private var start: UInt64?

    public init(path: String) throws(EncoderError) {
        file = try OutputFile(path: path)
        try file.write("time_ms,bytes,keyframe,refresh,active_share,encode_ms,quantizer\n")
        // A FIFO or /dev/full says no here, not only at the first row.
        try file.flush()
    }

    public var path: String { file.path }

    /// Encoder thread.
    func append(_ f: EncoderStatistics.Frame) throws(EncoderError) {
        let start = self.start ?? f.timestampNs
        self.start = start
        let ms = f.timestampNs > start ? Double(f.timestampNs - start) / 1e6 : 0
        try file.write(String(cFormat: "%.1f,%d,%d,%d,%.4f,%.3f,%d\n", ms, f.bytes, f.keyframe ? 1 : 0, f.refresh ? 1 : 0,
                              f.activeShare, Double(f.encodeNs) / 1e6, f.quantizer ?? -1))
        // Row by row into the file (one write a frame, at most --max-fps a second): a reader
        // tailing it sees each frame, and a run cut short keeps its rows.
        try file.flush()
    }

    /// After the encoder thread ended.
    public func close() throws(EncoderError) { try file.close() }
}
