import Foundation
import KraklBase
import KraklHost
@testable import KraklRoom
import Testing

/// Twilio join codes (the `k=twilio` form and a bare access token) and the parsing of what Twilio's
/// signaling server sends, including a seeded fuzz of it. Tokens come from Twilio's own helper
/// library (Tests/Fixtures/twilio_token.py), never from our code.
@Suite(.tags(.integration)) struct TwilioCodeAndMessageTests {
    static func twilioToken(identity: String = "Mubashir's screen", room: String? = "standup") throws -> String? {
        guard WhipTestServer.prerequisites() else { return nil }
        var argv = [TwilioTestRoom.tokenScript, "--account-sid", TwilioTestRoom.accountSid, "--api-key-sid", TwilioTestRoom.apiKeySid,
                    "--api-key-secret", "unit-test-secret", "--identity", identity]
        if let room { argv += ["--room", room] }
        let result = try Harness.run(WhipTestServer.python, argv, timeout: 30)
        guard result.status == 0 else {
            skipTest("twilio_token.py failed (the twilio package, scripts/setup): \(result.stderr.suffix(300))")
            return nil
        }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func aBareTwilioTokenIsATwilioCodeWithTheGlobalEndpoint() throws {
        guard let token = try Self.twilioToken() else { return }
        let invitation = try Invitation.read(token + "\n", now: Date())
        #expect(invitation.code.service == .twilio)
        #expect(invitation.code.url.absoluteString == "wss://global.vss.twilio.com/signaling")
        #expect(invitation.code.urlIsDefault)
        #expect(invitation.identity == "Mubashir's screen")
        #expect(invitation.room == "standup")
        // Its text form is a k=twilio code without u=, and reads back equal.
        #expect(invitation.code.text.hasPrefix("krakl:v=1;k=twilio;t=eyJ"))
        #expect(try JoinCode(parsing: invitation.code.text) == invitation.code)
        let summary = invitation.summary
        #expect(summary.contains("service:  Twilio Video") && summary.contains("identity: Mubashir's screen") && summary.contains("room:     standup"), "\(summary)")
        #expect(!summary.contains(String(token.split(separator: ".")[2])), "the token's signature is in the summary")
    }

    @Test func aTwilioCodeNamesItsSignalingURL() throws {
        guard let token = try Self.twilioToken(room: nil) else { return }
        let code = try JoinCode(parsing: "krakl:v=1;k=twilio;u=wss://sydney.vss.twilio.com/signaling;r=standup;t=" + token)
        #expect(code.url.absoluteString == "wss://sydney.vss.twilio.com/signaling" && !code.urlIsDefault)
        let invitation = try Invitation(code: code, now: Date())
        #expect(invitation.room == "standup")
        let bare = try JoinCode(parsing: "krakl:v=1;k=twilio;t=" + token)
        #expect(bare.urlIsDefault && bare.url == JoinCode.twilioDefaultURL)
        // ws:// is for a loopback test server only; other schemes are refused.
        #expect(try JoinCode(parsing: "krakl:v=1;k=twilio;u=ws://127.0.0.1:9/signaling;t=" + token).url.scheme == "ws")
        for bad in ["ws://192.0.2.1/signaling", "ws://example.org/signaling", "https://global.vss.twilio.com/signaling", "wss://u:p@h/x"] {
            #expect(throws: JoinCodeError.self, "\(bad) was accepted") { try JoinCode(parsing: "krakl:v=1;k=twilio;u=\(bad);t=" + token) }
        }
    }

    @Test func textThatIsNeitherACodeNorATokenIsStillRefused() {
        for text in ["hello", "eyJhbGciOi", "eyJ.eyJ.sig", "aaa.bbb.ccc", "https://example.org/join"] {
            #expect(throws: JoinCodeError.self, "\(text)") { try Invitation.read(text, now: Date()) }
        }
    }

    /// Text that is no code at all is told so, not where its first space is (issue 23, item 4.6).
    @Test func plainTextIsNotAJoinCodeRatherThanABadCharacter() {
        for text in ["hello world", "héllo", "https://example.org/a b"] {
            #expect(throws: JoinCodeError.malformedCode(.notAJoinCode), "\(text)") { try JoinCode(parsing: text) }
        }
        // Inside a code, the character's position is still what is said.
        #expect(throws: JoinCodeError.malformedCode(.notPrintableASCII(position: 15))) { try JoinCode(parsing: "krakl:v=1;k=wh\u{ED}p;u=https://h/;t=x") }
    }

    /// A join code file that is too long is refused with its real size (issue 23, item 4.5).
    @Test(arguments: [4257, 10057])
    func aTooLongCodeFileSaysItsRealSize(bytes: Int) throws {
        try Harness.requireBuild()
        let path = try Harness.temporaryDirectory() + "/long-code"
        try ("krakl:v=1;k=twilio;t=" + String(repeating: "a", count: bytes - 21)).write(toFile: path, atomically: true, encoding: .utf8)
        let result = try Harness.agent(["code", "@" + path])
        #expect(result.status == 40, "\(result)")
        #expect(result.stderr.contains("\(bytes) bytes"), "\(result.stderr)")
    }

    // MARK: Server frames

    @Test func theServersFramesParseIntoWhatTheDriverUses() throws {
        #expect(try TwilioMessages.parseFrame(#"{"type":"welcome","id":"x","negotiatedTimeout":4500}"#) == .welcome(negotiatedTimeout: 4500))
        #expect(try TwilioMessages.parseFrame(#"{"type":"heartbeat"}"#) == .heartbeat)
        #expect(try TwilioMessages.parseFrame(#"{"type":"busy","retryAfter":200,"keepAlive":true,"cookie":"c1"}"#)
                == .busy(retryAfter: 200, keepAlive: true, cookie: "c1"))
        #expect(try TwilioMessages.parseFrame(#"{"type":"weird"}"#) == .unknown(type: "weird"))
        let iced = try TwilioMessages.parseFrame(#"{"type":"msg","body":{"type":"iced","ice_servers":[{"urls":["turn:a:3478?transport=udp","turns:a:443"],"username":"u","credential":"c"},{"urls":"stun:s:3478"}]}}"#)
        #expect(iced == .message(.iced(servers: [IceServer(url: "turn:a:3478?transport=udp", username: "u", credential: "c"),
                                                 IceServer(url: "turns:a:443", username: "u", credential: "c"), IceServer(url: "stun:s:3478")])))
        let connected = try TwilioMessages.parseFrame(#"""
        {"type":"msg","body":{"type":"connected","session":"S1","sid":"RM1","name":"standup","participant":{"sid":"PA1","identity":"Ada"},
         "peer_connections":[{"id":"pc","description":{"type":"answer","revision":1,"sdp":"v=0\r\n"}}],
         "published":{"revision":1,"tracks":[{"id":"screen","sid":"MT1","state":"ready"}]},"options":{"session_timeout":12}}}
        """#)
        guard case .message(.connected(let state)) = connected else { Issue.record("\(connected)"); return }
        #expect(state.session == "S1" && state.roomSid == "RM1" && state.participantSid == "PA1" && state.identity == "Ada" && state.hasParticipant)
        #expect(state.sessionTimeout == 12)
        #expect(state.peerConnections == [TwilioMessages.PeerConnection(id: "pc", description: .init(type: "answer", revision: 1, sdp: "v=0\r\n"), ice: nil)])
        #expect(state.publishedTracks.first?.sid == "MT1")
        #expect(try TwilioMessages.parseFrame(#"{"type":"msg","body":{"type":"disconnected","status":"completed"}}"#)
                == .message(.disconnected(status: "completed")))
        #expect(try TwilioMessages.parseFrame(#"{"type":"msg","body":{"type":"error","code":53205,"message":"dup"}}"#)
                == .message(.error(code: 53205, message: "dup")))
    }

    @Test(arguments: [
        "not json", "[1,2]", "42", #"{"no":"type"}"#, #"{"type":"welcome"}"#, #"{"type":"welcome","negotiatedTimeout":true}"#,
        #"{"type":"msg","body":"text"}"#, #"{"type":"msg","body":{"type":"connected","participant":"me"}}"#,
        #"{"type":"msg","body":{"type":"connected","session":7,"participant":{}}}"#,
        #"{"type":"msg","body":{"type":"update","peer_connections":{"id":"x"}}}"#,
        #"{"type":"msg","body":{"type":"connected","participant":{},"peer_connections":[{"description":{"type":"answer","revision":1}}]}}"#,
    ])
    func malformedFramesAreRefusedWithAReason(text: String) {
        #expect(throws: TwilioMessages.Malformed.self, "\(text) was accepted") { try TwilioMessages.parseFrame(text) }
    }

    /// Seeded: mutated, truncated and inflated server frames never crash the parser, and huge lists
    /// are refused rather than walked.
    @Test func theFrameParserSurvivesAFuzz() throws {
        let seeds = [
            #"{"type":"msg","body":{"type":"connected","session":"S","sid":"RM1","participant":{"sid":"PA1","identity":"A"},"peer_connections":[{"id":"p","description":{"type":"answer","revision":1,"sdp":"v=0"},"ice":{"ufrag":"u","revision":2,"candidates":[{"candidate":"candidate:1 1 udp 1 127.0.0.2 9 typ host"}],"complete":true}}],"published":{"revision":1,"tracks":[{"id":"screen","sid":"MT1","state":"ready"}]}}}"#,
            #"{"type":"welcome","id":"i","negotiatedTimeout":5000}"#,
            #"{"type":"msg","body":{"type":"iced","ice_servers":[{"urls":["turn:h"],"username":"u","credential":"c"}]}}"#,
        ]
        var random = Fuzz.Rng(state: 0x7711_10_22)
        var outcomes = (parsed: 0, refused: 0)
        for _ in 0..<4000 {
            var bytes = Array(seeds[random.below(seeds.count)].utf8)
            switch random.below(4) {
            case 0: bytes = Array(bytes.prefix(random.below(bytes.count)))
            case 1: for _ in 0..<(1 + random.below(4)) { bytes[random.below(bytes.count)] = random.byte() }
            case 2:
                let at = random.below(bytes.count)
                bytes.insert(contentsOf: Array(#"[[[[[[{"a":1}]]]]]],"#.utf8), at: at)
            default: break
            }
            let text = String(decoding: bytes, as: UTF8.self)
            do {
                _ = try TwilioMessages.parseFrame(text)
                outcomes.parsed += 1
            } catch {
                outcomes.refused += 1
            }
        }
        #expect(outcomes.parsed > 500 && outcomes.refused > 500, "\(outcomes)")
        // A list far over the cap is refused, not walked.
        let many = (0..<10_000).map { _ in #"{"id":"t"}"# }.joined(separator: ",")
        #expect(throws: TwilioMessages.Malformed.self) {
            try TwilioMessages.parseFrame(#"{"type":"msg","body":{"type":"update","published":{"revision":2,"tracks":[\#(many)]}}}"#)
        }
    }

    @Test func theConnectSubscribesToNothingAndCarriesOneScreenTrack() throws {
        let connect = TwilioMessages.connect(token: "t", room: "standup", trackID: "screen", peerConnectionID: "pc", offer: "v=0", userAgent: "ua")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(TwilioMessages.encode(connect).utf8)) as? [String: Any])
        #expect(json["format"] as? String == "unified" && json["version"] as? Int == 2 && json["name"] as? String == "standup")
        let tracks = (json["participant"] as? [String: Any])?["tracks"] as? [[String: Any]] ?? []
        #expect(tracks.count == 1 && tracks[0]["kind"] as? String == "video" && tracks[0]["name"] as? String == "screen" && tracks[0]["id"] as? String == "screen")
        let rules = (json["subscribe"] as? [String: Any])?["rules"] as? [[String: Any]] ?? []
        #expect(rules.count == 1 && rules[0]["type"] as? String == "exclude" && rules[0]["all"] as? Bool == true)
        #expect((json["media_signaling"] as? [String: Any])?.isEmpty == true)
        let pcs = json["peer_connections"] as? [[String: Any]] ?? []
        #expect((pcs.first?["description"] as? [String: Any])?["revision"] as? Int == 1)
        let noRoom = TwilioMessages.encode(TwilioMessages.connect(token: "t", room: nil, trackID: "s", peerConnectionID: "p", offer: "", userAgent: ""))
        #expect(noRoom.contains("\"name\":null"))
    }
}
