import KraklBase

/// The session's first keyframe sent as a probe of the path, so that the first picture does not wait
/// for a guessed start rate.
///
/// At connect the path's capacity is unknown and the pacer would hold the first keyframe (~400 KB
/// for a detailed 1080p screen) to `pacingFactor` × the start bitrate: ~0.5 s at 2.5 × 2.5 Mbit/s,
/// most of the time to the first picture. libwebrtc's GCC probes the path at start with clusters at
/// several times the start rate and raises its rate when the feedback shows the path carried them.
/// Here the keyframe's own packets are the clusters: cluster k leaves at the pacing rate ×
/// `2^(k+1)` (up to `ceiling`) for `clusterDuration` of its own rate, then the next cluster
/// doubles it, until the keyframe has left. Feedback that says the path did not carry it (overuse in
/// the transport-wide-cc delay signal, or reported loss) ends the probe at once and the pacer goes back
/// to the estimate's rate. The first clusters go out before any feedback can arrive (as libwebrtc's
/// first probes do); the ceiling bounds that blind part.
///
/// Pure state: the owner tells it what was queued, sent and heard, and asks for the pacing rate.
public struct StartupProbe: Sendable, Equatable {
    public enum State: Sendable, Equatable {
        /// No keyframe queued yet since the transport came up.
        case waiting
        /// The first keyframe is leaving; `sentInCluster` bytes of cluster `cluster` are out.
        case probing(cluster: Int, sentInCluster: Int)
        /// The keyframe has left under the probe.
        case finished
        /// Feedback said the path did not carry the probe (or it was turned off).
        case stopped
    }

    /// The pacing rate the probe starts from (pacing factor × start bitrate), bits per second.
    public let baseRate: Double
    /// The probe never paces faster than this, bits per second.
    public let ceiling: Double
    public let clusterDuration: Duration
    /// A cluster is at least this many bytes (libwebrtc: at least 5 packets), so the feedback has
    /// several packets of each rate to look at.
    public let minimumClusterBytes: Int
    public private(set) var state: State
    /// The fastest rate the probe paced at, bits per second (0 before it started).
    public private(set) var peakRate = 0.0
    /// Bytes sent under the probe.
    public private(set) var bytesSent = 0

    /// - Parameters:
    ///   - baseRate: the pacing rate without the probe.
    ///   - ceiling: the fastest rate; at or below `baseRate` the probe is off.
    public init(baseRate: Double, ceiling: Double, clusterDuration: Duration = .milliseconds(15), minimumClusterBytes: Int = 6_000) {
        self.baseRate = baseRate
        self.ceiling = ceiling
        self.clusterDuration = clusterDuration
        self.minimumClusterBytes = minimumClusterBytes
        state = ceiling > baseRate ? .waiting : .stopped
    }

    /// The pacing rate while the probe runs; nil when it does not (before the keyframe, after it).
    public var rate: Double? {
        guard case .probing(let cluster, _) = state else { return nil }
        return Self.rate(cluster: cluster, base: baseRate, ceiling: ceiling)
    }

    static func rate(cluster: Int, base: Double, ceiling: Double) -> Double {
        min(ceiling, base * Double(1 << min(cluster + 1, 30)))
    }

    private func clusterBytes(_ cluster: Int) -> Int {
        let rate = Self.rate(cluster: cluster, base: baseRate, ceiling: ceiling)
        return max(minimumClusterBytes, Int(rate / 8 * Double(clusterDuration.inNanoseconds) / 1e9))
    }

    /// A keyframe was queued: the first one after the transport came up starts the probe.
    public mutating func keyframeQueued() {
        guard state == .waiting else { return }
        state = .probing(cluster: 0, sentInCluster: 0)
        peakRate = rate ?? 0
    }

    /// A media packet of `bytes` left while probing: the cluster fills up and the next one doubles the rate.
    public mutating func sent(bytes: Int) {
        guard case .probing(var cluster, var sent) = state else { return }
        bytesSent += bytes
        sent += bytes
        // The last cluster at the ceiling never ends: there is no faster rate to go to.
        if sent >= clusterBytes(cluster) && Self.rate(cluster: cluster, base: baseRate, ceiling: ceiling) < ceiling {
            cluster += 1
            sent = 0
        }
        state = .probing(cluster: cluster, sentInCluster: sent)
        peakRate = max(peakRate, rate ?? 0)
    }

    /// The probed keyframe's last packet left.
    public mutating func keyframeSent() {
        if case .probing = state { state = .finished }
    }

    /// What the receiver said. The probe ends on the first sign that the path did not carry it: the
    /// transport-wide-cc delay signal overusing (queues grew under the probe), or a receiver report with
    /// loss above `lossLimit`. A REMB is left to cap the encoder's target, as in GCC: it is the
    /// receiver's estimate of a media rate it has barely seen yet, not a measurement of the probe.
    public mutating func feedback(usage: BandwidthUsage, lossFraction: Double?, lossLimit: Double = 0.02) {
        guard state == .waiting || rate != nil else { return }
        if usage == .overusing || (lossFraction ?? 0) > lossLimit { state = .stopped }
    }
}
