import FoundationEssentials
import Glibc

/// A packet as the estimator sees it: when we sent it, when (in the
/// receiver's clock) it arrived, or nil when the feedback says it was lost.
public struct BandwidthSample: Sendable, Equatable {
    public var sendNs: UInt64
    public var arrivalUs: Int64?
    public var size: Int

    public init(sendNs: UInt64, arrivalUs: Int64?, size: Int) {
        self.sendNs = sendNs
        self.arrivalUs = arrivalUs
        self.size = size
    }
}

/// Whether the path's queues are growing, in the words of GCC
/// (draft-ietf-rmcat-gcc-02 §5.4).
public enum BandwidthUsage: String, Sendable { case normal, overusing, underusing }

/// A send-side bandwidth estimate in the spirit of Google Congestion Control
/// (draft-ietf-rmcat-gcc-02, libwebrtc's goog_cc), from three inputs:
///
/// - **loss** (receiver reports): above 10 % loss the loss-based rate drops
///   by half the loss fraction; below 2 % it grows 8 % a second; between, it holds.
/// - **delay** (transport-wide-cc arrival times): packets are grouped in 5 ms
///   send bursts; the inter-group delay variation is accumulated, smoothed and
///   fitted with a least-squares line over the last 20 groups (the trendline
///   filter); a slope above an adaptive threshold for 10 ms is overuse, which
///   cuts the delay-based rate to 0.85 × the rate the receiver acknowledged;
///   normal usage lets it grow 8 % a second (capped at 1.5 × acknowledged).
/// - **REMB**: the receiver's own estimate, an upper cap.
///
/// The target is the smallest of the three, within [minimum, maximum].
/// Pure state: the caller passes the time.
public struct BandwidthEstimator: Sendable {
    public let minimum: Double
    public let maximum: Double
    public private(set) var lossBased: Double
    /// nil until transport-wide-cc feedback arrives (a peer without it gives no delay signal).
    public private(set) var delayBased: Double?
    public private(set) var remb: Double?
    /// What the receiver acknowledged receiving lately, bits per second.
    public private(set) var ackedBitrate: Double?
    public private(set) var usage: BandwidthUsage = .normal
    public private(set) var lastLossFraction = 0.0

    private var lastLossIncrease: UInt64?
    private var lastLossDecrease: UInt64?
    private var lastDelayUpdate: UInt64?
    private var lastOveruseDecrease: UInt64?

    // Trendline state.
    private struct Group { var firstSendNs: UInt64; var lastSendNs: UInt64; var lastArrivalUs: Int64; var size: Int }
    private var currentGroup: Group?
    private var previousGroup: Group?
    private var accumulatedDelayMs = 0.0
    private var smoothedDelayMs = 0.0
    private var history: [(x: Double, y: Double)] = []
    private var firstArrivalUs: Int64?
    private var deltaCount = 0
    private var previousTrend = 0.0
    private var overuseTimeMs = 0.0
    private var overuseCount = 0
    private var threshold = 12.5
    private var lastThresholdUpdateMs: Double?
    /// Modified trend of the last update, for logs and tests.
    public private(set) var trend = 0.0
    // Acknowledged-rate window.
    private var acked: [(arrivalUs: Int64, size: Int)] = []

    static let groupSpanNs: UInt64 = 5_000_000
    static let windowSize = 20
    static let smoothing = 0.9
    static let trendGain = 4.0

    public init(minimum: Double, maximum: Double, start: Double) {
        precondition(minimum > 0 && maximum >= minimum, "bitrate bounds must be positive and ordered")
        self.minimum = minimum
        self.maximum = maximum
        lossBased = min(max(start, minimum), maximum)
    }

    /// The bitrate to give the encoder, bits per second.
    public var target: Double {
        var value = lossBased
        if let delayBased { value = min(value, delayBased) }
        if let remb { value = min(value, remb) }
        return min(max(value, minimum), maximum)
    }

    // MARK: loss

    /// A receiver report's fraction lost (0...1).
    public mutating func onLossReport(fractionLost: Double, now: UInt64) {
        lastLossFraction = fractionLost
        if fractionLost > 0.10 {
            // At most one decrease per 300 ms: several reports describe the same loss.
            if let last = lastLossDecrease, now < last + 300_000_000 { return }
            lossBased = max(minimum, lossBased * (1 - 0.5 * fractionLost))
            lastLossDecrease = now
            lastLossIncrease = now
        } else if fractionLost < 0.02 {
            let elapsed = lastLossIncrease.map { Double(now &- $0) / 1e9 } ?? 1.0
            lastLossIncrease = now
            lossBased = min(maximum, lossBased * pow(1.08, min(max(elapsed, 0), 1.0)))
        } else {
            lastLossIncrease = now
        }
    }

    // MARK: REMB

    public mutating func onRemb(bitsPerSecond: Double) {
        remb = max(bitsPerSecond, minimum)
    }

    // MARK: delay

    /// Packets of one transport-wide-cc feedback, in transport sequence order.
    public mutating func onTransportFeedback(_ samples: [BandwidthSample], now: UInt64) {
        if delayBased == nil { delayBased = target }
        for sample in samples {
            guard let arrival = sample.arrivalUs else { continue }
            acked.append((arrival, sample.size))
            addToGroups(sample, arrival: arrival)
        }
        updateAckedBitrate()
        updateDelayBased(now: now)
    }

    private mutating func updateAckedBitrate() {
        guard let newest = acked.map(\.arrivalUs).max() else { return }
        acked.removeAll { $0.arrivalUs < newest - 500_000 }
        guard let oldest = acked.map(\.arrivalUs).min(), acked.count >= 2 else { return }
        let span = max(Double(newest - oldest), 50_000) / 1e6
        let bits = Double(acked.reduce(0) { $0 + $1.size }) * 8
        let instant = bits / span
        ackedBitrate = ackedBitrate.map { 0.7 * $0 + 0.3 * instant } ?? instant
    }

    private mutating func addToGroups(_ sample: BandwidthSample, arrival: Int64) {
        guard var group = currentGroup else {
            currentGroup = Group(firstSendNs: sample.sendNs, lastSendNs: sample.sendNs, lastArrivalUs: arrival, size: sample.size)
            return
        }
        if sample.sendNs < group.firstSendNs { return }  // reordered into an old group: ignore
        if sample.sendNs - group.firstSendNs <= Self.groupSpanNs {
            group.lastSendNs = max(group.lastSendNs, sample.sendNs)
            group.lastArrivalUs = max(group.lastArrivalUs, arrival)
            group.size += sample.size
            currentGroup = group
            return
        }
        // The current group is complete: compare it with the one before.
        if let previous = previousGroup {
            let sendDeltaMs = Double(group.lastSendNs - previous.lastSendNs) / 1e6
            let arrivalDeltaMs = Double(group.lastArrivalUs - previous.lastArrivalUs) / 1e3
            addDelta(variationMs: arrivalDeltaMs - sendDeltaMs, sendDeltaMs: sendDeltaMs, arrivalUs: group.lastArrivalUs)
        }
        previousGroup = group
        currentGroup = Group(firstSendNs: sample.sendNs, lastSendNs: sample.sendNs, lastArrivalUs: arrival, size: sample.size)
    }

    /// The trendline filter and the overuse detector for one inter-group delay variation.
    mutating func addDelta(variationMs: Double, sendDeltaMs: Double, arrivalUs: Int64) {
        deltaCount = min(deltaCount + 1, 1000)
        if firstArrivalUs == nil { firstArrivalUs = arrivalUs }
        let x = Double(arrivalUs - firstArrivalUs!) / 1e3
        accumulatedDelayMs += variationMs
        smoothedDelayMs = Self.smoothing * smoothedDelayMs + (1 - Self.smoothing) * accumulatedDelayMs
        history.append((x, smoothedDelayMs))
        if history.count > Self.windowSize { history.removeFirst() }
        guard history.count == Self.windowSize else { return }
        let meanX = history.reduce(0) { $0 + $1.x } / Double(history.count)
        let meanY = history.reduce(0) { $0 + $1.y } / Double(history.count)
        var numerator = 0.0, denominator = 0.0
        for point in history {
            numerator += (point.x - meanX) * (point.y - meanY)
            denominator += (point.x - meanX) * (point.x - meanX)
        }
        let slope = denominator == 0 ? 0 : numerator / denominator
        trend = Double(min(deltaCount, 60)) * slope * Self.trendGain
        detect(sendDeltaMs: sendDeltaMs, nowMs: x)
    }

    private mutating func detect(sendDeltaMs: Double, nowMs: Double) {
        if trend > threshold {
            overuseTimeMs += overuseCount == 0 ? sendDeltaMs / 2 : sendDeltaMs
            overuseCount += 1
            if overuseTimeMs > 10 && overuseCount > 1 && trend >= previousTrend {
                usage = .overusing
                overuseTimeMs = 0
                overuseCount = 0
            }
        } else if trend < -threshold {
            overuseTimeMs = 0
            overuseCount = 0
            usage = .underusing
        } else {
            overuseTimeMs = 0
            overuseCount = 0
            usage = .normal
        }
        previousTrend = trend
        // Adaptive threshold (§5.4): follows |trend| slowly up, faster down; outliers skipped.
        let magnitude = abs(trend)
        let last = lastThresholdUpdateMs ?? nowMs
        lastThresholdUpdateMs = nowMs
        if magnitude <= threshold + 15 {
            let k = magnitude < threshold ? 0.039 : 0.0087
            threshold += k * (magnitude - threshold) * min(max(nowMs - last, 0), 100)
            threshold = min(max(threshold, 6), 600)
        }
    }

    private mutating func updateDelayBased(now: UInt64) {
        guard var rate = delayBased else { return }
        let elapsed = lastDelayUpdate.map { Double(now &- $0) / 1e9 } ?? 0
        lastDelayUpdate = now
        switch usage {
        case .overusing:
            // One cut per ~RTT-ish interval; the queue needs time to drain before it shows.
            if lastOveruseDecrease.map({ now >= $0 + 200_000_000 }) ?? true {
                let base = ackedBitrate ?? rate
                rate = min(rate, 0.85 * base)
                lastOveruseDecrease = now
            }
        case .underusing:
            break  // hold: queues are draining
        case .normal:
            // Application-limited (a still screen sends little): hold rather than grow on no evidence,
            // and do not cut either, so the rate is there when the screen gets busy.
            if let ackedBitrate, ackedBitrate < 0.5 * rate { break }
            rate *= pow(1.08, min(max(elapsed, 0), 1.0))
            if let ackedBitrate { rate = min(rate, max(1.5 * ackedBitrate + 10_000, minimum)) }
        }
        delayBased = min(max(rate, minimum), maximum)
    }
}
