import BackendKit
import CPipeWire
import Glibc
import KraklBackendABI

/// The pointer from SPA_META_Cursor (cursor=metadata): the buffer's bitmap
/// and position turned into BackendKit's CursorSprite, which draws it in for
/// the length of a delivery and reports its old and new places as damage.
struct CursorOverlay {
    private var sprite = CursorSprite()
    private var hotspotX = 0, hotspotY = 0
    var rect: krakl_rect? { sprite.rect }

    /// Takes the buffer's cursor metadata; returns the areas to redraw (old
    /// and new place), or nothing when neither place nor image changed.
    mutating func update(_ meta: krakl_pw_cursor, originX: Int, originY: Int, pictureWidth: Int, pictureHeight: Int) -> [krakl_rect] {
        var image: (pixels: [UInt32], width: Int, height: Int, alpha: CursorSprite.Alpha)?
        if meta.has_bitmap {
            var pixels: [UInt32] = []
            if let source = meta.pixels, meta.width > 0, meta.height > 0 {
                pixels = Self.convert(source, format: meta.format, width: Int(meta.width), height: Int(meta.height), stride: Int(meta.stride))
            }
            image = (pixels, Int(meta.width), Int(meta.height), .straight)
            hotspotX = Int(meta.hotspot_x)
            hotspotY = Int(meta.hotspot_y)
        }
        return sprite.update(image: image, left: Int(meta.x) - originX - hotspotX, top: Int(meta.y) - originY - hotspotY,
                             pictureWidth: pictureWidth, pictureHeight: pictureHeight)
    }

    /// The picture changed size: nothing is drawn anywhere yet.
    mutating func forgetPlace() { sprite.forgetPlace() }

    /// Blends the cursor over the picture (`redFirst`: RGBx/RGBA); the covered bytes go back with `restore`.
    func draw(into picture: UnsafeMutablePointer<UInt8>, stride: Int, redFirst: Bool) -> [UInt8]? {
        sprite.draw(into: picture, stride: stride, redFirst: redFirst)
    }

    func restore(_ under: [UInt8], into picture: UnsafeMutablePointer<UInt8>, stride: Int) { sprite.restore(under, into: picture, stride: stride) }

    /// The bitmap as 0xAARRGGBB, from the 32-bit formats portals use.
    private static func convert(_ source: UnsafePointer<UInt8>, format: UInt32, width: Int, height: Int, stride: Int) -> [UInt32] {
        // Byte positions of R, G, B, A in memory; nil alpha: opaque.
        let order: (r: Int, g: Int, b: Int, a: Int?)
        switch format {
        case SPA_VIDEO_FORMAT_BGRA.rawValue: order = (2, 1, 0, 3)
        case SPA_VIDEO_FORMAT_RGBA.rawValue: order = (0, 1, 2, 3)
        case SPA_VIDEO_FORMAT_ARGB.rawValue: order = (1, 2, 3, 0)
        case SPA_VIDEO_FORMAT_ABGR.rawValue: order = (3, 2, 1, 0)
        case SPA_VIDEO_FORMAT_BGRx.rawValue: order = (2, 1, 0, nil)
        case SPA_VIDEO_FORMAT_RGBx.rawValue: order = (0, 1, 2, nil)
        default: return []
        }
        var out = [UInt32](repeating: 0, count: width * height)
        for row in 0..<height {
            let line = source + row * stride
            for col in 0..<width {
                let p = line + col * 4
                let a = order.a.map { UInt32(p[$0]) } ?? 255
                out[row * width + col] = a << 24 | UInt32(p[order.r]) << 16 | UInt32(p[order.g]) << 8 | UInt32(p[order.b])
            }
        }
        return out
    }
}
