import Foundation
import KraklBackendABI
import KraklCore
internal import CYuv

/// A frame consumer for scanning: it keeps one luma (Y800) picture of the
/// source, updated from each frame's damaged rectangles only (libyuv's
/// ARGB/ABGR → J400 for packed frames, the Y plane as it is for I420/NV12),
/// and remembers where it changed since the last scan. Any backend feeds it
/// through the same host as the encoder; it never holds more than that one
/// picture. Frames arrive on the backend's thread; `scan` runs on another
/// and holds the picture's lock while zbar reads it.
public final class LumaCapture: FrameSink, @unchecked Sendable {
    private let lock = NSLock()
    private var picture: [UInt8] = []
    private var width = 0, height = 0
    /// Changed since the last scan, as a few boxes, each the changed area grown by `margin` and merged
    /// with the boxes it touches (nil: the whole picture).
    private var dirty: [Box]? = []
    struct Box: Equatable { var x0, y0, x1, y1: Int }
    /// A QR code's quiet zone and the part of it that did not change.
    static let margin = 64
    /// More boxes than this: a busy screen, scanned whole.
    static let maximumBoxes = 16
    private var changed = false
    private var frames = 0
    private var ended: String?
    private let logger: BackendLogger
    private let backend: String
    private let onChange: (@Sendable () -> Void)?
    private let gate: FrameGate

    /// - Parameter onChange: called on the backend's thread when the picture changes after a scan
    ///   (not for every frame): the scanner can sleep until there is something new to look at.
    public init(backend: String, logger: @escaping BackendLogger, onChange: (@Sendable () -> Void)? = nil) {
        self.backend = backend
        self.logger = logger
        self.onChange = onChange
        gate = FrameGate(backend: backend, logger: logger)
    }

    /// Frames received so far, and the picture's size.
    public var progress: (frames: Int, width: Int, height: Int) { lock.withLock { (frames, width, height) } }
    /// Why the source ended, once it did.
    public var sourceEnded: String? { lock.withLock { ended } }

    public func frame(_ pointer: UnsafePointer<krakl_frame>) {
        guard let info = gate.admit(pointer) else { return }
        lock.lock()
        defer { lock.unlock() }
        frames += 1
        var rects = info.damage
        if info.width != width || info.height != height || picture.isEmpty {
            width = info.width
            height = info.height
            picture = [UInt8](repeating: 0, count: width * height)
            rects = []
        }
        if rects.isEmpty { rects = [krakl_rect(x: 0, y: 0, width: Int32(width), height: Int32(height))] }
        for rect in rects { convert(info, rect) }
        if rects.count == 1 && rects[0].width == Int32(width) && rects[0].height == Int32(height) {
            dirty = nil
        } else if var boxes = dirty {
            for rect in rects { Self.add(rect, to: &boxes, width: width, height: height) }
            dirty = boxes.count > Self.maximumBoxes ? nil : boxes
        }
        let first = !changed
        changed = true
        if first { onChange?() }
    }

    public func event(_ event: SourceEvent) {
        switch event.kind {
        case .sourceEnded: lock.withLock { ended = event.message ?? "the backend gave no reason" }
        case .error: logger(backend, .error, "\(event.message ?? "unspecified error") (\(errnoName(event.error)))")
        default: break
        }
    }

    /// Luma of one damaged rectangle into the picture.
    private func convert(_ frame: FrameInfo, _ rect: krakl_rect) {
        let x = Int(rect.x), y = Int(rect.y), w = Int(rect.width), h = Int(rect.height)
        guard w > 0, h > 0 else { return }
        let planes = frame.planes, strides = frame.strides
        guard let source = planes[0] else { return }
        picture.withUnsafeMutableBufferPointer { buffer in
            let destination = buffer.baseAddress! + y * width + x
            switch frame.format {
            case KRAKL_FORMAT_I420.rawValue, KRAKL_FORMAT_NV12.rawValue:
                CopyPlane(source + y * strides[0] + x, Int32(strides[0]), destination, Int32(width), Int32(w), Int32(h))
            case KRAKL_FORMAT_RGBX.rawValue, KRAKL_FORMAT_RGBA.rawValue:
                ABGRToJ400(source + y * strides[0] + x * 4, Int32(strides[0]), destination, Int32(width), Int32(w), Int32(h))
            default:
                ARGBToJ400(source + y * strides[0] + x * 4, Int32(strides[0]), destination, Int32(width), Int32(w), Int32(h))
            }
        }
    }

    /// Whether the picture changed since the last `scan`.
    public var hasChanges: Bool { lock.withLock { changed } }

    /// Scans what changed since the last call: the changed regions first (each grown by a margin,
    /// so a code drawn in pieces is whole in one), and when they hold nothing, the whole picture.
    /// Returns the payloads found, and how many pixels zbar read.
    public func scan(with scanner: QRScanner) -> (payloads: [[UInt8]], pixels: Int) {
        lock.lock()
        defer { lock.unlock() }
        guard changed, width > 0 else { return ([], 0) }
        changed = false
        let regions = (dirty ?? []).map { (x: $0.x0, y: $0.y0, width: $0.x1 - $0.x0, height: $0.y1 - $0.y0) }
        dirty = []
        var pixels = 0
        let wholeArea = width * height
        for region in regions where region.width * region.height < wholeArea / 2 {
            var crop = [UInt8](repeating: 0, count: region.width * region.height)
            picture.withUnsafeBufferPointer { source in
                crop.withUnsafeMutableBufferPointer { destination in
                    for row in 0..<region.height {
                        let from = source.baseAddress! + (region.y + row) * width + region.x
                        (destination.baseAddress! + row * region.width).update(from: from, count: region.width)
                    }
                }
            }
            pixels += crop.count
            let found = crop.withUnsafeBufferPointer { scanner.scan(gray: $0, width: region.width, height: region.height) }
            if !found.isEmpty { return (found, pixels) }
        }
        pixels += wholeArea
        let found = picture.withUnsafeBufferPointer { scanner.scan(gray: $0, width: width, height: height) }
        return (found, pixels)
    }

    /// Grows `rect` by the margin (clipped to the picture) and merges it into `boxes`: a box it
    /// touches absorbs it, and the grown box then absorbs the others it touches, so a code drawn in
    /// many tiles becomes one box. Each merge removes a box, so this ends.
    static func add(_ rect: krakl_rect, to boxes: inout [Box], width: Int, height: Int) {
        var box = Box(x0: max(0, Int(rect.x) - margin), y0: max(0, Int(rect.y) - margin),
                      x1: min(width, Int(rect.x) + Int(rect.width) + margin), y1: min(height, Int(rect.y) + Int(rect.height) + margin))
        guard box.x1 > box.x0, box.y1 > box.y0 else { return }
        var merged = true
        while merged {
            merged = false
            if let i = boxes.firstIndex(where: { $0.x0 < box.x1 && box.x0 < $0.x1 && $0.y0 < box.y1 && box.y0 < $0.y1 }) {
                let other = boxes.remove(at: i)
                box = Box(x0: min(box.x0, other.x0), y0: min(box.y0, other.y0), x1: max(box.x1, other.x1), y1: max(box.y1, other.y1))
                merged = true
            }
        }
        boxes.append(box)
    }
}
