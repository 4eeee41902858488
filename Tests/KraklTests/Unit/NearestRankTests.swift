import KraklBase
import KraklHost
import Testing

/// The one percentile rule every p50/p99 in the agent, the probe and the bench uses.
@Suite(.tags(.unit)) struct NearestRankTests {
    @Test func nearestRankPicksTheElementAtCountTimesP() {
        let values = Array(1...100).map(Double.init)
        #expect(values.nearestRank(0.5) == 51 && values.nearestRank(0.99) == 100 && values.nearestRank(0) == 1)
        #expect(values.nearestRank(1) == 100, "p = 1 stays inside the array")
        #expect([UInt64]().nearestRank(0.5) == nil)
        #expect([7].nearestRank(0.99) == 7)
    }
}
