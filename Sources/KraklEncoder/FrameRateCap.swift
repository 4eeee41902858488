/// `--max-fps`: when the encoder may take the next picture. A token bucket on the host's clock:
/// credit accrues with time, up to `burst` intervals' worth, and each picture taken spends one
/// interval of it; two pictures are never taken closer than `minimumSpacing` intervals.
///
/// Over any span of T seconds at most `burst + fps × T` pictures pass, so the long-run rate is
/// the cap (the earlier rule, "a capture ¾ of an interval after the last one passes", let a
/// 40 fps source through at 40). The stored credit is what keeps latency low: a source at the
/// cap whose frame comes a little early (capture jitter, or the previous take ran late) finds
/// credit left and is taken at once, and the credit comes back as soon as it is on time again,
/// instead of every later frame inheriting the wait (measured with a take-time-only rule:
/// capture → encoded drifted to 24 ms at 30 fps for a 5 ms encode).
///
/// Only the host's clock counts here: capture timestamps are the backend's and do not open the cap.
struct FrameRateCap {
    /// Credit the bucket holds, in intervals.
    static let burst: UInt64 = 2
    /// The closest two takes may be, in quarters of an interval.
    static let minimumSpacingQuarters: UInt64 = 3

    let interval: UInt64
    private var lastTake: UInt64?
    /// Credit (ns of accrued time) right after the last take.
    private var creditAfterTake: UInt64 = 0

    init(interval: UInt64) { self.interval = max(1, interval) }

    /// The earliest time a picture may be taken (now or in the past: at once).
    func opensAt() -> UInt64 {
        guard let lastTake else { return 0 }
        let spacing = lastTake &+ interval * Self.minimumSpacingQuarters / 4
        let credit = creditAfterTake >= interval ? lastTake : lastTake &+ (interval - creditAfterTake)
        return max(spacing, credit)
    }

    func allows(now: UInt64) -> Bool { now >= opensAt() }

    /// A picture is taken at `now`.
    mutating func take(now: UInt64) {
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
