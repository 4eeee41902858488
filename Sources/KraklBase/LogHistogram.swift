/// Counts of non-negative values (durations in ns) in logarithmic buckets, for percentiles of a
/// run of any length in fixed memory (15 KB): 32 buckets per power of two, so a percentile is
/// within 1/64 (1.6 %) of the exact nearest-rank value; values below 32 are exact. The largest
/// and smallest values are kept exactly.
///
/// Keeping every sample instead grew a capture run by ~10 MB an hour at 30 fps, and a backend
/// flooding frames by ~350 MB a minute.
public struct LogHistogram: Sendable {
    private static let subBits = 5
    private static let sub = 1 << subBits
    private static let bucketCount = (64 - subBits + 1) * sub

    private var counts = [Int](repeating: 0, count: LogHistogram.bucketCount)
    public private(set) var count = 0
    public private(set) var maximum: UInt64 = 0
    public private(set) var minimum: UInt64 = .max

    public init() {}

    public mutating func add(_ value: UInt64) {
        counts[Self.index(value)] += 1
        count += 1
        maximum = max(maximum, value)
        minimum = min(minimum, value)
    }

    public mutating func reset() { self = LogHistogram() }

    /// The nearest-rank percentile (`p` in 0...1), as `Array.nearestRank` picks it, to within a
    /// bucket (the bucket's middle, kept between the smallest and largest values seen); nil when empty.
    public func percentile(_ p: Double) -> UInt64? {
        guard count > 0 else { return nil }
        let rank = min(count - 1, Int(Double(count) * p))
        var seen = 0
        for (index, n) in counts.enumerated() where n > 0 {
            seen += n
            if seen > rank { return min(maximum, max(minimum, Self.middle(index))) }
        }
        return maximum
    }

    static func index(_ value: UInt64) -> Int {
        guard value >= UInt64(sub) else { return Int(value) }
        let exponent = 63 - value.leadingZeroBitCount           // ≥ subBits
        let mantissa = Int(value >> UInt64(exponent - subBits)) & (sub - 1)
        return (exponent - subBits + 1) * sub + mantissa
    }

    static func middle(_ index: Int) -> UInt64 {
        guard index >= sub else { return UInt64(index) }
        let exponent = index / sub + subBits - 1
        let mantissa = UInt64(index % sub)
        let width = UInt64(1) << UInt64(exponent - subBits)
        let low = (UInt64(sub) + mantissa) << UInt64(exponent - subBits)
        return low &+ width / 2
    }
}
