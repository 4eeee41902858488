import CX11
import Glibc
import KraklBackendABI

/// The pointer as XFixes reports it, kept between frames so that only a
/// move or a new shape costs a redraw, and both the old and the new place
/// are reported as damage.
struct CursorState {
    private var serial: UInt = 0
    private var pixels: [UInt32] = []   // premultiplied ARGB
    private var width = 0, height = 0
    private var x = 0, y = 0            // top-left, capture-area pixels
    private var rect: krakl_rect?       // where it was last drawn (clipped)

    /// Polls XFixes; returns the areas to redraw (old and new place), or
    /// nothing when the pointer neither moved nor changed shape.
    mutating func update(display: OpaquePointer, area: CaptureArea) -> [krakl_rect] {
        guard let image = XFixesGetCursorImage(display) else { return [] }
        defer { XFree(image) }
        let c = image.pointee
        let changedShape = c.cursor_serial != serial
        if changedShape {
            serial = c.cursor_serial
            width = Int(c.width)
            height = Int(c.height)
            pixels = (0..<(width * height)).map { UInt32(truncatingIfNeeded: c.pixels[$0]) }
        }
        x = Int(c.x) - Int(c.xhot) - area.x
        y = Int(c.y) - Int(c.yhot) - area.y
        let newRect = clipped(krakl_rect(x: Int32(x), y: Int32(y), width: Int32(width), height: Int32(height)), to: area)
        guard changedShape || newRect?.x != rect?.x || newRect?.y != rect?.y || newRect?.width != rect?.width || newRect?.height != rect?.height else {
            return []
        }
        let old = rect
        rect = newRect
        return [old, newRect].compactMap { $0 }
    }

    private func clipped(_ r: krakl_rect, to area: CaptureArea) -> krakl_rect? {
        let x0 = max(0, Int(r.x)), y0 = max(0, Int(r.y))
        let x1 = min(area.width, Int(r.x) + Int(r.width)), y1 = min(area.height, Int(r.y) + Int(r.height))
        guard x0 < x1, y0 < y1 else { return nil }
        return krakl_rect(x: Int32(x0), y: Int32(y0), width: Int32(x1 - x0), height: Int32(y1 - y0))
    }

    /// Blends the cursor (premultiplied alpha) over BGRx pixels and returns
    /// the pixels it covered, for `restore` after the frame is delivered.
    func draw(into pixels: UnsafeMutablePointer<UInt8>, stride: Int) -> [UInt8]? {
        guard let rect else { return nil }
        var under: [UInt8] = []
        under.reserveCapacity(Int(rect.width * rect.height) * 4)
        for row in Int(rect.y)..<Int(rect.y + rect.height) {
            let line = pixels + row * stride + Int(rect.x) * 4
            under.append(contentsOf: UnsafeBufferPointer(start: line, count: Int(rect.width) * 4))
            let sy = row - y
            for col in Int(rect.x)..<Int(rect.x + rect.width) {
                let p = self.pixels[sy * width + (col - x)]
                let alpha = p >> 24
                guard alpha > 0 else { continue }
                let out = pixels + row * stride + col * 4
                let keep = 255 - alpha
                out[0] = UInt8(min(255, (p & 0xFF) + UInt32(out[0]) * keep / 255))
                out[1] = UInt8(min(255, ((p >> 8) & 0xFF) + UInt32(out[1]) * keep / 255))
                out[2] = UInt8(min(255, ((p >> 16) & 0xFF) + UInt32(out[2]) * keep / 255))
            }
        }
        return under
    }

    /// Puts back the pixels `draw` covered.
    func restore(_ under: [UInt8], into pixels: UnsafeMutablePointer<UInt8>, stride: Int) {
        guard let rect else { return }
        let rowBytes = Int(rect.width) * 4
        under.withUnsafeBufferPointer { saved in
            for (i, row) in (Int(rect.y)..<Int(rect.y + rect.height)).enumerated() {
                memcpy(pixels + row * stride + Int(rect.x) * 4, saved.baseAddress! + i * rowBytes, rowBytes)
            }
        }
    }
}
