import Glibc

/// Reads YUV4MPEG2 (.y4m) files: the plain raw-video container ffmpeg,
/// x264 and libvpx's tools write. 4:2:0 8-bit only, since that is what the
/// encoder takes without conversion.
final class Y4MReader {
    let width: Int
    let height: Int
    let fps: Double
    let frameSize: Int
    private let file: UnsafeMutablePointer<FILE>
    private let firstFrameOffset: Int

    struct Failure: Error {
        let message: String
        /// What create() reports: the file is missing, or is not a Y4M file we can play.
        var code: Int32 = -EINVAL
    }

    init(path: String) throws(Failure) {
        guard let file = fopen(path, "rb") else {
            throw Failure(message: "cannot open \(path): \(String(cString: strerror(errno)))", code: -errno)
        }
        self.file = file
        // Header: "YUV4MPEG2 W<w> H<h> F<n>:<d> [I.] [A.] [C<space>] [X...]\n"
        var header: [UInt8] = []
        var ended = false
        while header.count < Self.maximumHeader {
            let c = getc(file)
            if c == EOF { break }
            if c == 0x0A { ended = true; break }
            header.append(UInt8(c))
        }
        func failure(_ message: String, code: Int32 = -EINVAL) -> Failure {
            fclose(file)
            return Failure(message: "\(path): \(message)", code: code)
        }
        let words = String(decoding: header, as: UTF8.self).split(separator: " ")
        guard words.first == "YUV4MPEG2" else {
            fclose(file)
            throw Failure(message: "\(path) is not a Y4M file (it does not start with YUV4MPEG2)")
        }
        guard ended else {
            throw failure(header.count >= Self.maximumHeader ? "the Y4M header is longer than \(Self.maximumHeader) bytes"
                                                             : "the file ends inside its Y4M header (truncated file)")
        }
        var width = 0, height = 0, colour = "420jpeg"
        var rate: String?
        for word in words.dropFirst() {
            let value = word.dropFirst()
            switch word.first {
            case "W": width = Int(value) ?? 0
            case "H": height = Int(value) ?? 0
            case "F": rate = String(value)
            case "C": colour = String(value)
            default: break
            }
        }
        guard width > 0, height > 0, width <= 16384, height <= 16384 else { throw failure("the Y4M header has no valid W/H size") }
        guard ["420", "420jpeg", "420paldv", "420mpeg2"].contains(colour) else {
            throw failure("colour space C\(colour) is not supported; convert it with: ffmpeg -i \(path) -pix_fmt yuv420p out.y4m", code: -EOPNOTSUPP)
        }
        guard let rate else { throw failure("the Y4M header has no frame rate (F<n>:<d>)") }
        guard let fps = Self.frameRate(rate) else {
            throw failure("the Y4M frame rate F\(rate) is not valid: give F<n>:<d> with whole numbers above 0 and at most \(Int(Self.fpsRange.upperBound)) fps, e.g. F30:1 or F30000:1001")
        }
        // A header and nothing after it would play nothing and end "normally" (a frame cut short
        // is reported when it is read: the frames before it still play). Checked before every
        // property is set: from then on a throw would run deinit, which closes the file too.
        let headerEnd = ftell(file)
        var info = stat()
        if fstat(fileno(file), &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, Int(info.st_size) <= headerEnd {
            throw failure("the Y4M file holds no frame after its header (truncated file?)")
        }
        self.width = width
        self.height = height
        self.fps = fps
        frameSize = width * height + 2 * ((width + 1) / 2) * ((height + 1) / 2)
        firstFrameOffset = headerEnd
    }

    /// The longest header read (real ones are under 100 bytes; X comments may add some).
    static let maximumHeader = 4096
    /// The rates the file backend plays (its fps option's range).
    static let fpsRange = 1.0...240.0

    /// "30000:1001" → 29.97; nil unless both are whole numbers above 0 and the rate is in `fpsRange`.
    static func frameRate(_ text: String) -> Double? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let n = UInt32(parts[0]), let d = UInt32(parts[1]), n > 0, d > 0 else { return nil }
        let fps = Double(n) / Double(d)
        return fpsRange.contains(fps) ? fps : nil
    }

    deinit { fclose(file) }

    /// Reads the next frame into `buffer` (frameSize bytes). Returns false
    /// at the end of the file.
    func read(into buffer: UnsafeMutablePointer<UInt8>) throws(Failure) -> Bool {
        // Frame header: "FRAME[ params]\n"
        var tag: [UInt8] = []
        while true {
            let c = getc(file)
            if c == EOF {
                if tag.isEmpty { return false }
                throw Failure(message: "the Y4M file ends inside a frame header")
            }
            if c == 0x0A { break }
            if tag.count < 5 { tag.append(UInt8(c)) }
            if tag.count == 5 && tag != Array("FRAME".utf8) { throw Failure(message: "the Y4M file has a damaged frame header") }
        }
        guard tag == Array("FRAME".utf8) else { throw Failure(message: "the Y4M file has a damaged frame header") }
        guard fread(buffer, 1, frameSize, file) == frameSize else {
            throw Failure(message: "the Y4M file ends inside a frame (truncated file)")
        }
        return true
    }

    func rewind() { fseek(file, firstFrameOffset, SEEK_SET) }
}
