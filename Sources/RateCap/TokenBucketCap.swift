/// A rate cap as a token bucket on a monotonic clock (nanoseconds): credit accrues with time, up
/// to `burst` intervals' worth, each take spends one interval of it, and two takes are never closer
/// than `minimumSpacingQuarters` quarters of an interval.
///
/// Over any span of T seconds at most `burst + T / interval` takes pass, so the long-run rate is the
/// cap. The stored credit is what keeps latency low: something at the cap that comes a little early
/// (jitter, or the previous take ran late) finds credit left and is taken at once, and the credit
/// comes back as soon as it is on time again, instead of every later take inheriting the wait.
///
/// Two users with one rule: the encoder's `--max-fps` (KraklEncoder's FrameRateCap) and a
/// damage-driven capture thread's cadence (BackendKit's CaptureCadence). A target of its own
/// because backends link BackendKit without the host's modules.
public struct TokenBucketCap: Sendable {
    /// Credit the bucket holds, in intervals.
    public static let burst: UInt64 = 2
    /// The closest two takes may be, in quarters of an interval.
    public static let minimumSpacingQuarters: UInt64 = 3

    public let interval: UInt64
    private var lastTake: UInt64?
    /// Credit (ns of accrued time) right after the last take.
    private var creditAfterTake: UInt64 = 0

    public init(interval: UInt64) { self.interval = max(1, interval) }

    /// The earliest time of the next take (now or in the past: at once).
    public func opensAt() -> UInt64 {
        guard let lastTake else { return 0 }
        let spacing = lastTake &+ interval * Self.minimumSpacingQuarters / 4
        let credit = creditAfterTake >= interval ? lastTake : lastTake &+ (interval - creditAfterTake)
        return max(spacing, credit)
    }

    public func allows(now: UInt64) -> Bool { now >= opensAt() }

    /// A take at `now`.
    public mutating func take(now: UInt64) {
        let full = interval * Self.burst
        var credit = full
        if let lastTake {
            let elapsed = now > lastTake ? now - lastTake : 0
            credit = min(full, creditAfterTake + min(elapsed, full))
        }
        creditAfterTake = credit > interval ? credit - interval : 0
        lastTake = now
    }
}
