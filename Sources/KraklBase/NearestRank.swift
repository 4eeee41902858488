extension Array where Element: Comparable {
    /// The nearest-rank percentile (`p` in 0...1) of an array sorted ascending; nil when empty.
    /// The one rule the agent's, the encoder's, the probe's and the bench's p50/p99 use.
    public func nearestRank(_ p: Double) -> Element? {
        isEmpty ? nil : self[Swift.min(count - 1, Int(Double(count) * p))]
    }
}
