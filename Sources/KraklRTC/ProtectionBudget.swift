/// What the publisher sends beyond the encoder's output, NACK answers and
/// loss-protection copies, over the last second, kept inside the bandwidth
/// estimate: the encoder is given the estimate less what they took (at most
/// `maximumShare` of it), and while the path queues, copies, which nobody
/// asked for, are sent only within that share.
///
/// Without it, media at the full estimate plus resends and copies overfilled
/// a bottleneck: behind a 1 Mbit/s link the estimate fell to ~740 kbit/s
/// within 2 s, but 1.4–1.6 Mbit/s kept going out (resends of resends, each
/// lost half the time and asked for again; copies of every small frame),
/// and loss stayed at 10–69 % for 9–10 of the 11 s. libwebrtc keeps the
/// same account: its encoder target is the estimate less the measured NACK
/// and FEC rate (ProtectionBitrateCalculator).
///
/// Pure state: the caller passes the time.
struct ProtectionBudget: Sendable {
    static let window: UInt64 = 1_000_000_000
    /// Largest share of the estimate protection may take from the encoder.
    let maximumShare: Double
    private var sent = RingQueue<(at: UInt64, bytes: Int)>()
    private var bytesInWindow = 0

    init(maximumShare: Double) {
        precondition(maximumShare >= 0 && maximumShare < 1, "protection's share of the estimate is in [0, 1)")
        self.maximumShare = maximumShare
    }

    /// Whether `bytes` more keep protection within its share of an estimate of `target` bits per second.
    mutating func allows(bytes: Int, target: Double, now: UInt64) -> Bool {
        expire(now)
        return Double(bytesInWindow + bytes) * 8 <= maximumShare * target * Double(Self.window) / 1e9
    }

    mutating func record(bytes: Int, now: UInt64) {
        expire(now)
        sent.append((now, bytes))
        bytesInWindow += bytes
    }

    /// Protection's rate over the last second, bits per second.
    mutating func rate(now: UInt64) -> Double {
        expire(now)
        return Double(bytesInWindow) * 8 * 1e9 / Double(Self.window)
    }

    /// The encoder's part of an estimate of `target` bits per second.
    mutating func mediaTarget(_ target: Double, now: UInt64) -> Double {
        target - min(rate(now: now), maximumShare * target)
    }

    private mutating func expire(_ now: UInt64) {
        while let oldest = sent.first, now >= oldest.at + Self.window {
            bytesInWindow -= oldest.bytes
            _ = sent.popFirst()
        }
    }
}
