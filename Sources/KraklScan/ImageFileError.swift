/// Why an image file cannot be scanned. `description` is one line naming
/// the file and what to do.
public enum ImageFileError: Error, Equatable, Sendable, CustomStringConvertible {
    /// open() or fstat() failed (`reason` is strerror's text).
    case cannotOpen(path: String, reason: String)
    /// A folder, a device or a pipe: only regular files are read.
    case notAFile(path: String)
    /// 0 bytes.
    case empty(path: String)
    /// The first bytes are not a PNG, JPEG or binary PNM (P5/P6) header.
    case unknownFormat(path: String)
    /// The header claims more than `limits` allow (or more than stb_image
    /// decodes at all: then the size is unknown). Refused before decoding.
    case tooLarge(path: String, width: Int?, height: Int?, limits: ImageLimits)
    /// The header is fine but the pixels do not decode: truncated or damaged
    /// (`reason` is stb_image's short reason).
    case damaged(path: String, reason: String)

    public var description: String {
        switch self {
        case .cannotOpen(let path, let reason): return "cannot read \(path): \(reason)"
        case .notAFile(let path): return "\(path) is not a regular file: give the path of a PNG, JPEG or PPM/PGM image"
        case .empty(let path): return "\(path) is empty (0 bytes): give the path of a PNG, JPEG or PPM/PGM image"
        case .unknownFormat(let path): return "\(path) is not a PNG, JPEG or binary PPM/PGM (P6/P5) image"
        case .tooLarge(let path, let width, let height, let limits):
            let size = width.flatMap { w in height.map { h in "\(w)x\(h) pixels" } } ?? "too many pixels to decode"
            return "\(path) claims \(size), more than the \(limits.maximumSide)x\(limits.maximumSide) and "
                + "\(limits.maximumPixels / 1_000_000) Mpixel allowed: refused before decoding (scale the picture down)"
        case .damaged(let path, let reason):
            return "\(path) is truncated or damaged: its pixels do not decode (stb_image: \(reason))"
        }
    }
}

/// The largest picture `ImageFile` decodes. A screenshot or a photo of a
/// code is far below; a header asking for more is a decompression bomb.
public struct ImageLimits: Equatable, Sendable {
    /// Width and height each at most this.
    public var maximumSide: Int
    /// Width × height at most this.
    public var maximumPixels: Int

    public init(maximumSide: Int = 16384, maximumPixels: Int = 100_000_000) {
        self.maximumSide = maximumSide
        self.maximumPixels = maximumPixels
    }
}
