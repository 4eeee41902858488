import Foundation
import Testing
import KraklRoom
@testable import KraklSession

/// Every candidate of ours reaches the room, then end-of-candidates (issue 24): the agent in a WHIP
/// room on aiortc with coturn beside it, nftables dropping every UDP packet that is not to or from
/// the TURN server or its relay ports, so the only path is relayed. The WHIP server (whip_server.py)
/// records the offer's candidates and every trickle PATCH, and hands the trickled candidates to
/// aiortc as a browser's `addIceCandidate` would (end-of-candidates as `None`).
///
/// Before the fix, a relay candidate allocated while the offer was on its way was dropped (a WHIP
/// server has no resource to PATCH before it answers), end-of-candidates was never sent, and
/// relay-only with the TURN server only in the answer's `Link` header failed at once.
@Suite(.serialized, .tags(.integration, .netns)) struct CandidateDeliveryTests {
    enum TurnFrom: String, Sendable, CustomTestStringConvertible {
        /// `--ice-server turn:…` on the command line.
        case flag
        /// The join code's `ice=` field.
        case code
        /// The WHIP server's answer: `Link: <turn:…>; rel="ice-server"`.
        case link
        var testDescription: String { rawValue }
    }

    static let turnURL = "turn:127.0.0.2:3478?transport=udp"
    static let link = #"<turn:127.0.0.2:3478?transport=udp>; rel="ice-server"; username="u"; credential="p""#

    @Test(arguments: [(TurnFrom.flag, false), (.flag, true), (.code, false), (.code, true), (.link, false), (.link, true)])
    func relayCandidatesReachTheRoomThenEndOfCandidates(from: TurnFrom, relayOnly: Bool) throws {
        guard let room = try RoomSessionTests.WhipRoom(from == .link ? ["--link", Self.link] : []),
              let turn = try CoturnServer.start(in: room.namespace, extra: ["-v"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: room.namespace) else {
            return skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
        }
        let (code, _) = try room.codeFile(identity: "Ann", ice: from == .code ? [Self.turnURL + ",u,p"] : [])
        var extra = from == .flag ? ["--ice-server", Self.turnURL + ",u,p"] : []
        if relayOnly { extra += ["--ice-transport", "relay"] }
        let agent = try room.agent(codeFile: code, extra: extra)
        defer { agent.stop() }
        let label = "TURN from \(from.rawValue)\(relayOnly ? ", relay-only" : "")"
        #expect(agent.waitFor("sharing the screen", timeout: 30), "\(label): the agent never shared: \(agent.log.suffix(1500))")

        // End-of-candidates is the last thing trickled (bounded wait: gathering ends with the allocation).
        let ended = whipPoll(timeout: 15) { room.server.requests("PATCH").contains { $0["end_of_candidates"] as? Bool == true } }
        let offer = room.server.events("offer").first ?? [:]
        let patches = room.server.requests("PATCH")
        let trickled = patches.flatMap { $0["candidates"] as? [String] ?? [] }
        let offered = offer["candidates"] as? [String] ?? []
        print("\(label): offer candidates \(offered.map(Self.kind)), trickle \(offer["trickle"] ?? "?"); "
              + "PATCHes: \(patches.map { "\(($0["candidates"] as? [String] ?? []).map(Self.kind))\($0["end_of_candidates"] as? Bool == true ? " end" : "")" })")
        #expect(ended, "\(label): no PATCH said a=end-of-candidates: \(patches)")
        #expect(offer["trickle"] as? Bool == true && offer["end_of_candidates"] as? Bool == false,
                "\(label): the offer must announce trickle and not end its candidates: \(offer)")
        #expect(trickled.contains { Self.kind($0) == "relay" }, "\(label): no relay candidate reached the room: \(patches)")
        // Nothing after "no more", and every candidate once.
        if let end = patches.firstIndex(where: { $0["end_of_candidates"] as? Bool == true }) {
            let after = patches[(end + 1)...].flatMap { $0["candidates"] as? [String] ?? [] }
            #expect(after.isEmpty, "\(label): candidates after end-of-candidates: \(after)")
            #expect(patches[end]["candidates"] as? [String] == [], "\(label): the end came with candidates: \(patches[end])")
        }
        #expect(Set(trickled).count == trickled.count, "\(label): a candidate was sent twice: \(trickled)")
        if relayOnly {
            #expect((offered + trickled).allSatisfy { Self.kind($0) == "relay" }, "\(label): relay-only signalled another kind: \(offered + trickled)")
        }
        // aiortc took them (addIceCandidate), and the end (None).
        let applied = room.server.events("trickled")
        #expect(applied.contains { ($0["applied"] as? Int ?? 0) >= 1 }, "\(label): aiortc was given no candidate: \(applied)")
        #expect(applied.contains { $0["end"] as? Bool == true }, "\(label): aiortc was not told the end: \(applied)")

        // The media is relayed: the only path left.
        #expect(agent.waitFor("connected relay/udp -> host", timeout: 10), "\(label): no relayed pair in the status line: \(agent.log.suffix(600))")
        let pair = room.server.waitForEvent("pair", timeout: 5) ?? [:]
        print("\(label): aiortc's nominated pair: local \(pair["local_type"] ?? "?"), remote \(pair["remote_type"] ?? "?") \(pair["remote"] ?? "")")
        // The receiver's pair goes to the relay address we trickled. aioice names it "relay" when the
        // PATCH came before our first check through the relay (every run so far), "prflx" when the
        // check won the race; either way the address is the signalled one.
        let relayAddresses = trickled.filter { Self.kind($0) == "relay" }.map(Self.address)
        #expect(relayAddresses.contains(pair["remote"] as? String ?? "-"), "\(label): aiortc's pair \(pair) is not to a trickled relay candidate \(relayAddresses)")
        #expect(turn.process.log.contains("ALLOCATE processed, success"), "\(label): no allocation: \(turn.process.log.suffix(1500))")
        agent.signal(SIGTERM)
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 10)
        #expect(status == 0, "\(label): exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(600))")
    }

    /// Janus, with its own ICE agent (libnice): the relay candidate allocated while the offer was
    /// on its way is trickled once Janus answered, then `{"completed": true}`; Janus's admin API
    /// shows the relay candidate among the remote candidates it was given, the end of candidates
    /// (its all-trickles flag), and a selected pair to our relay.
    @Test(arguments: [false, true])
    func janusGetsTheRelayCandidateAndTheEnd(relayOnly: Bool) throws {
        guard let room = try RoomSessionTests.JanusRoom(),
              let turn = try CoturnServer.start(in: room.namespace, extra: ["-v"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: room.namespace) else {
            return skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
        }
        let (code, _) = try room.codeFile(identity: "Jan")
        let agent = try room.agent(codeFile: code, extra: ["--ice-server", Self.turnURL + ",u,p"] + (relayOnly ? ["--ice-transport", "relay"] : []))
        defer { agent.stop() }
        let label = "Janus, TURN from the flag\(relayOnly ? ", relay-only" : "")"
        #expect(agent.waitFor("connected relay/udp -> host", timeout: 30), "\(label): no relayed pair: \(agent.log.suffix(1500))")
        let ice = try room.host(["ice", "--display", "Jan"])
        let remote = ice["remote_candidates"] as? [String] ?? []
        let pair = ice["selected_pair"] as? String ?? ""
        print("\(label): Janus was given \(remote.map(Self.kind)), all-trickles \((ice["flags"] as? [String: Any])?["all-trickles"] ?? "?"), selected pair \(pair)")
        #expect(ice["found"] as? Bool == true, "\(label): Janus's admin API shows no publisher handle: \(ice)")
        #expect(remote.contains { Self.kind($0) == "relay" }, "\(label): Janus was not given the relay candidate: \(remote)")
        if relayOnly { #expect(remote.allSatisfy { Self.kind($0) == "relay" }, "\(label): relay-only signalled another kind: \(remote)") }
        #expect((ice["flags"] as? [String: Any])?["all-trickles"] as? Int == 1, "\(label): Janus was not told the end of candidates: \(ice)")
        // "LOCAL [host,udp] <-> REMOTE [TYPE,udp]": Janus's media goes to a relay address we trickled.
        let relays = remote.filter { Self.kind($0) == "relay" }.map(Self.address)
        let pairRemote = pair.components(separatedBy: " <-> ").last?.split(separator: " ").first.map(String.init) ?? "-"
        #expect(relays.contains(pairRemote), "\(label): Janus's selected pair \(pair) is not to a trickled relay candidate \(relays)")
        agent.signal(SIGTERM)
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 10)
        #expect(status == 0, "\(label): exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(600))")
        withExtendedLifetime(turn) {}
    }

    /// TURN over TCP, relay-only: the candidate reaches the room the same way, and the status line
    /// names the transport that leaves this machine.
    @Test func aTcpRelayIsTrickledAndNamed() throws {
        guard let room = try RoomSessionTests.WhipRoom(), let turn = try CoturnServer.start(in: room.namespace, extra: ["-v"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: room.namespace) else {
            return skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
        }
        let (code, _) = try room.codeFile(identity: "Ann")
        let agent = try room.agent(codeFile: code, extra: ["--ice-server", "turn:127.0.0.2:3478?transport=tcp,u,p", "--ice-transport", "relay"])
        defer { agent.stop() }
        #expect(agent.waitFor("connected relay/tcp -> host", timeout: 30), "no relay/tcp pair in the status line: \(agent.log.suffix(800))")
        #expect(Self.relayThenEnd(room.server), "the room was not sent the relay candidate and the end: \(room.server.requests("PATCH"))")
        agent.signal(SIGTERM)
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 10)
        #expect(status == 0, "exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(600))")
        withExtendedLifetime(turn) {}
    }

    /// Whether the WHIP server got a relay candidate by PATCH, then end-of-candidates (waits, bounded).
    static func relayThenEnd(_ server: WhipTestServer) -> Bool {
        _ = whipPoll(timeout: 15) { server.requests("PATCH").contains { $0["end_of_candidates"] as? Bool == true } }
        let patches = server.requests("PATCH")
        guard let relay = patches.firstIndex(where: { ($0["candidates"] as? [String] ?? []).contains { kind($0) == "relay" } }),
              let end = patches.firstIndex(where: { $0["end_of_candidates"] as? Bool == true }) else { return false }
        return relay <= end
    }

    /// Wrong TURN credentials, relay-only: not a lost connection (32) but the relay's refusal, 57.
    @Test func refusedCredentialsHaveTheirOwnStatus() throws {
        guard let room = try RoomSessionTests.WhipRoom(), let turn = try CoturnServer.start(in: room.namespace) else { return }
        guard try CoturnServer.blockDirectUdp(in: room.namespace) else {
            return skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
        }
        let (code, _) = try room.codeFile(identity: "Ann")
        let agent = try room.agent(codeFile: code, extra: ["--ice-server", Self.turnURL + ",u,wrong-pw", "--ice-transport", "relay"])
        defer { agent.stop() }
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 40)
        let log = agent.log
        print("wrong TURN credentials: exit \(status.map(String.init) ?? "none"): \(log.split(whereSeparator: \.isNewline).last { $0.contains("TURN") } ?? "-")")
        #expect(status == 57, "exit \(status.map(String.init) ?? "none") (57 = the relay refused our credentials): \(log.suffix(800))")
        #expect(log.contains("refused our credentials"), "unclear: \(log.suffix(800))")
        #expect(!log.contains("wrong-pw"), "the credential was printed")
        withExtendedLifetime(turn) {}
    }

    /// `typ` of an `a=candidate` value: host, srflx, relay.
    /// "IP:port" of an `a=candidate:` line (foundation component transport priority IP port typ …).
    static func address(_ candidate: String) -> String {
        let fields = candidate.split(separator: " ")
        guard let index = fields.firstIndex(of: "typ"), index >= 2 else { return "?" }
        return "\(fields[index - 2]):\(fields[index - 1])"
    }

    static func kind(_ candidate: String) -> String {
        let fields = candidate.split(separator: " ")
        guard let index = fields.firstIndex(of: "typ"), index + 1 < fields.count else { return "?" }
        return String(fields[index + 1])
    }
}

/// The forwarder's order, with a driver that only records what it is asked: held until the answer,
/// one batch, then one by one, end-of-candidates last and only after the answer.
@Suite(.tags(.unit)) struct CandidateForwarderOrderTests {
    final class RecordingDriver: RoomDriver, @unchecked Sendable {
        let service = "recording"
        var onEvent: (@Sendable (RoomEvent) -> Void)?
        private let lock = NSLock()
        private var calls: [String] = []
        var recorded: [String] { lock.withLock { calls } }
        func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer { RoomAnswer(sdp: "") }
        func restart(offer: String) throws(RoomError) -> String { "" }
        func trickle(candidate: String, mid: String) { lock.withLock { calls.append("one \(candidate) \(mid)") } }
        func trickle(candidates: [String], mid: String) { lock.withLock { calls.append("batch \(candidates.joined(separator: ",")) \(mid)") } }
        func endOfCandidates() { lock.withLock { calls.append("end") } }
        func leave() {}
    }

    @Test func heldUntilTheAnswerThenInOrderThenTheEnd() {
        let driver = RecordingDriver()
        let forwarder = CandidateForwarder(driver: driver, mid: "0")
        forwarder.add("a")
        forwarder.add("b")
        forwarder.gatheringEnded()  // before the answer: nothing may be said yet (the list below has no early "end")
        forwarder.roomAnswered()
        forwarder.add("c")
        forwarder.gatheringEnded()
        #expect(whipPoll(timeout: 5) { driver.recorded.count == 3 }, "\(driver.recorded)")
        #expect(driver.recorded == ["batch a,b 0", "one c 0", "end"])
    }

    @Test func nothingHeldSendsNoEmptyBatch() {
        let driver = RecordingDriver()
        let forwarder = CandidateForwarder(driver: driver, mid: "1")
        forwarder.roomAnswered()
        forwarder.gatheringEnded()
        #expect(whipPoll(timeout: 5) { driver.recorded.count == 1 }, "\(driver.recorded)")
        #expect(driver.recorded == ["end"])
    }
}
