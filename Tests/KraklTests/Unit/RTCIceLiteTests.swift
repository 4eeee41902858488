import KraklBase
import KraklHost
import Foundation
import KraklRTC
import Testing

/// A full controlling agent against an ICE-lite one, datagrams passed by hand on a made-up clock.
@Suite(.tags(.unit)) struct RTCIceLiteTests {
    static let fullBase = TransportAddress(ip: IPAddress("127.0.0.2")!, port: 5000)
    static let liteBase = TransportAddress(ip: IPAddress("127.0.0.3")!, port: 6000)

    final class Pair {
        var now: UInt64 = 1_000_000_000
        let full = IceAgent(bases: [RTCIceLiteTests.fullBase], controlling: true)
        let lite = IceAgent(bases: [RTCIceLiteTests.liteBase], controlling: true, stunServers: [RTCIceLiteTests.fullBase], lite: true)
        var liteSent = 0
        var liteEvents: [IceEvent] = []
        var fullEvents: [IceEvent] = []
        /// Drop everything the full agent sends (its checks stop reaching the lite one).
        var cut = false

        init() {
            full.setRemote(credentials: lite.local, candidates: lite.localCandidates, now: now)
            lite.setRemote(credentials: full.local, candidates: full.localCandidates, now: now)
        }

        func run(milliseconds: Int) {
            for _ in 0..<milliseconds {
                now += 1_000_000
                if let due = full.nextDeadline, due <= now { full.tick(now: now) }
                if let due = lite.nextDeadline, due <= now { lite.tick(now: now) }
                for _ in 0..<4 {
                    let (toLite, fe) = full.drain()
                    fullEvents += fe
                    if !cut { for t in toLite { lite.receive(t.bytes, from: t.localBase, base: t.to, now: now) } }
                    let (toFull, le) = lite.drain()
                    liteEvents += le
                    for t in toFull where t.to == RTCIceLiteTests.fullBase {
                        // Only answers go back: a lite agent's own requests would be a bug (counted below).
                        if let message = try? StunMessage(parsing: t.bytes), message.messageClass == .request { liteSent += 1 }
                        full.receive(t.bytes, from: t.localBase, base: t.to, now: now)
                    }
                }
            }
        }
    }

    @Test func theLiteSideAnswersNeverAsksAndIsSelectedByTheNomination() {
        let pair = Pair()
        #expect(pair.lite.lite && !pair.lite.controlling, "lite is always controlled")
        pair.run(milliseconds: 2000)
        #expect(pair.liteSent == 0 && pair.lite.checksSent == 0)
        #expect(pair.lite.selected != nil && pair.full.selected != nil)
        #expect(pair.lite.selected?.remoteAddress == RTCIceLiteTests.fullBase)
        #expect(pair.liteEvents.filter { if case .selected = $0 { return true } else { return false } }.count == 1)
        #expect(pair.lite.localCandidates.allSatisfy { $0.kind == .host }, "no server-reflexive gathering for a lite agent")
    }

    @Test func thePeersConsentChecksKeepItAliveAndTheirAbsenceEndsIt() {
        let pair = Pair()
        pair.run(milliseconds: 1000)
        // 40 s of the full side's consent checks (every ~5 s): still connected.
        pair.run(milliseconds: 40_000)
        #expect(pair.lite.phase == .connected && !pair.liteEvents.contains(.consentExpired))
        #expect(pair.liteSent == 0)
        // The peer goes silent: consent expires after 30 s, as for a full agent.
        pair.cut = true
        pair.run(milliseconds: 31_000)
        #expect(pair.liteEvents.contains(.consentExpired))
    }

    /// An ICE restart asked by the full (controlling) peer, as a WHEP PATCH brings it: the lite side takes
    /// new credentials at once, while the peer still checks the old pair with the old ones for a while
    /// (its new offer/answer takes time); those checks are answered and keep consent. When the peer's new
    /// generation nominates, the lite side selects again (even on the same addresses) and refuses the
    /// old generation from then on.
    @Test func aRestartKeepsTheOldPairUntilTheNewGenerationNominates() throws {
        let pair = Pair()
        pair.run(milliseconds: 1000)
        let before = try #require(pair.lite.selected)
        let oldLite = pair.lite.local, oldFull = pair.full.local
        let selectedBefore = pair.liteEvents.filter { if case .selected = $0 { return true } else { return false } }.count
        // The lite side restarts with the peer's new credentials (the PATCH); the peer itself is still
        // on the old generation for 35 s: longer than the consent timeout.
        let fullNew = IceCredentials.random(), liteNew = IceCredentials.random()
        pair.lite.restart(credentials: liteNew, now: pair.now)
        pair.lite.setRemote(credentials: fullNew, candidates: pair.full.localCandidates, now: pair.now)
        #expect(pair.lite.local == liteNew && pair.lite.local != oldLite)
        pair.run(milliseconds: 35_000)
        #expect(!pair.liteEvents.contains(.consentExpired), "the old generation's consent checks must keep the old pair")
        #expect(pair.lite.phase == .connected && pair.lite.selected?.key == before.key)
        #expect(!pair.fullEvents.contains(.consentExpired) && pair.full.phase == .connected)
        // The peer applies the answer: its restart, then checks and nomination with the new credentials.
        pair.full.restart(credentials: fullNew, now: pair.now)
        pair.full.setRemote(credentials: liteNew, candidates: pair.lite.localCandidates, now: pair.now)
        pair.run(milliseconds: 2000)
        let selectedAfter = pair.liteEvents.filter { if case .selected = $0 { return true } else { return false } }.count
        #expect(selectedAfter == selectedBefore + 1, "the new generation's nomination selects (again)")
        #expect(pair.lite.selected != nil && pair.liteSent == 0)
        // The old generation is forgotten: its check now gets 401.
        let check = StunMessage.bindingRequest(username: "\(oldLite.ufrag):\(oldFull.ufrag)", priority: 1, controlling: true, tieBreaker: 1,
                                               useCandidate: false)
        pair.lite.receive(check.encoded(integrityKey: StunMessage.shortTermKey(password: oldLite.pwd), fingerprint: true),
                          from: RTCIceLiteTests.fullBase, base: RTCIceLiteTests.liteBase, now: pair.now)
        let answers = pair.lite.drain().transmits.compactMap { try? StunMessage(parsing: $0.bytes) }
        #expect(answers.count == 1 && answers.first?.errorCode?.code == 401, "\(answers.map(\.messageClass))")
        // Consent goes on with the new generation.
        pair.run(milliseconds: 40_000)
        #expect(!pair.liteEvents.contains(.consentExpired) && pair.lite.phase == .connected)
    }
}
