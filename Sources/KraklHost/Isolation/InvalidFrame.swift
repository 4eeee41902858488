import KraklBase
import KraklBackendABI

/// A frame whose pixels cannot be copied (unknown format, impossible size, NULL plane, short
/// stride, struct too small), as the child saw it: its header fields. The agent rebuilds the
/// header with every plane pointer NULL (so no gate can take it) and gives it to the sink, whose
/// frame gate rejects and counts it as in the agent's process (a short stride is then reported
/// as a NULL plane).
public struct InvalidFrame: Sendable {
    public var structSize: UInt32
    public var format: UInt32
    public var width: UInt32
    public var height: UInt32
    public var planeCount: UInt32
    public var strides: [UInt32]
    public var planePresent: [Bool]
    public var timestamp: UInt64
    public var sequence: UInt64
    public var damageCount: UInt32
    public var damagePresent: Bool
    /// The damage rectangle the check found wrong (at most one is sent).
    public var damage: [krakl_rect]

    public init(_ pointer: UnsafePointer<krakl_frame>) {
        let info = FrameInfo(pointer)
        structSize = pointer.pointee.struct_size
        format = info.raw.format
        width = info.raw.width
        height = info.raw.height
        planeCount = info.raw.plane_count
        strides = info.strides.map { UInt32($0) }
        planePresent = info.planes.map { $0 != nil }
        timestamp = info.raw.timestamp_ns
        sequence = info.raw.sequence
        damageCount = info.raw.damage_count
        damagePresent = info.raw.damage != nil
        damage = []
    }

    public var encoded: WireWriter {
        var w = WireWriter(.invalidFrame)
        w.u32(structSize)
        w.shape(WireFrameShape(format: format, width: width, height: height, planeCount: planeCount, strides: strides))
        planePresent.forEach { w.u32($0 ? 1 : 0) }
        w.u64(timestamp)
        w.u64(sequence)
        w.u32(damageCount)
        w.u32(damagePresent ? 1 : 0)
        w.u32(UInt32(damage.count))
        damage.forEach { w.rect($0) }
        return w
    }

    public init(reading r: inout WireReader) throws(WireError) {
        structSize = try r.u32()
        let shape = try r.shape()
        (format, width, height, planeCount, strides) = (shape.format, shape.width, shape.height, shape.planeCount, shape.strides)
        planePresent = []
        for _ in 0..<Int(KRAKL_MAX_PLANES) { planePresent.append(try r.u32() != 0) }
        timestamp = try r.u64()
        sequence = try r.u64()
        damageCount = try r.u32()
        damagePresent = try r.u32() != 0
        let count = try r.u32()
        guard count <= 1 else { throw WireError("\(count) rectangles in an invalid-frame message") }
        damage = []
        for _ in 0..<count { damage.append(try r.rect()) }
        try r.finish()
    }
}
