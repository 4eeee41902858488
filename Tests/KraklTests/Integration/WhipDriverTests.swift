import KraklBase
import KraklHost
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import KraklRTC
@testable import KraklRoom
import Testing

/// The WHIP driver against Tests/Fixtures/whip_server.py: Python's HTTP
/// server, pyjwt checking our Bearer token and aiortc answering as the
/// receiving peer (docs/testing.md, "aiortc"), with a real KraklRTC publisher offering.
@Suite(.serialized, .tags(.integration, .netns)) struct WhipDriverTests {
    /// A namespace, a server in it and a publisher whose offer is real; nil after SKIP.
    struct Rig {
        let namespace: RtcTestNamespace
        let server: WhipTestServer
        let publisher: Publisher
        let log: RtcCallbackLog
        let token: String

        init?(_ arguments: [String] = [], tokenRoom: String? = nil) throws {
            guard WhipTestServer.prerequisites(), let namespace = try RtcTestNamespace() else { return nil }
            self.namespace = namespace
            server = try WhipTestServer(namespace: namespace, arguments)
            (publisher, log) = try whipPublisher(in: namespace)
            token = try WhipTestServer.token(room: tokenRoom ?? server.room)
        }

        func driver(timeouts: WhipTimeouts = WhipTimeouts(), acrossOrigins: Bool = false, endpoint: URL? = nil) -> WhipDriver {
            WhipDriver(endpoint: endpoint ?? server.endpoint, token: token, timeouts: timeouts, allowTokenAcrossOrigins: acrossOrigins)
        }

        func close() { publisher.close() }
    }

    static func monotonicMs() -> Double { MonotonicClock.milliseconds() }

    @Test func publishConnectsAndLeaveDeletesBeforeItReturns() throws {
        guard let rig = try Rig() else { return }
        defer { rig.close() }
        let driver = rig.driver()
        let postAt = Self.monotonicMs()
        let answer = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann Example")
        let answeredAt = Self.monotonicMs()
        #expect(answer.sdp.contains("127.0.0.2"), "aiortc's answer has no 127.0.0.2 candidate")
        #expect(answer.iceServers.isEmpty)
        let auth = try #require(rig.server.waitForEvent("auth"))
        #expect(auth["ok"] as? Bool == true && auth["identity"] as? String == "Ann Example", "the server's verdict on the token: \(auth)")
        let resource = try #require(driver.resourceURL)
        #expect(resource.absoluteString.hasPrefix("http://127.0.0.1:\(rig.server.port)/whip/resource/"), "Location resolved: \(resource)")
        #expect(driver.etag?.hasPrefix("\"") == true)

        try rig.publisher.setAnswer(answer.sdp)
        #expect(whipPoll(timeout: 10) { rig.log.connected }, "not connected: \(rig.log.events)")
        print("WHIP: POST → answer \(String(format: "%.1f", answeredAt - postAt)) ms, answer → connected \(String(format: "%.1f", Self.monotonicMs() - answeredAt)) ms (polled every 10 ms)")
        #expect(rig.server.waitForEvent("peer") { $0["state"] as? String == "connected" } != nil, "aiortc did not connect")

        let leaveAt = Self.monotonicMs()
        driver.leave()
        let leftAt = Self.monotonicMs()
        // A hang guard (10 s) for reading the server's event line; the DELETE itself is judged by order below.
        let delete = try #require(rig.server.waitForEvent("delete", timeout: 10), "no DELETE: \(rig.server.process.log)")
        let deleteAt = delete["t_ms"] as? Double ?? .infinity
        print("WHIP: DELETE seen \(String(format: "%.1f", deleteAt - leaveAt)) ms after leave() began; leave() returned after \(String(format: "%.1f", leftAt - leaveAt)) ms")
        // Order, not speed: leave() deletes the resource before it returns (the server saw the DELETE
        // between the call and its return; both stamps are CLOCK_MONOTONIC, 0.1 ms rounding).
        #expect(deleteAt >= leaveAt - 0.1 && deleteAt <= leftAt + 0.1, "DELETE at \(deleteAt), leave() from \(leaveAt) to \(leftAt)")
        let request = try #require(rig.server.requests("DELETE", atLeast: 1).first)
        #expect(request["token"] as? Bool == true && request["if_match"] is NSNull, "DELETE carries the token and no If-Match: \(request)")

        driver.leave()  // idempotent: no second DELETE
        #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "x") }
        #expect(rig.server.requests("DELETE", atLeast: 1).count == 1)
    }

    @Test(arguments: [("relative", 307), ("absolute", 308), ("relative", 302), ("absolute", 301)])
    func redirectIsFollowedWithTheSamePost(mode: String, status: Int) throws {
        guard let rig = try Rig(["--redirect", mode, "--redirect-status", "\(status)"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        let answer = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        #expect(answer.sdp.hasPrefix("v=0"))
        let posts = rig.server.requests("POST", atLeast: 2)
        #expect(posts.map { $0["path"] as? String } == ["/whip/endpoint/\(rig.server.room)", "/whip/final/\(rig.server.room)"])
        #expect(posts.allSatisfy { $0["token"] as? Bool == true && $0["content_type"] as? String == "application/sdp" })
        #expect(driver.resourceURL?.host == "127.0.0.1" && driver.resourceURL?.port == rig.server.port)
        driver.leave()
        #expect(rig.server.waitForEvent("delete", timeout: 2) != nil)
    }

    @Test func redirectLoopEndsAfterFiveHops() throws {
        guard let rig = try Rig(["--redirect", "loop"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        guard case .badReply(let message)? = error else { Issue.record("expected badReply, got \(String(describing: error))"); return }
        #expect(message.contains("more than 5 redirects"))
        #expect(rig.server.requests("POST", atLeast: 6).count == 6)
    }

    @Test(arguments: [false, true])
    func bearerTokenStaysOnItsOrigin(allowed: Bool) throws {
        guard let rig = try Rig(["--redirect", "other-origin", "--second-port-open"]) else { return }
        defer { rig.close() }
        let driver = rig.driver(acrossOrigins: allowed)
        _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        let posts = rig.server.requests("POST", atLeast: 2)
        #expect(posts.count == 2)
        #expect(posts.first?["token"] as? Bool == true && posts.first?["port"] as? Int == rig.server.port)
        #expect(posts.last?["port"] as? Int == rig.server.secondPort)
        #expect(posts.last?["token"] as? Bool == allowed, "token sent to the other origin: \(String(describing: posts.last))")
        driver.leave()
        let delete = rig.server.waitForEvent("request", timeout: 2) { $0["method"] as? String == "DELETE" }
        #expect(delete?["port"] as? Int == rig.server.secondPort && delete?["token"] as? Bool == allowed)
    }

    @Test func linkHeadersBecomeIceServers() throws {
        let turn = #"<turn:127.0.0.2:3478?transport=udp>; rel="ice-server"; username="u,1;x"; credential="p\"w"; credential-type="password""#
        guard let rig = try Rig(["--link", #"<stun:127.0.0.2:3478>; rel="ice-server""#, "--link", turn,
                                 "--link", #"<https://example.invalid/help>; rel="help""#]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let answer = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        #expect(answer.iceServers == [IceServer(url: "stun:127.0.0.2:3478"),
                                      IceServer(url: "turn:127.0.0.2:3478?transport=udp", username: "u,1;x", credential: "p\"w")])
    }

    /// Status → error class and the server's first line (whip_server.py sends "whip test server says N").
    @Test(arguments: [401, 403, 404, 415, 422, 500, 405])
    func refusalsMapByStatusClass(status: Int) throws {
        guard let rig = try Rig(["--status", "\(status)"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        let message = "whip test server says \(status)"
        switch status {
        case 401, 403: #expect(error == .unauthorized(status: status, message: message))
        case 404: #expect(error == .noSuchRoom(status: status, message: message))
        case 500: #expect(error == .serverError(status: status, message: message))
        default: #expect(error == .refused(status: status, message: message))
        }
        #expect(error?.description.contains("\(status) \(message)") == true, "\(String(describing: error))")
        #expect(rig.server.requests("POST", atLeast: 1).count == 1)
    }

    /// The server's own checks: pyjwt refuses a token signed with another key, or for another room.
    @Test(arguments: ["wrong-secret", "wrong-room", "no-token"])
    func serverRefusesABadToken(kind: String) throws {
        guard let rig = try Rig() else { return }
        defer { rig.close() }
        let token: String? = switch kind {
        case "wrong-secret": try WhipTestServer.token(room: rig.server.room, secret: "another-secret")
        case "wrong-room": try WhipTestServer.token(room: "another-room")
        default: nil
        }
        let driver = WhipDriver(endpoint: rig.server.endpoint, token: token)
        defer { driver.leave() }
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        guard case .unauthorized(401, let message)? = error else { Issue.record("expected 401, got \(String(describing: error))"); return }
        let expected = ["wrong-secret": "Signature verification failed", "wrong-room": "not 'room-", "no-token": "no Authorization header"][kind]!
        #expect(message.contains(expected), "\(message)")
        if let token { #expect(!error!.description.contains(token.split(separator: ".").last!), "the token's signature leaked into the error") }
    }

    @Test func retryAfterIsHonouredOnce() throws {
        guard let rig = try Rig(["--status", "429", "--status-count", "1", "--retry-after", "1"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let start = Self.monotonicMs()
        let answer = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        let elapsed = Self.monotonicMs() - start
        print("WHIP: 429 Retry-After: 1 then 201 after \(Int(elapsed)) ms")
        #expect(answer.sdp.hasPrefix("v=0"))
        // The lower bound judges that Retry-After was waited out; the upper is a hang guard (10x the 1 s wait).
        #expect(elapsed >= 1000 && elapsed < 10_000, "publish took \(elapsed) ms for Retry-After: 1")
        let posts = rig.server.requests("POST", atLeast: 2)
        #expect(posts.count == 2)
        if posts.count == 2, let first = posts[0]["t_ms"] as? Double, let second = posts[1]["t_ms"] as? Double {
            #expect(second - first >= 1000, "the second POST came \(second - first) ms after the first")
        }
    }

    @Test func serviceUnavailableTwiceFails() throws {
        guard let rig = try Rig(["--status", "503", "--status-count", "2", "--retry-after", "1"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let start = Self.monotonicMs()
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        #expect(error == .serverError(status: 503, message: "whip test server says 503"))
        #expect(Self.monotonicMs() - start >= 1000)
        #expect(rig.server.requests("POST", atLeast: 2).count == 2)
    }

    @Test func retryAfterBeyondTheBoundFailsAtOnce() throws {
        guard let rig = try Rig(["--status", "503", "--retry-after", "120"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let start = Self.monotonicMs()
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        guard case .serverError(503, let message)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(message.contains("120 s"))
        // The outcome (one POST, the 120 s named) shows the wait was not begun; this bound only guards a
        // hang (well under the 120 s it refused to wait; the target is a single request's round trip).
        #expect(Self.monotonicMs() - start < 20_000)
        #expect(rig.server.requests("POST", atLeast: 1).count == 1)
    }

    /// A person who stops while the driver waits out a Retry-After is not kept waiting.
    @Test func leaveCutsARetryAfterWaitShort() throws {
        // A 60 s Retry-After (allowed here): leave() ending the wait is told apart from the wait running
        // out by a margin no slow machine closes.
        guard let rig = try Rig(["--status", "503", "--retry-after", "60"]) else { return }
        defer { rig.close() }
        let driver = rig.driver(timeouts: WhipTimeouts(longestRetryAfter: .seconds(60)))
        let offer = rig.publisher.offerSDP
        let start = Self.monotonicMs()
        let outcome = WhipResultBox<RoomAnswer>()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            outcome.result = Result { () throws -> RoomAnswer in try driver.publish(offer: offer, identity: "Ann") }
            done.signal()
        }
        #expect(rig.server.waitForEvent("request", timeout: 5) != nil)
        driver.leave()
        // A hang guard (20 s, 10x more than ending a wait needs; a third of the Retry-After).
        #expect(done.wait(timeout: .now() + 20) == .success, "publish still waiting after leave()")
        let elapsed = Self.monotonicMs() - start
        guard case .failure(let error as RoomError)? = outcome.result, case .unreachable = error else {
            Issue.record("expected unreachable after leave, got \(String(describing: outcome.result))"); return
        }
        // Before the 60 s Retry-After was waited out: leave() ended the wait.
        #expect(elapsed < 60_000, "publish returned \(Int(elapsed)) ms after it started (Retry-After: 60)")
        #expect(rig.server.requests("POST", atLeast: 1).count == 1)
    }

    @Test(arguments: ["--no-location", "--garbage-body"])
    func unusableCreatedReplyIsBadReply(mode: String) throws {
        guard let rig = try Rig([mode]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        guard case .badReply(let message)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(message.contains(mode == "--no-location" ? "without a Location" : "not an SDP answer"), "\(message)")
        driver.leave()
        if mode == "--garbage-body" {
            // The resource exists even though its answer was garbage: leaving must delete it.
            #expect(rig.server.waitForEvent("delete", timeout: 2) != nil, "the half-made session was not deleted")
        }
    }

    @Test func silentServerIsUnreachableWithinTheTimeout() throws {
        guard let rig = try Rig(["--hang"]) else { return }
        defer { rig.close() }
        let driver = rig.driver(timeouts: WhipTimeouts(request: .seconds(2)))
        defer { driver.leave() }
        let start = Self.monotonicMs()
        let error = #expect(throws: RoomError.self) { _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann") }
        let elapsed = Self.monotonicMs() - start
        print("WHIP: a silent server gave up after \(Int(elapsed)) ms (time-out 2 s)")
        guard case .unreachable? = error else { Issue.record("\(String(describing: error))"); return }
        // At least the time-out (the order judged); the upper bound only guards against a hang.
        #expect(elapsed >= 1900 && elapsed <= 20_000, "gave up after \(elapsed) ms for a 2 s time-out")
    }

    @Test func restartPatchesAndRebuildsTheAnswer() throws {
        guard let rig = try Rig() else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        let first = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        try rig.publisher.setAnswer(first.sdp)
        #expect(whipPoll(timeout: 10) { rig.log.connected })

        let restarted = rig.publisher.restartIce()
        let answer = try driver.restart(offer: restarted)
        let event = try #require(rig.server.waitForEvent("restart"))
        let patch = try #require(rig.server.requests("PATCH", atLeast: 1).first)
        #expect(patch["if_match"] as? String == "*" && patch["content_type"] as? String == "application/trickle-ice-sdpfrag")
        #expect(patch["ufrag"] as? String == rig.publisher.offer.iceUfrag && patch["m_line"] as? Bool == true)
        #expect(answer.contains("a=ice-ufrag:\(event["ufrag"] as! String)\r\n") && answer.contains("a=ice-pwd:\(event["pwd"] as! String)\r\n"))
        #expect(!answer.contains("a=ice-ufrag:\(try SdpAnswer(parsing: first.sdp, offer: rig.publisher.offer).iceUfrag)\r\n"))
        let fingerprint = first.sdp.split(whereSeparator: \.isNewline).first { $0.hasPrefix("a=fingerprint:") }
        #expect(fingerprint != nil && answer.contains(String(fingerprint!)), "the rebuilt answer keeps the first answer's fingerprint")
        let parsed = try SdpAnswer(parsing: answer, offer: rig.publisher.offer)
        #expect(parsed.iceUfrag == event["ufrag"] as? String && !parsed.candidates.isEmpty)
        #expect(driver.etag == event["etag"] as? String)

        // Trickle after it: the new entity tag goes in If-Match, with the restarted credentials.
        driver.trickle(candidate: "candidate:1 1 udp 1 127.0.0.2 50000 typ host", mid: "0")
        let trickle = try #require(rig.server.waitForEvent("request") { $0["method"] as? String == "PATCH" && $0["if_match"] as? String != "*" })
        #expect(trickle["if_match"] as? String == event["etag"] as? String && trickle["mid"] as? String == "0")
        #expect(trickle["candidates"] as? [String] == ["1 1 udp 1 127.0.0.2 50000 typ host"])
    }

    @Test(arguments: [405, 422, 501])
    func restartRefusedIsRestartUnsupported(status: Int) throws {
        guard let rig = try Rig(["--patch-status", "\(status)"]) else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        _ = try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann")
        let error = #expect(throws: RoomError.self) { _ = try driver.restart(offer: rig.publisher.restartIce()) }
        guard case .restartUnsupported(let message)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(message.contains("\(status) PATCH answered \(status)"), "\(message)")
        if status != 422 {
            // A server that refuses PATCH takes no trickle either: one try, then nothing.
            driver.trickle(candidate: "candidate:1 1 udp 1 127.0.0.2 50000 typ host", mid: "0")
            driver.trickle(candidate: "candidate:2 1 udp 1 127.0.0.2 50002 typ host", mid: "0")
            #expect(rig.server.requests("PATCH", atLeast: 2).count == 2)
        }
    }

    /// The server ending the session (RFC 9725 §4.2) reaches the publisher, not the driver.
    @Test func serverClosingItsPeerConnectionReachesThePublisher() throws {
        guard let rig = try Rig() else { return }
        defer { rig.close() }
        let driver = rig.driver()
        defer { driver.leave() }
        try rig.publisher.setAnswer(try driver.publish(offer: rig.publisher.offerSDP, identity: "Ann").sdp)
        #expect(whipPoll(timeout: 10) { rig.log.connected })
        rig.server.closePeers()
        #expect(whipPoll(timeout: 5) { rig.log.events.contains(.remoteClosed) }, "no close_notify seen: \(rig.log.events)")
    }
}

/// The driver's pure parts, against published vectors and hand-made headers.
@Suite(.tags(.unit)) struct WhipRulesTests {
    /// RFC 3986 §5.4.1 and §5.4.2, every example.
    @Test func locationResolvesByRfc3986() {
        let base = URL(string: "http://a/b/c/d;p?q")!
        let vectors = [
            ("g", "http://a/b/c/g"), ("./g", "http://a/b/c/g"), ("g/", "http://a/b/c/g/"), ("/g", "http://a/g"),
            ("//g", "http://g"), ("?y", "http://a/b/c/d;p?y"), ("g?y", "http://a/b/c/g?y"), ("#s", "http://a/b/c/d;p?q#s"),
            ("g#s", "http://a/b/c/g#s"), ("g?y#s", "http://a/b/c/g?y#s"), (";x", "http://a/b/c/;x"), ("g;x", "http://a/b/c/g;x"),
            ("g;x?y#s", "http://a/b/c/g;x?y#s"), (".", "http://a/b/c/"), ("./", "http://a/b/c/"),
            ("..", "http://a/b/"), ("../", "http://a/b/"), ("../g", "http://a/b/g"), ("../..", "http://a/"), ("../../", "http://a/"),
            ("../../g", "http://a/g"), ("../../../g", "http://a/g"), ("../../../../g", "http://a/g"), ("/./g", "http://a/g"),
            ("/../g", "http://a/g"), ("g.", "http://a/b/c/g."), (".g", "http://a/b/c/.g"), ("g..", "http://a/b/c/g.."),
            ("..g", "http://a/b/c/..g"), ("./../g", "http://a/b/g"), ("./g/.", "http://a/b/c/g/"), ("g/./h", "http://a/b/c/g/h"),
            ("g/../h", "http://a/b/c/h"), ("g;x=1/./y", "http://a/b/c/g;x=1/y"), ("g;x=1/../y", "http://a/b/c/y"),
            ("g?y/./x", "http://a/b/c/g?y/./x"), ("g?y/../x", "http://a/b/c/g?y/../x"), ("g#s/./x", "http://a/b/c/g#s/./x"),
            ("g#s/../x", "http://a/b/c/g#s/../x"), ("http:g", "http:g"),
        ]
        for (reference, expected) in vectors where reference != "http:g" {
            #expect(WhipHttpRules.resolve(reference, against: base)?.absoluteString == expected, "\(reference)")
        }
        // Not usable as a WHIP resource: empty, another scheme, no host.
        #expect(WhipHttpRules.resolve("", against: base) == nil)
        #expect(WhipHttpRules.resolve("g:h", against: base) == nil)
        #expect(WhipHttpRules.resolve("http:g", against: base) == nil)
        let whip = URL(string: "https://whip.example:8443/whip/endpoint/room1")!
        #expect(WhipHttpRules.resolve("../resource/42", against: whip)?.absoluteString == "https://whip.example:8443/whip/resource/42")
        #expect(WhipHttpRules.resolve("https://other.example/r/1", against: whip)?.absoluteString == "https://other.example/r/1")
    }

    @Test func hopsAndTokenFollowTheOriginRules() {
        let endpoint = URL(string: "https://whip.example/whip/room")!
        let sameOriginDefaultPort = URL(string: "https://WHIP.example:443/whip/final")!
        let otherPort = URL(string: "https://whip.example:8443/whip/final")!
        let plain = URL(string: "http://whip.example/whip/final")!
        #expect(WhipHttpRules.refusal(from: endpoint, to: plain) == "from https down to http")
        #expect(WhipHttpRules.refusal(from: plain, to: endpoint) == nil)
        #expect(WhipHttpRules.refusal(from: endpoint, to: URL(string: "ftp://whip.example/x")!) != nil)
        #expect(WhipHttpRules.tokenMayGo(to: sameOriginDefaultPort, endpoint: endpoint, acrossOrigins: false))
        #expect(!WhipHttpRules.tokenMayGo(to: otherPort, endpoint: endpoint, acrossOrigins: false))
        #expect(WhipHttpRules.tokenMayGo(to: otherPort, endpoint: endpoint, acrossOrigins: true))
        #expect(!WhipHttpRules.tokenMayGo(to: plain, endpoint: endpoint, acrossOrigins: true))
        #expect(!WhipHttpRules.tokenMayGo(to: URL(string: "https://evil.example/whip/room")!, endpoint: endpoint, acrossOrigins: false))
    }

    @Test func retryAfterReadsSecondsAndDates() {
        // RFC 9110 §5.6.7's example date, in all three formats, 5 s before it.
        let now = Date(timeIntervalSince1970: 784_111_777 - 5)
        #expect(WhipHttpRules.retryAfterSeconds("3", now: now) == 3)
        #expect(WhipHttpRules.retryAfterSeconds(" 120 ", now: now) == 120)
        #expect(WhipHttpRules.retryAfterSeconds("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == 5)
        #expect(WhipHttpRules.retryAfterSeconds("Sunday, 06-Nov-94 08:49:37 GMT", now: now) == 5)
        #expect(WhipHttpRules.retryAfterSeconds("Sun Nov  6 08:49:37 1994", now: now) == 5)
        #expect(WhipHttpRules.retryAfterSeconds("Sun, 06 Nov 1994 08:49:37 GMT", now: now.addingTimeInterval(60)) == 0)
        #expect(WhipHttpRules.retryAfterSeconds("-1", now: now) == nil)
        #expect(WhipHttpRules.retryAfterSeconds("soon", now: now) == nil)
        #expect(WhipHttpRules.retryAfterSeconds("", now: now) == nil)
    }

    @Test func linkHeaderParsesSeveralFieldsAndJoinedOnes() {
        let joined = #"<stun:stun.example.net>; rel="ice-server", <turn:turn.example.net?transport=udp>; rel="ice-server"; username="user, name"; credential="p;a\"ss"; credential-type="password", <https://x.example/a,b>; rel=help"#
        let servers = LinkHeader.iceServers([joined])
        #expect(servers == [IceServer(url: "stun:stun.example.net"),
                            IceServer(url: "turn:turn.example.net?transport=udp", username: "user, name", credential: "p;a\"ss")])
        #expect(LinkHeader.iceServers([#"<stun:stun.example.net>; rel="ice-server""#, #"<turns:t.example:443?transport=tcp>;rel=ice-server;username=u;credential=c"#])
            == [IceServer(url: "stun:stun.example.net"), IceServer(url: "turns:t.example:443?transport=tcp", username: "u", credential: "c")])
        let links = LinkHeader.parse(joined)
        #expect(links.count == 3 && links[2].target == "https://x.example/a,b" && links[2].relations == ["help"])
        // rel lists, case, first rel wins, oauth credentials left out, malformed links skipped.
        #expect(LinkHeader.iceServers([#"<stun:a.example>; REL="preload ICE-Server""#]) == [IceServer(url: "stun:a.example")])
        #expect(LinkHeader.iceServers([#"<stun:a.example>; rel="help"; rel="ice-server""#]).isEmpty)
        #expect(LinkHeader.iceServers([#"<turn:a.example>; rel="ice-server"; username="u"; credential="t"; credential-type="oauth""#]).isEmpty)
        #expect(LinkHeader.iceServers([#"stun:bare.example; rel="ice-server", <stun:ok.example>; rel="ice-server""#]) == [IceServer(url: "stun:ok.example")])
        #expect(LinkHeader.iceServers([#"<stun:a.example>; rel="ice-server"; username="unterminated"#]).isEmpty)
        #expect(LinkHeader.iceServers([#"<http://a.example>; rel="ice-server""#, "", " , ,"]).isEmpty)
    }

    @Test func sdpFragmentsRoundTrip() {
        let offer = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=Ann\r\nt=0 0\r\na=group:BUNDLE 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdef012345\r\na=candidate:1 1 udp 2130706431 127.0.0.2 5000 typ host\r\na=sendonly\r\n"
        let fragment = WhipSdpFragment(parsing: offer)
        #expect(fragment.body == "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdef012345\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.2 5000 typ host\r\n")
        let answerFragment = WhipSdpFragment(parsing: "a=ice-ufrag:new1\r\na=ice-pwd:newpassword0123456789\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\na=candidate:9 1 udp 1 127.0.0.2 6000 typ host\r\na=end-of-candidates\r\n")
        let rebuilt = answerFragment.replacingIce(in: offer.replacingOccurrences(of: "a=sendonly", with: "a=recvonly"))
        #expect(rebuilt == "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=Ann\r\nt=0 0\r\na=group:BUNDLE 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=ice-ufrag:new1\r\na=ice-pwd:newpassword0123456789\r\na=recvonly\r\na=candidate:9 1 udp 1 127.0.0.2 6000 typ host\r\na=end-of-candidates\r\n")
        #expect(WhipSdpFragment(parsing: "a=candidate:1 1 udp 1 1.2.3.4 5 typ host\r\n").replacingIce(in: offer) == nil)
        #expect(WhipDriver.looksLikeSdp(offer) && !WhipDriver.looksLikeSdp("<html>v=0\nm=video</html>") && !WhipDriver.looksLikeSdp("v=0\r\n"))
    }

    @Test func statusesMapByClass() {
        func response(_ status: Int, _ body: String) -> HTTPResponse {
            HTTPResponse(status: status, headers: [], body: Data(body.utf8), url: URL(string: "http://127.0.0.1/")!)
        }
        #expect(WhipHttpRules.error(for: response(406, "not acceptable here\nmore")) == .refused(status: 406, message: "not acceptable here"))
        #expect(WhipHttpRules.error(for: response(403, "")) == .unauthorized(status: 403, message: HTTPURLResponse.localizedString(forStatusCode: 403)))
        #expect(WhipHttpRules.error(for: response(502, "bad gateway")) == .serverError(status: 502, message: "bad gateway"))
        if case .badReply = WhipHttpRules.error(for: response(304, "")) {} else { Issue.record("304 is not a refusal") }
    }
}
