import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// `krakl-agent --join` into a Twilio Video room: the agent's Twilio driver against the room
/// emulator (Tests/Fixtures/twilio_room.py, built from twilio-video.js's behaviour), tokens made by
/// Twilio's own helper library, aiortc decoding what the agent publishes. Every bound on time here
/// guards against a hang (about ten times what is expected); the times themselves are measured by
/// `krakl-bench room --service twilio` (docs/PERFORMANCE.md).
@Suite(.serialized, .tags(.integration, .netns)) struct TwilioRoomTests {
    static let identity = "Ada's screen"

    /// Shares until ≥ 30 frames are decoded; checks what the room saw of us.
    func sharesTheScreenOnly(_ room: TwilioTestRoom, _ agent: DtlsTestProcess) throws {
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 30 }
        let frames = TwilioTestRoom.frames(seen)
        #expect((frames["decoded"] as? Int ?? 0) >= 30, "frames decoded at the room: \(frames)")
        #expect(frames["stamps_in_order"] as? Bool == true && frames["stamps_decreasing"] as? Int == 0, "frame stamps: \(frames)")
        #expect((frames["stamps_read"] as? Int ?? 0) >= 27, "frame stamps unreadable: \(frames)")

        // Twilio's REST view: the identity, one published video track named "screen", nothing else.
        let (status, listed) = try room.restCall("GET", "/v1/Rooms/\(room.room)/Participants?Status=connected")
        let participants = listed["participants"] as? [[String: Any]] ?? []
        #expect(status == 200 && participants.count == 1 && participants.first?["identity"] as? String == Self.identity, "\(listed)")
        let sid = participants.first?["sid"] as? String ?? "?"
        let (_, published) = try room.restCall("GET", "/v1/Rooms/\(room.room)/Participants/\(sid)/PublishedTracks")
        let tracks = published["published_tracks"] as? [[String: Any]] ?? []
        #expect(tracks.count == 1 && tracks.first?["kind"] as? String == "video" && tracks.first?["name"] as? String == "screen", "\(published)")

        // The connect itself: one sendonly video m-section whose msid track is the announced track, a
        // subscription to nothing, no media-signaling channels, RSP's unified format.
        let connect = try #require(room.events("connect").last, "the emulator saw no connect")
        let sections = connect["m_sections"] as? [[String: Any]] ?? []
        #expect(sections.count == 1 && sections.first?["kind"] as? String == "video" && sections.first?["direction"] as? String == "sendonly",
                "offer m-sections: \(sections)")
        #expect(seen?["track_mapping"].flatMap { ($0 as? [String: Any])?["ok"] as? Bool } == true, "track mapping: \(seen?["track_mapping"] ?? "none")")
        let rules = (connect["subscribe"] as? [String: Any])?["rules"] as? [[String: Any]] ?? []
        #expect(rules.count == 1 && rules.first?["type"] as? String == "exclude" && rules.first?["all"] as? Bool == true, "subscribe: \(connect["subscribe"] ?? "none")")
        #expect((connect["media_signaling"] as? [String: Any])?.isEmpty == true)
        #expect(connect["format"] as? String == "unified")
        #expect(connect["token_present"] as? Bool == true)
        // Gathering over (no STUN or TURN here): the ICE state said so, `complete: true`.
        let done = try room.waitForParticipant(Self.identity, timeout: 10) { ($0["ice"] as? [String: Any])?["complete"] as? Bool == true }
        #expect((done?["ice"] as? [String: Any])?["complete"] as? Bool == true, "no end of candidates: \(done?["ice"] ?? "none")")
        // The status line names the room and our participant and track as Twilio gave them.
        #expect(agent.waitFor("RM", timeout: 5) && agent.log.contains("MT"), "the status shows no room/track SIDs: \(agent.log.suffix(600))")
    }

    @Test(arguments: ["code", "bare token"])
    func joinsSharesAndEndsWhenTheRoomIsCompleted(form: String) throws {
        guard let room = try TwilioTestRoom() else { return }
        let agent: DtlsTestProcess
        let token = try room.token(identity: Self.identity)
        if form == "code" {
            agent = try room.agent(try room.code(identity: Self.identity))
        } else {
            // A QR holding only the JWT: the default URL, overridden for the test by --twilio-url.
            agent = try room.agent(try room.file(token), arguments: ["--twilio-url", room.signalingURL])
        }
        defer { agent.stop() }
        try sharesTheScreenOnly(room, agent)

        let asked = try room.complete()
        let status = TwilioTestRoom.waitExit(agent, seconds: 20)
        let ms = (agent.exitedAtMs ?? .infinity) - asked
        print(String(format: "twilio (%@): room completed → agent exited %.0f ms later", form, ms))
        #expect(status == 30, "exit \(status.map(String.init) ?? "none") (30 = room ended): \(agent.log.suffix(800))")
        #expect(agent.log.contains("Sharing was ended by the room: the meeting was ended (Twilio 53118)."), "\(agent.log.suffix(400))")
        let after = try room.waitForParticipant(Self.identity, timeout: 5) { $0["disconnect_received"] as? Bool == true }
        #expect(after?["disconnect_received"] as? Bool == true && after?["bye_received"] as? Bool == true, "goodbye after completion: \(after ?? [:])")
        let signature = String(token.split(separator: ".").last ?? "")
        #expect(signature.count > 20 && !agent.log.contains(signature), "the token's signature appeared in the agent's output")
    }

    @Test func sigtermSaysDisconnectAndByeAndClosesNormally() throws {
        guard let room = try TwilioTestRoom() else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
        _ = try room.waitForParticipant(Self.identity) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 5 }
        agent.signal(SIGTERM)
        let status = TwilioTestRoom.waitExit(agent, seconds: 20)
        #expect(status == 0, "exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(600))")
        #expect(agent.log.contains("You stopped sharing."))
        let record = try room.waitForParticipant(Self.identity, timeout: 5) { $0["ws_close_code"] as? Int != nil }
        #expect(record?["disconnect_received"] as? Bool == true, "no disconnect: \(record ?? [:])")
        #expect(record?["bye_received"] as? Bool == true, "no bye: \(record ?? [:])")
        #expect(record?["ws_close_code"] as? Int == 1000, "close code: \(record?["ws_close_code"] ?? "none")")
        #expect(record?["syncs"] as? Int == 0, "a stop must not reconnect: \(record ?? [:])")
    }

    // MARK: Refusals

    @Test func aForgedSignatureIsRefusedWithTwiliosCode() throws {
        guard let room = try TwilioTestRoom() else { return }
        let forged = try room.token(identity: Self.identity, secret: "not-the-room-secret")
        let agent = try room.agent(try room.file("krakl:v=1;k=twilio;u=\(room.signalingURL);t=\(forged)"))
        defer { agent.stop() }
        let status = TwilioTestRoom.waitExit(agent, seconds: 30)
        #expect(status == 33, "exit \(status.map(String.init) ?? "none") (33 = token refused): \(agent.log.suffix(600))")
        #expect(agent.log.contains("20107"), "Twilio's code is not in the message: \(agent.log.suffix(400))")
        // A refused join has nothing to leave: no "leaving the room…" line (issue 23, item 4.12).
        #expect(!agent.log.contains("leaving the room"), "\(agent.log.suffix(400))")
    }

    @Test(arguments: [("--expired", "expired"), ("--nbf-offset", "not valid before")])
    func expiredAndFutureTokensAreRefusedBeforeConnecting(flag: String, words: String) throws {
        guard let room = try TwilioTestRoom() else { return }
        let token = try room.token(identity: Self.identity, extra: flag == "--expired" ? [flag] : [flag, "3600"])
        let agent = try room.agent(try room.file("krakl:v=1;k=twilio;u=\(room.signalingURL);t=\(token)"))
        defer { agent.stop() }
        let status = TwilioTestRoom.waitExit(agent, seconds: 30)
        #expect(status == 39, "exit \(status.map(String.init) ?? "none") (39 = token expired): \(agent.log.suffix(600))")
        #expect(agent.log.contains(words), "\(agent.log.suffix(400))")
        _ = room.waitForEvent("\u{1}never", timeout: 0.5)   // anything the agent sent would be logged by now
        #expect(room.events("ws-open").isEmpty, "the agent connected with a token it knew was unusable")
    }

    @Test func aCodeWhoseRoomDiffersFromTheTokensIsRefused() throws {
        guard let room = try TwilioTestRoom() else { return }
        let token = try room.token(identity: Self.identity)
        let agent = try room.agent(try room.file("krakl:v=1;k=twilio;u=\(room.signalingURL);r=another-room;t=\(token)"))
        defer { agent.stop() }
        #expect(TwilioTestRoom.waitExit(agent, seconds: 30) == 43, "\(agent.log.suffix(400))")
    }

    @Test(arguments: [
        (["--max-participants", "0"], Int32(54), "53105"),
        (["--require-room-exists"], Int32(34), "53106"),
        (["--error-code", "20106"], Int32(33), "20106"),
        (["--error-code", "53999"], Int32(35), "53999"),
    ])
    func theRoomsRefusalsHaveTheirOwnStatus(arguments: [String], status expected: Int32, code: String) throws {
        guard let room = try TwilioTestRoom(arguments) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        let status = TwilioTestRoom.waitExit(agent, seconds: 30)
        #expect(status == expected, "\(arguments): exit \(status.map(String.init) ?? "none"), wanted \(expected): \(agent.log.suffix(600))")
        #expect(agent.log.contains(code), "\(arguments): Twilio's code \(code) is not in: \(agent.log.suffix(400))")
    }

    @Test func theSameIdentityJoiningElsewhereReplacesUs() throws {
        guard let room = try TwilioTestRoom() else { return }
        let first = try room.agent(try room.code(identity: Self.identity))
        defer { first.stop() }
        #expect(first.waitFor("sharing the screen", timeout: 30), "the first agent never shared: \(first.log.suffix(800))")
        let second = try room.agent(try room.code(identity: Self.identity))
        defer { second.stop() }
        let status = TwilioTestRoom.waitExit(first, seconds: 30)
        #expect(status == 55, "the replaced agent exited \(status.map(String.init) ?? "none") (55 = replaced): \(first.log.suffix(600))")
        #expect(first.log.contains("53205"))
        #expect(second.waitFor("sharing the screen", timeout: 30), "the second agent never shared: \(second.log.suffix(800))")
    }

    // MARK: A server that misbehaves

    @Test(arguments: [
        ("no-welcome", Int32(37)), ("no-connected", Int32(37)), ("bad-json", Int32(38)), ("not-object", Int32(38)),
        ("connected-without-participant", Int32(38)), ("wrong-answer-revision", Int32(38)),
    ])
    func aBrokenJoinEndsWithAClearStatus(fault: String, expected: Int32) throws {
        guard let room = try TwilioTestRoom(["--fault", fault]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        let status = TwilioTestRoom.waitExit(agent, seconds: 60)
        #expect(status == expected, "\(fault): exit \(status.map(String.init) ?? "none"), wanted \(expected): \(agent.log.suffix(600))")
        #expect(agent.log.contains("Could not join the room"), "\(fault): \(agent.log.suffix(400))")
    }

    @Test(arguments: ["silent-after-connected", "close-after-connected", "huge-message"])
    func aLostSignalingSocketIsResumedWithSync(fault: String) throws {
        guard let room = try TwilioTestRoom(["--fault", fault, "--fault-after", "1"]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
        #expect(room.waitForEvent("synced", timeout: 40) != nil, "\(fault): no sync/synced: \(agent.log.suffix(800))")
        #expect(agent.log.contains("reconnecting"), "\(fault): the agent did not say it was reconnecting: \(agent.log.suffix(600))")
        #expect(agent.isRunning, "\(fault): the agent ended: \(agent.log.suffix(600))")
        // Media went on through the reconnect, and the room still ends it as usual.
        let going = try room.framesKeepComing(Self.identity)
        #expect(going.ok, "\(fault): frames stopped after the reconnect: \(going.frames)")
        _ = try room.complete()
        #expect(TwilioTestRoom.waitExit(agent, seconds: 20) == 30, "\(fault): \(agent.log.suffix(600))")
    }

    /// A busy signaling server (`busy` with `retryAfter` and a cookie): the agent waits, says hello
    /// again with the cookie, and joins.
    @Test func aBusyServerIsAskedAgainWithItsCookie() throws {
        guard let room = try TwilioTestRoom(["--fault", "busy-once"]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared after busy: \(agent.log.suffix(1500))")
        let cookie = try #require(room.waitForEvent("busy-cookie", timeout: 5), "the second hello was not seen")
        #expect(cookie["echoed"] as? Bool == true, "the cookie was not echoed: \(cookie)")
    }

    /// A frame of a type the client does not know, after joining: skipped (the SDK only reports it).
    @Test func anUnknownFrameAfterJoiningIsSkipped() throws {
        guard let room = try TwilioTestRoom(["--fault", "unknown-type", "--fault-after", "1"]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("unknown type \"weird\"", timeout: 30), "\(agent.log.suffix(800))")
        #expect(agent.isRunning, "\(agent.log.suffix(600))")
        _ = try room.complete()
        #expect(TwilioTestRoom.waitExit(agent, seconds: 20) == 30, "\(agent.log.suffix(600))")
    }

    /// The signaling server dies: reconnects are refused until the server's 3 s window has passed.
    @Test func aReconnectPastTheWindowIsConnectionLost() throws {
        guard let room = try TwilioTestRoom(["--session-timeout", "3"]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
        room.process.send(signal: SIGKILL)
        let status = TwilioTestRoom.waitExit(agent, seconds: 60)
        #expect(status == 32, "exit \(status.map(String.init) ?? "none") (32 = connection lost): \(agent.log.suffix(800))")
        #expect(agent.log.contains("not resumed within 3 s"), "\(agent.log.suffix(600))")
    }

    /// Twilio's TURN servers come in `iced`: with direct UDP between the agent and the room's media
    /// blocked (nftables), the media goes through the coturn server the room named, and its
    /// credential never appears in the agent's output.
    /// `iced`: the TURN server comes with Twilio's `iced` (allocated after the answer); `flag`:
    /// `--ice-server` (allocated while the connect is on its way, so the relay candidate is held
    /// until the room answers, then trickled: issue 24).
    @Test(arguments: ["iced", "flag"])
    func theTurnServersFromIcedCarryTheMediaWhenDirectUdpIsBlocked(_ from: String) throws {
        let credential = "iced-credential-\(UUID().uuidString.prefix(8))"
        let server = "turn:127.0.0.2:3478?transport=udp,twilio,\(credential)"
        guard let room = try TwilioTestRoom(from == "iced" ? ["--ice-server", server] : []) else { return }
        guard let turn = try CoturnServer.start(in: room.namespace, extra: ["--user=twilio:\(credential)"]) else { return }
        defer { withExtendedLifetime(turn) {} }
        guard try CoturnServer.blockDirectUdp(in: room.namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        let agent = try room.agent(try room.code(identity: Self.identity), arguments: from == "flag" ? ["--ice-server", server] : [])
        defer { agent.stop() }
        #expect(agent.waitFor("relay/udp -> host", timeout: 40), "the media did not go through the relay: \(agent.log.suffix(1200))")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 30 }
        #expect((TwilioTestRoom.frames(seen)["decoded"] as? Int ?? 0) >= 30, "frames through the relay: \(TwilioTestRoom.frames(seen))")
        #expect(!agent.log.contains(credential), "the TURN credential from iced appeared in the agent's output")
        // The relay candidate trickled, then the end of candidates once the allocation was answered.
        let ice = try room.waitForParticipant(Self.identity, timeout: 10) { ($0["ice"] as? [String: Any])?["complete"] as? Bool == true }?["ice"] as? [String: Any]
        let trickled = ice?["candidates"] as? [[String: Any]] ?? []
        #expect(trickled.contains { ($0["candidate"] as? String)?.contains("typ relay") == true }, "no relay candidate trickled: \(ice ?? [:])")
        #expect(ice?["complete"] as? Bool == true, "no end of candidates after the relay: \(ice ?? [:])")
        // Cumulative, as twilio-video.js sends them: every update repeats all the candidates so far.
        let updates = room.events("ice").filter { $0["identity"] as? String == Self.identity }
        #expect(!updates.isEmpty && updates.allSatisfy { ($0["candidates"] as? Int) == ($0["total"] as? Int) && $0["stale"] as? Bool == false },
                "updates that were not cumulative or not newer: \(updates)")
        #expect(updates.last?["complete"] as? Bool == true && updates.dropLast().allSatisfy { $0["complete"] as? Bool == false },
                "complete must come once, last: \(updates)")
        _ = try room.complete()
        #expect(TwilioTestRoom.waitExit(agent, seconds: 20) == 30, "\(agent.log.suffix(600))")
    }

    /// The server renegotiates mid-share (aiortc re-offers, once with an audio m-section added as a
    /// subscription would): the agent answers on the same transport with its video as negotiated
    /// and the new section rejected, the room applies it, and the frames keep coming.
    @Test(arguments: [[], ["--reoffer-add", "audio"]])
    func aServerReofferIsAnsweredAndTheShareGoesOn(extra: [String]) throws {
        guard let room = try TwilioTestRoom(["--reoffer-after", "1.5"] + extra) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
        let answer = try #require(room.waitForEvent("answer", timeout: 30), "no answer to the re-offer: \(agent.log.suffix(800))")
        #expect(answer["ok"] as? Bool == true && answer["applied"] as? Bool == true, "\(extra): \(answer)")
        let sections = answer["m_sections"] as? [[String: Any]] ?? []
        let video = sections.first { $0["kind"] as? String == "video" }
        #expect(video?["direction"] as? String == "sendonly" && video?["msid_track"] as? String == "screen", "\(sections)")
        if !extra.isEmpty {
            let audio = sections.first { $0["kind"] as? String == "audio" }
            #expect(audio?["port"] as? Int == 0 && audio?["direction"] as? String == "inactive", "the new audio section was not rejected: \(sections)")
        }
        let going = try room.framesKeepComing(Self.identity)
        #expect(going.ok, "frames stopped after the re-offer: \(going.frames)")
        #expect(going.frames["stamps_in_order"] as? Bool == true)
        #expect(agent.isRunning)
    }

    /// The room's media server trickles its candidates after the answer (and one for a stale ufrag):
    /// the agent pairs with the signalled host candidate, not a peer-reflexive one learned from checks.
    @Test func theServersTrickledCandidatesAreUsed() throws {
        guard let room = try TwilioTestRoom(["--trickle-answer-candidates"]) else { return }
        let agent = try room.agent(try room.code(identity: Self.identity))
        defer { agent.stop() }
        #expect(room.waitForEvent("server-trickled", timeout: 30) != nil, "the emulator did not trickle")
        #expect(agent.waitFor("host/udp -> host", timeout: 30), "not paired with the trickled host candidate: \(agent.log.suffix(800))")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 30 }
        #expect((TwilioTestRoom.frames(seen)["decoded"] as? Int ?? 0) >= 30)
        #expect(!agent.log.contains("127.0.0.2:9"), "the stale ufrag's candidate was used")
    }

    /// Only loopback addresses in the namespace and no `--address`: the failure says what to give
    /// (issue 23, item 4.3), in the person's words.
    @Test func withoutAnAddressToSendFromTheMessageSaysWhatToGive() throws {
        guard let room = try TwilioTestRoom() else { return }
        let code = try room.code(identity: Self.identity)
        let (program, argv) = room.namespace.command(Harness.agent, ["--join", "@" + code, "--once", "--plugins", room.registry, "--backend", "file"])
        let agent = try DtlsTestProcess(program, argv)
        defer { agent.stop() }
        #expect(TwilioTestRoom.waitExit(agent, seconds: 30) == 44, "\(agent.log.suffix(600))")
        #expect(agent.log.contains("give one with --address IP"), "\(agent.log.suffix(600))")
        #expect(!agent.log.contains("includeLoopback"), "\(agent.log.suffix(600))")
    }
}
