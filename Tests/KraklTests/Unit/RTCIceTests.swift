import Foundation
import Glibc
import KraklBase
import KraklRTC
import Testing

/// Two of our ICE agents wired together in memory with a fake clock, so the
/// pair state machine, nomination, role conflicts and consent can be
/// checked step by step. The wire may drop datagrams.
final class IceTestWire {
    let a: IceAgent
    let b: IceAgent
    var now: UInt64 = 1_000_000_000
    var eventsA: [IceEvent] = []
    var eventsB: [IceEvent] = []
    var delivered = 0
    var transmitsA: [IceTransmit] = []
    /// Returns false to drop a datagram; `fromA` tells the direction.
    var filter: (_ fromA: Bool, _ transmit: IceTransmit) -> Bool = { _, _ in true }

    init(a: IceAgent, b: IceAgent) {
        self.a = a
        self.b = b
    }

    static let addressA = TransportAddress(ip: IPAddress("10.0.0.1")!, port: 1000)
    static let addressB = TransportAddress(ip: IPAddress("10.0.0.2")!, port: 2000)

    /// Delivers pending datagrams both ways until none are left (bounded).
    func flush() {
        for _ in 0..<100 {
            let (ta, ea) = a.drain()
            let (tb, eb) = b.drain()
            eventsA += ea
            eventsB += eb
            transmitsA += ta
            if ta.isEmpty && tb.isEmpty { return }
            for t in ta where filter(true, t) && t.to == IceTestWire.addressB {
                delivered += 1
                b.receive(t.bytes, from: t.localBase, base: t.to, now: now)
            }
            for t in tb where filter(false, t) && t.to == IceTestWire.addressA {
                delivered += 1
                a.receive(t.bytes, from: t.localBase, base: t.to, now: now)
            }
        }
    }

    /// Advances the clock in `step` increments, ticking each agent when it is due, until
    /// `done` or `seconds` of fake time pass. Returns `done`.
    @discardableResult
    func run(seconds: Double, step: UInt64 = 5_000_000, until done: (IceTestWire) -> Bool = { _ in false }) -> Bool {
        let end = now + UInt64(seconds * 1e9)
        while now < end {
            flush()
            if done(self) { return true }
            now += step
            if let due = a.nextDeadline, due <= now { a.tick(now: now) }
            if let due = b.nextDeadline, due <= now { b.tick(now: now) }
        }
        flush()
        return done(self)
    }

    func selected(_ events: [IceEvent]) -> IceCandidatePair? {
        for case .selected(let pair) in events.reversed() { return pair }
        return nil
    }

    /// Both agents with each other's credentials and host candidates.
    static func connected(aControlling: Bool = true, bControlling: Bool = false, giveBCandidates: Bool = true,
                          configuration: IceConfiguration = IceConfiguration()) -> IceTestWire {
        let a = IceAgent(bases: [addressA], controlling: aControlling, tieBreaker: 10, configuration: configuration)
        let b = IceAgent(bases: [addressB], controlling: bControlling, tieBreaker: 20, configuration: configuration)
        let wire = IceTestWire(a: a, b: b)
        a.setRemote(credentials: b.local, candidates: b.localCandidates, now: wire.now)
        b.setRemote(credentials: a.local, candidates: giveBCandidates ? a.localCandidates : [], now: wire.now)
        return wire
    }
}

@Suite(.tags(.unit)) struct RTCIceTests {
    @Test func pairPriorityFollowsRfc8445() {
        let local = IceCandidate(foundation: "1", priority: 2_130_706_431, address: "10.0.0.1", port: 1, kind: .host)
        let remote = IceCandidate(foundation: "2", priority: 1_694_498_815, address: "10.0.0.2", port: 2, kind: .srflx)
        let pair = IceCandidatePair(local: local, localBase: TransportAddress(ip: IPAddress("10.0.0.1")!, port: 1), remote: remote,
                                    remoteAddress: TransportAddress(ip: IPAddress("10.0.0.2")!, port: 2))
        // G = 2130706431 (ours, controlling), D = 1694498815: 2^32·D + 2·G + 1.
        let minimumPart: UInt64 = UInt64(1_694_498_815) << 32
        let maximumPart: UInt64 = 2 * 2_130_706_431
        let controllingPriority: UInt64 = minimumPart + maximumPart + 1
        let controlledPriority: UInt64 = minimumPart + maximumPart
        #expect(pair.priority(controlling: true) == controllingPriority)
        // Controlled: G is the remote's: 2^32·MIN + 2·MAX + 0, since G < D.
        #expect(pair.priority(controlling: false) == controlledPriority)
        #expect(IceCandidate.priority(kind: .host) == 2_130_706_431, "type preference 126, local 65535, component 1")
    }

    @Test func checkListFreezesByFoundationAndUnfreezesOnSuccess() {
        var list = IceCheckList(controlling: true)
        let base = TransportAddress(ip: IPAddress("10.0.0.1")!, port: 1000)
        let local = IceCandidate(foundation: "1", priority: IceCandidate.priority(kind: .host), address: "10.0.0.1", port: 1000, kind: .host)
        let remotes = [
            IceCandidate(foundation: "x", priority: IceCandidate.priority(kind: .host, localPreference: 65535), address: "10.0.0.2", port: 2000, kind: .host),
            IceCandidate(foundation: "x", priority: IceCandidate.priority(kind: .host, localPreference: 60000), address: "10.0.0.3", port: 2000, kind: .host),
            IceCandidate(foundation: "y", priority: IceCandidate.priority(kind: .srflx), address: "10.0.0.4", port: 2000, kind: .srflx),
        ]
        let keys = remotes.map { list.add(local: local, localBase: base, remote: $0) }
        #expect(keys.allSatisfy { $0 != nil })
        #expect(list.pairs.map(\.state) == [.waiting, .frozen, .waiting], "one waiting pair per foundation: \(list.pairs)")
        #expect(list.pairs.map(\.remoteAddress.ip.description) == ["10.0.0.2", "10.0.0.3", "10.0.0.4"], "sorted by pair priority")
        // Same base and remote address again: pruned, not added.
        #expect(list.add(local: local, localBase: base, remote: remotes[0]) == keys[0])
        #expect(list.pairs.count == 3)
        // Mixed families and port 0 never pair.
        #expect(list.add(local: local, localBase: base, remote: IceCandidate(foundation: "z", priority: 1, address: "::1", port: 5, kind: .host)) == nil)
        #expect(list.add(local: local, localBase: base, remote: IceCandidate(foundation: "z", priority: 1, address: "10.0.0.9", port: 0, kind: .host)) == nil)

        #expect(list.nextOrdinaryCheck() == keys[0]!)
        list.setState(keys[0]!, .inProgress)
        #expect(list.nextOrdinaryCheck() == keys[2]!, "the other foundation's waiting pair comes next")
        list.setState(keys[0]!, .succeeded)
        #expect(list[keys[1]!]?.state == .waiting, "a success unfreezes its foundation")
        #expect(list.bestSucceeded?.key == keys[0]!)
        #expect(!list.higherPriorityPending(than: keys[0]!))
        list.setState(keys[1]!, .failed)
        list.setState(keys[2]!, .failed)
        #expect(!list.allFailed)
        list.setState(keys[0]!, .failed)
        #expect(list.allFailed)
    }

    @Test func twoAgentsConnectAndAgreeOnTheNominatedPair() throws {
        let wire = IceTestWire.connected()
        let done = wire.run(seconds: 5) { $0.selected($0.eventsA) != nil && $0.selected($0.eventsB) != nil }
        #expect(done, "no selection: A \(wire.eventsA) B \(wire.eventsB)")
        let a = try #require(wire.selected(wire.eventsA))
        let b = try #require(wire.selected(wire.eventsB))
        #expect(a.remoteAddress == IceTestWire.addressB && a.localBase == IceTestWire.addressA)
        #expect(b.remoteAddress == IceTestWire.addressA && b.localBase == IceTestWire.addressB)
        #expect(a.nominated && b.nominated)
        #expect(wire.a.controlling && !wire.b.controlling)
        #expect(wire.a.phase == .connected && wire.b.phase == .connected)
        // The nominating check carried USE-CANDIDATE.
        let nominations = wire.transmitsA.compactMap { try? StunMessage(parsing: $0.bytes) }.filter { $0.messageClass == .request && $0.useCandidate }
        #expect(!nominations.isEmpty, "the controlling side never sent USE-CANDIDATE")
    }

    @Test func unknownSourceBecomesPeerReflexive() throws {
        // B never hears of A's candidates: it must learn A from A's check.
        let wire = IceTestWire.connected(giveBCandidates: false)
        #expect(wire.run(seconds: 5) { $0.selected($0.eventsB) != nil })
        let learned = try #require(wire.b.remoteCandidates.first)
        #expect(learned.kind == .prflx)
        #expect(learned.transportAddress == IceTestWire.addressA)
    }

    @Test func roleConflictResolvesToOneControllingSide() {
        // Both claim to control; the larger tie-breaker (B, 20) keeps the role.
        let wire = IceTestWire.connected(aControlling: true, bControlling: true)
        let done = wire.run(seconds: 10) { $0.selected($0.eventsA) != nil && $0.selected($0.eventsB) != nil }
        #expect(done, "no selection after a role conflict: A \(wire.eventsA) B \(wire.eventsB)")
        #expect(!wire.a.controlling && wire.b.controlling, "A (smaller tie-breaker) must yield")
    }

    @Test func badIntegrityGets401AndNoPair() throws {
        let b = IceAgent(bases: [IceTestWire.addressB], controlling: false)
        b.setRemote(credentials: IceCredentials(ufrag: "peer", pwd: "0123456789012345678901"), candidates: [], now: 1)
        let request = StunMessage.bindingRequest(username: "\(b.local.ufrag):peer", priority: 1, controlling: true, tieBreaker: 1)
        let forged = request.encoded(integrityKey: StunMessage.shortTermKey(password: "not-the-password-at-all"), fingerprint: true)
        b.receive(forged, from: IceTestWire.addressA, base: IceTestWire.addressB, now: 2)
        let (transmits, _) = b.drain()
        let reply = try StunMessage(parsing: try #require(transmits.first).bytes)
        #expect(reply.messageClass == .errorResponse && reply.errorCode?.code == 401)
        #expect(b.checkList.pairs.isEmpty && b.remoteCandidates.isEmpty)
        // Garbage and truncated STUN are dropped without a reply.
        b.receive([0, 1, 0, 0], from: IceTestWire.addressA, base: IceTestWire.addressB, now: 3)
        b.receive(Array(forged.prefix(30)), from: IceTestWire.addressA, base: IceTestWire.addressB, now: 3)
        #expect(b.drain().transmits.isEmpty)
    }

    @Test func successResponseCarriesTheSourceAndAuthenticates() throws {
        let b = IceAgent(bases: [IceTestWire.addressB], controlling: false)
        b.setRemote(credentials: IceCredentials(ufrag: "peer", pwd: "0123456789012345678901"), candidates: [], now: 1)
        let request = StunMessage.bindingRequest(username: "\(b.local.ufrag):peer", priority: 77, controlling: true, tieBreaker: 1)
        b.receive(request.encoded(integrityKey: StunMessage.shortTermKey(password: b.local.pwd), fingerprint: true),
                  from: IceTestWire.addressA, base: IceTestWire.addressB, now: 2)
        let (transmits, _) = b.drain()
        let reply = try StunMessage(parsing: try #require(transmits.first).bytes)
        #expect(reply.messageClass == .successResponse && reply.transactionID == request.transactionID)
        #expect(reply.xorMappedAddress == IceTestWire.addressA)
        #expect((try? reply.validateIntegrity(key: StunMessage.shortTermKey(password: b.local.pwd))) != nil)
        #expect((try? reply.validateFingerprint()) != nil)
        // The check's source became a peer-reflexive candidate with the PRIORITY it carried.
        #expect(b.remoteCandidates.first?.priority == 77)
    }

    @Test func consentKeepsTheSessionAliveAndExpiresWhenThePeerGoesQuiet() {
        let wire = IceTestWire.connected()
        #expect(wire.run(seconds: 5) { $0.selected($0.eventsA) != nil })
        // 20 s with the peer answering: consent checks every ~5 s, each answered.
        wire.run(seconds: 20)
        #expect(wire.a.consentResponses >= 3, "consent checks answered: \(wire.a.consentResponses)")
        #expect(!wire.eventsA.contains(.consentExpired))
        // The peer goes silent: consent must expire 30 s after its last answer, not before, not much after.
        wire.filter = { fromA, _ in fromA }
        let lastAnswer = Double(wire.now) / 1e9 - wire.a.secondsSinceConsent(now: wire.now)
        #expect(wire.run(seconds: 40) { $0.eventsA.contains(.consentExpired) }, "no expiry after 40 s of silence: \(wire.eventsA)")
        let expiredAfter = Double(wire.now) / 1e9 - lastAnswer
        #expect(expiredAfter >= 30 && expiredAfter <= 30.1, "consent expired \(expiredAfter) s after the last answer")
        #expect(wire.a.phase == .failed)
        // Nothing more is sent once consent is gone.
        let sentBefore = wire.transmitsA.count
        wire.run(seconds: 10)
        #expect(wire.transmitsA.count == sentBefore, "checks went on after consent expired")
    }

    @Test func checksAreRetransmittedUnderLoss() {
        // Drop every other datagram from A: retransmissions still connect.
        let wire = IceTestWire.connected()
        var count = 0
        wire.filter = { fromA, _ in
            guard fromA else { return true }
            count += 1
            return count % 2 == 0
        }
        #expect(wire.run(seconds: 10) { $0.selected($0.eventsA) != nil && $0.selected($0.eventsB) != nil })
    }

    @Test func iceRestartNominatesAgainWithNewCredentials() throws {
        let wire = IceTestWire.connected()
        #expect(wire.run(seconds: 5) { $0.selected($0.eventsA) != nil })
        let before = wire.eventsA.filter { if case .selected = $0 { return true } else { return false } }.count
        let oldCredentials = wire.a.local
        wire.a.restart(credentials: .random(), now: wire.now)
        wire.b.restart(credentials: .random(), now: wire.now)
        #expect(wire.a.local != oldCredentials)
        #expect(wire.a.selected != nil, "media keeps its pair during a restart")
        wire.a.setRemote(credentials: wire.b.local, candidates: wire.b.localCandidates, now: wire.now)
        wire.b.setRemote(credentials: wire.a.local, candidates: wire.a.localCandidates, now: wire.now)
        let done = wire.run(seconds: 5) { w in
            w.eventsA.filter { if case .selected = $0 { return true } else { return false } }.count > before
        }
        #expect(done, "no new nomination after the restart: \(wire.eventsA)")
    }

    @Test func addressPolicyKeepsLoopbackAndLinkLocalOut() {
        let policy = IceAddressPolicy()
        #expect(!policy.admits(IPAddress("127.0.0.1")!))
        #expect(!policy.admits(IPAddress("::1")!))
        #expect(!policy.admits(IPAddress("fe80::1")!))
        #expect(policy.admits(IPAddress("192.0.2.7")!))
        let only = IceAddressPolicy(allowed: [IPAddress("127.0.0.2")!])
        #expect(only.admits(IPAddress("127.0.0.2")!))
        #expect(!only.admits(IPAddress("192.0.2.7")!))
        let noV6 = IceAddressPolicy(includeIPv6: false)
        #expect(!noV6.admits(IPAddress("2001:db8::1")!))
        // The real interfaces: loopback appears only when asked for.
        #expect(!IceHostAddresses.gather(IceAddressPolicy()).contains { $0.isLoopback })
        #expect(IceHostAddresses.gather(IceAddressPolicy(includeLoopback: true)).contains(IPAddress("127.0.0.1")!))
        #expect(IceHostAddresses.gather(IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])) == [IPAddress("127.0.0.1")!])
    }
}

@Suite(.tags(.unit)) struct RTCIceEventLoopTests {
    @Test func timersFireInDeadlineOrderAndPostsWakeTheLoop() throws {
        let loop = try EventLoop(name: "test-loop")
        loop.start()
        defer { loop.stop() }
        let condition = Condition()
        var order: [Int] = []
        let start = DispatchTime.now().uptimeNanoseconds
        loop.post {
            let now = DispatchTime.now().uptimeNanoseconds
            loop.schedule(at: now + 30_000_000) { condition.lock(); order.append(3); condition.broadcast(); condition.unlock() }
            loop.schedule(at: now + 10_000_000) { condition.lock(); order.append(1); condition.unlock() }
            let cancelled = loop.schedule(at: now + 20_000_000) { condition.lock(); order.append(99); condition.unlock() }
            loop.schedule(at: now + 20_000_000) { condition.lock(); order.append(2); condition.unlock() }
            loop.cancel(cancelled)
        }
        condition.lock()
        _ = condition.wait(while: { order.count < 3 }, until: Date().addingTimeInterval(5))
        let seen = order
        condition.unlock()
        let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
        #expect(seen == [1, 2, 3], "timers fired as \(seen)")
        #expect(elapsed >= 29, "the last timer fired early: \(elapsed) ms")
    }

    @Test func udpSocketsCarryDatagramsThroughTheLoop() throws {
        let loop = try EventLoop(name: "test-udp")
        let a = try UdpSocket(bindTo: IPAddress("127.0.0.1")!)
        let b = try UdpSocket(bindTo: IPAddress("127.0.0.1")!)
        #expect(a.localAddress.port != 0 && a.localAddress.port != b.localAddress.port)
        let condition = Condition()
        var received: [[UInt8]] = []
        var from: TransportAddress?
        loop.start()
        defer { loop.stop() }
        loop.post {
            var buffer = [UInt8](repeating: 0, count: 2048)
            loop.watch(fd: b.fd) {
                while let (bytes, source) = b.receive(&buffer) {
                    condition.lock(); received.append(bytes); from = source; condition.broadcast(); condition.unlock()
                }
            }
        }
        for i in 0..<5 { #expect(a.send([UInt8(i), 1, 2, 3], to: b.localAddress)) }
        condition.lock()
        _ = condition.wait(while: { received.count < 5 }, until: Date().addingTimeInterval(5))
        condition.unlock()
        #expect(received.map { $0[0] } == [0, 1, 2, 3, 4])
        #expect(from == a.localAddress)
        #expect(loop.stop(timeout: .seconds(5)), "the loop thread did not end")
    }
}
