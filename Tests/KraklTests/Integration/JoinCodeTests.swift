import Foundation
import KraklRoom
import Testing

/// Join codes and their tokens (docs/join-codes.md): the format's rules one
/// by one, then round trips through the independent Python generator and the
/// JavaScript of the docs (run under Node with the real qrcode-generator,
/// its QR image read back by zbar), with pyjwt checking the signatures.
@Suite(.tags(.integration)) struct JoinCodeTests {
    // MARK: - Tokens made here, with Foundation's base64 (not the parser's decoder)

    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    /// A signature that must never show up in any message.
    static let signature = base64url(Data("signature-that-must-not-leak-9f3a".utf8))
    static let header = #"{"typ":"JWT","alg":"HS256","cty":"twilio-fpa;v=1"}"#

    static func base64url(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func claims(identity: Any? = "Ada's screen", room: String? = nil, video: Bool = true,
                       exp: Any? = 1_800_003_600, nbf: Any? = 1_800_000_000, extra: [String: Any] = [:]) -> String {
        var grants: [String: Any] = [:]
        if let identity { grants["identity"] = identity }
        if video { grants["video"] = room.map { ["room": $0] } ?? [:] }
        var claims: [String: Any] = ["jti": "jti-1", "iss": "krakl-test", "sub": "krakl", "iat": 1_800_000_000, "grants": grants]
        if let exp { claims["exp"] = exp }
        if let nbf { claims["nbf"] = nbf }
        claims.merge(extra) { $1 }
        let data = try! JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }

    static func token(header: String = header, claims: String = claims(), signature: String = signature) -> String {
        base64url(Data(header.utf8)) + "." + base64url(Data(claims.utf8)) + "." + signature
    }

    static func code(_ fields: String, token: String = token()) -> String {
        "krakl:v=1;" + fields.replacingOccurrences(of: "TOKEN", with: token)
    }

    /// Expects `body` to throw `expected`, with a one-line message that
    /// never holds the token's signature or more than its first 8 characters.
    static func expect(_ expected: JoinCodeError, token: String = token(), sourceLocation: SourceLocation = #_sourceLocation,
                       _ body: () throws(JoinCodeError) -> Void) {
        do {
            try body()
            Issue.record("no error; expected \(expected)", sourceLocation: sourceLocation)
        } catch {
            #expect(error == expected, sourceLocation: sourceLocation)
            checkMessage(error.description, token: token, sourceLocation: sourceLocation)
            checkMessage(everyForm(error), token: token, multiline: true, sourceLocation: sourceLocation)
        }
    }

    /// `value` as `print`, `debugPrint` and `dump` show it, one after the other.
    static func everyForm(_ value: Any) -> String {
        var dumped = ""
        dump(value, to: &dumped)
        return "\(value)\n\(String(reflecting: value))\n\(dumped)"
    }

    static func checkMessage(_ message: String, token: String, multiline: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(!message.isEmpty && (multiline || !message.contains("\n")), "not one line: \(message)", sourceLocation: sourceLocation)
        let parts = token.split(separator: ".")
        if parts.count == 3 { #expect(!message.contains(parts[2]), "signature in: \(message)", sourceLocation: sourceLocation) }
        // Any 9 consecutive characters of the token would be more than it may show.
        let tokenPieces = Set(Array(token.utf8).byteRuns(9))
        if let piece = Array(message.utf8).byteRuns(9).first(where: tokenPieces.contains) {
            Issue.record("message shows \(String(decoding: piece, as: UTF8.self)) of the token: \(message)", sourceLocation: sourceLocation)
        }
    }

    // MARK: - The code's format

    @Test func parsesEveryFieldAsWritten() throws {
        let token = Self.token()
        let text = "krakl:v=1;k=janus;u=http://127.0.0.1:8088/janus;r=a%3Bb%2Cc%3Dd%25e%20%C3%A9;t=\(token)"
            + ";ice=stun:[::1]:3478;ice=turn:turn.example.org?transport%3Dudp,us%2Cer,pa%3Bss"
        let code = try JoinCode(parsing: text)
        #expect(code.version == 1)
        #expect(code.service == .janus)
        #expect(code.url.absoluteString == "http://127.0.0.1:8088/janus")
        #expect(code.token == token)
        #expect(code.room == "a;b,c=d%e é")
        #expect(code.iceServers == [IceServer(url: "stun:[::1]:3478"),
                                    IceServer(url: "turn:turn.example.org?transport=udp", username: "us,er", credential: "pa;ss")])
    }

    @Test func roundTripsThroughText() throws {
        let codes = [
            JoinCode(service: .whip, url: URL(string: "https://sfu.example.org/whip/endpoint?room=a&x=1")!, token: Self.token()),
            JoinCode(service: .janus, url: URL(string: "http://[::1]:8088/janus")!, token: Self.token(), room: "Ünïcode room; 50% = ok, yes",
                     iceServers: [IceServer(url: "stun:stun.example.org"),
                                  IceServer(url: "turns:turn.example.org:5349?transport=tcp", username: "ü ser", credential: "a,b;c=d%e\u{7F}")]),
            JoinCode(service: .janus, url: URL(string: "http://127.0.0.1:8088/janus")!, token: Self.token(), room: "1234"),
            { var c = JoinCode(service: .whip, url: URL(string: "https://h.example/whip")!, token: Self.token()); c.tokenAcrossOrigins = true; return c }(),
        ]
        #expect(codes.last!.text.contains(";xo=1"))
        #expect(try JoinCode(parsing: codes.last!.text).tokenAcrossOrigins)
        #expect(try !JoinCode(parsing: codes[0].text).tokenAcrossOrigins, "off unless the code says so")
        #expect(throws: JoinCodeError.malformedCode(.badFlag("xo"))) {
            try JoinCode(parsing: Self.code("k=whip;u=https://h.example/whip;t=TOKEN;xo=yes"))
        }
        for code in codes {
            let text = code.text
            #expect(text.unicodeScalars.allSatisfy { (0x21...0x7E).contains($0.value) }, "not printable ASCII: \(text)")
            #expect(text.hasPrefix("krakl:v=1;"))
            #expect(try JoinCode(parsing: text) == code)
            // A pasted code keeps its newline and indentation: still the same code.
            #expect(try JoinCode(parsing: "  \(text)\r\n") == code)
        }
    }

    @Test func ignoresUnknownFieldsEmptyFieldsAndSchemeCase() throws {
        let plain = try JoinCode(parsing: Self.code("k=whip;u=https://h.example/whip;t=TOKEN"))
        let extended = try JoinCode(parsing: "KRAKL:v=1;;x-future=anything%20at%20all;k=whip;zz=1;u=https://h.example/whip;t=\(Self.token());")
        #expect(plain == extended)
    }

    @Test func refusesMalformedCodes() {
        let t = Self.token()
        let cases: [(String, JoinCodeError.CodeProblem)] = [
            ("", .empty),
            (" \n\t", .empty),
            ("krakl:v=1;k=wh\u{ED}p;u=https://h/;t=\(t)", .notPrintableASCII(position: 15)),
            ("krakl:v=1;k=whip;u=https://h/;t=\(t);r=a b", .notPrintableASCII(position: 37 + t.count)),
            ("krakl:v=1;k=whip;\u{1}u=https://h/;t=\(t)", .notPrintableASCII(position: 18)),
            ("https://h.example/whip", .notAJoinCode),
            ("krakl", .notAJoinCode),
            ("krakl:", .versionNotFirst),
            ("krakl:k=whip;v=1;u=https://h/;t=\(t)", .versionNotFirst),
            ("krakl:v=;k=whip", .badVersion),
            ("krakl:v=one;k=whip", .badVersion),
            ("krakl:v=0;k=whip", .badVersion),
            ("krakl:v=-1;k=whip", .badVersion),
            ("krakl:v=99999999999999999999;k=whip", .badVersion),
            (Self.code("k=whip;u=https://h/;t=TOKEN;junk"), .fieldWithoutValue("junk")),
            (Self.code("k=whip;k=janus;u=https://h/;t=TOKEN"), .duplicateField("k")),
            (Self.code("k=whip;u=https://h/;t=TOKEN;v=1"), .duplicateField("v")),
            (Self.code("u=https://h/;t=TOKEN"), .missingField("k")),
            (Self.code("k=whip;t=TOKEN"), .missingField("u")),
            (Self.code("k=whip;u=https://h/"), .missingField("t")),
            (Self.code("k=whip;u=https://h/;t="), .missingField("t")),
            (Self.code("k=zoom;u=https://h/;t=TOKEN"), .unknownService("zoom")),
            (Self.code("k=whip;u=https://h/%4;t=TOKEN"), .badPercentEncoding(field: "u")),
            (Self.code("k=whip;u=https://h/%zz;t=TOKEN"), .badPercentEncoding(field: "u")),
            (Self.code("k=janus;u=https://h/;r=%FF%FE;t=TOKEN"), .badPercentEncoding(field: "r")),
            (Self.code("k=janus;u=https://h/;r=;t=TOKEN"), .badRoom("is empty (leave r= out if the token names the room)")),
            (Self.code("k=janus;u=https://h/;r=a%0Ab;t=TOKEN"), .badRoom("has a control character")),
        ]
        for (input, problem) in cases {
            Self.expect(.malformedCode(problem), token: t) { () throws(JoinCodeError) in _ = try JoinCode(parsing: input) }
        }
        let long = Self.code("k=whip;u=https://h/;t=TOKEN;pad=" + String(repeating: "x", count: 4096))
        Self.expect(.malformedCode(.tooLong(bytes: long.utf8.count))) { () throws(JoinCodeError) in _ = try JoinCode(parsing: long) }
        // 4096 bytes exactly is still a code.
        let limit = Self.code("k=whip;u=https://h/;t=TOKEN;pad=")
        #expect(throws: Never.self) { try JoinCode(parsing: limit + String(repeating: "x", count: 4096 - limit.utf8.count)) }
    }

    @Test func refusesBadServiceURLs() {
        for url in ["ftp://h.example/x", "/janus", "janus", "http://", "http:/janus", "https://user:secret@h.example/whip",
                    "http://h%20x.example/", "http://h\u{E9}.example/".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!,
                    "mailto:a@b.example"] {
            let input = Self.code("k=whip;u=\(url);t=TOKEN")
            do {
                _ = try JoinCode(parsing: input)
                Issue.record("accepted u=\(url)")
            } catch {
                guard case .malformedCode(.badURL) = error else { Issue.record("u=\(url): \(error)"); continue }
                #expect(!error.description.contains("secret"), "\(error)")
            }
        }
    }

    @Test func checksIceServersAsRFC7064And7065Say() throws {
        let good = ["stun:stun.example.org", "stun:192.0.2.1:3478", "stun:[2001:db8::1]:19302", "STUN:Stun.Example.org.",
                    "turn:turn.example.org,u,p", "turn:turn.example.org:3478?transport%3Dudp,u,p", "turns:t.example.org:443?transport%3Dtcp,u,p"]
        for server in good {
            #expect(throws: Never.self, "ice=\(server)") { try JoinCode(parsing: Self.code("k=whip;u=https://h/;t=TOKEN;ice=\(server)")) }
        }
        let bad = ["http://stun.example.org", "stuns:stun.example.org", "stun://stun.example.org", "stun:", "stun:-bad-.example",
                   "stun:stun.example.org:0", "stun:stun.example.org:70000", "stun:stun.example.org:34a", "stun:stun.example.org?transport%3Dudp",
                   "turn:turn.example.org", "turn:turn.example.org?transport%3Dsctp,u,p", "turn:turn.example.org,u", "turn:turn.example.org,,p",
                   "stun:[2001:db8::1", "stun:[zz]:1", "stun:h_x.example", "turn:t.example%C3%A9,u,p"]
        for server in bad {
            do {
                _ = try JoinCode(parsing: Self.code("k=whip;u=https://h/;t=TOKEN;ice=stun:ok.example;ice=\(server)"))
                Issue.record("accepted ice=\(server)")
            } catch {
                guard case .malformedCode(.badIceServer(index: 2, _)) = error else { Issue.record("ice=\(server): \(error)"); continue }
            }
        }
    }

    @Test func refusesNewerVersionsBeforeReadingTheirFields() {
        // Version 2 may have other fields: nothing else is judged.
        Self.expect(.unsupportedVersion(2)) { () throws(JoinCodeError) in _ = try JoinCode(parsing: "krakl:v=2;whatever;k=zoom") }
        #expect(JoinCodeError.unsupportedVersion(2).description
            == "join code version 2 is newer than this agent understands (it reads version 1): update krakl-agent")
    }

    // MARK: - Tokens

    @Test func readsTheTokenClaims() throws {
        let token = try AccessToken(parsing: Self.token(claims: Self.claims(room: "r-1", extra: ["iat": 1_799_999_000.5])))
        #expect(token.identity == "Ada's screen")
        #expect(token.room == "r-1")
        #expect(token.expiry == Date(timeIntervalSince1970: 1_800_003_600))
        #expect(token.notBefore == Date(timeIntervalSince1970: 1_800_000_000))
        #expect(token.issuedAt == Date(timeIntervalSince1970: 1_799_999_000.5))
        #expect(token.id == "jti-1" && token.issuer == "krakl-test" && token.subject == "krakl")
        #expect(token.algorithm == "HS256")
        #expect(try AccessToken(parsing: Self.token(claims: Self.claims(room: nil))).room == nil)
    }

    @Test func refusesMalformedTokens() {
        let noVideo = Self.claims(video: false)
        let b64 = { (text: String) in Self.base64url(Data(text.utf8)) }
        let cases: [(String, JoinCodeError.TokenProblem)] = [
            ("abc", .notThreeParts(count: 1)),
            ("a.b", .notThreeParts(count: 2)),
            (Self.token() + ".x", .notThreeParts(count: 4)),
            (Self.token().replacingOccurrences(of: "eyJ", with: "ey+"), .badBase64URL(part: 1)),
            (b64(Self.header) + "." + b64(Self.claims()) + "=." + Self.signature, .badBase64URL(part: 2)),
            (b64(Self.header) + "." + b64(Self.claims()) + "." + Self.signature + "/", .badBase64URL(part: 3)),
            (b64(Self.header) + "." + b64(Self.claims()) + ".abcde", .badBase64URL(part: 3)),
            (b64("not json") + "." + b64(Self.claims()) + "." + Self.signature, .headerNotJSON),
            (b64("[1]") + "." + b64(Self.claims()) + "." + Self.signature, .headerNotJSON),
            (Self.token(claims: "{\"grants\":"), .claimsNotJSON),
            (Self.token(claims: "[]"), .claimsNotJSON),
            (Self.token(header: #"{"typ":"JOSE","alg":"HS256","cty":"twilio-fpa;v=1"}"#), .wrongType("JOSE")),
            (Self.token(header: #"{"alg":"HS256","cty":"twilio-fpa;v=1"}"#), .wrongType(nil)),
            (Self.token(header: #"{"typ":"JWT","alg":"HS256"}"#), .wrongContentType(nil)),
            (Self.token(header: #"{"typ":"JWT","alg":"HS256","cty":"twilio-fpa;v=2"}"#), .wrongContentType("twilio-fpa;v=2")),
            (Self.token(header: #"{"typ":"JWT","alg":"none","cty":"twilio-fpa;v=1"}"#), .unsigned),
            (Self.token(header: #"{"typ":"JWT","cty":"twilio-fpa;v=1"}"#), .unsigned),
            (Self.token(signature: ""), .unsigned),
            (Self.token(claims: Self.claims(identity: nil)), .noIdentity),
            (Self.token(claims: Self.claims(identity: "  ")), .noIdentity),
            (Self.token(claims: Self.claims(identity: 42)), .badClaim(name: "grants.identity", reason: "is not a string")),
            (Self.token(claims: Self.claims(identity: "Ada\nEve")), .badIdentity("has a control character or line break")),
            (Self.token(claims: Self.claims(identity: "Ada\u{202E}neercs")), .badIdentity("has a bidirectional override character")),
            (Self.token(claims: Self.claims(identity: String(repeating: "a", count: 257))),
             .badIdentity("is 257 characters long, more than the 256 allowed")),
            (Self.token(claims: Self.claims(exp: nil)), .noExpiry),
            (Self.token(claims: Self.claims(exp: "tomorrow")), .badClaim(name: "exp", reason: "is not a number")),
            (Self.token(claims: Self.claims(exp: 1_800_003_600_000_000)),
             .badClaim(name: "exp", reason: "is not a time in seconds since 1970 between years 1970 and 9999")),
            (Self.token(claims: Self.claims(nbf: -5)), .badClaim(name: "nbf", reason: "is not a time in seconds since 1970 between years 1970 and 9999")),
            (Self.token(claims: noVideo), .noVideoGrant),
            (Self.token(claims: Self.claims(room: "")), .badClaim(name: "grants.video.room", reason: "is empty (leave it out to allow any room)")),
            (Self.token(claims: Self.claims(extra: ["iss": 7])), .badClaim(name: "iss", reason: "is not a string")),
            (Self.token(claims: Self.claims(extra: ["grants": "all"])), .badClaim(name: "grants", reason: "is not an object")),
        ]
        for (token, problem) in cases {
            Self.expect(.malformedToken(problem), token: token) { () throws(JoinCodeError) in _ = try AccessToken(parsing: token) }
            // The same through a whole code, where the agent meets it.
            let code = Self.code("k=whip;u=https://h/;t=TOKEN", token: token)
            Self.expect(.malformedToken(problem), token: token) { () throws(JoinCodeError) in _ = try Invitation.read(code, now: Self.now) }
        }
    }

    @Test func judgesTimesWithSixtySecondsOfSkew() throws {
        func token(exp: Int, nbf: Int) throws(JoinCodeError) -> AccessToken {
            try AccessToken(parsing: Self.token(claims: Self.claims(exp: exp, nbf: nbf)))
        }
        let now = 1_800_000_000
        // Inside the skew either way: accepted.
        try token(exp: now - 60, nbf: now - 3600).checkTimes(now: Self.now)
        try token(exp: now + 3600, nbf: now + 60).checkTimes(now: Self.now)
        let expired = try token(exp: now - 61, nbf: now - 3600)
        Self.expect(.tokenExpired(expiry: Date(timeIntervalSince1970: Double(now - 61)), now: Self.now, skew: .seconds(60))) {
            () throws(JoinCodeError) in try expired.checkTimes(now: Self.now)
        }
        let early = try token(exp: now + 7200, nbf: now + 3600)
        Self.expect(.tokenNotYetValid(notBefore: Date(timeIntervalSince1970: Double(now + 3600)), now: Self.now, skew: .seconds(60))) {
            () throws(JoinCodeError) in try early.checkTimes(now: Self.now)
        }
        // The skew is a parameter: none allowed, one second late is expired.
        Self.expect(.tokenExpired(expiry: Date(timeIntervalSince1970: Double(now - 1)), now: Self.now, skew: .zero)) {
            () throws(JoinCodeError) in try token(exp: now - 1, nbf: now - 10).checkTimes(now: Self.now, skew: .zero)
        }
        // The messages say when (local time), how far, and the skew allowed.
        let expiredText = JoinCodeError.tokenExpired(expiry: Date(timeIntervalSince1970: Double(now - 3725)), now: Self.now, skew: .seconds(60)).description
        #expect(expiredText.contains("1 h 2 min ago") && expiredText.contains("60 s of clock skew"), "\(expiredText)")
        let earlyText = JoinCodeError.tokenNotYetValid(notBefore: Date(timeIntervalSince1970: Double(now + 90)), now: Self.now, skew: .seconds(60)).description
        #expect(earlyText.contains("in 1 min 30 s") && earlyText.contains("60 s of clock skew") && earlyText.contains("clock"), "\(earlyText)")
        let local = DateFormatter()
        local.dateFormat = "yyyy-MM-dd HH:mm"
        #expect(earlyText.contains(local.string(from: Date(timeIntervalSince1970: Double(now + 90)))), "not in local time: \(earlyText)")
    }

    @Test func settlesTheRoom() throws {
        func read(_ kind: String, codeRoom: String?, tokenRoom: String?) throws(JoinCodeError) -> Invitation {
            let token = Self.token(claims: Self.claims(room: tokenRoom))
            return try Invitation.read(Self.code("k=\(kind);u=https://h/x;" + (codeRoom.map { "r=\($0);" } ?? "") + "t=TOKEN", token: token), now: Self.now)
        }
        #expect(try read("janus", codeRoom: "1234", tokenRoom: "1234").room == "1234")
        #expect(try read("janus", codeRoom: "1234", tokenRoom: nil).room == "1234")
        #expect(try read("janus", codeRoom: nil, tokenRoom: "1234").room == "1234")
        #expect(try read("whip", codeRoom: nil, tokenRoom: nil).room == nil)
        #expect(try read("whip", codeRoom: nil, tokenRoom: "w").room == "w")
        #expect(try read("janus", codeRoom: "1", tokenRoom: "1").identity == "Ada's screen")
        Self.expect(.roomMismatch(codeRoom: "1234", tokenRoom: "999")) { () throws(JoinCodeError) in
            _ = try read("janus", codeRoom: "1234", tokenRoom: "999")
        }
        Self.expect(.roomMismatch(codeRoom: "a", tokenRoom: "b")) { () throws(JoinCodeError) in _ = try read("whip", codeRoom: "a", tokenRoom: "b") }
        Self.expect(.noRoom) { () throws(JoinCodeError) in _ = try read("janus", codeRoom: nil, tokenRoom: nil) }
        // Time is judged at `now`: the same code, an hour and two minutes later, is expired.
        let later = Self.now.addingTimeInterval(3600 + 120)
        #expect(throws: JoinCodeError.tokenExpired(expiry: Date(timeIntervalSince1970: 1_800_003_600), now: later, skew: .seconds(60))) {
            try Invitation.read(Self.code("k=whip;u=https://h/;t=TOKEN"), now: later)
        }
    }

    @Test func tokenNeverShowsWhole() throws {
        let text = Self.token()
        let token = try AccessToken(parsing: text)
        #expect(token.shortened == String(text.prefix(8)) + "…")
        Self.checkMessage(Self.everyForm(token), token: text, multiline: true)
        let invitation = try Invitation.read(Self.code("k=janus;u=https://h/janus?apikey=s3cr3t#frag;r=7;t=TOKEN;ice=stun:s.example;ice=turn:t.example,alice,hunter2"),
                                             now: Self.now)
        for shown in [Self.everyForm(invitation), Self.everyForm(invitation.code)] {
            Self.checkMessage(shown, token: text, multiline: true)
            #expect(!shown.contains("hunter2"), "TURN credential in: \(shown)")
        }
        #expect(invitation.description == "Janus VideoRoom https://h/janus, room \"7\", as \"Ada's screen\" (token \(token.shortened))")
        #expect(invitation.code.description == "krakl:v=1;k=janus;u=https://h/janus;r=7;t=\(token.shortened);ice=stun:s.example;ice=turn:t.example")
        let summary = invitation.summary(now: Self.now)
        for line in summary.split(separator: "\n") { Self.checkMessage(String(line), token: text) }
        for secret in ["s3cr3t", "frag", "hunter2", "alice"] { #expect(!summary.contains(secret), "\(secret) in \(summary)") }
        for expected in ["Janus VideoRoom", "https://h/janus\n", "room:     7", "identity: Ada's screen", "in 1 h", "stun:s.example",
                         "turn:t.example (with credentials)", "token:    " + token.shortened] {
            #expect(summary.contains(expected), "\(expected) missing from:\n\(summary)")
        }
    }

    // MARK: - Mutations: every input gives a code or a typed error, never a crash


    @Test func survivesRandomMutations() throws {
        let token = Self.token(claims: Self.claims(room: "1234"))
        let seed = Self.code("k=janus;u=http://127.0.0.1:8088/janus;r=1234;t=TOKEN;ice=turn:t.example:3478?transport%3Dudp,u%2C1,p%3B2", token: token)
        _ = try Invitation.read(seed, now: Self.now)
        var random = Fuzz.Rng(state: 0x6B72_616B_6C21)
        let alphabet = Array("%;,=:/.?-_[]krakl0123456789ABCDEFabcdefvkutrice \n\u{0}\u{7F}é€😀".unicodeScalars)
        var accepted = 0, refused: [String: Int] = [:]
        for round in 0..<3000 {
            var scalars = Array(seed.unicodeScalars)
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let at = Int.random(in: 0..<max(1, scalars.count), using: &random)
                switch Int.random(in: 0..<6, using: &random) {
                case 0: if !scalars.isEmpty { scalars[at] = alphabet.randomElement(using: &random)! }
                case 1: scalars.insert(alphabet.randomElement(using: &random)!, at: at)
                case 2: if !scalars.isEmpty { scalars.remove(at: at) }
                case 3: scalars = Array(scalars[..<at])
                case 4: let end = min(scalars.count, at + Int.random(in: 1...40, using: &random)); scalars.insert(contentsOf: scalars[at..<end], at: at)
                default: if !scalars.isEmpty { scalars[at] = Unicode.Scalar(UInt8.random(in: 0x21...0x7E, using: &random)) }
                }
            }
            var text = ""
            text.unicodeScalars.append(contentsOf: scalars)
            do {
                let invitation = try Invitation.read(text, now: Self.now)
                accepted += 1
                // What was accepted serializes to text that reads back the same.
                #expect(try JoinCode(parsing: invitation.code.text) == invitation.code, "\(text)")
            } catch {
                Self.checkMessage(error.description, token: token)
                // dump() is slow (≈ 2 ms an error): a sample of every tenth.
                if round % 10 == 0 { Self.checkMessage(Self.everyForm(error), token: token, multiline: true) }
                refused[Mirror(reflecting: error).children.first?.label ?? "noRoom", default: 0] += 1
            }
        }
        print("mutations: \(accepted) accepted, refused by case: \(refused.sorted { $0.key < $1.key })")
        #expect(accepted > 0 && refused.count >= 3)
    }

    // MARK: - The independent generators: Python (stdlib) and the docs' JavaScript

    static let generator = Harness.repoRoot + "/Tests/Fixtures/make_join_code.py"
    static let python = "/usr/bin/python3"
    static let node = "/usr/bin/node"
    static let qrcodeLibrary = "/usr/share/nodejs/qrcode-generator/qrcode.js"
    /// pyjwt, to check signatures the generators make (scripts/setup installs it).
    static let venvPython = "/opt/krakl-venv/bin/python"

    /// Runs the Python generator; returns its JSON output (code, token, claims).
    static func generate(_ arguments: [String]) throws -> [String: Any] {
        let result = try Harness.run(python, [generator] + arguments + ["--print", "json"], timeout: 30)
        try #require(result.status == 0, "make_join_code.py \(arguments): \(result.stderr)")
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    @Test func readsWhatThePythonGeneratorMakes() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python) else { skipTest("\(Self.python) missing"); return }
        let now = Int(Date().timeIntervalSince1970)
        struct Case { var arguments: [String]; var service: JoinCode.Service; var url: String; var room: String?; var identity: String
                      var exp: Int; var nbf: Int?; var ice: [IceServer] }
        let cases = [
            Case(arguments: ["--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", "1234", "--identity", "Mubashir's screen"],
                 service: .janus, url: "http://127.0.0.1:8088/janus", room: "1234", identity: "Mubashir's screen", exp: now + 3600, nbf: nil, ice: []),
            Case(arguments: ["--kind", "whip", "--url", "https://sfu.example.org/whip/ep?x=1", "--identity", "Zoë ; = , % 画面",
                             "--token-room", "Salle été;=,", "--ttl", "600", "--nbf", String(now - 30),
                             "--ice", "stun:stun.example.org:3478", "--ice", "turn:[2001:db8::1]:3478?transport=tcp,us,er,pa,ss"],
                 service: .whip, url: "https://sfu.example.org/whip/ep?x=1", room: "Salle été;=,", identity: "Zoë ; = , % 画面",
                 exp: now + 600, nbf: now - 30,
                 ice: [IceServer(url: "stun:stun.example.org:3478"),
                       IceServer(url: "turn:[2001:db8::1]:3478?transport=tcp", username: "us", credential: "er,pa,ss")]),
            Case(arguments: ["--kind", "janus", "--url", "https://meet.example.org/janus", "--room", "lobby", "--token-room", "lobby",
                             "--identity", "A", "--exp", String(now + 86_400 * 3), "--twilio-jti",
                             "--issuer", "SK0123456789abcdef0123456789abcdef", "--subject", "AC0123456789abcdef0123456789abcdef"],
                 service: .janus, url: "https://meet.example.org/janus", room: "lobby", identity: "A", exp: now + 86_400 * 3, nbf: nil, ice: []),
        ]
        for c in cases {
            let made = try Self.generate(c.arguments + ["--iat", String(now)])
            let text = try #require(made["code"] as? String), tokenText = try #require(made["token"] as? String)
            let invitation = try Invitation.read(text + "\n", now: Date())
            #expect(invitation.code.service == c.service)
            #expect(invitation.code.url.absoluteString == c.url)
            #expect(invitation.room == c.room)
            #expect(invitation.identity == c.identity)
            #expect(invitation.token.expiry == Date(timeIntervalSince1970: Double(c.exp)))
            #expect(invitation.token.issuedAt == Date(timeIntervalSince1970: Double(now)))
            #expect(invitation.token.notBefore == c.nbf.map { Date(timeIntervalSince1970: Double($0)) })
            #expect(invitation.code.iceServers == c.ice)
            #expect(invitation.code.token == tokenText)
            // Two independent writers of the format agree byte for byte.
            #expect(invitation.code.text == text)
        }
    }

    @Test func refusesWhatThePythonGeneratorMakesWrong() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python) else { skipTest("\(Self.python) missing"); return }
        let now = Int(Date().timeIntervalSince1970)
        let base = ["--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", "1234", "--iat", String(now)]
        let cases: [([String], (JoinCodeError) -> Bool)] = [
            (["--identity", "A", "--exp", String(now - 120)], { if case .tokenExpired = $0 { return true }; return false }),
            (["--identity", "A", "--nbf", String(now + 600)], { if case .tokenNotYetValid = $0 { return true }; return false }),
            (["--identity", "A", "--no-exp"], { $0 == .malformedToken(.noExpiry) }),
            ([], { $0 == .malformedToken(.noIdentity) }),
            (["--identity", "A", "--token-room", "999"], { $0 == .roomMismatch(codeRoom: "1234", tokenRoom: "999") }),
        ]
        for (arguments, matches) in cases {
            let made = try Self.generate(base + arguments)
            let text = try #require(made["code"] as? String), token = try #require(made["token"] as? String)
            do {
                _ = try Invitation.read(text, now: Date())
                Issue.record("accepted \(arguments)")
            } catch {
                #expect(matches(error), "\(arguments): \(error)")
                Self.checkMessage(error.description, token: token)
            }
        }
    }

    /// pyjwt (an independent JWT implementation) checks a token's HS256
    /// signature with `secret`; nil when pyjwt is not installed.
    static func pyjwt(_ token: String, secret: String) throws -> Harness.Result? {
        guard FileManager.default.isExecutableFile(atPath: venvPython) else { return nil }
        let script = "import jwt, json, sys; print(json.dumps(jwt.decode(sys.argv[1], sys.argv[2], algorithms=['HS256'], "
            + "options={'require': ['exp', 'iat']})))"
        let result = try Harness.run(venvPython, ["-c", script, token, secret], timeout: 30)
        return result.stderr.contains("No module named 'jwt'") ? nil : result
    }

    /// The claims pyjwt verified, or nil when pyjwt is not installed.
    static func verifyWithPyJWT(_ token: String, secret: String) throws -> [String: Any]? {
        guard let result = try pyjwt(token, secret: secret) else { return nil }
        try #require(result.status == 0, "pyjwt refused the token: \(result.stderr.suffix(300))")
        return try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
    }

    @Test func pythonGeneratorSignsAsPyJWTVerifies() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python) else { skipTest("\(Self.python) missing"); return }
        let made = try Self.generate(["--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--identity", "Ada", "--token-room", "7",
                                      "--secret", "s3cr3t-for-this-test"])
        guard let claims = try Self.verifyWithPyJWT(try #require(made["token"] as? String), secret: "s3cr3t-for-this-test") else {
            skipTest("pyjwt missing in /opt/krakl-venv (scripts/setup installs it)"); return
        }
        let grants = claims["grants"] as? [String: Any]
        #expect(grants?["identity"] as? String == "Ada")
        #expect((grants?["video"] as? [String: Any])?["room"] as? String == "7")
    }

    /// The JavaScript between `<!-- name:begin -->` and `<!-- name:end -->` in docs/join-codes.md.
    static func docSnippet(_ name: String) throws -> String {
        let doc = try String(contentsOfFile: Harness.repoRoot + "/docs/join-codes.md", encoding: .utf8)
        let begin = try #require(doc.range(of: "<!-- \(name):begin -->"), "no \(name) in docs/join-codes.md")
        let end = try #require(doc.range(of: "<!-- \(name):end -->", range: begin.upperBound..<doc.endIndex))
        let block = doc[begin.upperBound..<end.lowerBound]
        let open = try #require(block.range(of: "```javascript\n")), close = try #require(block.range(of: "```", options: .backwards))
        return String(block[open.upperBound..<close.lowerBound])
    }

    /// Runs `script` with node; returns its stdout as JSON.
    static func runNode(_ script: String, _ arguments: [String]) throws -> [String: Any] {
        let path = try Harness.temporaryDirectory() + "/snippet.js"
        try script.write(toFile: path, atomically: true, encoding: .utf8)
        let result = try Harness.run(node, [path] + arguments, timeout: 30)
        try #require(result.status == 0, "node: \(result.stderr.suffix(500))")
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    @Test func docsJavaScriptMakesCodesTheAgentReadsAndSmallQRCodes() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.node) else { skipTest("\(Self.node) missing"); return }
        guard FileManager.default.fileExists(atPath: Self.qrcodeLibrary) else { skipTest("node-qrcode-generator missing"); return }
        guard FileManager.default.isExecutableFile(atPath: Self.python) else { skipTest("\(Self.python) missing"); return }
        let script = "const qrcode = require('\(Self.qrcodeLibrary)');\n" + (try Self.docSnippet("join-code-snippet")) + """
            const input = JSON.parse(process.argv[2]);
            const code = makeJoinCode(input);
            const qr = joinCodeQR(code);
            const svg = qr.createSvgTag({ cellSize: 4, margin: 4 });
            process.stdout.write(JSON.stringify({ code, modules: qr.getModuleCount(), svg: svg.startsWith('<svg') }));
            """
        struct Case { var kind: String; var url: String; var room: String?; var identity: String; var ice: [[String: Any]]
                      var expectedIce: [IceServer]; var typical: Bool }
        let cases = [
            // The typical code of docs/join-codes.md: it must fit QR version 15 at level M.
            Case(kind: "janus", url: "http://127.0.0.1:8088/janus", room: "1234", identity: "Mubashir's screen",
                 ice: [["urls": "stun:stun.l.google.com:19302"]], expectedIce: [IceServer(url: "stun:stun.l.google.com:19302")], typical: true),
            Case(kind: "whip", url: "https://meet.example.org/whip/room-42", room: nil, identity: "Mubashir's screen", ice: [],
                 expectedIce: [], typical: true),
            // Everything the escaping has to handle, and RTCIceServer's list form of urls.
            Case(kind: "janus", url: "https://meet.example.org/janus?a=b;c", room: "Salle n°5; 100% = ok, yes", identity: "Zoë 画面",
                 ice: [["urls": ["stun:a.example", "turn:t.example:3478?transport=udp"], "username": "u,1", "credential": "p;=%2"]],
                 expectedIce: [IceServer(url: "stun:a.example", username: "u,1", credential: "p;=%2"),
                               IceServer(url: "turn:t.example:3478?transport=udp", username: "u,1", credential: "p;=%2")], typical: false),
        ]
        for c in cases {
            var generatorArguments = ["--kind", c.kind, "--url", c.url, "--identity", c.identity]
            if let room = c.room { generatorArguments += ["--room", room] }
            let token = try #require(try Self.generate(generatorArguments)["token"] as? String)
            var input: [String: Any] = ["kind": c.kind, "url": c.url, "token": token, "iceServers": c.ice]
            if let room = c.room { input["room"] = room }
            let inputJSON = String(decoding: try JSONSerialization.data(withJSONObject: input), as: UTF8.self)
            let output = try Self.runNode(script, [inputJSON])
            let code = try #require(output["code"] as? String)
            let modules = try #require(output["modules"] as? Int)
            #expect(output["svg"] as? Bool == true)

            let invitation = try Invitation.read(code, now: Date())
            #expect(invitation.code.service.rawValue == c.kind)
            #expect(invitation.code.url.absoluteString == c.url)
            #expect(invitation.code.token == token)
            #expect(invitation.code.room == c.room)
            #expect(invitation.identity == c.identity)
            #expect(invitation.code.iceServers == c.expectedIce)
            // The Swift writer agrees with the JavaScript one byte for byte.
            #expect(invitation.code.text == code)
            print("join code from the docs' JavaScript: \(code.utf8.count) bytes, QR version \((modules - 17) / 4) at level M (\(modules) modules)")
            if c.typical { #expect(modules <= 77, "QR version \((modules - 17) / 4) > 15 for a typical code of \(code.utf8.count) bytes") }
        }
    }

    /// The QR image the docs' JavaScript makes, read back by a real scanner
    /// (zbar, which guesses the character set of what it reads: the reason
    /// codes are ASCII), reads as the same code.
    @Test func docsQRImageScansBackWithZbar() throws {
        let zbarimg = "/usr/bin/zbarimg"
        guard FileManager.default.isExecutableFile(atPath: zbarimg) else { skipTest("zbarimg missing (Debian zbar-tools)"); return }
        guard FileManager.default.isExecutableFile(atPath: Self.node), FileManager.default.fileExists(atPath: Self.qrcodeLibrary),
              FileManager.default.isExecutableFile(atPath: Self.python) else { skipTest("node, node-qrcode-generator or python3 missing"); return }
        let folder = try Harness.temporaryDirectory()
        let script = "const qrcode = require('\(Self.qrcodeLibrary)');\n" + (try Self.docSnippet("join-code-snippet")) + """
            const input = JSON.parse(process.argv[2]);
            const code = makeJoinCode(input);
            const image = joinCodeQR(code).createDataURL(4, 16);
            require('fs').writeFileSync(process.argv[3], Buffer.from(image.split(',')[1], 'base64'));
            process.stdout.write(JSON.stringify({ code }));
            """
        for (room, identity) in [("1234", "Mubashir's screen"), ("Salle n°5; 100% = ok", "Zoë 画面")] {
            let token = try #require(try Self.generate(["--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", room,
                                                        "--identity", identity])["token"] as? String)
            let input: [String: Any] = ["kind": "janus", "url": "http://127.0.0.1:8088/janus", "token": token, "room": room,
                                        "iceServers": [["urls": "stun:stun.l.google.com:19302"]]]
            let image = folder + "/code-\(UUID().uuidString).gif"
            let made = try Self.runNode(script, [String(decoding: try JSONSerialization.data(withJSONObject: input), as: UTF8.self), image])
            // QR codes only, as the agent's own scanner reads: with every symbology on, zbarimg
            // now and then also finds a Codabar in the QR's modules ("A124A" on a line of its own).
            let scan = try Harness.run(zbarimg, ["--quiet", "--raw", "-Sdisable", "-Sqrcode.enable", image], timeout: 30)
            try #require(scan.status == 0, "zbarimg: \(scan.stderr.suffix(300))")
            let scanned = scan.stdout.trimmingCharacters(in: .newlines)
            #expect(scanned == made["code"] as? String)
            let invitation = try Invitation.read(scan.stdout, now: Date())
            #expect(invitation.room == room && invitation.identity == identity && invitation.code.token == token)
        }
    }

    @Test func docsDevelopmentSignerMakesTokensPyJWTVerifies() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.node) else { skipTest("\(Self.node) missing"); return }
        let script = (try Self.docSnippet("dev-token-snippet")) + """
            const input = JSON.parse(process.argv[2]);
            process.stdout.write(JSON.stringify({ token: devAccessToken(input) }));
            """
        let secret = "dev-secret-\(UInt32.random(in: 0...UInt32.max))"
        for room: String? in ["1234", nil] {
            var input: [String: Any] = ["secret": secret, "issuer": "dev", "subject": "bench", "identity": "Ada's screen", "ttl": 600]
            if let room { input["room"] = room }
            let inputJSON = String(decoding: try JSONSerialization.data(withJSONObject: input), as: UTF8.self)
            let tokenText = try #require(try Self.runNode(script, [inputJSON])["token"] as? String)
            let token = try AccessToken(parsing: tokenText)
            #expect(token.identity == "Ada's screen")
            #expect(token.room == room)
            #expect(token.algorithm == "HS256")
            #expect(token.expiry.timeIntervalSince(try #require(token.issuedAt)) == 600)
            try token.checkTimes(now: Date())
            guard let claims = try Self.verifyWithPyJWT(tokenText, secret: secret) else {
                skipTest("pyjwt missing in /opt/krakl-venv: signature not checked"); continue
            }
            #expect((claims["grants"] as? [String: Any])?["identity"] as? String == "Ada's screen")
            let wrong = try #require(try Self.pyjwt(tokenText, secret: secret + "x"))
            #expect(wrong.status != 0 && wrong.stderr.contains("Signature verification failed"), "pyjwt with a wrong secret: \(wrong.stderr.suffix(200))")
        }
    }
}

extension Array where Element == UInt8 {
    /// Every run of `size` consecutive bytes.
    func byteRuns(_ size: Int) -> [ArraySlice<UInt8>] {
        count < size ? [] : (0...(count - size)).map { self[$0..<$0 + size] }
    }
}
