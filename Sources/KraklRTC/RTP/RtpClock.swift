/// Maps capture times (monotonic nanoseconds) to RTP timestamps. The first
/// capture time anchors a random starting timestamp (RFC 3550 §5.1); later
/// ones advance it by elapsed time, so frame pacing jitter in the encoder does
/// not bend the media clock.
public struct RtpClock: Sendable {
    public let clockRate: UInt32
    public let baseTimestamp: UInt32
    public private(set) var baseNanoseconds: UInt64?

    public init(clockRate: UInt32 = 90_000, baseTimestamp: UInt32 = UInt32.random(in: 0...UInt32.max)) {
        self.clockRate = clockRate
        self.baseTimestamp = baseTimestamp
    }

    /// The RTP timestamp for a capture time; wraps modulo 2^32. Times before the anchor count backwards.
    public mutating func timestamp(captureNanoseconds: UInt64) -> UInt32 {
        guard let base = baseNanoseconds else {
            baseNanoseconds = captureNanoseconds
            return baseTimestamp
        }
        let elapsed = Int64(bitPattern: captureNanoseconds &- base)
        // Split to avoid overflow: whole seconds, then the rounded remainder.
        let seconds = elapsed / 1_000_000_000, rest = elapsed % 1_000_000_000
        let ticks = seconds * Int64(clockRate) + (rest * Int64(clockRate) + (rest >= 0 ? 500_000_000 : -500_000_000)) / 1_000_000_000
        return baseTimestamp &+ UInt32(truncatingIfNeeded: ticks)
    }
}
