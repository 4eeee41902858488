import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// A frame copied out of its borrowed C struct by the size rule, with its
/// format's plane geometry worked out.
public struct FrameInfo {
    public let raw: krakl_frame
    public var width: Int { Int(raw.width) }
    public var height: Int { Int(raw.height) }
    public var format: UInt32 { raw.format }

    public init(_ pointer: UnsafePointer<krakl_frame>) {
        raw = copyBySizeRule(pointer, declaredSize: Int(pointer.pointee.struct_size), as: krakl_frame.self)
    }

    /// The damage rectangles; none when the count is over KRAKL_MAX_DAMAGE_RECTS (such a frame is
    /// refused, and its array may hold far fewer: reading up to the limit from a count of 2^32 − 1
    /// over 4 rectangles crashed the isolated child, and conformance counted them the same way).
    public var damage: [krakl_rect] {
        guard raw.damage_count > 0, raw.damage_count <= FrameCheck.maximumDamageRects, let rects = raw.damage else { return [] }
        return Array(UnsafeBufferPointer(start: rects, count: Int(raw.damage_count)))
    }

    public var strides: [Int] { withUnsafeBytes(of: raw.stride) { Array($0.bindMemory(to: UInt32.self)).map(Int.init) } }
    public var planes: [UnsafePointer<UInt8>?] { withUnsafeBytes(of: raw.plane) { Array($0.bindMemory(to: UnsafePointer<UInt8>?.self)) } }

    /// Share of the frame the damage covers (1 when it names no rectangle;
    /// overlapping rectangles are counted once per rectangle, capped at 1).
    public var damageShare: Double {
        let rects = damage
        guard !rects.isEmpty, width > 0, height > 0 else { return 1 }
        let area = rects.reduce(0.0) { $0 + Double(max(0, $1.width)) * Double(max(0, $1.height)) }
        return min(1, area / (Double(width) * Double(height)))
    }
}

/// What every frame from any backend must satisfy before the host uses
/// it. The agent drops (and reports) a frame that fails; conformance fails.
public enum FrameCheck {
    public static let minimumFrameSize = MemoryLayout<krakl_frame>.offset(of: \krakl_frame.cursor)! + MemoryLayout<UnsafeRawPointer>.size
    // The header's numbers (krakl_backend.h, "Host limits"), so the two cannot drift apart.
    public static let maximumDamageRects = UInt32(KRAKL_MAX_DAMAGE_RECTS)
    public static let maximumSide = Int(KRAKL_MAX_FRAME_SIDE)
    public static let maximumStride = Int(KRAKL_MAX_STRIDE)

    /// Bytes per row and rows of each plane, or nil for an unknown format.
    public static func planeGeometry(format: UInt32, width: Int, height: Int) -> [(rowBytes: Int, rows: Int)]? {
        let cw = (width + 1) / 2, ch = (height + 1) / 2
        switch format {
        case KRAKL_FORMAT_BGRX.rawValue, KRAKL_FORMAT_RGBX.rawValue, KRAKL_FORMAT_BGRA.rawValue, KRAKL_FORMAT_RGBA.rawValue:
            return [(width * 4, height)]
        case KRAKL_FORMAT_I420.rawValue: return [(width, height), (cw, ch), (cw, ch)]
        case KRAKL_FORMAT_NV12.rawValue: return [(width, height), (cw * 2, ch)]
        default: return nil
        }
    }

    public static func formatName(_ format: UInt32) -> String {
        ["invalid", "BGRx", "RGBx", "BGRA", "RGBA", "I420", "NV12"][Int(format < 7 ? format : 0)]
    }

    /// The first problem with the frame's geometry, or nil when it is sound.
    public static func geometryProblem(_ pointer: UnsafePointer<krakl_frame>) -> String? {
        let size = Int(pointer.pointee.struct_size)
        guard size >= minimumFrameSize else { return "frame struct_size is \(size), ABI 1.0 needs at least \(minimumFrameSize)" }
        let frame = FrameInfo(pointer)
        guard (1...maximumSide).contains(frame.width), (1...maximumSide).contains(frame.height) else {
            return "frame size \(frame.width)x\(frame.height) is outside 1...\(maximumSide)"
        }
        guard let geometry = planeGeometry(format: frame.format, width: frame.width, height: frame.height) else {
            return "unknown pixel format \(frame.format)"
        }
        guard Int(frame.raw.plane_count) == geometry.count else {
            return "\(formatName(frame.format)) has \(geometry.count) planes, the frame says plane_count=\(frame.raw.plane_count)"
        }
        let strides = frame.strides, planes = frame.planes
        for (index, plane) in geometry.enumerated() {
            // Strides before the pointer: an isolated backend's unusable frame reaches this check
            // with its strides but without pixels (NULL planes), and must get the same reason.
            guard strides[index] >= plane.rowBytes else {
                return "plane \(index) stride \(strides[index]) is less than width x bytes per pixel (\(plane.rowBytes))"
            }
            // Above it, libyuv's 32-bit strides would trap (measured: a stride of 2^32 − 1 ended the agent with SIGILL).
            guard strides[index] <= maximumStride else {
                return "plane \(index) stride \(strides[index]) exceeds KRAKL_MAX_STRIDE (\(maximumStride))"
            }
            guard planes[index] != nil else { return "plane \(index) pointer is NULL" }
        }
        guard frame.raw.timestamp_ns > 0 else { return "timestamp_ns is 0" }
        return nil
    }

    /// The first damage rectangle outside the frame (or malformed), or nil.
    public static func damageProblem(_ frame: FrameInfo) -> String? {
        if frame.raw.damage_count > maximumDamageRects { return "damage_count \(frame.raw.damage_count) exceeds \(maximumDamageRects)" }
        if frame.raw.damage_count > 0 && frame.raw.damage == nil { return "damage_count is \(frame.raw.damage_count) but damage is NULL" }
        for r in frame.damage {
            if r.x < 0 || r.y < 0 || r.width <= 0 || r.height <= 0
                || Int(r.x) + Int(r.width) > frame.width || Int(r.y) + Int(r.height) > frame.height {
                return "damage rectangle (\(r.x),\(r.y) \(r.width)x\(r.height)) is empty or outside the \(frame.width)x\(frame.height) frame"
            }
        }
        return nil
    }

    /// Reads every byte the frame says it has, so a bad pointer or stride
    /// faults here, in the backend's own call, rather than in the encoder.
    @discardableResult
    public static func touchPixels(_ frame: FrameInfo) -> UInt64 {
        guard let geometry = planeGeometry(format: frame.format, width: frame.width, height: frame.height) else { return 0 }
        var sum: UInt64 = 0
        let strides = frame.strides, planes = frame.planes
        for (index, plane) in geometry.enumerated() {
            guard let base = planes[index] else { continue }
            for row in 0..<plane.rows {
                let line = base + row * strides[index]
                for i in Swift.stride(from: 0, to: plane.rowBytes, by: 64) { sum &+= UInt64(line[i]) }
                sum &+= UInt64(line[plane.rowBytes - 1])
            }
        }
        return sum
    }
}

/// The host's gate for a backend's frames (the capture run, the sharing session, the scanner): a
/// frame with impossible geometry or damage outside it is dropped, and the first one is logged,
/// once, naming the backend, so a misbehaving backend is visible without flooding the log.
/// Called on the backend's capture thread.
public final class FrameGate: Sendable {
    private let backend: String
    private let logger: BackendLogger
    private let reported = Guarded(false)

    public init(backend: String, logger: @escaping BackendLogger) {
        self.backend = backend
        self.logger = logger
    }

    /// The frame's copied header when it may be used; nil (after the one log line) when it may not.
    public func admit(_ pointer: UnsafePointer<krakl_frame>) -> FrameInfo? {
        let geometry = FrameCheck.geometryProblem(pointer)
        let info = FrameInfo(pointer)
        guard let problem = geometry ?? FrameCheck.damageProblem(info) else { return info }
        let first = reported.withLock { reported -> Bool in defer { reported = true }; return !reported }
        if first { logger(backend, .error, "dropped an invalid frame (the backend is misbehaving): \(problem)") }
        return nil
    }
}
