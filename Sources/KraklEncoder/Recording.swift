import KraklBase
import KraklHost
import Glibc

/// Where encoded frames go: a file now, the RTP publisher later.
public protocol EncodedFrameSink: AnyObject {
    /// Encoder thread. Frames arrive in presentation order.
    func write(_ frame: EncodedFrame) throws(EncoderError)
    /// Completes the output (indexes, sizes); nothing is written after it.
    func finish() throws(EncoderError)
}

/// Milliseconds from `start` to `timestamp`, never below `floor` (the previous frame's), so a
/// container's timecodes only go forward whatever timestamps arrive. The pipeline already hands
/// out increasing times (PresentationClock); this keeps a writer from trapping if it is fed
/// directly.
func forwardMilliseconds(_ timestamp: UInt64, since start: UInt64, floor: UInt64) -> UInt64 {
    max(floor, timestamp > start ? (timestamp - start) / 1_000_000 : 0)
}

/// IVF: the minimal container of libvpx's own tools (32-byte file header,
/// 12-byte frame headers), handy for `ffmpeg -i x.ivf` and vpxdec. The frame
/// count in the header is patched at the end; on a pipe it stays 0, which
/// readers take as "unknown".
public final class IVFWriter: EncodedFrameSink {
    private let file: OutputFile
    private var frames = 0
    private var firstTimestamp: UInt64?
    private var lastMs: UInt64 = 0

    public init(path: String, codec: VideoCodec, width: Int, height: Int) throws(EncoderError) {
        file = try OutputFile(path: path)
        var header = Array("DKIF".utf8) + le(0, 2) + le(32, 2) + Array(codec.fourcc.utf8)
        header += le(UInt64(width), 2) + le(UInt64(height), 2) + le(1000, 4) + le(1, 4) + le(0, 4) + le(0, 4)
        try file.write(header)
    }

    public func write(_ frame: EncodedFrame) throws(EncoderError) {
        let start = firstTimestamp ?? frame.timestampNs
        firstTimestamp = start
        lastMs = forwardMilliseconds(frame.timestampNs, since: start, floor: lastMs)
        try file.write(le(UInt64(frame.data.count), 4) + le(lastMs, 8) + frame.data)
        // Each frame leaves stdio at once: a live reader (a FIFO) gets it now, and a full disk says so at this frame.
        try file.flush()
        frames += 1
    }

    public func finish() throws(EncoderError) {
        if file.isSeekable { try file.patch(le(UInt64(frames), 4), at: 24) }
        try file.close()
    }
}

/// Little-endian bytes of `value`.
func le(_ value: UInt64, _ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64($0))) } }
