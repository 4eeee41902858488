import Testing
@testable import KraklEncoder

/// When an unchanged screen is refined and when that stops (SettleRefinement, sans I/O: times are
/// given, nothing waits).
@Suite("Encoder: refinement after the screen settles", .tags(.unit))
struct SettleRefinementTests {
    static let interval: UInt64 = 33_333_333

    /// A refinement whose picture changed at 0 and a clock at its first pass.
    struct Timeline {
        var refinement = SettleRefinement(frameIntervalNs: SettleRefinementTests.interval, width: 1920, height: 1080)
        var now: UInt64 = SettleRefinement.settleDelayNs
        init() { refinement.changed(atNs: 0) }

        /// One pass now, the clock a frame interval on; true when the pass ended the refinement.
        mutating func pass(bytes: Int, quantizer: Int?) -> Bool {
            let ended = refinement.passed(atNs: now, bytes: bytes, quantizer: quantizer)
            now += SettleRefinementTests.interval
            return ended
        }
        var empty: Int { refinement.emptyPassBytes - 1 }
    }

    @Test func nothingBeforeTheFirstPictureThenTheFirstPassOneSecondAfterTheChange() {
        var refinement = SettleRefinement(frameIntervalNs: Self.interval, width: 1920, height: 1080)
        #expect(refinement.nextPassNs == nil)
        refinement.changed(atNs: 5_000_000_000)
        #expect(refinement.nextPassNs == 5_000_000_000 + SettleRefinement.settleDelayNs)
        // A pass that did not converge: the next one a frame interval later, not seconds.
        let ended = refinement.passed(atNs: 6_000_000_000, bytes: 20_000, quantizer: 40)
        #expect(!ended)
        #expect(refinement.nextPassNs == 6_000_000_000 + Self.interval)
    }

    @Test func aPassAtTheConvergedQuantizerEndsItUntilTheNextChange() {
        var line = Timeline()
        for quantizer in [56, 44, 30, 18, 9] {
            let ended = line.pass(bytes: 8_000, quantizer: quantizer)
            #expect(!ended, "ended at q \(quantizer)")
        }
        let ended = line.pass(bytes: 8_000, quantizer: SettleRefinement.convergedQuantizer)
        #expect(ended)
        #expect(line.refinement.nextPassNs == nil)
        // A change starts it over.
        line.refinement.changed(atNs: line.now)
        #expect(line.refinement.nextPassNs == line.now + SettleRefinement.settleDelayNs)
        #expect(line.refinement.passes == 0)
    }

    @Test func aRunOfEmptyPassesEndsItAndOneRealPassBreaksTheRun() {
        var line = Timeline()
        var endedEarly = false
        for _ in 0..<(SettleRefinement.emptyRunLimit - 1) { endedEarly = line.pass(bytes: line.empty, quantizer: 56) || endedEarly }
        endedEarly = line.pass(bytes: 5_000, quantizer: 50) || endedEarly
        for _ in 0..<(SettleRefinement.emptyRunLimit - 1) { endedEarly = line.pass(bytes: line.empty, quantizer: 56) || endedEarly }
        #expect(!endedEarly, "ended before 15 empty passes in a row")
        let ended = line.pass(bytes: line.empty, quantizer: 56)
        #expect(ended, "15 empty passes in a row did not end it")
        #expect(line.refinement.nextPassNs == nil)
    }

    @Test func smallPassesWhileTheQuantizerFallsAreNotStuck() {
        // Measured at 1080p, 2.5 Mbit/s after the keyframe: 9 passes of 858–989 bytes at q 56, then
        // 698, 225, 513 and 516 bytes at q 52, 48, 44, 40, then 2 KB and up. The falling ones reset
        // the count, so such a start never adds up to the limit.
        var line = Timeline()
        var ended = false
        for _ in 0..<(SettleRefinement.emptyRunLimit - 1) { ended = line.pass(bytes: line.empty, quantizer: 56) || ended }
        for quantizer in stride(from: 52, through: 12, by: -4) { ended = line.pass(bytes: line.empty, quantizer: quantizer) || ended }
        #expect(!ended)
        #expect(line.refinement.nextPassNs != nil)
    }

    @Test func aLinkTooSlowToConvergeStopsAtThePassLimit() {
        var line = Timeline()
        var endedAt: Int?
        for pass in 1...(SettleRefinement.passLimit + 10) where line.refinement.nextPassNs != nil {
            if line.pass(bytes: 3_000, quantizer: 50) { endedAt = pass }
        }
        #expect(endedAt == SettleRefinement.passLimit)
        #expect(line.refinement.passes == SettleRefinement.passLimit)
    }
}
