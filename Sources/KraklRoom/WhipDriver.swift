import FoundationEssentials
import Glibc
import KraklBase

/// How long the WHIP driver waits.
public struct WhipTimeouts: Sendable, Equatable {
    /// A publish (all its redirect hops together, not counting a Retry-After wait) or a restart
    /// PATCH, from sending to the whole reply.
    public var request: Duration
    /// The DELETE on leave.
    public var leave: Duration
    /// One trickle PATCH (best effort, so short).
    public var trickle: Duration
    /// The longest `Retry-After` obeyed; a server asking for more is failed at once.
    public var longestRetryAfter: Duration

    public init(request: Duration = .seconds(10), leave: Duration = .seconds(2), trickle: Duration = .seconds(2),
                longestRetryAfter: Duration = .seconds(10)) {
        self.request = request
        self.leave = leave
        self.trickle = trickle
        self.longestRetryAfter = longestRetryAfter
    }
}

/// A WHIP client (RFC 9725): one publish to one endpoint.
///
/// - `publish` POSTs the offer (`application/sdp`) and expects `201 Created`
///   with the answer and a `Location` (the session's resource, resolved by
///   RFC 3986 against the URL that answered). 307/308 redirects, and
///   leniently 301/302, are followed with the same POST, at most 5 hops, never
///   from https to http. `Link: <…>; rel="ice-server"` headers come back as
///   `RoomAnswer.iceServers`; the `ETag` is kept for trickle.
/// - `restart` PATCHes the resource with the restarted offer's ICE lines
///   (`application/trickle-ice-sdpfrag`, `If-Match: *` as RFC 9725 §4.3.2
///   asks for a restart) and turns the sdpfrag answer into a whole SDP.
/// - `leave` DELETEs the resource (bounded, no If-Match) and closes the client.
///
/// The Bearer token goes on every request whose URL has the endpoint's
/// origin (scheme, host, port), and elsewhere only with
/// `allowTokenAcrossOrigins`. It never appears in errors or logs.
///
/// WHIP has no event channel: a server ends a session by revoking ICE
/// consent or sending DTLS close_notify (RFC 9725 §4.2), which reach the
/// publisher, not this driver. `onEvent` is therefore never called by it.
/// The identity has no WHIP field either: the offer carries it (`s=`, the
/// `a=msid` stream id), so `publish` ignores its `identity` argument.
public final class WhipDriver: RoomDriver, Sendable {
    public let service = "WHIP"
    public let endpoint: URL
    public let timeouts: WhipTimeouts
    public let allowTokenAcrossOrigins: Bool
    /// Redirects followed for one POST before giving up.
    public static let maximumRedirects = 5

    private let token: String?
    private let client = HTTPClient()
    private struct State: Sendable {
        var eventHandler: (@Sendable (RoomEvent) -> Void)?
        var resource: URL?
        var entityTag: String?
        var currentAnswer: String?
        var currentOffer: String?
        var trickling = true
        /// The m-section our trickled candidates were for, for the end-of-candidates PATCH.
        var trickledMid: String?
        var left = false
        /// Set by `abandonJoin`: publish fails at its next step (leave is unaffected).
        var abandoned = false
    }
    /// The resource, ETag and candidates; a Retry-After wait waits on it for `left` or `abandoned`.
    private let state = Guarded(State())

    /// - Parameters:
    ///   - endpoint: the WHIP endpoint URL (http or https).
    ///   - token: sent as `Authorization: Bearer` when set.
    ///   - allowTokenAcrossOrigins: let the token follow a redirect to another origin (the join code
    ///     says so); never from https to http.
    public init(endpoint: URL, token: String?, timeouts: WhipTimeouts = WhipTimeouts(), allowTokenAcrossOrigins: Bool = false) {
        self.endpoint = endpoint
        self.token = token.flatMap { $0.isEmpty ? nil : $0 }
        self.timeouts = timeouts
        self.allowTokenAcrossOrigins = allowTokenAcrossOrigins
    }

    /// Never called by WHIP (see the type's comment); kept for the protocol.
    public var onEvent: (@Sendable (RoomEvent) -> Void)? {
        get { state.withLock { $0.eventHandler } }
        set { state.withLock { $0.eventHandler = newValue } }
    }

    /// The session's resource URL once a POST got 201 with a Location.
    public var resourceURL: URL? { state.withLock { $0.resource } }
    /// The resource's entity tag (RFC 9725 §4.3.1), if the server gave one.
    public var etag: String? { state.withLock { $0.entityTag } }

    // MARK: - Publish

    public func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
        var url = endpoint
        var hops = 0
        var waited = false
        // One budget for every hop, so redirects cannot stretch a join past the time-out.
        var deadline = Date().addingTimeInterval(timeouts.request.inSeconds)
        while true {
            let epoch = client.cancelEpoch   // before the check: an abandon after it still stops the POST
            try checkNotLeft()
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0.05 else {
                throw .unreachable("POST \(endpoint.redactedForLog): no answer within \(Int(timeouts.request.inSeconds.rounded())) s (\(hops) redirects)")
            }
            // Whole seconds: FoundationNetworking hands libcurl the time-out as an integer (1.99 s became 1 s).
            let response = try client.send(HTTPRequest(method: "POST", url: url, headers: headers(for: url, [
                ("Content-Type", "application/sdp"), ("Accept", "application/sdp"),
            ]), body: Data(offer.utf8), timeout: .seconds(max(1, remaining.rounded()))), unlessCancelledSince: epoch)
            switch response.status {
            case 200, 201:
                return try accept(response, offer: offer)
            case 301, 302, 307, 308:
                hops += 1
                guard hops <= Self.maximumRedirects else {
                    throw .badReply("POST \(endpoint.redactedForLog): more than \(Self.maximumRedirects) redirects")
                }
                guard let location = response.header("Location"), let next = WhipHttpRules.resolve(location, against: response.url) else {
                    throw .badReply("POST \(url.redactedForLog): \(response.status) redirect without a usable Location")
                }
                if let refusal = WhipHttpRules.refusal(from: url, to: next) {
                    throw .badReply("POST \(url.redactedForLog): redirect to \(next.redactedForLog) refused (\(refusal))")
                }
                url = next
            case 429, 503:
                let error = WhipHttpRules.error(for: response)
                let failure = RoomError.serverError(status: response.status, message: error.serverMessage)
                guard !waited else { throw failure }
                guard let value = response.header("Retry-After"), let seconds = WhipHttpRules.retryAfterSeconds(value) else { throw failure }
                guard seconds <= timeouts.longestRetryAfter.inSeconds else {
                    throw .serverError(status: response.status, message: error.serverMessage + " (asks to retry after \(Int(seconds.rounded())) s)")
                }
                waited = true
                try wait(seconds: seconds)
                deadline.addTimeInterval(seconds)
            default:
                throw WhipHttpRules.error(for: response)
            }
        }
    }

    /// A 2xx reply to the POST: resource, entity tag, ICE servers and answer.
    private func accept(_ response: HTTPResponse, offer: String) throws(RoomError) -> RoomAnswer {
        guard let location = response.header("Location"), !location.trimmingSpaces().isEmpty else {
            throw .badReply("POST \(response.url.redactedForLog): \(response.status) without a Location header (no resource to end the session with)")
        }
        guard let resourceURL = WhipHttpRules.resolve(location, against: response.url) else {
            throw .badReply("POST \(response.url.redactedForLog): Location \"\(location.prefix(80))\" is not an http(s) URL")
        }
        if let refusal = WhipHttpRules.refusal(from: response.url, to: resourceURL) {
            throw .badReply("POST \(response.url.redactedForLog): resource \(resourceURL.redactedForLog) refused (\(refusal))")
        }
        // The resource exists from here on, answer usable or not: leave() deletes it.
        state.withLock { state in
            state.resource = resourceURL
            state.entityTag = response.header("ETag")
        }
        guard let sdp = String(data: response.body, encoding: .utf8), Self.looksLikeSdp(sdp) else {
            let type = response.header("Content-Type") ?? "no Content-Type"
            throw .badReply("POST \(response.url.redactedForLog): the \(response.status) body is not an SDP answer (\(type), \(response.body.count) bytes)")
        }
        state.withLock { state in
            state.currentAnswer = sdp
            state.currentOffer = offer
        }
        return RoomAnswer(sdp: sdp, iceServers: LinkHeader.iceServers(response.headerValues("Link")))
    }

    /// An SDP starts with `v=0` and has an m-section; the Content-Type is not trusted either way
    /// (servers label answers `text/plain` or `application/octet-stream`).
    static func looksLikeSdp(_ text: String) -> Bool {
        let lines = text.split(whereSeparator: \.isNewline).map { $0.trimmingSpaces() }
        return lines.first == "v=0" && lines.contains { $0.hasPrefix("m=") }
    }

    // MARK: - Restart and trickle

    public func restart(offer: String) throws(RoomError) -> String {
        try checkNotLeft()
        let (resource, firstAnswer) = state.withLock { ($0.resource, $0.currentAnswer) }
        guard let resource, let firstAnswer else { throw .restartUnsupported("no WHIP session to restart (publish first)") }
        let fragment = WhipSdpFragment(parsing: offer)
        guard fragment.iceUfrag != nil, fragment.icePwd != nil, fragment.mediaLine != nil else {
            throw .restartUnsupported("the restarted offer has no ICE credentials or m-line")
        }
        let response = try client.send(HTTPRequest(method: "PATCH", url: resource, headers: headers(for: resource, [
            ("Content-Type", "application/trickle-ice-sdpfrag"), ("If-Match", "*"),
        ]), body: Data(fragment.body.utf8), timeout: timeouts.request))
        switch response.status {
        case 200..<300:
            let text = String(decoding: response.body, as: UTF8.self)
            // A whole SDP is taken as it is (some servers send one); an sdpfrag is merged into the first answer.
            let answer = Self.looksLikeSdp(text) ? text : WhipSdpFragment(parsing: text).replacingIce(in: firstAnswer)
            guard let answer else {
                throw .restartUnsupported("PATCH \(resource.redactedForLog): \(response.status) without new ICE credentials")
            }
            state.withLock { state in
                state.currentAnswer = answer
                state.currentOffer = offer
                state.trickling = true
                if let tag = response.header("ETag") { state.entityTag = tag }
            }
            return answer
        case 405, 422, 501:
            throw .restartUnsupported("PATCH \(resource.redactedForLog): \(response.status) \(WhipHttpRules.error(for: response).serverMessage)")
        default:
            throw WhipHttpRules.error(for: response)
        }
    }

    /// Best effort, blocking for at most `timeouts.trickle`: one PATCH per candidate, with the
    /// current offer's credentials so the server can tell which ICE session it belongs to. A server
    /// that answers 405 or 501 does not take trickle; nothing more is sent to it until a restart.
    public func trickle(candidate: String, mid: String) {
        trickle(candidates: [candidate], mid: mid)
    }

    /// The candidates gathered while the offer was on its way, in one PATCH (RFC 9725 §4.3.1 lets a
    /// client batch what it has).
    public func trickle(candidates: [String], mid: String) {
        guard !candidates.isEmpty else { return }
        patch(candidates: candidates.map { $0.hasPrefix("a=") ? String($0.dropFirst(2)) : $0 }, endOfCandidates: false, mid: mid)
    }

    /// `a=end-of-candidates` in a fragment of its own (RFC 8840 §4.4, RFC 9725 §4.3.1): the server may
    /// stop waiting for more of ours.
    public func endOfCandidates() {
        patch(candidates: [], endOfCandidates: true, mid: nil)
    }

    /// One trickle PATCH; `mid` nil: the one the last PATCH named, else the offer's.
    private func patch(candidates: [String], endOfCandidates: Bool, mid: String?) {
        let (resource, offer, tag, go, mid) = state.withLock { state in
            if let mid { state.trickledMid = mid }
            return (state.resource, state.currentOffer, state.entityTag, state.trickling && !state.left, state.trickledMid)
        }
        guard go, let resource, let offer else { return }
        let credentials = WhipSdpFragment(parsing: offer)
        let fragment = WhipSdpFragment(iceUfrag: credentials.iceUfrag, icePwd: credentials.icePwd, mediaLine: credentials.mediaLine,
                                       mid: mid ?? credentials.mid, candidates: candidates, endOfCandidates: endOfCandidates)
        var extra = [("Content-Type", "application/trickle-ice-sdpfrag")]
        if let tag { extra.append(("If-Match", tag)) }
        guard let response = try? client.send(HTTPRequest(method: "PATCH", url: resource, headers: headers(for: resource, extra),
                                                          body: Data(fragment.body.utf8), timeout: timeouts.trickle)) else { return }
        if response.status == 405 || response.status == 501 {
            state.withLock { $0.trickling = false }
        }
    }

    // MARK: - Leave

    public func leave() {
        // `change`: a Retry-After wait in publish wakes.
        let (first, resource) = state.change { state in
            defer { state.left = true }
            return (!state.left, state.resource)
        }
        guard first else { return }
        if let resource {
            // Any reply will do: the session is over on our side whatever the server says.
            _ = try? client.send(HTTPRequest(method: "DELETE", url: resource, headers: headers(for: resource, []), timeout: timeouts.leave))
        }
        client.invalidate()
    }

    // MARK: - Helpers

    private func headers(for url: URL, _ extra: [(String, String)]) -> [(name: String, value: String)] {
        var headers = extra.map { (name: $0.0, value: $0.1) }
        if let token, WhipHttpRules.tokenMayGo(to: url, endpoint: endpoint, acrossOrigins: allowTokenAcrossOrigins) {
            headers.append((name: "Authorization", value: "Bearer " + token))
        }
        return headers
    }

    private func checkNotLeft() throws(RoomError) {
        let (gone, stopped) = state.withLock { ($0.left, $0.abandoned) }
        if gone { throw .unreachable("the WHIP session was left") }
        if stopped { throw .unreachable("the join was stopped") }
    }

    public func abandonJoin() {
        state.change { $0.abandoned = true }
        client.cancelRunning()
    }

    /// Sleeps for a Retry-After, cut short by `leave()`.
    private func wait(seconds: Double) throws(RoomError) {
        state.wait(until: Date().addingTimeInterval(seconds), for: { $0.left || $0.abandoned }, then: { _, _ in })
        try checkNotLeft()
    }
}

extension RoomError {
    /// The server's words of a status error (its first line), for rewrapping.
    fileprivate var serverMessage: String {
        switch self {
        case .unauthorized(_, let message), .noSuchRoom(_, let message), .refused(_, let message), .serverError(_, let message):
            return message
        case .unreachable(let message), .badReply(let message), .restartUnsupported(let message), .proxyFailed(_, let message),
             .roomFull(let message):
            return message
        }
    }
}
