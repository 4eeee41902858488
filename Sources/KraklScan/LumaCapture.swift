import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
internal import CYuv

/// A frame consumer for scanning: it keeps one luma (Y800) picture of the
/// source, updated from each frame's damaged rectangles only (libyuv's
/// ARGB/ABGR → J400 for packed frames, the Y plane as it is for I420/NV12),
/// and remembers where it changed since the last scan. Any backend feeds it
/// through the same host as the encoder; it never holds more than that one
/// picture. Frames arrive on the backend's thread; `scan` runs on another
/// and holds the picture's lock while zbar reads it.
public final class LumaCapture: FrameSink, Sendable {
    /// The picture and its change state: the backend's thread writes, the scan reads.
    private struct Picture {
        var pixels: [UInt8] = []
        var width = 0, height = 0
        /// Changed since the last scan, as a few boxes, each the changed area grown by `margin` and merged
        /// with the boxes it touches (nil: the whole picture).
        var dirty: [Box]? = []
        var changed = false
        var frames = 0
        var ended: String?
        /// The coarse picture (`Signature`) when it was last scanned: a whole-frame update that does not
        /// differ from it by more than noise is not a change.
        var scannedSignature: Signature?
        /// Looks still owed to an unchanged view since its last change (`looksAfterAChange`).
        var extraLooks = 0
        var described: String?
    }
    private let state = Guarded(Picture())
    struct Box: Equatable { var x0, y0, x1, y1: Int }
    /// A QR code's quiet zone and the part of it that did not change.
    static let margin = 64
    /// More boxes than this: a busy screen, scanned whole.
    static let maximumBoxes = 16
    private let logger: BackendLogger
    private let backend: String
    private let onChange: (@Sendable () -> Void)?
    private let gate: FrameGate
    /// After a change, this many more pictures of the then unchanged view are looked at: whether zbar
    /// reads a camera's code can hang on the picture's noise (of 30 frames of one still view, measured
    /// with Tests/Fixtures/camera_clip.sh rotated, the first was not read and the next were), and a
    /// view that stays still would otherwise get no second look. An unchanged view then costs nothing.
    public static let looksAfterAChange = 3

    /// - Parameter onChange: called on the backend's thread when the picture changes after a scan
    ///   (not for every frame): the scanner can sleep until there is something new to look at.
    public init(backend: String, logger: @escaping BackendLogger, onChange: (@Sendable () -> Void)? = nil) {
        self.backend = backend
        self.logger = logger
        self.onChange = onChange
        gate = FrameGate(backend: backend, logger: logger)
    }

    /// Frames received so far, and the picture's size.
    public var progress: (frames: Int, width: Int, height: Int) { state.withLock { ($0.frames, $0.width, $0.height) } }
    /// Why the source ended, once it did.
    public var sourceEnded: String? { state.withLock { $0.ended } }
    /// What the source said its pictures are, for people (its last FORMAT_CHANGED event's message:
    /// the camera's name, size and rate).
    public var sourceDescription: String? { state.withLock { $0.described } }

    public func frame(_ pointer: UnsafePointer<krakl_frame>) {
        guard let info = gate.admit(pointer) else { return }
        // onChange runs under the lock, as it always has (it only wakes the scanner).
        state.withLock { p in
            p.frames += 1
            var rects = info.damage
            if info.width != p.width || info.height != p.height || p.pixels.isEmpty {
                p.width = info.width
                p.height = info.height
                p.pixels = [UInt8](repeating: 0, count: p.width * p.height)
                rects = []
                p.extraLooks = Self.looksAfterAChange
            }
            let wholeUpdate = rects.isEmpty
            if rects.isEmpty { rects = [krakl_rect(x: 0, y: 0, width: Int32(p.width), height: Int32(p.height))] }
            for rect in rects { Self.convert(info, rect, into: &p) }
            // A frame without damage (every camera picture, a screen source without damage metadata)
            // may show the same as the last look: judged from the picture, so an unchanged view is not
            // scanned again (zbar over a 720p picture costs ~20 ms; this look costs ~0.05 ms).
            if wholeUpdate && !p.changed, let scanned = p.scannedSignature {
                if Signature(p.pixels, width: p.width, height: p.height).differs(from: scanned) {
                    p.extraLooks = Self.looksAfterAChange
                } else if p.extraLooks > 0 {
                    p.extraLooks -= 1
                } else {
                    return
                }
            }
            if rects.count == 1 && rects[0].width == Int32(p.width) && rects[0].height == Int32(p.height) {
                p.dirty = nil
            } else if var boxes = p.dirty {
                for rect in rects { Self.add(rect, to: &boxes, width: p.width, height: p.height) }
                p.dirty = boxes.count > Self.maximumBoxes ? nil : boxes
            }
            let first = !p.changed
            p.changed = true
            if first { onChange?() }
        }
    }

    public func event(_ event: SourceEvent) {
        switch event.kind {
        case .sourceEnded: state.withLock { $0.ended = event.message ?? "the backend gave no reason" }
        case .formatChanged: if let message = event.message { state.withLock { $0.described = message } }
        case .error: logger(backend, .error, "\(event.message ?? "unspecified error") (\(errnoName(event.error)))")
        default: break
        }
    }

    /// Luma of one damaged rectangle into the picture.
    private static func convert(_ frame: FrameInfo, _ rect: krakl_rect, into p: inout Picture) {
        let x = Int(rect.x), y = Int(rect.y), w = Int(rect.width), h = Int(rect.height)
        guard w > 0, h > 0 else { return }
        let planes = frame.planes, strides = frame.strides
        guard let source = planes[0] else { return }
        let width = p.width
        p.pixels.withUnsafeMutableBufferPointer { buffer in
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
    public var hasChanges: Bool { state.withLock { $0.changed } }

    /// Scans what changed since the last call: the changed regions first (each grown by a margin,
    /// so a code drawn in pieces is whole in one), and when they hold nothing, the whole picture.
    /// Returns the payloads found, and how many pixels zbar read.
    public func scan(with scanner: QRScanner) -> (payloads: [[UInt8]], pixels: Int) {
        state.withLock { p in
            guard p.changed, p.width > 0 else { return ([], 0) }
            p.changed = false
            p.scannedSignature = Signature(p.pixels, width: p.width, height: p.height)
            let regions = (p.dirty ?? []).map { (x: $0.x0, y: $0.y0, width: $0.x1 - $0.x0, height: $0.y1 - $0.y0) }
            p.dirty = []
            var pixels = 0
            let width = p.width, height = p.height, wholeArea = width * height
            for region in regions where region.width * region.height < wholeArea / 2 {
                var crop = [UInt8](repeating: 0, count: region.width * region.height)
                p.pixels.withUnsafeBufferPointer { source in
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
            let found = p.pixels.withUnsafeBufferPointer { scanner.scan(gray: $0, width: width, height: height) }
            return (found, pixels)
        }
    }

    /// A coarse picture: the mean luma of each 32x32 cell, from every 4th pixel of every 4th row
    /// (1/16 of the pixels: ~58k reads at 720p). Two pictures of one unchanged view differ by
    /// sensor noise, which averaging 64 samples makes well under one level; a QR code coming into
    /// view, or the view moving, changes the cells it covers by tens of levels.
    struct Signature {
        static let cell = 32, step = 4
        /// A cell whose mean moved by this much (levels of 255) is a change.
        static let threshold: Int32 = 4
        private var means: [Int32] = []

        init(_ picture: [UInt8], width: Int, height: Int) {
            let columns = (width + Self.cell - 1) / Self.cell, rows = (height + Self.cell - 1) / Self.cell
            var sums = [Int32](repeating: 0, count: columns * rows), counts = [Int32](repeating: 0, count: columns * rows)
            picture.withUnsafeBufferPointer { pixels in
                for y in stride(from: 0, to: height, by: Self.step) {
                    let row = (y / Self.cell) * columns, line = pixels.baseAddress! + y * width
                    for x in stride(from: 0, to: width, by: Self.step) {
                        sums[row + x / Self.cell] += Int32(line[x])
                        counts[row + x / Self.cell] += 1
                    }
                }
            }
            means = zip(sums, counts).map { $1 > 0 ? $0 * 16 / $1 : 0 }
        }

        func differs(from other: Signature) -> Bool {
            guard means.count == other.means.count else { return true }
            return zip(means, other.means).contains { abs($0 - $1) >= Self.threshold * 16 }
        }
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
