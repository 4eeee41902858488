import Foundation
import KraklBackendABI
@testable import KraklBase
@testable import KraklHost

/// A frame copied out of a backend callback: tightly packed planes and
/// damage, so tests can diff pixels after the callback returned.
struct CapturedFrame {
    let format: UInt32
    let width: Int
    let height: Int
    let planes: [[UInt8]]
    let damage: [krakl_rect]
    let timestamp: UInt64
    let sequence: UInt64

    /// Row bytes and rows per plane, per the ABI's formats.
    var geometry: [(rowBytes: Int, rows: Int)] { FrameCheck.planeGeometry(format: format, width: width, height: height)! }
}

/// Collects every frame and event from a real backend loaded through the
/// agent's own loader and host.
final class FrameCollector: FrameSink, @unchecked Sendable {
    private let condition = Condition()
    private(set) var frames: [CapturedFrame] = []
    private(set) var ended = false
    private(set) var events: [SourceEvent] = []

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let info = FrameInfo(pointer)
        let geometry = FrameCheck.planeGeometry(format: info.format, width: info.width, height: info.height)!
        var planes: [[UInt8]] = []
        for (index, plane) in geometry.enumerated() {
            var bytes = [UInt8](repeating: 0, count: plane.rowBytes * plane.rows)
            for row in 0..<plane.rows {
                let source = info.planes[index]! + row * info.strides[index]
                bytes.withUnsafeMutableBufferPointer { _ = memcpy($0.baseAddress! + row * plane.rowBytes, source, plane.rowBytes) }
            }
            planes.append(bytes)
        }
        let copy = CapturedFrame(format: info.format, width: info.width, height: info.height, planes: planes,
                                 damage: info.damage, timestamp: info.raw.timestamp_ns, sequence: info.raw.sequence)
        condition.lock()
        frames.append(copy)
        condition.broadcast()
        condition.unlock()
    }

    func event(_ event: SourceEvent) {
        condition.lock()
        events.append(event)
        if event.kind == .sourceEnded { ended = true }
        condition.broadcast()
        condition.unlock()
    }

    /// Waits (bounded) for the source to end by itself.
    func waitForEnd(timeout: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return condition.wait(while: { !ended }, until: Date().addingTimeInterval(timeout))
    }

    /// Waits (bounded) until at least `count` frames arrived.
    @discardableResult
    func waitForFrames(_ count: Int, timeout: Double) -> Bool {
        waitUntil(timeout: timeout) { $0.count >= count }
    }

    /// Waits (bounded) until the frames so far satisfy `done`.
    @discardableResult
    func waitUntil(timeout: Double, _ done: ([CapturedFrame]) -> Bool) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return condition.wait(while: { !done(frames) }, until: Date().addingTimeInterval(timeout))
    }

    var frameCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return frames.count
    }

    /// Starts a backend library with `options`; the caller stops it.
    static func start(library path: String, options: [String: JSON]) throws -> (FrameCollector, BackendSource) {
        let collector = FrameCollector()
        let library = try BackendLibrary.load(path: path, backend: "test")
        var object = JSONObject()
        for key in options.keys.sorted() { object[key] = options[key] }
        let source = try BackendSource(library: library, backendName: "test", options: object, sink: collector, logger: { _, _, _ in })
        try source.start()
        return (collector, source)
    }

    /// Runs a backend library with `options` until it ends by itself.
    static func collect(library path: String, options: [String: JSON], timeout: Double = 60) throws -> FrameCollector {
        let (collector, source) = try start(library: path, options: options)
        let ended = collector.waitForEnd(timeout: timeout)
        try source.stop()
        try source.destroy()
        if !ended { throw CollectorTimeout() }
        return collector
    }

    struct CollectorTimeout: Error {}
}

/// Where two frames differ, mapped to luma/pixel coordinates.
struct FrameDiff {
    let width: Int
    let height: Int
    private(set) var changed: [Bool]

    init(_ a: CapturedFrame, _ b: CapturedFrame) {
        width = b.width
        height = b.height
        changed = Array(repeating: false, count: width * height)
        let geometry = b.geometry
        for (index, plane) in geometry.enumerated() {
            // How many pixels one byte of this plane stands for.
            let bytesPerPixel = index == 0 ? plane.rowBytes / width : (b.format == KRAKL_FORMAT_NV12.rawValue ? 2 : 1)
            let scale = index == 0 ? 1 : 2
            for row in 0..<plane.rows {
                let offset = row * plane.rowBytes
                let same = a.planes[index].withUnsafeBytes { pa in b.planes[index].withUnsafeBytes { pb in
                    memcmp(pa.baseAddress! + offset, pb.baseAddress! + offset, plane.rowBytes) == 0 } }
                if same { continue }
                for byte in 0..<plane.rowBytes where a.planes[index][row * plane.rowBytes + byte] != b.planes[index][row * plane.rowBytes + byte] {
                    let x = byte / bytesPerPixel * scale, y = row * scale
                    for dy in 0..<scale where y + dy < height {
                        for dx in 0..<scale where x + dx < width { changed[(y + dy) * width + x + dx] = true }
                    }
                }
            }
        }
    }

    var changedCount: Int { changed.filter { $0 }.count }

    func anyChanged(in r: krakl_rect) -> Bool {
        for y in Int(r.y)..<Int(r.y + r.height) {
            for x in Int(r.x)..<Int(r.x + r.width) where changed[y * width + x] { return true }
        }
        return false
    }

    /// The first changed pixel not covered by any rectangle, or nil.
    func uncovered(by rects: [krakl_rect]) -> (x: Int, y: Int)? {
        for y in 0..<height {
            for x in 0..<width where changed[y * width + x] {
                if !rects.contains(where: { x >= $0.x && x < $0.x + $0.width && y >= $0.y && y < $0.y + $0.height }) { return (x, y) }
            }
        }
        return nil
    }
}
