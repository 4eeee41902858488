import BackendKit
import CX11
import Glibc
import KraklBackendABI

/// The pointer as XFixes reports it, kept between frames so that only a
/// move or a new shape costs a redraw (the drawing itself is BackendKit's
/// CursorSprite, shared with the PipeWire backend).
struct CursorState {
    private var serial: UInt = 0
    private var sprite = CursorSprite()

    /// Asks XFixes; returns the areas to redraw (old and new place), or
    /// nothing when the pointer neither moved nor changed shape.
    mutating func update(display: OpaquePointer, area: CaptureArea) -> [krakl_rect] {
        guard let image = XFixesGetCursorImage(display) else { return [] }
        defer { XFree(image) }
        let c = image.pointee
        var shape: (pixels: [UInt32], width: Int, height: Int, alpha: CursorSprite.Alpha)?
        if c.cursor_serial != serial {
            serial = c.cursor_serial
            let count = Int(c.width) * Int(c.height)
            shape = ((0..<count).map { UInt32(truncatingIfNeeded: c.pixels[$0]) }, Int(c.width), Int(c.height), .premultiplied)
        }
        return sprite.update(image: shape, left: Int(c.x) - Int(c.xhot) - area.x, top: Int(c.y) - Int(c.yhot) - area.y,
                             pictureWidth: area.width, pictureHeight: area.height)
    }

    /// Where the pointer is drawn (clipped to the picture), nil when hidden.
    var rect: krakl_rect? { sprite.rect }

    /// The picture changed size: the next update places the pointer afresh (a rectangle clipped to
    /// the old size could lie outside the new picture).
    mutating func forgetPlace() { sprite.forgetPlace() }

    /// Blends the cursor over a BGRx patch whose first pixel is picture pixel (x, y).
    func draw(intoPatch patch: UnsafeMutablePointer<UInt8>, stride: Int, x: Int, y: Int) {
        sprite.draw(intoPatch: patch, stride: stride, originX: x, originY: y)
    }
}
