import KraklBase
import KraklBackendABI

/// Where each plane and the cursor image of a frame sit in one slot of the ring: planes with
/// their rows tightly packed (rounded to 64 bytes), then room for one cursor image.
public struct SlotLayout: Equatable, Sendable {
    public let format: UInt32
    public let width: Int
    public let height: Int
    public let planeOffsets: [Int]
    public let strides: [Int]
    public let cursorOffset: Int
    /// Bytes of one slot, a whole number of pages.
    public let slotSize: Int

    public init?(format: UInt32, width: Int, height: Int) {
        guard (1...FrameCheck.maximumSide).contains(width), (1...FrameCheck.maximumSide).contains(height),
              let geometry = FrameCheck.planeGeometry(format: format, width: width, height: height) else { return nil }
        self.format = format
        self.width = width
        self.height = height
        var offset = 0
        var offsets: [Int] = [], strides: [Int] = []
        for plane in geometry {
            let stride = (plane.rowBytes + 63) & ~63
            offsets.append(offset)
            strides.append(stride)
            offset += (stride * plane.rows + 63) & ~63
        }
        planeOffsets = offsets
        self.strides = strides
        cursorOffset = offset
        slotSize = (offset + WireLimits.cursorBytes + 4095) & ~4095
    }
}

/// "Frame ready in slot k": everything of a krakl_frame but its pixels, which are in the slot.
public struct FrameMessage: Sendable {
    public struct Cursor: Equatable, Sendable {
        public var visible: UInt32
        public var x: Int32, y: Int32, hotspotX: Int32, hotspotY: Int32
        public var width: UInt32, height: UInt32, stride: UInt32
        public var serial: UInt64
        /// Offset of the image in the slot; nil when the frame carries no image.
        public var pixelsOffset: UInt64?
        public init(visible: UInt32, x: Int32, y: Int32, hotspotX: Int32, hotspotY: Int32, width: UInt32, height: UInt32,
                    stride: UInt32, serial: UInt64, pixelsOffset: UInt64?) {
            self.visible = visible; self.x = x; self.y = y; self.hotspotX = hotspotX; self.hotspotY = hotspotY
            self.width = width; self.height = height; self.stride = stride; self.serial = serial; self.pixelsOffset = pixelsOffset
        }
    }

    public var generation: UInt32
    public var slot: UInt32
    public var format: UInt32
    public var width: UInt32
    public var height: UInt32
    public var planeCount: UInt32
    public var strides: [UInt32]
    public var offsets: [UInt64]
    public var timestamp: UInt64
    public var sequence: UInt64
    /// Frames the child dropped since the previous message (the ring was full); their damage is in this one's.
    public var dropped: UInt32
    /// Empty: the whole frame may have changed.
    public var damage: [krakl_rect]
    /// The backend's damage was wrong (outside the frame, NULL with a count): `damage` is what it
    /// gave, unchecked, for the sink's frame gate to judge as in the agent's process; with
    /// `damageNull`, the rectangles are not passed (the backend gave a NULL pointer, or a count over
    /// KRAKL_MAX_DAMAGE_RECTS) and `damageNullCount` is the count it gave.
    public var damageUnchecked = false
    public var damageNull = false
    public var damageNullCount: UInt32 = 0
    public var cursor: Cursor?

    public init(generation: UInt32, slot: UInt32, layout: SlotLayout, timestamp: UInt64, sequence: UInt64,
                dropped: UInt32, damage: [krakl_rect], cursor: Cursor?) {
        self.generation = generation
        self.slot = slot
        format = layout.format
        width = UInt32(layout.width)
        height = UInt32(layout.height)
        planeCount = UInt32(layout.strides.count)
        strides = layout.strides.map { UInt32($0) } + Array(repeating: 0, count: Int(KRAKL_MAX_PLANES) - layout.strides.count)
        offsets = layout.planeOffsets.map { UInt64($0) } + Array(repeating: 0, count: Int(KRAKL_MAX_PLANES) - layout.strides.count)
        self.timestamp = timestamp
        self.sequence = sequence
        self.dropped = dropped
        self.damage = damage
        self.cursor = cursor
    }

    public var encoded: WireWriter {
        var w = WireWriter(.frame)
        w.u32(generation)
        w.u32(slot)
        w.shape(WireFrameShape(format: format, width: width, height: height, planeCount: planeCount, strides: strides))
        offsets.forEach { w.u64($0) }
        w.u64(timestamp)
        w.u64(sequence)
        w.u32(dropped)
        w.u32((damageUnchecked ? 1 : 0) | (damageNull ? 2 : 0))
        w.u32(damageNullCount)
        w.u32(UInt32(damage.count))
        damage.forEach { w.rect($0) }
        if let c = cursor {
            w.u32(1)
            w.u32(c.visible)
            [c.x, c.y, c.hotspotX, c.hotspotY].forEach { w.i32($0) }
            [c.width, c.height, c.stride].forEach { w.u32($0) }
            w.u64(c.serial)
            w.u64(c.pixelsOffset ?? .max)
        } else {
            w.u32(0)
        }
        return w
    }

    /// Reads a frame message; counts are bounded here, offsets against the mapping by the caller.
    public init(reading r: inout WireReader) throws(WireError) {
        generation = try r.u32()
        slot = try r.u32()
        let shape = try r.shape()
        (format, width, height, planeCount, strides) = (shape.format, shape.width, shape.height, shape.planeCount, shape.strides)
        offsets = []
        for _ in 0..<Int(KRAKL_MAX_PLANES) { offsets.append(try r.u64()) }
        timestamp = try r.u64()
        sequence = try r.u64()
        dropped = try r.u32()
        let flags = try r.u32()
        guard flags <= 3 else { throw WireError("damage flags \(flags) in a frame message") }
        damageUnchecked = flags & 1 != 0
        damageNull = flags & 2 != 0
        damageNullCount = try r.u32()
        let count = Int(try r.u32())
        guard count <= WireLimits.maximumRects else { throw WireError("\(count) damage rectangles in a frame message (at most \(WireLimits.maximumRects))") }
        damage = []
        damage.reserveCapacity(count)
        for _ in 0..<count { damage.append(try r.rect()) }
        switch try r.u32() {
        case 0: cursor = nil
        case 1:
            let visible = try r.u32()
            let x = try r.i32(), y = try r.i32(), hx = try r.i32(), hy = try r.i32()
            let w = try r.u32(), h = try r.u32(), stride = try r.u32()
            let serial = try r.u64(), offset = try r.u64()
            cursor = Cursor(visible: visible, x: x, y: y, hotspotX: hx, hotspotY: hy, width: w, height: h, stride: stride,
                            serial: serial, pixelsOffset: offset == .max ? nil : offset)
        case let other: throw WireError("cursor flag \(other) in a frame message")
        }
        try r.finish()
    }
}
