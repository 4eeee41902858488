import Glibc

/// An owned I420 picture with 32-byte aligned rows (libyuv's SIMD paths and
/// libvpx both like aligned strides).
public final class I420Image {
    public let width: Int
    public let height: Int
    public let strideY: Int
    public let strideUV: Int
    public let y: UnsafeMutablePointer<UInt8>
    public let u: UnsafeMutablePointer<UInt8>
    public let v: UnsafeMutablePointer<UInt8>
    private let storage: UnsafeMutableRawPointer

    public var chromaWidth: Int { (width + 1) / 2 }
    public var chromaHeight: Int { (height + 1) / 2 }

    public init(width: Int, height: Int) {
        self.width = width
        self.height = height
        strideY = (width + 31) & ~31
        strideUV = ((width + 1) / 2 + 31) & ~31
        let ySize = strideY * height, uvSize = strideUV * ((height + 1) / 2)
        storage = UnsafeMutableRawPointer.allocate(byteCount: ySize + 2 * uvSize, alignment: 64)
        y = storage.bindMemory(to: UInt8.self, capacity: ySize + 2 * uvSize)
        u = y + ySize
        v = u + uvSize
        // Black in BT.601 limited range.
        memset(y, 16, ySize)
        memset(u, 128, 2 * uvSize)
    }

    deinit { storage.deallocate() }

    /// Appends the visible pixels, tightly packed (Y, then U, then V), for
    /// dumps that ffmpeg reads as `-f rawvideo -pix_fmt yuv420p`.
    public func appendPacked(to buffer: inout [UInt8]) {
        for row in 0..<height { buffer.append(contentsOf: UnsafeBufferPointer(start: y + row * strideY, count: width)) }
        for plane in [u, v] {
            for row in 0..<chromaHeight { buffer.append(contentsOf: UnsafeBufferPointer(start: plane + row * strideUV, count: chromaWidth)) }
        }
    }
}

/// A rectangle in pixels of one picture.
public struct PixelRect: Equatable, Sendable, CustomStringConvertible {
    public var x: Int
    public var y: Int
    public var width: Int
    public var height: Int

    public init(x: Int, y: Int, width: Int, height: Int) {
        self.x = x
        self.y = y
        self.width = width
        self.height = height
    }

    public var maxX: Int { x + width }
    public var maxY: Int { y + height }
    public var area: Int { width * height }
    public var isEmpty: Bool { width <= 0 || height <= 0 }
    public var description: String { "(\(x),\(y) \(width)x\(height))" }

    public func intersection(_ other: PixelRect) -> PixelRect {
        let x0 = max(x, other.x), y0 = max(y, other.y)
        return PixelRect(x: x0, y: y0, width: max(0, min(maxX, other.maxX) - x0), height: max(0, min(maxY, other.maxY) - y0))
    }

    public func union(_ other: PixelRect) -> PixelRect {
        let x0 = min(x, other.x), y0 = min(y, other.y)
        return PixelRect(x: x0, y: y0, width: max(maxX, other.maxX) - x0, height: max(maxY, other.maxY) - y0)
    }

    /// Grown outwards to even coordinates (4:2:0 chroma covers 2×2 pixels),
    /// then clipped to `bounds`.
    public func evenAligned(within bounds: PixelRect) -> PixelRect {
        let x0 = x & ~1, y0 = y & ~1
        let x1 = (maxX + 1) & ~1, y1 = (maxY + 1) & ~1
        return PixelRect(x: x0, y: y0, width: x1 - x0, height: y1 - y0).intersection(bounds)
    }
}
