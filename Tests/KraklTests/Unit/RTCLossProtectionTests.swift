import Testing
@testable import KraklRTC

/// The loss-protection rules on their own (the publisher's loopback and aiortc tests cover them on the wire).
@Suite(.tags(.unit)) struct RTCLossProtectionTests {
    let ms: UInt64 = 1_000_000
    var configuration: VideoSendConfiguration { VideoSendConfiguration() }

    /// Sends a frame's packets at `at` and returns them.
    func sendFrame(_ p: inout LossProtection, _ sequences: [UInt16], at: UInt64) {
        p.frameQueued(sequences, now: at)
        for s in sequences { p.packetSent(s, at: at) }
    }

    @Test func beforeAnyReportSmallFramesAreCopiedOnceAfterTheDelay() {
        var p = LossProtection(configuration: configuration)
        let t: UInt64 = 1_000 * ms
        sendFrame(&p, [10], at: t)
        #expect(p.nextDue == t + p.delay)
        #expect(p.takeDue(now: t + p.delay - 1).isEmpty, "a copy left before its time")
        #expect(p.takeDue(now: t + p.delay) == [10])
        #expect(p.nextDue == nil && p.takeDue(now: t + 10 * p.delay).isEmpty, "more than one copy with no loss reported")
    }

    @Test func aCleanFirstReportTurnsItOffAndLossTurnsItOnForTheHold() {
        var p = LossProtection(configuration: configuration)
        let t: UInt64 = 1_000 * ms
        p.receiverReport(lossFraction: 0, now: t)
        sendFrame(&p, [1], at: t)
        #expect(p.nextDue == nil, "copied after a clean report")

        p.receiverReport(lossFraction: 0.01, now: t)
        sendFrame(&p, [2], at: t + ms)
        #expect(p.takeDue(now: t + ms + p.delay) == [2])
        // Below the second-copy threshold: one copy only.
        #expect(p.takeDue(now: t + ms + 3 * p.delay).isEmpty)
        // A clean report later does not end the hold; the hold's end does.
        p.receiverReport(lossFraction: 0, now: t + 2 * ms)
        sendFrame(&p, [3], at: t + 3 * ms)
        #expect(p.nextDue != nil, "a clean report cut the hold short")
        _ = p.takeDue(now: .max)
        sendFrame(&p, [4], at: t + p.hold + ms)
        #expect(p.nextDue == nil, "still copying after the hold")
        // A NACK is loss too.
        p.lossSeen(now: t + p.hold + 2 * ms)
        sendFrame(&p, [5], at: t + p.hold + 3 * ms)
        #expect(p.takeDue(now: .max) == [5])
    }

    @Test func heavyLossGetsASecondCopyAndLargeFramesNone() {
        var p = LossProtection(configuration: configuration)
        let t: UInt64 = 1_000 * ms
        p.receiverReport(lossFraction: 0.05, now: t)
        sendFrame(&p, [7, 8], at: t)           // two packets: protected
        sendFrame(&p, [9, 10, 11], at: t + ms) // three: not
        #expect(p.takeDue(now: t + p.delay) == [7, 8])
        #expect(p.takeDue(now: t + 2 * p.delay) == [7, 8], "no second copy at 5 % loss")
        #expect(p.takeDue(now: .max).isEmpty, "a three-packet frame was copied")
    }

    /// Both rounds of copies stay in due order even when a second copy was scheduled before a later first copy.
    @Test func copiesComeDueInTimeOrderAcrossRounds() {
        var p = LossProtection(configuration: configuration)
        let t: UInt64 = 1_000 * ms
        p.receiverReport(lossFraction: 0.1, now: t)
        sendFrame(&p, [1], at: t)                          // copies at t+d, t+2d
        sendFrame(&p, [2], at: t + p.delay * 3 / 2)        // first copy at t+2.5d
        #expect(p.takeDue(now: t + p.delay) == [1])
        #expect(p.nextDue == t + 2 * p.delay)
        #expect(p.takeDue(now: t + 2 * p.delay) == [1])
        #expect(p.nextDue == t + p.delay * 5 / 2)
    }

    @Test func zeroFramePacketsTurnsItOff() {
        var c = VideoSendConfiguration()
        c.protectedFramePackets = 0
        var p = LossProtection(configuration: c)
        p.receiverReport(lossFraction: 0.2, now: 0)
        sendFrame(&p, [1], at: ms)
        #expect(p.nextDue == nil)
    }

    /// Marks of packets that never left (dropped by the pacer) cannot pile up.
    @Test func unsentMarksStayBounded() {
        var p = LossProtection(configuration: configuration)
        for s in 0..<2_000 { p.frameQueued([UInt16(s)], now: ms) }
        sendFrame(&p, [5_000], at: ms)
        #expect(p.takeDue(now: .max) == [5_000])
        // Old marks were dropped, so an old sequence number sent now is not copied.
        p.packetSent(0, at: 2 * ms)
        #expect(p.takeDue(now: .max).isEmpty)
    }
}
