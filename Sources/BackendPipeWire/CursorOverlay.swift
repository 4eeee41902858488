import CPipeWire
import Glibc
import KraklBackendABI

/// The pointer from SPA_META_Cursor (cursor=metadata), drawn into the
/// picture for the length of a delivery and then taken out again, with its
/// old and new places reported as damage (as the X11 backend does).
struct CursorOverlay {
    /// Straight-alpha pixels as 0xAARRGGBB.
    private var pixels: [UInt32] = []
    private var width = 0, height = 0
    private var hotspotX = 0, hotspotY = 0
    private var visible = false
    /// Hotspot position in picture pixels.
    private var x = 0, y = 0
    /// Where it was last drawn (clipped to the picture).
    private(set) var rect: krakl_rect?

    /// Takes the buffer's cursor metadata; returns the areas to redraw (old
    /// and new place), or nothing when neither place nor image changed.
    mutating func update(_ meta: krakl_pw_cursor, originX: Int, originY: Int, pictureWidth: Int, pictureHeight: Int) -> [krakl_rect] {
        var changedImage = false
        if meta.has_bitmap {
            changedImage = true
            if let source = meta.pixels, meta.width > 0, meta.height > 0 {
                width = Int(meta.width)
                height = Int(meta.height)
                pixels = Self.convert(source, format: meta.format, width: width, height: height, stride: Int(meta.stride))
                visible = !pixels.isEmpty
            } else {
                visible = false
            }
            hotspotX = Int(meta.hotspot_x)
            hotspotY = Int(meta.hotspot_y)
        }
        x = Int(meta.x) - originX
        y = Int(meta.y) - originY
        let newRect = visible ? clip(krakl_rect(x: Int32(x - hotspotX), y: Int32(y - hotspotY), width: Int32(width), height: Int32(height)),
                                     pictureWidth, pictureHeight) : nil
        guard changedImage || !same(newRect, rect) else { return [] }
        let old = rect
        rect = newRect
        return [old, newRect].compactMap { $0 }
    }

    /// The picture changed size: nothing is drawn anywhere yet.
    mutating func forgetPlace() { rect = nil }

    private func same(_ a: krakl_rect?, _ b: krakl_rect?) -> Bool {
        a?.x == b?.x && a?.y == b?.y && a?.width == b?.width && a?.height == b?.height
    }

    private func clip(_ r: krakl_rect, _ w: Int, _ h: Int) -> krakl_rect? {
        let x0 = max(0, Int(r.x)), y0 = max(0, Int(r.y))
        let x1 = min(w, Int(r.x) + Int(r.width)), y1 = min(h, Int(r.y) + Int(r.height))
        guard x0 < x1, y0 < y1 else { return nil }
        return krakl_rect(x: Int32(x0), y: Int32(y0), width: Int32(x1 - x0), height: Int32(y1 - y0))
    }

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

    /// Blends the cursor over the picture and returns the pixels it
    /// covered, for `restore` after the delivery. `redFirst`: the picture
    /// is RGBx/RGBA rather than BGRx/BGRA.
    func draw(into picture: UnsafeMutablePointer<UInt8>, stride: Int, redFirst: Bool) -> [UInt8]? {
        guard visible, let rect else { return nil }
        var under: [UInt8] = []
        under.reserveCapacity(Int(rect.width * rect.height) * 4)
        let left = x - hotspotX, top = y - hotspotY
        let (ri, bi) = redFirst ? (0, 2) : (2, 0)
        for row in Int(rect.y)..<Int(rect.y + rect.height) {
            let line = picture + row * stride + Int(rect.x) * 4
            under.append(contentsOf: UnsafeBufferPointer(start: line, count: Int(rect.width) * 4))
            for col in Int(rect.x)..<Int(rect.x + rect.width) {
                let p = pixels[(row - top) * width + (col - left)]
                let alpha = p >> 24
                guard alpha > 0 else { continue }
                let out = picture + row * stride + col * 4
                let keep = 255 - alpha
                out[ri] = UInt8(((p >> 16) & 0xFF) * alpha / 255 + UInt32(out[ri]) * keep / 255)
                out[1] = UInt8(((p >> 8) & 0xFF) * alpha / 255 + UInt32(out[1]) * keep / 255)
                out[bi] = UInt8((p & 0xFF) * alpha / 255 + UInt32(out[bi]) * keep / 255)
            }
        }
        return under
    }

    /// Puts back the pixels `draw` covered.
    func restore(_ under: [UInt8], into picture: UnsafeMutablePointer<UInt8>, stride: Int) {
        guard let rect else { return }
        let rowBytes = Int(rect.width) * 4
        under.withUnsafeBufferPointer { saved in
            for (i, row) in (Int(rect.y)..<Int(rect.y + rect.height)).enumerated() {
                memcpy(picture + row * stride + Int(rect.x) * 4, saved.baseAddress! + i * rowBytes, rowBytes)
            }
        }
    }
}
