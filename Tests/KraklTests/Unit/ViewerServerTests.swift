import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklViewer
import Testing

/// A peer factory that answers with a fixed text and remembers what it was given.
final class FakePeerFactory: ViewerPeerFactory, @unchecked Sendable {
    /// @unchecked Sendable: a test fake: its records are under `lock`; `onClosed` is set once, by the endpoint's thread.
    final class Peer: ViewerPeer, @unchecked Sendable {
        let answer = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=fake answer\r\nt=0 0\r\n"
        private let lock = NSLock()
        private var _closed = false
        private var _candidates: [String] = []
        var onClosed: (@Sendable (String) -> Void)?
        var stats: ViewerPeerStats { ViewerPeerStats(state: closed ? "closed" : "connected") }
        var closed: Bool { lock.withLock { _closed } }
        var candidates: [String] { lock.withLock { _candidates } }
        func addRemoteCandidates(sdpFragment: String) throws(ViewerPeerError) { lock.withLock { _candidates.append(sdpFragment) } }
        /// Restarts answer with a new ufrag each time ("fake1", "fake2", …); `restartable` false: the protocol's 501.
        var restartable: Bool {
            get { lock.withLock { _restartable } }
            set { lock.withLock { _restartable = newValue } }
        }
        private var _restartable = true
        private var _restarts: [String] = []
        var restarts: [String] { lock.withLock { _restarts } }
        func restartIce(sdpFragment: String) throws(ViewerPeerError) -> String {
            guard restartable else { throw .notImplemented("ICE restarts are not supported by this peer") }
            let count = lock.withLock { _restarts.append(sdpFragment); return _restarts.count }
            return "a=ice-ufrag:fake\(count)\r\na=ice-pwd:fakefakefakefakefakefake\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\n"
                + "a=candidate:1 1 udp 2130706431 127.0.0.1 40000 typ host\r\na=end-of-candidates\r\n"
        }
        func close() { lock.withLock { _closed = true } }
        /// As the answerer would on consent expiry.
        func dropByItself() { lock.withLock { _closed = true }; onClosed?("consent expired") }
    }

    private let lock = NSLock()
    private var _offers: [String] = []
    private var _peers: [Peer] = []
    var refusal: ViewerPeerError?

    var offers: [String] { lock.withLock { _offers } }
    var peers: [Peer] { lock.withLock { _peers } }

    func makePeer(offer: String) throws(ViewerPeerError) -> ViewerPeer {
        let peer = Peer()
        let refusal: ViewerPeerError? = lock.withLock {
            _offers.append(offer)
            if self.refusal == nil { _peers.append(peer) }
            return self.refusal
        }
        if let refusal { throw refusal }
        return peer
    }
}

/// One HTTP exchange over a raw loopback socket: whatever bytes a test wants to send, and the
/// reply read to the server's close (bounded in time).
struct RawHTTP {
    struct Reply {
        var status: Int
        var headers: [(String, String)]
        var body: String
        /// The server closed without answering.
        var closedSilently: Bool
        func header(_ name: String) -> String? { headers.first { $0.0.caseInsensitiveCompare(name) == .orderedSame }?.1 }
    }

    static func connect(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard result == 0 else { close(fd); throw POSIXError(.ECONNREFUSED) }
        var timeout = timeval(tv_sec: 15, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    static func send(_ fd: Int32, _ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }   // the server may close early on a refused request
            offset += n
        }
    }

    /// Reads until the server closes (or 15 s).
    static func readReply(_ fd: Int32) -> Reply {
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            data += chunk[0..<n]
        }
        close(fd)
        let text = String(decoding: data, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n") else { return Reply(status: 0, headers: [], body: text, closedSilently: true) }
        var lines = text[..<split.lowerBound].components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        let headers = lines.compactMap { line -> (String, String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        return Reply(status: statusLine.count > 1 ? Int(statusLine[1]) ?? 0 : 0, headers: headers, body: String(text[split.upperBound...]), closedSilently: false)
    }

    static func exchange(port: UInt16, _ raw: [UInt8]) throws -> Reply {
        let fd = try connect(port: port)
        send(fd, raw)
        return readReply(fd)
    }

    static func request(port: UInt16, _ method: String, _ path: String, headers: [(String, String)] = [], body: String = "") throws -> Reply {
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        if !body.isEmpty || method == "POST" || method == "PATCH" { text += "Content-Length: \(body.utf8.count)\r\n" }
        return try exchange(port: port, Array((text + "\r\n" + body).utf8))
    }
}

/// The built-in viewer's HTTP server and WHEP rules over real loopback sockets, with a fake
/// peer factory standing in for the WebRTC answerer.
@Suite(.tags(.unit)) struct ViewerServerTests {
    static let offer = "v=0\r\no=- 42 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\n"
        + "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\na=recvonly\r\na=rtpmap:96 VP8/90000\r\n"
    static let sdp = [("Content-Type", "application/sdp")]

    final class Running {
        let factory = FakePeerFactory()
        let server: ViewerServer
        var port: UInt16 { server.http.address.port }
        init(maximumViewers: Int = 4, requireToken: Bool? = nil, limits: HTTPLimits = HTTPLimits()) throws {
            server = try ViewerServer(listen: ListenAddress(host: "127.0.0.1", port: 0), factory: factory, maximumViewers: maximumViewers,
                                      requireToken: requireToken, limits: limits)
            server.start()
        }
        deinit { server.stop(reason: "the test ended") }
    }

    @Test func postAnswersWithLocationETagAndTheAnswer() throws {
        let viewer = try Running()
        let reply = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(reply.status == 201)
        #expect(reply.header("Content-Type") == "application/sdp")
        let location = try #require(reply.header("Location"))
        #expect(location.hasPrefix("/whep/resource/") && location.count > "/whep/resource/".count + 16)
        let etag = try #require(reply.header("ETag"))
        #expect(etag.hasPrefix("\"") && etag.hasSuffix("\"") && etag.count > 2)
        #expect(reply.body == FakePeerFactory.Peer().answer)
        #expect(viewer.factory.offers == [Self.offer])
        // Another viewer gets another resource.
        let second = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(second.status == 201 && second.header("Location") != location)
        #expect(viewer.server.endpoint.viewerCount == 2)
    }

    @Test func refusesWhatIsNotAnOfferAndUnknownResources() throws {
        let viewer = try Running()
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: [("Content-Type", "text/plain")], body: Self.offer).status == 415)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", body: Self.offer).status == 415)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: "hello").status == 400)
        #expect(try RawHTTP.request(port: viewer.port, "GET", "/whep").status == 405)
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", "/whep/resource/0123").status == 404)
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", "/whep/resource/0123", headers: [("Content-Type", "application/trickle-ice-sdpfrag")],
                                    body: "a=candidate:1 1 udp 1 127.0.0.1 9 typ host\r\n").status == 404)
        #expect(try RawHTTP.request(port: viewer.port, "GET", "/nothing-here").status == 404)
        #expect(viewer.factory.offers.isEmpty)
        // The answerer's refusals keep their meaning.
        viewer.factory.refusal = .unacceptableOffer("no VP8")
        let refused = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(refused.status == 406 && refused.body.contains("no VP8"))
        viewer.factory.refusal = .notImplemented("the viewer's WebRTC answerer is not built yet")
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 501)
        #expect(viewer.server.endpoint.viewerCount == 0)
    }

    @Test func deleteClosesThePeerAndPatchTrickles() throws {
        let viewer = try Running()
        let created = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        let location = try #require(created.header("Location")), etag = try #require(created.header("ETag"))
        let peer = try #require(viewer.factory.peers.first)
        let fragment = "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\na=candidate:1 1 udp 2113937151 127.0.0.1 50000 typ host\r\n"
        let trickle = [("Content-Type", "application/trickle-ice-sdpfrag"), ("If-Match", etag)]
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", location, headers: trickle, body: fragment).status == 204)
        #expect(peer.candidates == [fragment])
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", location, headers: [("Content-Type", "application/trickle-ice-sdpfrag"), ("If-Match", "\"other\"")],
                                    body: fragment).status == 412)
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", location, headers: [("Content-Type", "text/plain")], body: fragment).status == 415)
        // A peer that cannot restart ICE: 501, said so, and the session goes on.
        peer.restartable = false
        let restart = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: [("Content-Type", "application/trickle-ice-sdpfrag"), ("If-Match", "*")],
                                          body: "a=ice-ufrag:new1\r\na=ice-pwd:newnewnewnewnewnewnewnew\r\n")
        #expect(restart.status == 501 && restart.body.contains("ICE restart"))
        #expect(peer.candidates.count == 1)
        #expect(!peer.closed)
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", location).status == 200)
        #expect(peer.closed)
        #expect(viewer.server.endpoint.viewerCount == 0)
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", location).status == 404)
    }

    /// RFC 9725 §4.3.2 as WHEP uses it: a restart PATCH (If-Match: *, new credentials) gets 200 with the
    /// peer's answer fragment and a new ETag; the old ETag is then stale (412), trickle goes on with the
    /// new one (204), and a restart of a session that is not there is 404.
    @Test func anIceRestartAnswers200WithTheNewFragmentAndANewETag() throws {
        let viewer = try Running()
        let created = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        let location = try #require(created.header("Location")), firstTag = try #require(created.header("ETag"))
        let peer = try #require(viewer.factory.peers.first)
        let restartBody = "a=ice-ufrag:efgh\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\n"
            + "a=candidate:1 1 udp 2113937151 127.0.0.1 50002 typ host\r\n"
        let fragment = [("Content-Type", "application/trickle-ice-sdpfrag")]
        let restart = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", "*")], body: restartBody)
        #expect(restart.status == 200, "\(restart.status) \(restart.body)")
        #expect(restart.header("Content-Type") == "application/trickle-ice-sdpfrag")
        #expect(restart.body.contains("a=ice-ufrag:fake1") && restart.body.contains("a=ice-pwd:") && restart.body.contains("a=candidate:"))
        #expect(ViewerServerTests.ufrag(restart.body) == "fake1", "the peer's new credentials, not the viewer's")
        let secondTag = try #require(restart.header("ETag"))
        #expect(secondTag != firstTag && secondTag.hasPrefix("\""))
        #expect(peer.restarts == [restartBody])
        // The ETag of the ICE session before the restart is stale now, for trickle and restart alike.
        let trickle = "a=ice-ufrag:efgh\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\na=candidate:2 1 udp 1 127.0.0.1 50003 typ host\r\n"
        let stale = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", firstTag)], body: trickle)
        #expect(stale.status == 412 && stale.header("ETag") == secondTag)
        let staleRestart = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", firstTag)],
                                               body: restartBody.replacingOccurrences(of: "efgh", with: "ijkl"))
        #expect(staleRestart.status == 412)
        // Trickle of the new generation (its ufrag, the new ETag) is still 204.
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", secondTag)], body: trickle).status == 204)
        #expect(peer.candidates == [trickle])
        // A second restart with the current ETag (not "*") works too, and gets yet another ufrag and ETag.
        let again = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", secondTag)],
                                        body: restartBody.replacingOccurrences(of: "efgh", with: "mnop"))
        #expect(again.status == 200 && again.body.contains("a=ice-ufrag:fake2") && again.header("ETag") != secondTag)
        // "*" without new credentials is not a restart anyone can answer.
        let empty = try RawHTTP.request(port: viewer.port, "PATCH", location, headers: fragment + [("If-Match", "*")], body: "a=candidate:3 1 udp 1 127.0.0.1 50004 typ host\r\n")
        #expect(empty.status == 400 && empty.body.contains("ice-ufrag"))
        #expect(peer.restarts.count == 2 && !peer.closed)
        // No such session: 404 for a restart as for trickle.
        let unknown = try RawHTTP.request(port: viewer.port, "PATCH", "/whep/resource/00112233445566778899aabbccddeeff", headers: fragment + [("If-Match", "*")],
                                          body: restartBody)
        #expect(unknown.status == 404)
        #expect(viewer.server.endpoint.viewerCount == 1)
    }

    /// The first `a=ice-ufrag` value of an SDP text or fragment.
    static func ufrag(_ text: String) -> String? {
        text.split(whereSeparator: \.isNewline).first { $0.hasPrefix("a=ice-ufrag:") }.map { String($0.dropFirst(12)) }
    }

    @Test func theViewerLimitAnswers503WithRetryAfter() throws {
        let viewer = try Running(maximumViewers: 2)
        let first = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 201)
        let full = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(full.status == 503)
        #expect(Int(full.header("Retry-After") ?? "") ?? 0 > 0)
        #expect(viewer.factory.offers.count == 2, "no peer is made for a viewer over the limit")
        // A place frees when a viewer leaves (DELETE) or its peer drops by itself.
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", try #require(first.header("Location"))).status == 200)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 201)
        viewer.factory.peers[1].dropByItself()
        #expect(viewer.server.endpoint.viewerCount == 1)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 201)
        // Sharing over: every peer closed, newcomers told so.
        viewer.server.endpoint.end(reason: "the source ended")
        #expect(viewer.factory.peers.allSatisfy { $0.closed })
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 410)
        #expect(try RawHTTP.request(port: viewer.port, "GET", "/status").body.contains("\"ended\":\"the source ended\""))
    }

    @Test func aTokenIsRequiredOffLoopbackOrWhenAskedFor() throws {
        let viewer = try Running(requireToken: true)
        let token = try #require(viewer.server.token)
        #expect(token.value.count >= 22)
        #expect(viewer.server.url.hasSuffix("/#token=" + token.value))
        #expect(!viewer.server.redactedURL.contains(token.value))
        let missing = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp, body: Self.offer)
        #expect(missing.status == 401)
        #expect(missing.header("WWW-Authenticate")?.hasPrefix("Bearer") == true)
        let wrong = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp + [("Authorization", "Bearer " + String(token.value.reversed()))], body: Self.offer)
        #expect(wrong.status == 401 && wrong.header("WWW-Authenticate")?.contains("invalid_token") == true)
        #expect(try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp + [("Authorization", "Basic " + token.value)], body: Self.offer).status == 401)
        #expect(viewer.factory.offers.isEmpty)
        let good = try RawHTTP.request(port: viewer.port, "POST", "/whep", headers: Self.sdp + [("Authorization", "Bearer " + token.value)], body: Self.offer)
        #expect(good.status == 201)
        let location = try #require(good.header("Location"))
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", location).status == 401)
        #expect(try RawHTTP.request(port: viewer.port, "PATCH", location, headers: [("Content-Type", "application/trickle-ice-sdpfrag")], body: "a=end-of-candidates\r\n").status == 401)
        #expect(try RawHTTP.request(port: viewer.port, "GET", "/status").status == 401)
        #expect(try RawHTTP.request(port: viewer.port, "DELETE", location, headers: [("Authorization", "Bearer " + token.value)]).status == 200)
        // The page itself holds no secret: it loads without the token (and reads it from the fragment).
        #expect(try RawHTTP.request(port: viewer.port, "GET", "/").status == 200)
        // Any origin may call in with the token (CORS), since the token is the permission.
        let preflight = try RawHTTP.request(port: viewer.port, "OPTIONS", "/whep", headers: [("Origin", "http://player.example"), ("Access-Control-Request-Method", "POST")])
        #expect(preflight.status == 204 && preflight.header("Access-Control-Allow-Origin") == "*")
        #expect(preflight.header("Access-Control-Allow-Headers")?.contains("Authorization") == true)
        #expect(preflight.header("Accept-Post") == "application/sdp")
        #expect(preflight.header("Access-Control-Expose-Headers")?.contains("Location") == true)
        // The token comparison itself.
        #expect(ViewerAccessToken.constantTimeEqual(Array("abc".utf8), Array("abc".utf8)))
        #expect(!ViewerAccessToken.constantTimeEqual(Array("abd".utf8), Array("abc".utf8)))
        #expect(!ViewerAccessToken.constantTimeEqual(Array("ab".utf8), Array("abc".utf8)))
        #expect(!ViewerAccessToken.constantTimeEqual(Array("abcd".utf8), Array("abc".utf8)))
        #expect(ViewerAccessToken().value != ViewerAccessToken().value)
        #expect(!"\(token)".contains(token.value) && !String(reflecting: token).contains(token.value))
    }

    @Test func withoutATokenOnlyLoopbackNamesAndOriginsAreServed() throws {
        let viewer = try Running()
        #expect(viewer.server.token == nil && !viewer.server.url.contains("#"))
        // DNS rebinding: a foreign name pointed at 127.0.0.1 is refused.
        #expect(try RawHTTP.exchange(port: viewer.port, Array("GET /status HTTP/1.1\r\nHost: evil.example:\(viewer.port)\r\n\r\n".utf8)).status == 421)
        #expect(try RawHTTP.exchange(port: viewer.port, Array("GET /status HTTP/1.1\r\nHost: localhost:\(viewer.port)\r\n\r\n".utf8)).status == 200)
        #expect(try RawHTTP.exchange(port: viewer.port, Array("GET /status HTTP/1.1\r\nHost: [::1]:\(viewer.port)\r\n\r\n".utf8)).status == 200)
        let foreign = try RawHTTP.request(port: viewer.port, "OPTIONS", "/whep", headers: [("Origin", "https://evil.example")])
        #expect(foreign.header("Access-Control-Allow-Origin") == nil)
        let local = try RawHTTP.request(port: viewer.port, "OPTIONS", "/whep", headers: [("Origin", "http://localhost:3000")])
        #expect(local.header("Access-Control-Allow-Origin") == "http://localhost:3000")
        #expect(local.header("Accept-Post") == "application/sdp")
    }

    @Test func hostileRequestsAreBoundedAndTheServerKeepsServing() throws {
        var limits = HTTPLimits()
        limits.requestTimeout = .seconds(1)
        limits.maximumConnections = 4
        let viewer = try Running(limits: limits)
        let port = viewer.port
        let oversizedHead = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Junk: " + String(repeating: "a", count: 20_000) + "\r\n\r\n"
        #expect(try RawHTTP.exchange(port: port, Array(oversizedHead.utf8)).status == 431)
        let endlessHead = "GET / HTTP/1.1\r\nX-Junk: " + String(repeating: "a", count: 40_000)   // never ends
        #expect(try RawHTTP.exchange(port: port, Array(endlessHead.utf8)).status == 431)
        let bigBody = "POST /whep HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\nContent-Length: 300000\r\n\r\n" + String(repeating: "v", count: 300_000)
        #expect(try RawHTTP.exchange(port: port, Array(bigBody.utf8)).status == 413)
        for length in ["99999999999999999999", "-1", "12, 12", "0x10"] {
            let huge = "POST /whep HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\nContent-Length: \(length)\r\n\r\nv=0"
            let reply = try RawHTTP.exchange(port: port, Array(huge.utf8))
            #expect((400..<500).contains(reply.status), "Content-Length: \(length) → \(reply.status)")
        }
        #expect(try RawHTTP.exchange(port: port, Array("POST /whep HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".utf8)).status == 501)
        for garbage in ["\u{16}\u{03}\u{01}\u{02}\u{00}\u{01}\u{00}\u{01}\u{fc}\u{03}\u{03}", "SSH-2.0-OpenSSH_9.2\r\n\r\n", "GET\r\n\r\n",
                        "GET / HTTP/9.9\r\n\r\n", "GET /\u{0}x HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\n folded: x\r\n\r\n", "GET / HTTP/1.1\r\nno colon\r\n\r\n"] {
            let reply = try RawHTTP.exchange(port: port, Array(garbage.utf8))
            #expect(reply.closedSilently || (400..<600).contains(reply.status), "\(garbage.debugDescription) → \(reply.status)")
        }
        // Slowloris: a request that never completes is cut off by the request time-out.
        let slow = try RawHTTP.connect(port: port)
        RawHTTP.send(slow, Array("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n".utf8))
        let started = MonotonicClock.milliseconds()
        let cut = RawHTTP.readReply(slow)
        #expect(cut.closedSilently || cut.status == 408 || cut.status == 0)
        #expect(MonotonicClock.milliseconds() - started < 14_000, "cut off by the 1 s time-out, not by the test's 15 s read bound")
        // Connections over the bound get 503 at once; the held ones do not stop others later.
        let held = try (0..<4).map { _ in try RawHTTP.connect(port: port) }
        var extra = RawHTTP.Reply(status: 0, headers: [], body: "", closedSilently: true)
        let deadline = MonotonicClock.milliseconds() + 5000
        // The server counts a connection once it accepted it: poll until all four are in.
        while extra.status != 503 && MonotonicClock.milliseconds() < deadline {
            extra = try RawHTTP.exchange(port: port, Array("GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8))
        }
        #expect(extra.status == 503)
        for fd in held { close(fd) }
        var after = RawHTTP.Reply(status: 0, headers: [], body: "", closedSilently: true)
        let again = MonotonicClock.milliseconds() + 5000
        while after.status != 200 && MonotonicClock.milliseconds() < again {
            after = try RawHTTP.request(port: port, "GET", "/")
        }
        #expect(after.status == 200 && after.body.contains("<video"))
        #expect(try RawHTTP.request(port: port, "POST", "/whep", headers: Self.sdp, body: Self.offer).status == 201)
    }

    @Test func thePageIsSelfContainedUnderAContentSecurityPolicy() throws {
        let viewer = try Running()
        let html = try RawHTTP.request(port: viewer.port, "GET", "/")
        #expect(html.status == 200 && html.header("Content-Type") == "text/html; charset=utf-8")
        let policy = try #require(html.header("Content-Security-Policy"))
        #expect(policy.contains("default-src 'none'") && policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"))
        let script = try RawHTTP.request(port: viewer.port, "GET", "/viewer.js")
        #expect(script.status == 200 && script.header("Content-Type")?.hasPrefix("text/javascript") == true)
        let style = try RawHTTP.request(port: viewer.port, "GET", "/viewer.css")
        #expect(style.status == 200 && style.header("Content-Type")?.hasPrefix("text/css") == true)
        #expect(script.body.contains("recvonly") && script.body.contains("'/whep'") && script.body.contains("keepalive: true"))
        #expect(script.body.contains("Authorization") && script.body.contains("getStats"))
        for body in [html.body, script.body, style.body] {
            // No URL of anything elsewhere: no scheme://, no protocol-relative src/href, no @import.
            #expect(body.range(of: "[A-Za-z][A-Za-z0-9+.-]*://", options: .regularExpression) == nil)
            #expect(body.range(of: "(src|href)=\"//", options: .regularExpression) == nil)
            #expect(!body.contains("@import") && !body.contains("url("))
        }
        #expect(!html.body.contains("<script>") && !html.body.contains("style="), "no inline script or style (the CSP forbids them)")
        let head = try RawHTTP.request(port: viewer.port, "HEAD", "/")
        #expect(head.status == 200 && head.body.isEmpty && Int(head.header("Content-Length") ?? "") == html.body.utf8.count)
    }

    @Test func listenAddressesAndBindFailures() throws {
        #expect(ListenAddress("127.0.0.1") == ListenAddress(host: "127.0.0.1", port: 8990))
        #expect(ListenAddress("10.1.2.3:9000") == ListenAddress(host: "10.1.2.3", port: 9000))
        #expect(ListenAddress("[::1]:81") == ListenAddress(host: "::1", port: 81))
        #expect(ListenAddress("::1") == ListenAddress(host: "::1", port: 8990))
        #expect(ListenAddress("localhost:7") == ListenAddress(host: "127.0.0.1", port: 7))
        for bad in ["", "example.com", "1.2.3.4:99999", "1.2.3.4:x", "[::1", "300.1.1.1"] { #expect(ListenAddress(bad) == nil, "\(bad)") }
        #expect(ListenAddress("127.0.0.2")!.isLoopback && ListenAddress("::1")!.isLoopback)
        #expect(!ListenAddress("0.0.0.0")!.isLoopback && !ListenAddress("10.0.0.1")!.isLoopback && !ListenAddress("::")!.isLoopback)
        // A non-loopback address always gets a token, even if asked not to.
        let first = try Running()
        #expect(throws: ViewerServerError.self) {
            _ = try ViewerServer(listen: ListenAddress(host: "127.0.0.1", port: first.port), factory: FakePeerFactory())
        }
        do {
            _ = try ViewerServer(listen: ListenAddress(host: "127.0.0.1", port: first.port), factory: FakePeerFactory())
        } catch {
            #expect(error.description.contains("in use") && error.description.contains("--listen"))
        }
    }
}
