/// How many lines of a backend's log reach the terminal: a token bucket of `burst` lines refilled
/// at `perSecond`. A backend that logs in a loop wrote 160 MB to stderr in 12 s (an audit's
/// backend), which in a daemon that runs for days is a full journal or disk; past the bucket,
/// lines are counted, and the next line that gets through says how many were not shown.
/// Pure state: the caller passes the time (CLOCK_MONOTONIC ns).
public struct LogRateLimit: Sendable {
    public let perSecond: Double
    public let burst: Double
    private var tokens: Double
    private var last: UInt64?
    /// Lines not shown since the last one that was.
    public private(set) var suppressed = 0

    public static let defaultPerSecond = 50.0

    public init(perSecond: Double = LogRateLimit.defaultPerSecond, burst: Double = 200) {
        self.perSecond = perSecond
        self.burst = burst
        tokens = burst
    }

    /// Whether a line at `now` is shown; when it is, `notShownBefore` lines were held back since
    /// the previous one (say so first).
    public mutating func admit(now: UInt64) -> (shown: Bool, notShownBefore: Int) {
        if let last, now > last { tokens = min(burst, tokens + Double(now - last) / 1e9 * perSecond) }
        last = max(last ?? now, now)
        guard tokens >= 1 else {
            suppressed += 1
            return (false, 0)
        }
        tokens -= 1
        defer { suppressed = 0 }
        return (true, suppressed)
    }
}
