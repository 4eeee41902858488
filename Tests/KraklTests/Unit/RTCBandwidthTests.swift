import KraklRTC
import Testing

@Suite(.tags(.unit)) struct RTCBandwidthTests {
    static let ms: UInt64 = 1_000_000

    @Test func heavyLossCutsByHalfTheLossFractionOncePer300ms() {
        var e = BandwidthEstimator(minimum: 100_000, maximum: 5_000_000, start: 1_000_000)
        e.onLossReport(fractionLost: 0.2, now: 1000 * Self.ms)
        #expect(abs(e.target - 900_000) < 1, "1 Mbit/s × (1 − 0.5 × 0.2): \(e.target)")
        e.onLossReport(fractionLost: 0.2, now: 1100 * Self.ms)
        #expect(abs(e.target - 900_000) < 1, "a second report within 300 ms describes the same loss")
        e.onLossReport(fractionLost: 0.5, now: 1400 * Self.ms)
        #expect(abs(e.target - 675_000) < 1)
        for i in 0..<40 { e.onLossReport(fractionLost: 1, now: UInt64(2000 + 400 * i) * Self.ms) }
        #expect(e.target == 100_000, "never below the minimum")
    }

    @Test func lowLossGrowsEightPercentASecondAndModerateLossHolds() {
        var e = BandwidthEstimator(minimum: 100_000, maximum: 5_000_000, start: 1_000_000)
        e.onLossReport(fractionLost: 0, now: 0)
        let start = e.target
        for second in 1...5 { e.onLossReport(fractionLost: 0.01, now: UInt64(second) * 1000 * Self.ms) }
        let expected = start * 1.08 * 1.08 * 1.08 * 1.08 * 1.08
        #expect(abs(e.target - expected) / expected < 0.01, "five seconds of <2 % loss: \(e.target) vs \(expected)")
        let held = e.target
        for second in 6...10 { e.onLossReport(fractionLost: 0.05, now: UInt64(second) * 1000 * Self.ms) }
        #expect(e.target == held, "2-10 % loss holds")
        for second in 11...60 { e.onLossReport(fractionLost: 0, now: UInt64(second) * 1000 * Self.ms) }
        #expect(e.target == 5_000_000, "capped at the maximum")
    }

    @Test func rembIsAnUpperCap() {
        var e = BandwidthEstimator(minimum: 100_000, maximum: 5_000_000, start: 2_000_000)
        e.onRemb(bitsPerSecond: 700_000)
        #expect(e.target == 700_000)
        e.onRemb(bitsPerSecond: 10)
        #expect(e.target == 100_000, "a tiny REMB still leaves the minimum")
        e.onRemb(bitsPerSecond: 9_000_000)
        #expect(e.target == 2_000_000, "a generous REMB does not raise the estimate by itself")
    }

    /// Packets every 6 ms (each its own 5 ms group) of 1200 bytes; `extra` ms of queueing added per packet.
    static func feed(_ e: inout BandwidthEstimator, packets: Int, from first: Int, extraDelayMs: Double, startNs: UInt64) -> UInt64 {
        var now = startNs
        var batch: [BandwidthSample] = []
        for i in first..<(first + packets) {
            let send = startNs + UInt64(i - first) * 6 * Self.ms
            let queue = extraDelayMs * Double(i - first)
            let arrival = Int64(Double(i) * 6_000 + queue * 1000) + 50_000
            batch.append(BandwidthSample(sendNs: send, arrivalUs: arrival, size: 1200))
            if batch.count == 10 {
                now = send + 20 * Self.ms
                e.onTransportFeedback(batch, now: now)
                batch.removeAll()
            }
        }
        return now
    }

    @Test func steadyDelayIsNormalAndGrowingDelayIsOveruse() {
        var e = BandwidthEstimator(minimum: 100_000, maximum: 5_000_000, start: 3_000_000)
        var now = Self.feed(&e, packets: 200, from: 0, extraDelayMs: 0, startNs: 1_000 * Self.ms)
        #expect(e.usage == .normal, "constant one-way delay must not read as overuse (trend \(e.trend))")
        let acked = e.ackedBitrate ?? 0
        #expect(acked > 1_400_000 && acked < 1_800_000, "1200 B every 6 ms is 1.6 Mbit/s: \(acked)")
        // Each packet waits 2 ms longer than the one before: a queue is building.
        now = Self.feed(&e, packets: 200, from: 200, extraDelayMs: 2, startNs: now + 6 * Self.ms)
        #expect(e.usage == .overusing, "growing delay not seen (trend \(e.trend))")
        let delayBased = e.delayBased ?? .infinity
        #expect(delayBased <= 0.85 * (e.ackedBitrate ?? 0) * 1.2, "overuse cuts to ~0.85 × acked: \(delayBased) vs acked \(e.ackedBitrate ?? 0)")
        #expect(e.target <= delayBased)
        _ = now
    }
}
