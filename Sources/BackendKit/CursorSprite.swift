import Glibc
import KraklBackendABI

/// A pointer image drawn into a captured picture for the length of one
/// delivery and then taken out again (so the backend keeps no second copy of
/// the frame), with its old and new places reported as damage. The X11
/// backend feeds it from XFixes, the PipeWire backend from SPA_META_Cursor.
public struct CursorSprite {
    /// XFixes hands out premultiplied ARGB; PipeWire cursor bitmaps are straight.
    public enum Alpha: Sendable { case premultiplied, straight }

    /// 0xAARRGGBB, `alpha` tells how to blend.
    private var pixels: [UInt32] = []
    private var width = 0, height = 0
    private var alpha = Alpha.premultiplied
    /// Top-left corner in picture pixels (may lie outside the picture).
    private var left = 0, top = 0
    /// Where it was last drawn, clipped to the picture; nil: not drawn.
    public private(set) var rect: krakl_rect?

    public init() {}

    /// A new image (nil keeps the current one; an empty one hides the
    /// pointer) and/or a new top-left corner. Returns the areas to redraw
    /// (old and new place), or nothing when neither place nor image changed.
    public mutating func update(image: (pixels: [UInt32], width: Int, height: Int, alpha: Alpha)?, left: Int, top: Int,
                                pictureWidth: Int, pictureHeight: Int) -> [krakl_rect] {
        if let image {
            pixels = image.pixels.count == image.width * image.height ? image.pixels : []
            width = pixels.isEmpty ? 0 : image.width
            height = pixels.isEmpty ? 0 : image.height
            alpha = image.alpha
        }
        self.left = left
        self.top = top
        let placed = pixels.isEmpty ? nil
            : krakl_rect(x: Int32(left), y: Int32(top), width: Int32(width), height: Int32(height)).clipped(width: pictureWidth, height: pictureHeight)
        guard image != nil || !Self.same(placed, rect) else { return [] }
        let old = rect
        rect = placed
        return [old, placed].compactMap { $0 }
    }

    /// The picture changed size: nothing is drawn anywhere yet.
    public mutating func forgetPlace() { rect = nil }

    /// Blends the pointer over 32-bit pixels (BGRx/BGRA, or RGBx/RGBA when
    /// `redFirst`) and returns the bytes it covered, for `restore`.
    public func draw(into picture: UnsafeMutablePointer<UInt8>, stride: Int, redFirst: Bool = false) -> [UInt8]? {
        guard let rect else { return nil }
        var under: [UInt8] = []
        under.reserveCapacity(Int(rect.width * rect.height) * 4)
        for row in Int(rect.y)..<Int(rect.y + rect.height) {
            under.append(contentsOf: UnsafeBufferPointer(start: picture + row * stride + Int(rect.x) * 4, count: Int(rect.width) * 4))
        }
        blend(into: picture, stride: stride, redFirst: redFirst, originX: 0, originY: 0)
        return under
    }

    /// Blends the pointer over a patch of 32-bit BGRx pixels whose first byte is picture pixel
    /// (`originX`, `originY`) and which covers all of `rect`; nothing is kept to restore (the patch
    /// is a copy: a backend whose picture is not packed blends there and converts the patch).
    public func draw(intoPatch patch: UnsafeMutablePointer<UInt8>, stride: Int, originX: Int, originY: Int) {
        blend(into: patch, stride: stride, redFirst: false, originX: originX, originY: originY)
    }

    private func blend(into picture: UnsafeMutablePointer<UInt8>, stride: Int, redFirst: Bool, originX: Int, originY: Int) {
        guard let rect else { return }
        let (ri, bi) = redFirst ? (0, 2) : (2, 0)
        for row in Int(rect.y)..<Int(rect.y + rect.height) {
            let line = picture + (row - originY) * stride + (Int(rect.x) - originX) * 4
            for col in Int(rect.x)..<Int(rect.x + rect.width) {
                let p = pixels[(row - top) * width + (col - left)]
                let a = p >> 24
                guard a > 0 else { continue }
                let out = line + (col - Int(rect.x)) * 4
                let keep = 255 - a
                let (r, g, b) = ((p >> 16) & 0xFF, (p >> 8) & 0xFF, p & 0xFF)
                switch alpha {
                case .premultiplied:
                    out[ri] = UInt8(min(255, r + UInt32(out[ri]) * keep / 255))
                    out[1] = UInt8(min(255, g + UInt32(out[1]) * keep / 255))
                    out[bi] = UInt8(min(255, b + UInt32(out[bi]) * keep / 255))
                case .straight:
                    out[ri] = UInt8((r * a + UInt32(out[ri]) * keep) / 255)
                    out[1] = UInt8((g * a + UInt32(out[1]) * keep) / 255)
                    out[bi] = UInt8((b * a + UInt32(out[bi]) * keep) / 255)
                }
            }
        }
    }

    /// Puts back the bytes `draw` covered.
    public func restore(_ under: [UInt8], into picture: UnsafeMutablePointer<UInt8>, stride: Int) {
        guard let rect, under.count == Int(rect.width * rect.height) * 4 else { return }
        let rowBytes = Int(rect.width) * 4
        under.withUnsafeBufferPointer { saved in
            for (i, row) in (Int(rect.y)..<Int(rect.y + rect.height)).enumerated() {
                memcpy(picture + row * stride + Int(rect.x) * 4, saved.baseAddress! + i * rowBytes, rowBytes)
            }
        }
    }

    private static func same(_ a: krakl_rect?, _ b: krakl_rect?) -> Bool {
        a?.x == b?.x && a?.y == b?.y && a?.width == b?.width && a?.height == b?.height
    }
}
