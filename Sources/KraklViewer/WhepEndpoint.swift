import FoundationEssentials
import Glibc
import KraklBase

/// The viewer's rules, one per request: WHEP (draft-ietf-wish-whep, with
/// the HTTP rules of WHIP, RFC 9725) for players, the page and its status
/// for people. Pure request → response over the peers it keeps; the
/// server's thread calls it, peers' close callbacks may come from any thread.
public final class WhepEndpoint: Sendable {
    public struct Policy: Sendable {
        /// Viewers at once; the next POST gets 503 with Retry-After.
        public var maximumViewers = 4
        /// Required as a Bearer token on everything but the page itself (nil: loopback, none needed).
        public var token: ViewerAccessToken?
        /// What a refused viewer is told to wait before it asks again (Retry-After, whole seconds).
        public var retryAfter: Duration = .seconds(10)

        public init() {}
    }

    public static let endpointPath = "/whep"
    public static let resourcePrefix = "/whep/resource/"

    public let policy: Policy
    private let factory: ViewerPeerFactory
    /// The viewers' resources and notes.
    private struct Viewers {
        var resources: [String: Resource] = [:]
        var endedReason: String?
        var idleNote: String?
    }
    private let viewers = Guarded(Viewers())

    /// A viewer came or went (the count after it); any thread. Set before serving.
    public var onViewersChanged: (@Sendable (_ count: Int, _ event: String) -> Void)? {
        get { viewersHandler.wrappedValue }
        set { viewersHandler.wrappedValue = newValue }
    }
    private let viewersHandler = Locked<(@Sendable (_ count: Int, _ event: String) -> Void)?>(wrappedValue: nil)

    private struct Resource {
        let peer: ViewerPeer
        let etag: String
        /// The offer's ICE username fragment: a PATCH with another one is an ICE restart.
        let ufrag: String?
    }

    public init(factory: ViewerPeerFactory, policy: Policy) {
        self.factory = factory
        self.policy = policy
    }

    public var viewerCount: Int { viewers.withLock { $0.resources.count } }

    /// Every viewer's numbers, for status lines.
    public var viewerStats: [ViewerPeerStats] {
        let peers = viewers.withLock { $0.resources.values.map(\.peer) }
        return peers.map(\.stats)
    }

    /// Sharing is over: every peer is closed, new viewers are turned away, and `/status` says why
    /// (a page still open shows it).
    public func end(reason: String) {
        let peers: [ViewerPeer] = viewers.withLock { v in
            v.endedReason = v.endedReason ?? reason
            defer { v.resources = [:] }
            return v.resources.values.map(\.peer)
        }
        for peer in peers { peer.close() }
    }

    /// Nothing is being shared for now, but the server stays (the home screen's viewer between
    /// sessions): `/status` gives `note` as `idle` and an open page shows it; nil when frames flow.
    public func setIdle(_ note: String?) { viewers.withLock { $0.idleNote = note } }

    // MARK: - Requests

    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        var response = route(request)
        response.headers += [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]
        response.headers += corsHeaders(request)
        return response
    }

    private func route(_ request: HTTPRequest) -> HTTPResponse {
        if policy.token == nil, let problem = foreignHost(request) { return .text(421, problem) }
        let path = request.path
        if request.method == "OPTIONS" { return options(path) }
        switch path {
        case "/", "/index.html":
            return page(request, ViewerPage.html, type: "text/html; charset=utf-8")
        case "/viewer.js":
            return page(request, ViewerPage.script, type: "text/javascript; charset=utf-8")
        case "/viewer.css":
            return page(request, ViewerPage.style, type: "text/css; charset=utf-8")
        case "/status":
            guard request.method == "GET" || request.method == "HEAD" else { return notAllowed("GET, HEAD, OPTIONS") }
            if let refusal = unauthorized(request) { return refusal }
            return status()
        case Self.endpointPath:
            guard request.method == "POST" else { return notAllowed("POST, OPTIONS") }
            if let refusal = unauthorized(request) { return refusal }
            return post(request)
        default:
            guard path.hasPrefix(Self.resourcePrefix) else { return .text(404, "no such page") }
            let id = String(path.dropFirst(Self.resourcePrefix.count))
            guard request.method == "PATCH" || request.method == "DELETE" else { return notAllowed("PATCH, DELETE, OPTIONS") }
            if let refusal = unauthorized(request) { return refusal }
            return request.method == "DELETE" ? delete(id) : patch(id, request)
        }
    }

    private func page(_ request: HTTPRequest, _ text: String, type: String) -> HTTPResponse {
        guard request.method == "GET" || request.method == "HEAD" else { return notAllowed("GET, HEAD") }
        return HTTPResponse(status: 200, headers: [("Content-Type", type), ("Content-Security-Policy", ViewerPage.contentSecurityPolicy),
                                                   ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY")],
                            body: Array(text.utf8))
    }

    private func notAllowed(_ allow: String) -> HTTPResponse {
        .text(405, "method not allowed here", headers: [("Allow", allow)])
    }

    private func options(_ path: String) -> HTTPResponse {
        if path == Self.endpointPath {
            return HTTPResponse(status: 204, headers: [("Allow", "POST, OPTIONS"), ("Accept-Post", "application/sdp")])
        }
        if path.hasPrefix(Self.resourcePrefix) {
            return HTTPResponse(status: 204, headers: [("Allow", "PATCH, DELETE, OPTIONS"), ("Accept-Patch", "application/trickle-ice-sdpfrag")])
        }
        return HTTPResponse(status: 204, headers: [("Allow", "GET, HEAD, OPTIONS")])
    }

    /// 401 unless the request carries the token (when one is needed).
    private func unauthorized(_ request: HTTPRequest) -> HTTPResponse? {
        guard let token = policy.token else { return nil }
        if token.accepts(authorization: request.header("Authorization")) { return nil }
        let given = request.header("Authorization") != nil
        return .text(401, "this viewer needs its access token: open the URL the agent printed (it ends in #token=…)",
                     headers: [("WWW-Authenticate", given ? "Bearer realm=\"krakl-viewer\", error=\"invalid_token\"" : "Bearer realm=\"krakl-viewer\"")])
    }

    /// Without a token the viewer trusts that only this machine can reach it; a Host that is
    /// not a loopback name is a page elsewhere that pointed its own name at 127.0.0.1 (DNS
    /// rebinding), and is refused.
    private func foreignHost(_ request: HTTPRequest) -> String? {
        guard let host = request.header("Host") else { return nil }   // HTTP/1.0 clients: nothing to rebind
        var name = host.lowercased()
        if name.hasPrefix("[") { name = String(name.prefix { $0 != "]" }.dropFirst()) } else if let colon = name.lastIndex(of: ":") { name = String(name[..<colon]) }
        if name == "localhost" || name.hasSuffix(".localhost") { return nil }
        if let address = ListenAddress(name, defaultPort: 0), address.isLoopback { return nil }
        return "this viewer answers only to loopback names (127.0.0.1, [::1], localhost) unless it has a token (--listen with another address, or --viewer-token)"
    }

    /// Any origin may call in when a token guards the viewer (the token is the permission; no
    /// cookies are involved). Without one, only pages on this machine's loopback origins may:
    /// otherwise any web site open in a browser here could watch the screen.
    private func corsHeaders(_ request: HTTPRequest) -> [(name: String, value: String)] {
        guard let origin = request.header("Origin") else { return [] }
        let allowed: String
        if policy.token != nil {
            allowed = "*"
        } else {
            guard let url = URL(string: origin), let host = url.host, host == "localhost" || (ListenAddress(host.trimming(where: { $0 == "[" || $0 == "]" }), defaultPort: 0)?.isLoopback ?? false) else { return [] }
            allowed = origin
        }
        var headers: [(name: String, value: String)] = [
            ("Access-Control-Allow-Origin", allowed),
            ("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE, OPTIONS"),
            ("Access-Control-Allow-Headers", "Authorization, Content-Type, If-Match"),
            ("Access-Control-Expose-Headers", "Location, ETag, Accept-Patch, Accept-Post, Link, Retry-After"),
            ("Access-Control-Max-Age", "600"),
        ]
        if allowed != "*" { headers.append(("Vary", "Origin")) }
        return headers
    }

    private func status() -> HTTPResponse {
        let (count, ended, idle) = viewers.withLock { ($0.resources.count, $0.endedReason, $0.idleNote) }
        var object: [String: Any] = ["sharing": ended == nil && idle == nil, "viewers": count, "maximumViewers": policy.maximumViewers]
        object["ended"] = ended ?? JSONNull()
        object["idle"] = idle ?? JSONNull()
        let text = (try? JSONText.serialize(object, options: [.sortedKeys])) ?? "{}"
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/json")], body: Array(text.utf8))
    }

    // MARK: - WHEP

    private func post(_ request: HTTPRequest) -> HTTPResponse {
        guard request.mediaType == "application/sdp" else {
            return .text(415, "POST an SDP offer with Content-Type: application/sdp", headers: [("Accept-Post", "application/sdp")])
        }
        if let ended = viewers.withLock({ $0.endedReason }) { return .text(410, "sharing has ended: \(ended)") }
        guard let offer = String(validating: request.body, as: UTF8.self), offer.hasPrefix("v=0") else {
            return .text(400, "the body is not an SDP offer (it must start with v=0)")
        }
        // The server handles one request at a time, and the count is checked again when the peer
        // is stored, so the limit holds even if that ever changes.
        let id = Self.randomHex(16)
        let admitted: Bool = viewers.withLock {
            guard $0.resources.count < policy.maximumViewers else { return false }
            return true
        }
        guard admitted else {
            return .text(503, "\(policy.maximumViewers) viewers are watching already (--max-viewers); try again later",
                         headers: [("Retry-After", "\(policy.retryAfter.components.seconds)")])
        }
        let peer: ViewerPeer
        do throws(ViewerPeerError) {
            peer = try factory.makePeer(offer: offer)
        } catch {
            return .text(error.httpStatus, error.description)
        }
        let etag = "\"\(Self.randomHex(8))\""
        let resource = Resource(peer: peer, etag: etag, ufrag: Self.attribute("ice-ufrag", in: offer))
        let count: Int? = viewers.withLock { v in
            // Sharing ended while the peer was made: it is not kept.
            guard v.endedReason == nil, v.resources.count < policy.maximumViewers else { return nil }
            v.resources[id] = resource
            return v.resources.count
        }
        guard let count else {
            peer.close()
            return viewers.withLock({ $0.endedReason }) != nil ? .text(410, "sharing has ended")
                : .text(503, "the viewers' places are taken; try again later", headers: [("Retry-After", "\(policy.retryAfter.components.seconds)")])
        }
        peer.onClosed = { [weak self] reason in self?.peerClosed(id, reason: reason) }
        onViewersChanged?(count, "viewer \(id.prefix(6)) joined")
        return HTTPResponse(status: 201, headers: [
            ("Content-Type", "application/sdp"), ("Location", Self.resourcePrefix + id), ("ETag", etag),
            ("Accept-Patch", "application/trickle-ice-sdpfrag"),
        ], body: Array(peer.answer.utf8))
    }

    /// Trickle (RFC 8840 fragment, same ICE credentials) → 204, or an ICE restart (RFC 9725 §4.3.2:
    /// `If-Match: *` and new `ice-ufrag`/`ice-pwd`) → 200 with our new credentials and candidates as
    /// an sdpfrag and a new ETag. `If-Match` with any other value than the current ETag is 412: the
    /// PATCH was meant for an earlier ICE session (out of order after a restart).
    private func patch(_ id: String, _ request: HTTPRequest) -> HTTPResponse {
        guard let resource = viewers.withLock({ $0.resources[id] }) else { return .text(404, "no such viewer session (it ended, or never was)") }
        guard request.mediaType == "application/trickle-ice-sdpfrag" else {
            return .text(415, "PATCH takes Content-Type: application/trickle-ice-sdpfrag", headers: [("Accept-Patch", "application/trickle-ice-sdpfrag")])
        }
        guard let fragment = String(validating: request.body, as: UTF8.self) else { return .text(400, "the fragment is not UTF-8 text") }
        let ifMatch = request.header("If-Match")
        if let ifMatch, ifMatch != "*", ifMatch != resource.etag {
            return .text(412, "the ETag does not match this session's ICE session (a restart changed it)", headers: [("ETag", resource.etag)])
        }
        let ufrag = Self.attribute("ice-ufrag", in: fragment)
        if ifMatch == "*" || (ufrag != nil && ufrag != resource.ufrag) {
            return restart(id, resource, fragment: fragment, ufrag: ufrag)
        }
        do throws(ViewerPeerError) {
            try resource.peer.addRemoteCandidates(sdpFragment: fragment)
        } catch {
            return .text(error.httpStatus, error.description)
        }
        return HTTPResponse(status: 204, headers: [("ETag", resource.etag)])
    }

    /// An ICE restart: the peer answers with its new credentials; the resource gets a new ETag.
    /// Refused, the session goes on as it was (RFC 9725 §4.3.2: the old ICE session is kept).
    private func restart(_ id: String, _ resource: Resource, fragment: String, ufrag: String?) -> HTTPResponse {
        guard let ufrag, Self.attribute("ice-pwd", in: fragment) != nil else {
            return .text(400, "an ICE restart (If-Match: *) needs the new a=ice-ufrag and a=ice-pwd in the fragment")
        }
        guard ufrag != resource.ufrag else {
            return .text(400, "an ICE restart needs a new a=ice-ufrag (this one is the session's current one); a trickle PATCH sends If-Match with the ETag")
        }
        let answer: String
        do throws(ViewerPeerError) {
            answer = try resource.peer.restartIce(sdpFragment: fragment)
        } catch {
            return .text(error.httpStatus, error.description)
        }
        let etag = "\"\(Self.randomHex(8))\""
        let count: Int? = viewers.withLock { v in
            // The peer may have ended meanwhile (consent, DELETE): then there is nothing to restart.
            guard v.resources[id]?.peer === resource.peer else { return nil }
            v.resources[id] = Resource(peer: resource.peer, etag: etag, ufrag: ufrag)
            return v.resources.count
        }
        guard let count else { return .text(404, "no such viewer session (it ended while restarting)") }
        onViewersChanged?(count, "viewer \(id.prefix(6)) restarted ICE")
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/trickle-ice-sdpfrag"), ("ETag", etag)], body: Array(answer.utf8))
    }

    private func delete(_ id: String) -> HTTPResponse {
        let removed: (ViewerPeer, Int)? = viewers.withLock { v in
            guard let resource = v.resources.removeValue(forKey: id) else { return nil }
            return (resource.peer, v.resources.count)
        }
        guard let (peer, count) = removed else { return .text(404, "no such viewer session (it ended, or never was)") }
        let stats = peer.stats
        peer.close()
        onViewersChanged?(count, "viewer \(id.prefix(6))\(Self.restartsSaid(stats)) left")
        return .text(200, "the viewer session ended")
    }

    /// Restarts said with their DTLS count (a restart must not have made a new handshake); empty
    /// without restarts.
    static func restartsSaid(_ stats: ViewerPeerStats) -> String {
        stats.iceRestarts == 0 ? "" : " (\(stats.iceRestarts) ICE restart\(stats.iceRestarts == 1 ? "" : "s"), "
            + "\(stats.dtlsHandshakes) DTLS handshake\(stats.dtlsHandshakes == 1 ? "" : "s"))"
    }

    /// The peer ended by itself. A page that closes its connection (DTLS close_notify or RTCP BYE:
    /// state "closed") left, as with a DELETE, which often comes after the close and then finds no
    /// session; anything else (consent expired, failed) dropped it.
    private func peerClosed(_ id: String, reason: String) {
        let ended: (ViewerPeer, Int)? = viewers.withLock { v in
            guard let resource = v.resources.removeValue(forKey: id) else { return nil }
            return (resource.peer, v.resources.count)
        }
        guard let (peer, count) = ended else { return }
        let stats = peer.stats
        if stats.state == "closed" {
            onViewersChanged?(count, "viewer \(id.prefix(6))\(Self.restartsSaid(stats)) left")
        } else {
            onViewersChanged?(count, "viewer \(id.prefix(6))\(Self.restartsSaid(stats)) dropped: \(reason)")
        }
    }

    // MARK: - Helpers

    static func randomHex(_ bytes: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<bytes).map { _ in String(cFormat: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }

    /// The value of the first `a=NAME:` line of an SDP text.
    static func attribute(_ name: String, in sdp: String) -> String? {
        for line in sdp.split(whereSeparator: { $0 == "\r\n" || $0 == "\n" || $0 == "\r" }) where line.hasPrefix("a=\(name):") {
            return String(line.dropFirst(name.count + 3)).trimmingSpaces()
        }
        return nil
    }
}
