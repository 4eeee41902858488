/// How the agent reaches a room: one driver per signalling protocol (WHIP,
/// Janus VideoRoom). The sharing session owns one driver for one join and
/// calls it from its control thread; every call is bounded in time by the
/// driver, so a server that never answers can stall a join for at most the
/// driver's time-out, never forever.
///
/// The order of calls is always: `publish` once, then any number of
/// `restart`/`trickle`, then `leave` once (also after a failed `publish`,
/// so a half-made session on the server is cleaned up).
public protocol RoomDriver: AnyObject, Sendable {
    /// A short name for status lines and errors: "WHIP", "Janus VideoRoom".
    var service: String { get }

    /// Server-side events (the room ended, the server dropped us), on any
    /// thread. Set before `publish`; called at most once with an end.
    var onEvent: (@Sendable (RoomEvent) -> Void)? { get set }

    /// Joins the room as `identity` and publishes the video described by
    /// `offer` (an SDP offer). Returns the server's answer.
    func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer

    /// ICE restart: sends a restarted offer (new ice-ufrag/pwd) and returns
    /// the answer SDP. Throws `.restartUnsupported` when the server cannot
    /// restart in place; the session then keeps the old path until ICE
    /// consent expires (30 s without an answer), when it ends as connection lost.
    func restart(offer: String) throws(RoomError) -> String

    /// A local ICE candidate learned after the offer (an `a=candidate` value
    /// without the `a=`), for the m-section `mid`. Best effort.
    func trickle(candidate: String, mid: String)

    /// Candidates gathered while the offer was on its way to the server (the session holds them until
    /// `publish` has returned: before that a WHIP server has no resource to PATCH), sent at once;
    /// drivers that can carry them in one message do (WHIP: one PATCH; Twilio: one `update`).
    func trickle(candidates: [String], mid: String)

    /// Unpublishes, leaves the room and ends the server-side session, each
    /// step bounded (about 2 s in all); never throws: leaving must always
    /// finish. Safe to call more than once.
    func leave()

    /// The person stopped while `publish` or `restart` is still waiting on the server: from any
    /// thread, makes that call throw at once instead of at its time-out (a silent server kept a
    /// Ctrl-C waiting 7 s). `leave` still works afterwards, so the server side is cleaned up.
    func abandonJoin()

    /// No more local candidates will come (gathering ended): drivers that can say so tell the server
    /// (WHIP `a=end-of-candidates`, Janus `completed`, Twilio `complete: true`). Best effort.
    func endOfCandidates()

    /// What the room server told us about the session, for status lines ("room RM…, participant
    /// PA…"); nil when the service has nothing to show.
    var roomDetails: String? { get }
}

extension RoomDriver {
    /// Drivers without a way to cut a request short wait for its time-out.
    public func abandonJoin() {}
    public func trickle(candidates: [String], mid: String) {
        for candidate in candidates { trickle(candidate: candidate, mid: mid) }
    }
    public func endOfCandidates() {}
    public var roomDetails: String? { nil }
}

/// What the server answered to `publish`.
public struct RoomAnswer: Equatable, Sendable {
    /// The SDP answer.
    public var sdp: String
    /// ICE servers the server offered with its answer (WHIP `Link:
    /// rel="ice-server"`), to add to the join code's own.
    public var iceServers: [IceServer]

    public init(sdp: String, iceServers: [IceServer] = []) {
        self.sdp = sdp
        self.iceServers = iceServers
    }
}

/// What the room server tells a publisher without being asked.
public enum RoomEvent: Equatable, Sendable {
    /// The room is over for us: the host ended it, the backend destroyed
    /// it, we were removed. `reason` is the server's words, for the person.
    case roomEnded(reason: String)
    /// The server dropped our media session (Janus `hangup`, `timeout`)
    /// without saying that the room ended.
    case connectionLost(reason: String)
    /// Another participant with our identity joined, and the server removed us (Twilio 53205).
    case replaced(reason: String)
    /// The signaling connection was lost and is being resumed (media goes on meanwhile); not an end.
    case reconnecting(reason: String)
    /// The signaling connection was resumed after `reconnecting`.
    case reconnected
    /// Something the person may want to know that changes nothing (a message the driver skipped).
    case notice(String)
    /// A candidate the room's media server trickled (a `candidate:` value), for the current ICE
    /// credentials of our one m-section.
    case remoteCandidate(String)
}

/// Why a request to the room server did not give what was needed. The
/// session turns these into end reasons; the agent maps those to exit
/// statuses (docs/exit-codes.md).
public enum RoomError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The server refused us: 401/403 (the token was not accepted).
    case unauthorized(status: Int, message: String)
    /// The server has no such room or endpoint: 404, Janus "no such room".
    case noSuchRoom(status: Int, message: String)
    /// Any other refusal (4xx, or a Janus plugin error): the offer, a method the server does not allow.
    case refused(status: Int, message: String)
    /// The room has as many participants as it may (Twilio 53105).
    case roomFull(message: String)
    /// The server is overloaded or failing (5xx, 429/503 after one bounded
    /// wait for Retry-After).
    case serverError(status: Int, message: String)
    /// No answer: DNS, connection refused, TLS, or the time-out passed.
    case unreachable(String)
    /// The server answered something we cannot use (no Location, not SDP,
    /// malformed JSON, too many redirects).
    case badReply(String)
    /// The server cannot restart ICE in place (WHIP 405/422/501).
    case restartUnsupported(String)
    /// The HTTP proxy (HTTPS_PROXY, HTTP_PROXY) could not be used: it refused the CONNECT (403,
    /// 407), could not be reached, did not answer in time, or its setting is malformed. `proxy`
    /// names it ("proxy 10.0.0.1:3128", never its password).
    case proxyFailed(proxy: String, message: String)

    public var description: String {
        switch self {
        case .unauthorized(let status, let message):
            return "refused by the room server: \(status) \(message) (the join code's token was not accepted: ask for a fresh code)"
        case .noSuchRoom(let status, let message):
            return "refused by the room server: \(status) \(message) (no such room: has the meeting ended?)"
        case .refused(let status, let message):
            return "refused by the room server: \(status) \(message)"
        case .roomFull(let message):
            return "the room is full: \(message)"
        case .serverError(let status, let message):
            return "the room server failed: \(status) \(message); try again later"
        case .unreachable(let message):
            return "cannot reach the room server: \(message)"
        case .badReply(let message):
            return "the room server's reply is not usable: \(message)"
        case .restartUnsupported(let message):
            return "the room server cannot restart ICE: \(message)"
        case .proxyFailed(let proxy, let message):
            return "cannot reach the room server through the HTTP \(proxy): \(message)"
        }
    }
}
