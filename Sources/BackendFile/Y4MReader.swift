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
        while header.count < 256 {
            let c = getc(file)
            if c == EOF || c == 0x0A { break }
            header.append(UInt8(c))
        }
        let words = String(decoding: header, as: UTF8.self).split(separator: " ")
        var width = 0, height = 0, fps = 0.0, colour = "420jpeg"
        guard words.first == "YUV4MPEG2" else {
            fclose(file)
            throw Failure(message: "\(path) is not a Y4M file (it does not start with YUV4MPEG2)")
        }
        for word in words.dropFirst() {
            let value = word.dropFirst()
            switch word.first {
            case "W": width = Int(value) ?? 0
            case "H": height = Int(value) ?? 0
            case "F":
                let parts = value.split(separator: ":").compactMap { Double($0) }
                if parts.count == 2, parts[1] > 0 { fps = parts[0] / parts[1] }
            case "C": colour = String(value)
            default: break
            }
        }
        guard width > 0, height > 0, width <= 16384, height <= 16384 else {
            fclose(file)
            throw Failure(message: "\(path): the Y4M header has no valid W/H size")
        }
        guard ["420", "420jpeg", "420paldv", "420mpeg2"].contains(colour) else {
            fclose(file)
            throw Failure(message: "\(path): colour space C\(colour) is not supported; convert it with: ffmpeg -i \(path) -pix_fmt yuv420p out.y4m", code: -EOPNOTSUPP)
        }
        self.width = width
        self.height = height
        self.fps = fps > 0 && fps <= 240 ? fps : 30
        frameSize = width * height + 2 * ((width + 1) / 2) * ((height + 1) / 2)
        firstFrameOffset = ftell(file)
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
