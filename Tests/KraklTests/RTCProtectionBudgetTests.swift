import Testing
@testable import KraklRTC

/// The protection budget on its own (the loopback test covers it in the publisher, the aiortc bottleneck
/// test on a real link). Its calls are mutating, so each is read into a constant before #expect.
@Suite struct RTCProtectionBudgetTests {
    let ms: UInt64 = 1_000_000
    let t: UInt64 = 5_000_000_000

    @Test func theEncoderGetsTheEstimateLessWhatProtectionTookInTheLastSecond() {
        var budget = ProtectionBudget(maximumShare: 0.5)
        let untouched = budget.mediaTarget(1_000_000, now: t)
        #expect(untouched == 1_000_000, "nothing sent: the encoder gets it all")
        budget.record(bytes: 10_000, now: t)             // 80 kbit
        budget.record(bytes: 5_000, now: t + 400 * ms)   // 40 kbit
        let rate = budget.rate(now: t + 500 * ms)
        let both = budget.mediaTarget(1_000_000, now: t + 500 * ms)
        #expect(rate == 120_000 && both == 880_000)
        // The first record leaves the window a second after it was made, the second 400 ms later.
        let second = budget.mediaTarget(1_000_000, now: t + 1_000 * ms)
        let none = budget.mediaTarget(1_000_000, now: t + 1_400 * ms)
        #expect(second == 960_000 && none == 1_000_000)
    }

    @Test func protectionNeverTakesMoreThanItsShare() {
        var budget = ProtectionBudget(maximumShare: 0.5)
        budget.record(bytes: 100_000, now: t)            // 800 kbit in one second
        let capped = budget.mediaTarget(1_000_000, now: t + ms)
        #expect(capped == 500_000, "the encoder keeps half however much was resent")
        let within = budget.mediaTarget(2_000_000, now: t + ms)
        #expect(within == 1_200_000, "below the share, only what was taken")
    }

    @Test func copiesFitOnlyWhileTheShareLasts() {
        var budget = ProtectionBudget(maximumShare: 0.5)
        // 500 kbit/s estimate: protection may send 250 kbit = 31 250 bytes in any second.
        let exactly = budget.allows(bytes: 31_250, target: 500_000, now: t)
        let oneMore = budget.allows(bytes: 31_251, target: 500_000, now: t)
        #expect(exactly && !oneMore)
        budget.record(bytes: 30_000, now: t)
        let rest = budget.allows(bytes: 1_250, target: 500_000, now: t + 10 * ms)
        let beyond = budget.allows(bytes: 1_251, target: 500_000, now: t + 10 * ms)
        #expect(rest && !beyond)
        let later = budget.allows(bytes: 31_250, target: 500_000, now: t + 1_000 * ms)
        #expect(later, "a second later the share is whole again")
        var noShare = ProtectionBudget(maximumShare: 0)
        let anything = noShare.allows(bytes: 1, target: 500_000, now: t)
        #expect(!anything, "share 0: no copies at all")
    }
}
