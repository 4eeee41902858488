import CPipeWire
import CYuv
import KraklBackendABI

/// A camera's picture as I420, converted (libyuv) from what the camera
/// sends: YUY2 or UYVY (what most V4L2 webcams give raw), NV12, I420, or
/// packed RGB. Cameras have no damage: each picture is whole. One buffer,
/// reused while the size stays.
struct CameraPicture {
    private(set) var width = 0
    private(set) var height = 0
    private var storage: UnsafeMutablePointer<UInt8>?

    var chromaWidth: Int { (width + 1) / 2 }
    var chromaHeight: Int { (height + 1) / 2 }
    var planes: (y: UnsafeMutablePointer<UInt8>, u: UnsafeMutablePointer<UInt8>, v: UnsafeMutablePointer<UInt8>)? {
        guard let storage else { return nil }
        return (storage, storage + width * height, storage + width * height + chromaWidth * chromaHeight)
    }

    /// One plane of a camera buffer: where it starts, its stride, and the bytes readable from there.
    struct Plane {
        let pixels: UnsafePointer<UInt8>
        let stride: Int
        let size: Int
    }

    /// The formats this converts, with the planes each has and the smallest stride of the first.
    static func layout(_ format: UInt32, width: Int) -> (planes: Int, minimumStride: Int)? {
        switch format {
        case SPA_VIDEO_FORMAT_YUY2.rawValue, SPA_VIDEO_FORMAT_UYVY.rawValue: return (1, width * 2)
        case SPA_VIDEO_FORMAT_NV12.rawValue: return (2, width)
        case SPA_VIDEO_FORMAT_I420.rawValue: return (3, width)
        case SPA_VIDEO_FORMAT_BGRx.rawValue, SPA_VIDEO_FORMAT_RGBx.rawValue: return (1, width * 4)
        default: return nil
        }
    }

    /// The planes of a buffer holding `format`: one data per plane, or (what a single-block buffer
    /// holds) the planes one after another in the first, chroma strides following the luma stride.
    /// nil when the buffer is smaller than its format says.
    static func planes(of buffer: UnsafeMutablePointer<spa_buffer>, format: UInt32, width: Int, height: Int) -> [Plane]? {
        guard let layout = layout(format, width: width), let datas = buffer.pointee.datas else { return nil }
        let count = Int(buffer.pointee.n_datas)
        func plane(_ index: Int) -> (base: UnsafePointer<UInt8>, stride: Int, size: Int)? {
            let data = datas[index]
            guard let base = data.data, let chunk = data.chunk, chunk.pointee.size > 0 else { return nil }
            let offset = Int(chunk.pointee.offset) % max(Int(data.maxsize), 1)
            return (UnsafePointer(base.assumingMemoryBound(to: UInt8.self)) + offset, Int(chunk.pointee.stride), Int(data.maxsize) - offset)
        }
        let chromaHeight = (height + 1) / 2
        var result: [Plane] = []
        if count >= layout.planes {
            for index in 0..<layout.planes {
                guard let p = plane(index) else { return nil }
                let rows = index == 0 ? height : chromaHeight
                // A row's bytes: the luma's, NV12's interleaved UV (two per chroma pixel), I420's U or V.
                let rowBytes = index == 0 ? layout.minimumStride : (width + 1) / 2 * (format == SPA_VIDEO_FORMAT_NV12.rawValue ? 2 : 1)
                let stride = p.stride > 0 ? p.stride : rowBytes
                guard stride >= rowBytes, stride * (rows - 1) + rowBytes <= p.size else { return nil }
                result.append(Plane(pixels: p.base, stride: stride, size: p.size))
            }
            return result
        }
        guard count >= 1, let first = plane(0) else { return nil }
        let stride = first.stride > 0 ? first.stride : layout.minimumStride
        guard stride >= layout.minimumStride else { return nil }
        let lumaBytes = stride * height
        switch layout.planes {
        case 1:
            guard lumaBytes <= first.size else { return nil }
            return [Plane(pixels: first.base, stride: stride, size: first.size)]
        case 2:
            guard lumaBytes + stride * chromaHeight <= first.size else { return nil }
            return [Plane(pixels: first.base, stride: stride, size: lumaBytes),
                    Plane(pixels: first.base + lumaBytes, stride: stride, size: first.size - lumaBytes)]
        default:
            let chromaStride = (stride + 1) / 2, chromaBytes = chromaStride * chromaHeight
            guard lumaBytes + 2 * chromaBytes <= first.size else { return nil }
            return [Plane(pixels: first.base, stride: stride, size: lumaBytes),
                    Plane(pixels: first.base + lumaBytes, stride: chromaStride, size: chromaBytes),
                    Plane(pixels: first.base + lumaBytes + chromaBytes, stride: chromaStride, size: chromaBytes)]
        }
    }

    /// Converts one buffer's planes into the picture; false for a format it does not convert.
    mutating func convert(_ planes: [Plane], format: UInt32, width: Int, height: Int) -> Bool {
        if width != self.width || height != self.height || storage == nil {
            storage?.deallocate()
            self.width = width
            self.height = height
            storage = .allocate(capacity: width * height + 2 * chromaWidth * chromaHeight)
        }
        guard let (y, u, v) = self.planes else { return false }
        let w = Int32(width), h = Int32(height), sy = Int32(width), sc = Int32(chromaWidth)
        let p0 = planes[0].pixels, s0 = Int32(planes[0].stride)
        let status: Int32
        switch format {
        case SPA_VIDEO_FORMAT_YUY2.rawValue: status = YUY2ToI420(p0, s0, y, sy, u, sc, v, sc, w, h)
        case SPA_VIDEO_FORMAT_UYVY.rawValue: status = UYVYToI420(p0, s0, y, sy, u, sc, v, sc, w, h)
        case SPA_VIDEO_FORMAT_NV12.rawValue: status = NV12ToI420(p0, s0, planes[1].pixels, Int32(planes[1].stride), y, sy, u, sc, v, sc, w, h)
        case SPA_VIDEO_FORMAT_I420.rawValue:
            status = I420Copy(p0, s0, planes[1].pixels, Int32(planes[1].stride), planes[2].pixels, Int32(planes[2].stride), y, sy, u, sc, v, sc, w, h)
        // libyuv names packed RGB by its 32-bit word: memory B G R x is its ARGB, R G B x its ABGR.
        case SPA_VIDEO_FORMAT_BGRx.rawValue: status = ARGBToI420(p0, s0, y, sy, u, sc, v, sc, w, h)
        case SPA_VIDEO_FORMAT_RGBx.rawValue: status = ABGRToI420(p0, s0, y, sy, u, sc, v, sc, w, h)
        default: return false
        }
        return status == 0
    }

    /// The picture as a frame (I420, three planes); the pointers are valid until the next convert.
    func frame() -> krakl_frame? {
        guard let (y, u, v) = planes else { return nil }
        var frame = krakl_frame()
        frame.format = KRAKL_FORMAT_I420.rawValue
        frame.width = UInt32(width)
        frame.height = UInt32(height)
        frame.plane_count = 3
        frame.stride.0 = UInt32(width)
        frame.stride.1 = UInt32(chromaWidth)
        frame.stride.2 = UInt32(chromaWidth)
        frame.plane.0 = UnsafePointer(y)
        frame.plane.1 = UnsafePointer(u)
        frame.plane.2 = UnsafePointer(v)
        return frame
    }

    mutating func free() {
        storage?.deallocate()
        storage = nil
        width = 0
        height = 0
    }

    /// A format's name for people (spa_debug's names are not in the public API).
    static func name(_ format: UInt32) -> String {
        switch format {
        case SPA_VIDEO_FORMAT_YUY2.rawValue: return "YUY2"
        case SPA_VIDEO_FORMAT_UYVY.rawValue: return "UYVY"
        case SPA_VIDEO_FORMAT_NV12.rawValue: return "NV12"
        case SPA_VIDEO_FORMAT_I420.rawValue: return "I420"
        case SPA_VIDEO_FORMAT_BGRx.rawValue: return "BGRx"
        case SPA_VIDEO_FORMAT_RGBx.rawValue: return "RGBx"
        default: return "format \(format)"
        }
    }
}
