import KraklCore
import Glibc

/// Where encoded frames go: a file now, the RTP publisher later.
public protocol EncodedFrameSink: AnyObject {
    /// Encoder thread. Frames arrive in presentation order.
    func write(_ frame: EncodedFrame) throws(EncoderError)
    /// Completes the output (indexes, sizes); nothing is written after it.
    func finish() throws(EncoderError)
}

/// A file written with stdio, with the seek-back patching both containers
/// need for sizes and counts known only at the end.
final class OutputFile {
    let path: String
    private let file: UnsafeMutablePointer<FILE>

    init(path: String) throws(EncoderError) {
        guard let file = fopen(path, "w+b") else {
            throw EncoderError("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        self.path = path
        self.file = file
    }

    deinit { fclose(file) }

    var position: Int { ftell(file) }

    func write(_ bytes: [UInt8]) throws(EncoderError) {
        guard bytes.isEmpty || fwrite(bytes, 1, bytes.count, file) == bytes.count else {
            throw EncoderError("writing \(path) failed: \(String(cString: strerror(errno)))")
        }
    }

    /// Overwrites bytes at `offset` and returns to the end.
    func patch(_ bytes: [UInt8], at offset: Int) throws(EncoderError) {
        fseek(file, offset, SEEK_SET)
        try write(bytes)
        fseek(file, 0, SEEK_END)
    }

    func close() throws(EncoderError) {
        guard fflush(file) == 0 else { throw EncoderError("writing \(path) failed: \(String(cString: strerror(errno)))") }
    }
}

/// IVF: the minimal container of libvpx's own tools (32-byte file header,
/// 12-byte frame headers), handy for `ffmpeg -i x.ivf` and vpxdec.
public final class IVFWriter: EncodedFrameSink {
    private let file: OutputFile
    private var frames = 0
    private var firstTimestamp: UInt64?

    public init(path: String, codec: VideoCodec, width: Int, height: Int) throws(EncoderError) {
        file = try OutputFile(path: path)
        var header = Array("DKIF".utf8) + le(0, 2) + le(32, 2) + Array(codec.fourcc.utf8)
        header += le(UInt64(width), 2) + le(UInt64(height), 2) + le(1000, 4) + le(1, 4) + le(0, 4) + le(0, 4)
        try file.write(header)
    }

    public func write(_ frame: EncodedFrame) throws(EncoderError) {
        let start = firstTimestamp ?? frame.timestampNs
        firstTimestamp = start
        try file.write(le(UInt64(frame.data.count), 4) + le((frame.timestampNs - start) / 1_000_000, 8) + frame.data)
        frames += 1
    }

    public func finish() throws(EncoderError) {
        try file.patch(le(UInt64(frames), 4), at: 24)
        try file.close()
    }
}

/// Little-endian bytes of `value`.
func le(_ value: UInt64, _ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64($0))) } }
