import KraklRTC
import Testing

@Suite(.tags(.unit)) struct RTCPacerTests {
    static func packet(_ sequence: UInt16, payload: Int = 1188) -> RtpPacket {
        RtpPacket(payloadType: 96, sequenceNumber: sequence, timestamp: 0, ssrc: 1, payload: [UInt8](repeating: 0, count: payload))
    }

    /// Pops everything the pacer lets out, jumping the clock to each next send time.
    static func drain(_ pacer: inout Pacer, from start: UInt64) -> [(time: UInt64, item: Pacer.Item)] {
        var now = start
        var sent: [(UInt64, Pacer.Item)] = []
        for _ in 0..<100_000 {
            while let item = pacer.pop(now: now) { sent.append((now, item)) }
            guard let next = pacer.nextSendTime(now: now) else { break }
            now = max(next, now + 1)
        }
        return sent
    }

    @Test func aKeyframeLeavesSpreadAtThePacingRate() {
        // 100 packets of 1200 bytes (960 kbit) at 6.25 Mbit/s (2.5 × 2.5 Mbit/s): ~154 ms, not one burst.
        var pacer = Pacer(rate: 6_250_000)
        pacer.enqueue((0..<100).map { Self.packet($0) }, kind: .media, now: 0)
        #expect(pacer.count == 100)
        let sent = Self.drain(&pacer, from: 0)
        #expect(sent.count == 100)
        #expect(sent.map(\.item.packet.sequenceNumber) == Array(0..<100), "order kept")
        let spanMs = Double(sent.last!.time - sent.first!.time) / 1e6
        #expect(spanMs > 140 && spanMs < 170, "keyframe spread over \(spanMs) ms")
        // No 10 ms window carries more than the rate allows plus the 5 ms burst (and one packet of slack).
        let allowance = 6_250_000 / 8 * 0.015 + 1200
        for (index, first) in sent.enumerated() {
            let window = sent[index...].prefix { $0.time < first.time + 10_000_000 }.reduce(0) { $0 + $1.item.size }
            #expect(Double(window) <= allowance, "\(window) bytes within 10 ms from \(first.time)")
        }
        #expect(pacer.isEmpty && pacer.nextSendTime(now: sent.last!.time) == nil)
    }

    @Test func retransmissionsGoFirst() {
        var pacer = Pacer(rate: 1_000_000)
        pacer.enqueue((0..<5).map { Self.packet($0) }, kind: .media, now: 0)
        pacer.enqueue([Self.packet(900)], kind: .retransmission, now: 0)
        let first = pacer.pop(now: 0)
        #expect(first?.kind == .retransmission && first?.packet.sequenceNumber == 900)
        #expect(pacer.pop(now: 0) == nil, "the budget is spent after one packet at 1 Mbit/s")
        let sent = Self.drain(&pacer, from: 0)
        #expect(sent.map(\.item.packet.sequenceNumber) == [0, 1, 2, 3, 4])
    }

    @Test func aFullQueueDropsTheOldestMediaAndSaysSo() {
        var pacer = Pacer(rate: 1_000_000, capacity: 10)
        #expect(pacer.enqueue((0..<8).map { Self.packet($0) }, kind: .media, now: 0) == 0)
        let dropped = pacer.enqueue((100..<108).map { Self.packet($0) }, kind: .media, now: 1)
        #expect(dropped == 6)
        #expect(pacer.count == 10)
        #expect(pacer.droppedPackets == 6)
        let order = Self.drain(&pacer, from: 2).map(\.item.packet.sequenceNumber)
        #expect(order == [6, 7] + Array(100..<108), "the newest frame is kept whole: \(order)")
        // Retransmissions never push media out: they are dropped instead when full.
        var full = Pacer(rate: 1_000_000, capacity: 4)
        full.enqueue((0..<4).map { Self.packet($0) }, kind: .media, now: 0)
        #expect(full.enqueue([Self.packet(50)], kind: .retransmission, now: 0) == 0)
        #expect(full.count == 4)
        #expect(full.flushMedia() == 4 && full.isEmpty)
    }

    @Test func theRateCanChangeMidQueue() {
        var slow = Pacer(rate: 500_000)
        slow.enqueue((0..<20).map { Self.packet($0) }, kind: .media, now: 0)
        var fast = slow
        fast.setRate(5_000_000, now: 0)
        let slowSpan = Self.drain(&slow, from: 0).last!.time
        let fastSpan = Self.drain(&fast, from: 0).last!.time
        #expect(Double(slowSpan) / Double(fastSpan) > 8, "10× the rate should be ~10× faster: \(slowSpan) vs \(fastSpan) ns")
    }
}

/// StartupProbe's rules on their own (the stream's use of them: RTCStartupProbeStreamTests).
@Suite(.tags(.unit)) struct RTCStartupProbeTests {
    @Test func clustersDoubleTheRateUpToTheCeilingThenTheProbeEndsWithTheKeyframe() {
        var probe = StartupProbe(baseRate: 6_250_000, ceiling: 60_000_000)
        #expect(probe.state == .waiting && probe.rate == nil)
        probe.sent(bytes: 1200)
        #expect(probe.rate == nil && probe.bytesSent == 0, "nothing counts before the keyframe")
        probe.keyframeQueued()
        var rates: [Double] = []
        for _ in 0..<400 {
            if rates.last != probe.rate { rates.append(probe.rate!) }
            probe.sent(bytes: 1200)
        }
        #expect(rates == [12_500_000, 25_000_000, 50_000_000, 60_000_000])
        #expect(probe.peakRate == 60_000_000 && probe.bytesSent == 480_000)
        probe.keyframeQueued()
        #expect(probe.rate == 60_000_000, "a second keyframe while probing does not restart it")
        probe.keyframeSent()
        #expect(probe.state == .finished && probe.rate == nil)
        probe.keyframeQueued()
        #expect(probe.rate == nil, "only the first keyframe probes")
    }

    @Test func aClusterLastsItsDurationAtItsRateAndAtLeastTheMinimum() {
        var probe = StartupProbe(baseRate: 10_000_000, ceiling: 100_000_000, clusterDuration: .milliseconds(10), minimumClusterBytes: 30_000)
        probe.keyframeQueued()
        // 20 Mbit/s for 10 ms is 25 kB, under the 30 kB minimum; 40 Mbit/s for 10 ms is 50 kB.
        for _ in 0..<29 { probe.sent(bytes: 1000) }
        #expect(probe.rate == 20_000_000)
        probe.sent(bytes: 1000)
        #expect(probe.rate == 40_000_000)
        for _ in 0..<49 { probe.sent(bytes: 1000) }
        #expect(probe.rate == 40_000_000)
        probe.sent(bytes: 1000)
        #expect(probe.rate == 80_000_000)
    }

    @Test(arguments: [(BandwidthUsage.overusing, nil as Double?, true), (.normal, 0.05, true), (.normal, 0.02, false),
                      (.underusing, nil, false), (.normal, nil, false)])
    func feedbackEndsTheProbeOnOveruseOrLoss(usage: BandwidthUsage, loss: Double?, ends: Bool) {
        var probe = StartupProbe(baseRate: 6_250_000, ceiling: 60_000_000)
        probe.keyframeQueued()
        probe.feedback(usage: usage, lossFraction: loss)
        #expect((probe.state == .stopped) == ends)
        #expect((probe.rate == nil) == ends)
        // Before the keyframe the same signs cancel it too.
        var waiting = StartupProbe(baseRate: 6_250_000, ceiling: 60_000_000)
        waiting.feedback(usage: usage, lossFraction: loss)
        waiting.keyframeQueued()
        #expect((waiting.rate == nil) == ends)
    }

    @Test func aCeilingAtOrBelowThePacingRateTurnsItOff() {
        var probe = StartupProbe(baseRate: 6_250_000, ceiling: 6_250_000)
        probe.keyframeQueued()
        #expect(probe.state == .stopped && probe.rate == nil)
    }
}

