@testable import KraklRTC
import Testing

/// What a publisher keeps of the frames encoded while ICE and DTLS connect: a decodable chain (the
/// newest keyframe and what follows it), within its bounds, and nothing stale.
@Suite(.tags(.unit)) struct RTCEarlyFramesTests {
    static let second: UInt64 = 1_000_000_000

    static func frame(_ id: UInt8, key: Bool = false, bytes: Int = 10, at ms: UInt64) -> OutgoingVideoFrame {
        OutgoingVideoFrame(data: [id] + [UInt8](repeating: 0, count: bytes - 1), keyframe: key,
                           captureNs: 10 * second + ms * 1_000_000, width: 64, height: 64)
    }

    static func ids(_ frames: [OutgoingVideoFrame]) -> [UInt8] { frames.map { $0.data[0] } }

    @Test func theChainStartsAtTheNewestKeyframe() {
        var early = EarlyFrames()
        let first = early.add([Self.frame(1, at: 0), Self.frame(2, key: true, at: 33), Self.frame(3, at: 66)])
        let second = early.add([Self.frame(4, key: true, at: 100), Self.frame(5, at: 133)])
        let taken = early.take(now: 10 * Self.second + 150_000_000)
        #expect(Self.ids(taken.chain) == [4, 5] && taken.discarded == 0)
        #expect(first + second == 3, "the inter frame without a keyframe and the older chain (2, 3) are given up")
        #expect(early.isEmpty && early.take(now: 11 * Self.second).chain.isEmpty, "taking empties the store")
    }

    @Test func interFramesWithoutAKeyframeAreNotKept() {
        var early = EarlyFrames()
        #expect(early.add([Self.frame(1, at: 0), Self.frame(2, at: 33)]) == 2)
        #expect(early.take(now: 10 * Self.second).chain.isEmpty)
    }

    @Test func aChainPastItsFrameOrByteBoundIsGivenUp() {
        var byCount = EarlyFrames(maximumFrames: 3)
        byCount.add([Self.frame(1, key: true, at: 0), Self.frame(2, at: 1), Self.frame(3, at: 2)])
        #expect(!byCount.isEmpty)
        let given = byCount.add([Self.frame(4, at: 3)])
        #expect(byCount.isEmpty && given == 4, "a fourth frame would exceed 3: the chain goes")
        byCount.add([Self.frame(5, at: 4)])
        #expect(byCount.take(now: 10 * Self.second).chain.isEmpty, "and inter frames after it cannot start a chain")

        var byBytes = EarlyFrames(maximumBytes: 1000)
        byBytes.add([Self.frame(1, key: true, bytes: 600, at: 0), Self.frame(2, bytes: 300, at: 1)])
        #expect(Self.ids(byBytes.take(now: 10 * Self.second).chain) == [1, 2], "900 bytes fit in 1000")
        byBytes.add([Self.frame(3, key: true, bytes: 600, at: 2), Self.frame(4, bytes: 500, at: 3)])
        #expect(byBytes.take(now: 10 * Self.second).chain.isEmpty, "1100 bytes do not")
        byBytes.add([Self.frame(5, key: true, bytes: 1200, at: 4)])
        #expect(Self.ids(byBytes.take(now: 10 * Self.second).chain) == [5], "a keyframe alone is kept whatever its size")
    }

    @Test func aStaleChainIsNotSent() {
        var early = EarlyFrames(maximumAge: .seconds(1))
        early.add([Self.frame(1, key: true, at: 0), Self.frame(2, at: 33)])
        let stale = early.take(now: 10 * Self.second + 1_001_000_000)
        #expect(stale.chain.isEmpty, "1.001 s after its keyframe was captured")
        #expect(stale.discarded == 2)
        early.add([Self.frame(3, key: true, at: 0)])
        #expect(Self.ids(early.take(now: 10 * Self.second + 999_000_000).chain) == [3])
        early.add([Self.frame(4, key: true, at: 500)])
        #expect(Self.ids(early.take(now: 10 * Self.second).chain) == [4], "a capture time after now (another clock's rounding) is not stale")
    }
}
