import CBackendHost
import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost

/// Damage as a list of rectangles or "all of it", merged into a bounding box past a cap.
enum Damage {
    case whole
    case rects([krakl_rect])

    static let none = Damage.rects([])

    func union(_ other: Damage, cap: Int) -> Damage {
        guard case .rects(let a) = self, case .rects(let b) = other else { return .whole }
        let all = a + b
        guard all.count > cap else { return .rects(all) }
        // A superset is always correct: past the cap, one box around everything.
        var x0 = Int32.max, y0 = Int32.max, x1 = Int32.min, y1 = Int32.min
        for r in all {
            x0 = min(x0, r.x); y0 = min(y0, r.y)
            x1 = max(x1, r.x + r.width); y1 = max(y1, r.y + r.height)
        }
        return .rects([krakl_rect(x: x0, y: y0, width: x1 - x0, height: y1 - y0)])
    }
}

/// The child's side of the shared frames: a memfd of `slotCount` slots, each holding a whole
/// picture. A frame is copied once, into a free slot, and only where that slot's picture is
/// out of date (the frame's damage plus the damage of frames written to other slots since);
/// then "frame in slot k" goes to the agent, which hands the sink a krakl_frame pointing into
/// its own mapping and releases the slot after the sink returns.
///
/// When no slot is free the backend waits at most `waitMilliseconds` (to ride out a moment's
/// scheduling delay of the agent's reader on a loaded machine) and then the frame is dropped
/// and counted, its damage carried into the next frame the agent gets; after a drop it does not
/// wait again until the agent releases a slot, so a stuck agent never slows a backend by more
/// than one wait.
/// @unchecked Sendable: the ring's slots are shared memory whose ownership moves by messages; the free list is under `condition`.
final class FrameRingWriter: @unchecked Sendable {
    let socket: WireSocket
    let slotCount: Int
    let waitMilliseconds: Int
    private let condition = Condition()
    private var layout: SlotLayout?
    private var generation: UInt32 = 0
    private var mapping: UnsafeMutableRawPointer?
    private var mappingSize = 0
    private var memfd: Int32 = -1
    private var held: [Bool] = []
    /// What each slot's picture misses (damage of the frames written elsewhere since).
    private var stale: [Damage] = []
    /// Damage of frames dropped since the last message, owed to the next one.
    private var carried = Damage.none
    private var dropped: UInt32 = 0
    private var stalled = false
    private var warnedCursor = false
    /// Copy statistics for the bench: bytes copied, frames written.
    private(set) var copiedBytes = 0

    init(socket: WireSocket, slotCount: Int, waitMilliseconds: Int) {
        self.socket = socket
        self.slotCount = slotCount
        self.waitMilliseconds = waitMilliseconds
    }

    /// The agent is done with a slot (a release for an older ring is ignored).
    func release(slot: UInt32, generation: UInt32) {
        condition.lock()
        if generation == self.generation, Int(slot) < held.count {
            held[Int(slot)] = false
            stalled = false
            condition.broadcast()
        }
        condition.unlock()
    }

    /// A frame from the backend, on its capture thread.
    func deliver(_ pointer: UnsafePointer<krakl_frame>) {
        let info = FrameInfo(pointer)
        // Pixels that cannot be copied (no such format, NULL planes, short strides) never reach
        // the ring; everything else does, and the agent's own frame gate judges the timestamp and
        // the damage as it would in its process (a zero timestamp or wrong damage stays as given).
        var probe = info.raw
        probe.struct_size = pointer.pointee.struct_size
        probe.timestamp_ns = 1
        guard withUnsafePointer(to: &probe, { FrameCheck.geometryProblem($0) }) == nil else {
            socket.send(InvalidFrame(pointer).encoded)
            return
        }
        let damageWrong = FrameCheck.damageProblem(info) != nil
        // A count over the host's limit has no rectangles (FrameInfo.damage reads none): the agent
        // gets the count alone, as for a NULL array, and judges it as in its process.
        let countTooLarge = info.raw.damage_count > FrameCheck.maximumDamageRects
        let frameDamage: Damage = damageWrong || info.damage.isEmpty ? .whole : .rects(info.damage)
        condition.lock()
        defer { condition.unlock() }
        if layout?.format != info.format || layout?.width != info.width || layout?.height != info.height {
            guard makeRing(format: info.format, width: info.width, height: info.height) else { return }
        }
        guard let layout, let mapping else { return }
        var slot = held.firstIndex(of: false)
        if slot == nil && !stalled {
            let deadline = Date().addingTimeInterval(Double(waitMilliseconds) / 1000)
            _ = condition.wait(while: { !held.contains(false) }, until: deadline)
            slot = held.firstIndex(of: false)
            if slot == nil { stalled = true }
        }
        guard let slot else {
            dropped &+= 1
            carried = carried.union(frameDamage, cap: WireLimits.maximumRects)
            for index in stale.indices { stale[index] = stale[index].union(frameDamage, cap: 64) }
            return
        }
        let base = mapping + slot * layout.slotSize
        copy(info, layout: layout, into: base, damage: stale[slot].union(frameDamage, cap: 64))
        for index in stale.indices { stale[index] = index == slot ? .none : stale[index].union(frameDamage, cap: 64) }
        let report = carried.union(frameDamage, cap: WireLimits.maximumRects)
        carried = .none
        held[slot] = true
        let cursor = info.raw.cursor.flatMap { copyCursor($0, into: base + layout.cursorOffset, offset: layout.cursorOffset) }
        var message = FrameMessage(generation: generation, slot: UInt32(slot), layout: layout, timestamp: info.raw.timestamp_ns,
                                   sequence: info.raw.sequence, dropped: dropped,
                                   damage: { if case .rects(let r) = report { return r } else { return [] } }(), cursor: cursor)
        if damageWrong {
            message.damageUnchecked = true
            if info.raw.damage == nil || countTooLarge {
                message.damageNull = true
                message.damageNullCount = info.raw.damage_count
            } else {
                message.damage = Array(info.damage.prefix(WireLimits.maximumRects))
            }
        }
        dropped = 0
        // The sink's gate drops a frame with wrong damage: the next one then says "everything".
        if damageWrong { carried = .whole }
        socket.send(message.encoded)
    }

    /// A fresh ring for a new format or size; every slot starts out of date.
    private func makeRing(format: UInt32, width: Int, height: Int) -> Bool {
        releaseRing()
        guard let next = SlotLayout(format: format, width: width, height: height) else { return false }
        let size = next.slotSize * slotCount
        let fd = krakl_sealed_memfd("krakl-frames", UInt64(size))
        guard fd >= 0, let pointer = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), pointer != MAP_FAILED else {
            if fd >= 0 { close(fd) }
            var w = WireWriter(.log)
            w.i32(LogLevel.error.rawValue)
            w.text("isolated mode: cannot make \(slotCount) frame buffers of \(next.slotSize) bytes: \(String(cString: strerror(fd < 0 ? -fd : errno)))")
            socket.send(w)
            return false
        }
        generation &+= 1
        layout = next
        mapping = pointer
        mappingSize = size
        memfd = fd
        held = Array(repeating: false, count: slotCount)
        stale = Array(repeating: .whole, count: slotCount)
        stalled = false
        var w = WireWriter(.ring)
        w.u32(generation)
        w.u32(UInt32(slotCount))
        w.u64(UInt64(next.slotSize))
        socket.send(w, passing: fd)
        return true
    }

    private func releaseRing() {
        if let mapping { munmap(mapping, mappingSize) }
        if memfd >= 0 { close(memfd) }
        mapping = nil
        memfd = -1
        layout = nil
    }

    /// Copies the frame's planes into a slot: everything, or only the rectangles of `damage`.
    private func copy(_ info: FrameInfo, layout: SlotLayout, into base: UnsafeMutableRawPointer, damage: Damage) {
        let geometry = FrameCheck.planeGeometry(format: info.format, width: info.width, height: info.height)!
        let sources = info.planes, sourceStrides = info.strides
        var rects: [krakl_rect]
        switch damage {
        case .whole: rects = []
        case .rects(let list): rects = list
        }
        let area = rects.reduce(0) { $0 + Int($1.width) * Int($1.height) }
        if area * 10 >= info.width * info.height * 6 { rects = [] }   // most of it: one pass, row by row
        if rects.isEmpty { rects = [krakl_rect(x: 0, y: 0, width: Int32(info.width), height: Int32(info.height))] }
        for (index, plane) in geometry.enumerated() {
            guard let source = sources[index] else { continue }
            // Chroma planes of 4:2:0 formats are subsampled by 2 both ways; a unit is 1 byte (I420),
            // 2 (NV12's UV pairs) or 4 (packed pixels).
            let shift = index > 0 ? 1 : 0
            let unit = plane.rowBytes / max(1, (info.width + (1 << shift) - 1) >> shift)
            let target = base + layout.planeOffsets[index]
            for r in rects {
                let x0 = Int(r.x) >> shift, x1 = min((Int(r.x + r.width) + (1 << shift) - 1) >> shift, plane.rowBytes / unit)
                let y0 = Int(r.y) >> shift, y1 = min((Int(r.y + r.height) + (1 << shift) - 1) >> shift, plane.rows)
                guard x1 > x0, y1 > y0 else { continue }
                let bytes = (x1 - x0) * unit
                for row in y0..<y1 {
                    memcpy(target + row * layout.strides[index] + x0 * unit, source + row * sourceStrides[index] + x0 * unit, bytes)
                }
                copiedBytes += bytes * (y1 - y0)
            }
        }
    }

    /// The cursor's fields, and its image copied into the slot when it has one that fits.
    private func copyCursor(_ pointer: UnsafePointer<krakl_cursor>, into target: UnsafeMutableRawPointer, offset: Int) -> FrameMessage.Cursor {
        var cursor = krakl_cursor()
        let declared = Int(pointer.pointee.struct_size)
        _ = withUnsafeMutableBytes(of: &cursor) { memcpy($0.baseAddress!, pointer, min(max(declared, 0), $0.count)) }
        var pixelsOffset: UInt64?
        let width = Int(cursor.width), height = Int(cursor.height)
        if let pixels = cursor.pixels, width > 0, height > 0, width <= WireLimits.maximumCursorSide,
           height <= WireLimits.maximumCursorSide, Int(cursor.stride) >= width * 4 {
            for row in 0..<height { memcpy(target + row * width * 4, pixels + row * Int(cursor.stride), width * 4) }
            pixelsOffset = UInt64(offset)
        } else if cursor.pixels != nil && (width > WireLimits.maximumCursorSide || height > WireLimits.maximumCursorSide) && !warnedCursor {
            warnedCursor = true
            var w = WireWriter(.log)
            w.i32(LogLevel.warning.rawValue)
            w.text("isolated mode: a \(width)x\(height) cursor image is larger than \(WireLimits.maximumCursorSide)x\(WireLimits.maximumCursorSide); cursor images that large reach the agent without their pixels (position and serial only)")
            socket.send(w)
        }
        return FrameMessage.Cursor(visible: cursor.visible, x: cursor.x, y: cursor.y, hotspotX: cursor.hotspot_x, hotspotY: cursor.hotspot_y,
                                   width: cursor.width, height: cursor.height, stride: pixelsOffset == nil ? cursor.stride : UInt32(width * 4),
                                   serial: cursor.serial, pixelsOffset: pixelsOffset)
    }
}
