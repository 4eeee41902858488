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

    /// The band of block rows refining what stopped changing: which blocks it adds to a frame.
    @Test func theBandLeavesOutBlocksThatConvergedAndTakesBackOnesThatChangedCoarsely() {
        // 1920×1080: 120×68 blocks, a band of 5 rows (68 / 15 rounded up), 14 frames a sweep.
        var band = RefinementBand(width: 1920, height: 1080)
        let blocks = band.columns * band.rows
        func frame(damage: [Int] = [], quantizer: Int?) -> [UInt8] {
            var map = [UInt8](repeating: 0, count: blocks)
            for index in damage { map[index] = 1 }
            band.add(to: &map)
            band.encoded(map: map, quantizer: quantizer)
            return map
        }
        // Nothing converged yet: the first frame's band is its first 5 rows, whole.
        let first = frame(quantizer: 20)
        #expect(first.prefix(5 * 120).allSatisfy { $0 == 1 } && first.dropFirst(5 * 120).allSatisfy { $0 == 0 })
        // A sweep at the converged quantizer (14 frames), then the band adds nothing at all.
        for _ in 0..<14 { _ = frame(quantizer: SettleRefinement.convergedQuantizer) }
        let quiet = (0..<14).map { _ in frame(quantizer: 2).reduce(0) { $0 + Int($1) } }
        #expect(quiet.allSatisfy { $0 == 0 }, "blocks a frame once converged: \(quiet)")
        // A block that changed in a coarse frame (q 40) comes back into the band on its row's turn.
        let changed = 30 * 120 + 7
        _ = frame(damage: [changed], quantizer: 40)
        let sweep = (0..<14).map { _ in frame(quantizer: 2) }
        #expect(sweep.filter { $0[changed] == 1 }.count == 1, "the coarse block was not refined once in a sweep")
        #expect(sweep.map { $0.reduce(0) { $0 + Int($1) } }.reduce(0, +) == 1, "the band took other blocks too")
        // A frame of every block (a keyframe, a pass) at an unknown quantizer: nothing counts as converged.
        band.encoded(map: nil, quantizer: nil)
        #expect(band.converged.allSatisfy { !$0 })
    }
}
