import KraklBackendABI

/// Numbers a source's frames and hands them to the host: timestamps on
/// CLOCK_MONOTONIC that strictly increase over the source's life (across
/// stop/start too, as the ABI requires) and a running sequence.
public struct FrameSender {
    public private(set) var sequence: UInt64 = 0
    private var lastTimestamp: UInt64 = 0

    public init() {}

    /// The capture time for the next frame: now, or 1 ns after the previous
    /// frame's if the clock has not moved since.
    public func nextTimestamp() -> UInt64 { max(monotonicNanoseconds(), lastTimestamp + 1) }

    /// Sets `frame`'s size field, timestamp, sequence and damage (none: the
    /// whole frame) and delivers it; the frame is borrowed for the call only.
    public mutating func send(_ frame: inout krakl_frame, timestamp: UInt64, damage: [krakl_rect], to host: BackendHost) {
        frame.struct_size = UInt32(MemoryLayout<krakl_frame>.size)
        frame.timestamp_ns = timestamp
        frame.sequence = sequence
        damage.withUnsafeBufferPointer { rects in
            frame.damage_count = UInt32(rects.count)
            frame.damage = rects.count > 0 ? rects.baseAddress : nil
            host.deliver(&frame)
        }
        lastTimestamp = timestamp
        sequence += 1
    }
}
