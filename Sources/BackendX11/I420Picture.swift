import CYuv
import Glibc
import KraklBackendABI

/// The captured screen as the host's encoder takes it: I420, BT.601 limited range, converted
/// with libyuv's ARGBToI420 as the host converts BGRx frames (so the encoded picture is the
/// same). 1.5 bytes a pixel instead of BGRx's 4: 3.1 MB at 1080p instead of 8.3 MB.
/// Rows are tightly packed (stride = width, chroma (width+1)/2).
final class I420Picture {
    let width: Int, height: Int
    var strideY: Int { width }
    var strideUV: Int { (width + 1) / 2 }
    let y: UnsafeMutablePointer<UInt8>
    let u: UnsafeMutablePointer<UInt8>
    let v: UnsafeMutablePointer<UInt8>

    init(width: Int, height: Int) {
        self.width = width
        self.height = height
        let ySize = width * height, uvSize = ((width + 1) / 2) * ((height + 1) / 2)
        y = .allocate(capacity: ySize + 2 * uvSize)
        u = y + ySize
        v = u + uvSize
        // Black, until the first (whole) read replaces it.
        y.initialize(repeating: 16, count: ySize)
        u.initialize(repeating: 128, count: 2 * uvSize)
    }

    deinit { y.deallocate() }

    /// Converts BGRx rows (`stride` bytes apart) into rectangle `r` of the picture. `r` has even
    /// x and y, and an even width and height except where it ends at an odd last column or row,
    /// so each 2×2 chroma block is converted whole, from the same pixels as a whole-picture
    /// conversion would use.
    func convert(bgrx: UnsafePointer<UInt8>, stride: Int, into r: krakl_rect) {
        let x = Int(r.x), top = Int(r.y)
        ARGBToI420(bgrx, Int32(stride),
                   y + top * strideY + x, Int32(strideY),
                   u + top / 2 * strideUV + x / 2, Int32(strideUV),
                   v + top / 2 * strideUV + x / 2, Int32(strideUV),
                   r.width, r.height)
    }

    /// The Y, U and V bytes of rectangle `r` (even-aligned as for `convert`), for `restore`.
    func save(_ r: krakl_rect) -> [UInt8] {
        var saved: [UInt8] = []
        saved.reserveCapacity(Int(r.width * r.height) * 3 / 2 + Int(r.width) + Int(r.height) + 1)
        forEachRow(of: r) { row, bytes in saved.append(contentsOf: UnsafeBufferPointer(start: row, count: bytes)) }
        return saved
    }

    /// Puts back what `save` returned for the same rectangle.
    func restore(_ saved: [UInt8], _ r: krakl_rect) {
        saved.withUnsafeBufferPointer { buffer in
            var offset = 0
            forEachRow(of: r) { row, bytes in
                guard offset + bytes <= buffer.count else { return }
                memcpy(row, buffer.baseAddress! + offset, bytes)
                offset += bytes
            }
        }
    }

    /// Each row of each plane inside `r`: its first byte and its length.
    private func forEachRow(of r: krakl_rect, _ body: (UnsafeMutablePointer<UInt8>, Int) -> Void) {
        let x = Int(r.x), top = Int(r.y), w = Int(r.width), h = Int(r.height)
        for row in top..<(top + h) { body(y + row * strideY + x, w) }
        let cx = x / 2, cw = (x + w + 1) / 2 - cx
        for plane in [u, v] {
            for row in (top / 2)..<((top + h + 1) / 2) { body(plane + row * strideUV + cx, cw) }
        }
    }
}
