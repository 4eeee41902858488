import CYuv
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost

/// The encoder's picture size for a source size: the source itself when it
/// fits within `maximum`, else scaled down to fit with its aspect kept;
/// always even (4:2:0) and at least 16×16.
public func outputSize(width: Int, height: Int, maximum: (width: Int, height: Int)) -> (width: Int, height: Int) {
    var w = Double(width), h = Double(height)
    let scale = min(1, Double(maximum.width) / w, Double(maximum.height) / h)
    w *= scale
    h *= scale
    return (max(16, Int(w) & ~1), max(16, Int(h) & ~1))
}

/// Converts captured frames (BGRx/RGBx/BGRA/RGBA/I420/NV12) into an
/// I420Image of the output size with libyuv, touching only the damaged
/// areas when the frame says what changed. Runs on the capture thread.
final class FrameConverter {
    /// Scaled packed pixels, kept so damaged areas can be scaled alone.
    private var scaledPacked: UnsafeMutablePointer<UInt8>?
    private var scaledPackedSize = 0
    /// Full-size I420 for planar sources that need scaling.
    private var planarScratch: I420Image?

    deinit { scaledPacked?.deallocate() }

    /// Writes the frame's changed areas into `image` (whose size is the
    /// output size) and returns them in output pixels, or nil when the whole
    /// picture was rewritten.
    func convert(_ frame: FrameInfo, into image: I420Image) -> [PixelRect]? {
        let bounds = PixelRect(x: 0, y: 0, width: image.width, height: image.height)
        let scaling = frame.width != image.width + (frame.width & 1) || frame.height != image.height + (frame.height & 1)
        let sourceDamage = frame.damage.map { PixelRect(x: Int($0.x), y: Int($0.y), width: Int($0.width), height: Int($0.height)) }
        let packed = frame.raw.plane_count == 1

        if !scaling {
            // Same size (an odd last column/row is cropped): convert rectangles in place.
            let rects = sourceDamage.isEmpty ? [bounds] : sourceDamage.map { $0.evenAligned(within: bounds) }.filter { !$0.isEmpty }
            for rect in rects { convertUnscaled(frame, rect, into: image) }
            return sourceDamage.isEmpty ? nil : rects
        }
        let sx = Double(image.width) / Double(frame.width), sy = Double(image.height) / Double(frame.height)
        // Each damaged rectangle mapped to output pixels, grown by 2 for the filter's reach.
        let rects = sourceDamage.isEmpty ? [bounds] : sourceDamage.map { r -> PixelRect in
            let x0 = Int((Double(r.x) * sx).rounded(.down)) - 2, y0 = Int((Double(r.y) * sy).rounded(.down)) - 2
            let x1 = Int((Double(r.maxX) * sx).rounded(.up)) + 2, y1 = Int((Double(r.maxY) * sy).rounded(.up)) + 2
            return PixelRect(x: x0, y: y0, width: x1 - x0, height: y1 - y0).evenAligned(within: bounds)
        }.filter { !$0.isEmpty }
        if packed {
            let stride = image.width * 4
            if scaledPackedSize != stride * image.height {
                scaledPacked?.deallocate()
                scaledPackedSize = stride * image.height
                scaledPacked = .allocate(capacity: scaledPackedSize)
            }
            let scaled = scaledPacked!
            for r in rects {
                // libyuv's clipped scaling can differ by a step at the clip's own
                // edges (seen: the first row), so scale 2 px more than is converted.
                let clip = PixelRect(x: r.x - 2, y: r.y - 2, width: r.width + 4, height: r.height + 4).intersection(bounds)
                ARGBScaleClip(frame.planes[0], Int32(frame.strides[0]), Int32(frame.width), Int32(frame.height),
                              scaled, Int32(stride), Int32(image.width), Int32(image.height),
                              Int32(clip.x), Int32(clip.y), Int32(clip.width), Int32(clip.height), kFilterBilinear)
                packedToI420(format: frame.format, source: scaled + r.y * stride + r.x * 4, stride: stride, rect: r, into: image)
            }
            return sourceDamage.isEmpty ? nil : rects
        }
        // Planar and scaled (an X11 screen or a Y4M larger than the maximum, NV12 from a GPU path): libyuv
        // has no clipped I420 scale, so the whole frame is scaled, every frame: 3840x2160 into 1920x1080
        // costs the capture thread ~2-4 ms a frame (X11 typing at 4K: 91-134 ticks in 10 s, against
        // 18-24 for BGRx frames through ARGBScaleClip). The output outside the mapped damage is what the
        // previous frame's scale gave (the same source pixels under the filter), so only the mapped
        // damage is reported as changed: reporting the whole picture made the encoder code all of it
        // every frame (its thread 533 ticks in 10 s, against 215).
        let source: (y: UnsafePointer<UInt8>, u: UnsafePointer<UInt8>, v: UnsafePointer<UInt8>, sy: Int, su: Int, sv: Int)
        if frame.format == KRAKL_FORMAT_I420.rawValue {
            source = (frame.planes[0]!, frame.planes[1]!, frame.planes[2]!, frame.strides[0], frame.strides[1], frame.strides[2])
        } else {
            if planarScratch?.width != frame.width || planarScratch?.height != frame.height {
                planarScratch = I420Image(width: frame.width, height: frame.height)
            }
            let scratch = planarScratch!
            NV12ToI420(frame.planes[0], Int32(frame.strides[0]), frame.planes[1], Int32(frame.strides[1]),
                       scratch.y, Int32(scratch.strideY), scratch.u, Int32(scratch.strideUV), scratch.v, Int32(scratch.strideUV),
                       Int32(frame.width), Int32(frame.height))
            source = (UnsafePointer(scratch.y), UnsafePointer(scratch.u), UnsafePointer(scratch.v), scratch.strideY, scratch.strideUV, scratch.strideUV)
        }
        I420Scale(source.y, Int32(source.sy), source.u, Int32(source.su), source.v, Int32(source.sv),
                  Int32(frame.width), Int32(frame.height),
                  image.y, Int32(image.strideY), image.u, Int32(image.strideUV), image.v, Int32(image.strideUV),
                  Int32(image.width), Int32(image.height), kFilterBilinear)
        return sourceDamage.isEmpty ? nil : rects
    }

    /// One rectangle (even-aligned, inside the image) at equal sizes.
    private func convertUnscaled(_ frame: FrameInfo, _ r: PixelRect, into image: I420Image) {
        let planes = frame.planes, strides = frame.strides
        let dy = image.y + r.y * image.strideY + r.x
        let du = image.u + r.y / 2 * image.strideUV + r.x / 2
        let dv = image.v + r.y / 2 * image.strideUV + r.x / 2
        switch frame.format {
        case KRAKL_FORMAT_I420.rawValue:
            I420Copy(planes[0]! + r.y * strides[0] + r.x, Int32(strides[0]),
                     planes[1]! + r.y / 2 * strides[1] + r.x / 2, Int32(strides[1]),
                     planes[2]! + r.y / 2 * strides[2] + r.x / 2, Int32(strides[2]),
                     dy, Int32(image.strideY), du, Int32(image.strideUV), dv, Int32(image.strideUV), Int32(r.width), Int32(r.height))
        case KRAKL_FORMAT_NV12.rawValue:
            NV12ToI420(planes[0]! + r.y * strides[0] + r.x, Int32(strides[0]),
                       planes[1]! + r.y / 2 * strides[1] + r.x, Int32(strides[1]),
                       dy, Int32(image.strideY), du, Int32(image.strideUV), dv, Int32(image.strideUV), Int32(r.width), Int32(r.height))
        default:
            packedToI420(format: frame.format, source: planes[0]! + r.y * strides[0] + r.x * 4, stride: strides[0], rect: r, into: image)
        }
    }

    /// libyuv names packed formats by the 32-bit word: its "ARGB" is B,G,R,A
    /// in memory (our BGRx/BGRA) and "ABGR" is R,G,B,A (our RGBx/RGBA).
    private func packedToI420(format: UInt32, source: UnsafePointer<UInt8>, stride: Int, rect r: PixelRect, into image: I420Image) {
        let dy = image.y + r.y * image.strideY + r.x
        let du = image.u + r.y / 2 * image.strideUV + r.x / 2
        let dv = image.v + r.y / 2 * image.strideUV + r.x / 2
        if format == KRAKL_FORMAT_RGBX.rawValue || format == KRAKL_FORMAT_RGBA.rawValue {
            ABGRToI420(source, Int32(stride), dy, Int32(image.strideY), du, Int32(image.strideUV), dv, Int32(image.strideUV), Int32(r.width), Int32(r.height))
        } else {
            ARGBToI420(source, Int32(stride), dy, Int32(image.strideY), du, Int32(image.strideUV), dv, Int32(image.strideUV), Int32(r.width), Int32(r.height))
        }
    }
}
