/// An 8-bit gray picture (Y800: one byte a pixel, rows of `width` bytes,
/// no padding), what zbar scans.
public struct GrayImage: Equatable, Sendable {
    public let width: Int
    public let height: Int
    /// `width * height` bytes, row after row.
    public let pixels: [UInt8]

    /// `pixels` must hold exactly `width * height` bytes.
    public init(width: Int, height: Int, pixels: [UInt8]) {
        precondition(width > 0 && height > 0 && pixels.count == width * height, "gray image of \(width)x\(height) needs \(width * height) bytes")
        self.width = width
        self.height = height
        self.pixels = pixels
    }
}
