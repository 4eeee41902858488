/// Time in configurations and across module boundaries is a `Duration` (`.milliseconds(50)`,
/// `.seconds(15)`): a connect budget cannot be read as nanoseconds in one place and seconds in
/// another. Inside a module, deadlines and ages are CLOCK_MONOTONIC nanoseconds (`MonotonicClock`),
/// and these turn a duration into that arithmetic at the point of use.
extension Duration {
    /// Whole nanoseconds (a negative duration is 0).
    public var inNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0, attoseconds >= 0 else { return 0 }
        return UInt64(seconds) &* 1_000_000_000 &+ UInt64(attoseconds / 1_000_000_000)
    }

    public var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }

    public var inMilliseconds: Double { inSeconds * 1000 }
}
