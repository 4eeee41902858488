import Dispatch
import FoundationEssentials
import Glibc
import KraklBase

/// Publishes into a Janus VideoRoom through Janus's HTTP API (checked
/// against Janus 1.1.2): create a session, attach the VideoRoom plugin,
/// join as a publisher named by the identity, publish the offer.
///
/// Janus answers plugin requests twice: an `ack` to the POST, then the real
/// reply as an event on the session's long-poll (`GET /janus/<session>`),
/// matched here by `transaction`. One thread keeps that long-poll open from
/// `create` to `leave`; each poll also counts as a keepalive for Janus
/// (its `session_timeout` is 60 s, a poll returns within 30 s), and it is
/// where the room's end arrives: `{"videoroom":"destroyed"}`, a kick,
/// `hangup`, `timeout`.
///
/// `leave()` must follow every `publish`, also a failed one (the
/// `RoomDriver` rule): until then the long-poll keeps the session alive.
public final class JanusDriver: RoomDriver, Sendable {
    /// How long each part may take. Every request and wait is bounded.
    public struct Timeouts: Sendable {
        /// One HTTP request (create, attach, the POST of a message).
        public var request: Duration = .seconds(5)
        /// An asynchronous reply on the long-poll (`joined`, `configured` with the answer).
        public var event: Duration = .seconds(10)
        /// All of `leave()`: unpublish, leave, detach, destroy, stopping the long-poll.
        public var leave: Duration = .seconds(2)
        /// One long-poll GET (Janus answers within 30 s, with a keepalive if nothing happened).
        public var longPoll: Duration = .seconds(40)
        /// The long-poll failing this long (Janus gone) ends the session as connection-lost.
        public var lostContact: Duration = .seconds(15)

        public init() {}
    }

    public let service = "Janus VideoRoom"

    public var onEvent: (@Sendable (RoomEvent) -> Void)? {
        get { state.withLock { $0.eventHandler } }
        set { state.withLock { $0.eventHandler = newValue } }
    }

    private let base: URL
    private let room: JanusID
    private let token: String?
    private let pin: String?
    private let timeouts: Timeouts
    /// Requests and the long-poll on separate clients: leaving cancels the
    /// poll that may be waiting 30 s without touching the last requests.
    private let control = HTTPClient()
    private let poller = HTTPClient()

    private struct State: Sendable {
        var eventHandler: (@Sendable (RoomEvent) -> Void)?
        var session: UInt64?
        var handle: UInt64?
        var participant: JanusID?
        var joined = false
        var published = false
        var publishCalled = false
        /// Transactions whose reply is expected on the long-poll, and the replies that came.
        var waiting: Set<String> = []
        var arrived: [String: JanusMessage] = [:]
        /// An end was told to `onEvent` (or we are leaving): no second one.
        var ended = false
        var leaving = false
        /// Set by `abandonJoin`: the join's requests fail at once (leave's are still sent).
        var abandoned = false
        var stopPolling = false
        /// Why the session cannot answer any more (its long-poll found it gone).
        var sessionGone: String?
        var pollFinished: DispatchSemaphore?
        /// The poll thread while it runs (a pthread_t: a Thread is not Sendable).
        var pollThread: pthread_t?
        var transactions: UInt64 = 0
    }
    /// Waiters for replies (and the poll's pause) wait on it; `change` wakes them.
    private let state = Guarded(State())

    /// - Parameters:
    ///   - baseURL: the Janus HTTP API root, e.g. `https://host/janus`.
    ///   - room: the VideoRoom id; all digits is sent as a JSON number,
    ///     anything else as a string (Janus `string_ids`).
    ///   - token: the join code's token.
    ///   - sendToken: send `token` as Janus's core `token` (token_auth) on
    ///     every request. Off by default: Janus's stored-token auth rejects
    ///     a token it was not given, and the JWT is never such a token
    ///     unless the deployment made it one.
    ///   - pin: the room's PIN, when it has one.
    public init(baseURL: URL, room: String, token: String? = nil, sendToken: Bool = false, pin: String? = nil,
                timeouts: Timeouts = Timeouts()) {
        // Trailing slashes would give `//` paths, which Janus does not route.
        var text = baseURL.absoluteString
        while text.hasSuffix("/") { text.removeLast() }
        base = URL(string: text) ?? baseURL
        self.room = JanusID(room: room)
        self.token = sendToken ? token : nil
        self.pin = pin
        self.timeouts = timeouts
    }

    /// The Janus session id once created (tests check that leave destroyed it).
    var sessionForTests: UInt64? { state.withLock { $0.session } }

    deinit {
        control.invalidate()
        poller.invalidate()
    }

    // MARK: RoomDriver

    public func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
        let again = state.withLock { state in
            defer { state.publishCalled = true }
            return state.publishCalled || state.leaving
        }
        if again { throw .refused(status: 0, message: "publish: this Janus driver was already used; make a new one for a new join") }
        if room == .string("") { throw .noSuchRoom(status: 0, message: "the join code names no Janus room") }

        let created = try post([], JanusRequest(janus: "create", transaction: nextTransaction(), token: token),
                               step: "create a Janus session")
        guard created.janus == "success", let sessionID = created.data?.id else {
            throw .badReply("create a Janus session: Janus answered \"\(created.janus)\" without a session id")
        }
        state.withLock { $0.session = sessionID }
        startPolling(session: sessionID)

        let attached = try post(["\(sessionID)"], JanusRequest(janus: "attach", transaction: nextTransaction(), token: token,
                                                             plugin: "janus.plugin.videoroom"),
                                step: "attach to the VideoRoom plugin")
        guard attached.janus == "success", let handleID = attached.data?.id else {
            throw .badReply("attach to the VideoRoom plugin: Janus answered \"\(attached.janus)\" without a handle id")
        }
        state.withLock { $0.handle = handleID }

        let joinStep = "join room \(room)"
        let joinReply = try pluginRequest(.join(room: room, display: identity, pin: pin), step: joinStep)
        guard let data = joinReply.videoroom, data.videoroom == "joined", let id = data.id else {
            throw .badReply("\(joinStep): expected a \"joined\" event, got \(Self.summary(joinReply))")
        }
        state.withLock { state in
            state.participant = id
            state.joined = true
        }

        let published = try pluginRequest(.publish, jsep: JanusJsep(type: "offer", sdp: offer), step: "publish")
        guard published.videoroom?.configured == "ok", let jsep = published.jsep, jsep.type == "answer" else {
            throw .badReply("publish: expected \"configured\": \"ok\" with an SDP answer, got \(Self.summary(published))")
        }
        state.withLock { $0.published = true }
        return RoomAnswer(sdp: jsep.sdp)
    }

    /// Janus 1.1.2 restarts a publisher's ICE when a `configure` carries an
    /// offer with new ice-ufrag/pwd; the answer comes with the `configured` event.
    public func restart(offer: String) throws(RoomError) -> String {
        let ready = state.withLock { $0.published && !$0.leaving }
        guard ready else { throw .restartUnsupported("nothing is published on this Janus handle to restart") }
        let reply: JanusMessage
        do {
            reply = try pluginRequest(.restartConfigure, jsep: JanusJsep(type: "offer", sdp: offer), step: "ICE restart")
        } catch {
            // A refused renegotiation: the session publishes afresh instead.
            if case .refused(_, let message) = error { throw .restartUnsupported(message) }
            throw error
        }
        guard let jsep = reply.jsep, jsep.type == "answer" else {
            throw .badReply("ICE restart: expected an SDP answer, got \(Self.summary(reply))")
        }
        return jsep.sdp
    }

    public func trickle(candidate: String, mid: String) {
        send(trickle: JanusCandidate(candidate: candidate, sdpMid: mid, sdpMLineIndex: 0))
    }

    /// Tells Janus that no more local candidates will come.
    public func endOfCandidates() {
        send(trickle: JanusCandidate(completed: true))
    }

    public func leave() {
        let ids = state.change { state -> (UInt64?, UInt64?, Bool)? in
            if state.leaving { return nil }
            state.leaving = true
            state.ended = true
            return (state.session, state.handle, state.joined)
        }
        guard let (sessionID, handleID, wasJoined) = ids else { return }

        let deadline = Date().addingTimeInterval(timeouts.leave.inSeconds)
        // Keep a little of the budget for stopping the long-poll.
        let stepsEnd = deadline.addingTimeInterval(-min(0.3, timeouts.leave.inSeconds / 4))
        var answering = true
        func step(_ name: String, _ path: [String], _ request: JanusRequest) {
            let remaining = stepsEnd.timeIntervalSinceNow
            guard answering, remaining > 0.05 else { return }
            do {
                _ = try post(path, request, step: name, timeout: .seconds(min(remaining, 1)))
            } catch {
                // A server that does not answer will not answer the next step either.
                switch error {
                case .unreachable, .proxyFailed: answering = false
                default: break
                }
            }
        }
        if let sessionID, let handleID {
            let path = ["\(sessionID)", "\(handleID)"]
            if wasJoined {
                // Both are answered with an ack; their events are not waited for.
                step("unpublish", path, JanusRequest(janus: "message", transaction: nextTransaction(), token: token, body: .unpublish))
                step("leave the room", path, JanusRequest(janus: "message", transaction: nextTransaction(), token: token, body: .leave))
            }
            step("detach", path, JanusRequest(janus: "detach", transaction: nextTransaction(), token: token))
        }
        if let sessionID {
            step("destroy the session", ["\(sessionID)"], JanusRequest(janus: "destroy", transaction: nextTransaction(), token: token))
        }

        let (finished, onPollThread) = state.change { state in
            state.stopPolling = true
            // An onEvent handler that leaves runs on the poll thread, which cannot wait for itself.
            return (state.pollFinished, state.pollThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false)
        }
        poller.invalidate()  // cancels a poll waiting on Janus
        if let finished, !onPollThread {
            _ = finished.wait(timeout: .now() + max(0.2, deadline.timeIntervalSinceNow))
        }
        control.invalidate()
    }

    // MARK: Requests

    private func nextTransaction() -> String {
        let n = state.withLock { state in
            state.transactions += 1
            return state.transactions
        }
        return String(cFormat: "krakl-%llu-%08x", n, UInt32.random(in: 0...UInt32.max))
    }

    private func url(_ path: [String]) -> URL {
        path.reduce(base) { $0.appendingPathComponent($1) }
    }

    /// POSTs one request and returns Janus's reply; a Janus `error` reply throws.
    public func abandonJoin() {
        let joining = state.change { state in
            state.abandoned = true
            return !state.leaving
        }
        if joining { control.cancelRunning() }
    }

    private func post(_ path: [String], _ request: JanusRequest, step: String, timeout: Duration? = nil) throws(RoomError) -> JanusMessage {
        // The epoch is read before the check: an abandon that comes after it still stops the request.
        let epoch = control.cancelEpoch
        let (stopped, joining) = state.withLock { ($0.abandoned && !$0.leaving, !$0.leaving) }
        if stopped { throw .unreachable("\(step): the join was stopped") }
        let body: Data
        do { body = try JSONEncoder().encode(request) } catch {
            throw .badReply("\(step): cannot encode the request: \(error)")
        }
        let response: HTTPResponse
        do {
            response = try control.send(HTTPRequest(method: "POST", url: url(path), headers: [(name: "Content-Type", value: "application/json")],
                                                    body: body, timeout: timeout ?? timeouts.request), unlessCancelledSince: joining ? epoch : nil)
        } catch {
            if case .unreachable(let message) = error { throw .unreachable("\(step): \(message)") }
            throw error
        }
        guard response.status == 200 else { throw JanusErrors.http(response, step: step) }
        let message: JanusMessage
        do { message = try JSONDecoder().decode(JanusMessage.self, from: response.body) } catch {
            throw .badReply("\(step): not a Janus reply: \(response.firstLine)")
        }
        if message.janus == "error" {
            throw JanusErrors.core(message.error ?? JanusFailure(code: 0, reason: "an error without a code"), step: step)
        }
        return message
    }

    /// A VideoRoom request whose reply comes as an event (or, for requests
    /// Janus answers at once, in the POST's reply). A VideoRoom error code throws.
    private func pluginRequest(_ body: VideoRoomRequest, jsep: JanusJsep? = nil, step: String) throws(RoomError) -> JanusMessage {
        let ids = state.withLock { ($0.session, $0.handle) }
        guard let sessionID = ids.0, let handleID = ids.1 else {
            throw .badReply("\(step): no Janus session to send it on")
        }
        let transaction = nextTransaction()
        state.withLock { _ = $0.waiting.insert(transaction) }
        defer {
            state.withLock { state in
                state.waiting.remove(transaction)
                state.arrived[transaction] = nil
            }
        }
        let reply = try post(["\(sessionID)", "\(handleID)"],
                             JanusRequest(janus: "message", transaction: transaction, token: token, body: body, jsep: jsep), step: step)
        let event: JanusMessage
        switch reply.janus {
        case "ack":
            event = try waitForReply(transaction, step: step)
        case "success", "event":
            event = reply
        default:
            throw .badReply("\(step): Janus answered \"\(reply.janus)\"")
        }
        if let data = event.videoroom, let code = data.errorCode {
            throw JanusErrors.videoRoom(code: code, error: data.error, step: step)
        }
        return event
    }

    private func waitForReply(_ transaction: String, step: String) throws(RoomError) -> JanusMessage {
        let deadline = Date().addingTimeInterval(timeouts.event.inSeconds)
        // Bounded: the wait ends at the deadline; wake-ups only re-check.
        let outcome = state.wait(until: deadline, for: { state in
            state.arrived[transaction] != nil || state.leaving || state.abandoned || state.sessionGone != nil
        }, then: { state, _ -> Result<JanusMessage, RoomError> in
            if let reply = state.arrived[transaction] { return .success(reply) }
            if state.leaving { return .failure(.unreachable("\(step): cancelled by leave")) }
            if state.abandoned { return .failure(.unreachable("\(step): the join was stopped")) }
            if let gone = state.sessionGone { return .failure(.unreachable("\(step): \(gone)")) }
            return .failure(.unreachable("\(step): no answer from Janus within \(Self.seconds(timeouts.event.inSeconds)) s"))
        })
        return try outcome.get()
    }

    private func send(trickle candidate: JanusCandidate) {
        let ids = state.withLock { ($0.session, $0.handle, $0.leaving) }
        guard let sessionID = ids.0, let handleID = ids.1, !ids.2 else { return }
        // Best effort: a lost candidate costs at most a slower connect.
        _ = try? post(["\(sessionID)", "\(handleID)"],
                      JanusRequest(janus: "trickle", transaction: nextTransaction(), token: token, candidate: candidate),
                      step: "trickle", timeout: min(timeouts.request, .seconds(2)))
    }

    // MARK: The long-poll

    private func startPolling(session sessionID: UInt64) {
        let finished = DispatchSemaphore(value: 0)
        state.withLock { $0.pollFinished = finished }
        startThread(name: "krakl-janus-poll") { [self] in
            // First thing: a leave from an onEvent handler runs on this thread and must know it.
            state.withLock { $0.pollThread = pthread_self() }
            poll(session: sessionID)
            state.withLock { $0.pollThread = nil }
            finished.signal()
        }
    }

    private func pollURL(session sessionID: UInt64, request: UInt64) -> URL {
        var parts = URLComponents(url: url(["\(sessionID)"]), resolvingAgainstBaseURL: false)
        var query = "maxev=10&rid=\(request)"
        // Everything but unreserved characters escaped: libmicrohttpd reads a
        // bare "+" in a query as a space, and Janus's signed tokens are base64.
        if let token { query += "&token=" + Self.percentEncoded(token) }
        parts?.percentEncodedQuery = query
        return parts?.url ?? url(["\(sessionID)"])
    }

    /// Every byte of the UTF-8 but RFC 3986's unreserved characters as %XX (uppercase hex).
    static func percentEncoded(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                bytes.append(byte)
            default:
                bytes += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 15)]]
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private var stopping: Bool { state.withLock { $0.stopPolling } }

    private func poll(session sessionID: UInt64) {
        // When the current run of failed polls began; one failure after a
        // quiet 30 s poll is not yet a lost server.
        var failingSince: Date?
        var pause = 0.1
        var request: UInt64 = 0
        while !stopping {
            request += 1
            let outcome: Result<HTTPResponse, RoomError>
            do {
                outcome = .success(try poller.send(HTTPRequest(method: "GET", url: pollURL(session: sessionID, request: request),
                                                               timeout: timeouts.longPoll)))
            } catch {
                outcome = .failure(error)
            }
            if stopping { break }
            switch outcome {
            case .success(let response) where response.status == 200:
                if let batch = try? JSONDecoder().decode(JanusEventBatch.self, from: response.body) {
                    failingSince = nil
                    pause = 0.1
                    handle(batch.messages)
                    continue
                }
            case .success(let response) where response.status == 404:
                // janus_http answers 404 for a session it no longer has.
                sessionEnded("the Janus session is gone (it expired, or the server restarted)")
                return
            case .success(let response) where response.status == 401 || response.status == 403:
                sessionEnded("Janus refused the event poll: HTTP \(response.status)")
                return
            case .success, .failure:
                break
            }
            let since = failingSince ?? Date()
            failingSince = since
            if Date().timeIntervalSince(since) >= timeouts.lostContact.inSeconds {
                let why: String
                if case .failure(let error) = outcome { why = "\(error)" } else { why = "no usable reply" }
                sessionEnded("lost contact with the Janus server for \(Self.seconds(timeouts.lostContact.inSeconds)) s: \(why)")
                return
            }
            // A failing poll is retried after a pause that leave() cuts short.
            state.wait(until: Date().addingTimeInterval(pause), for: { $0.stopPolling }, then: { _, _ in })
            pause = min(pause * 2, 1)
        }
    }

    /// The session cannot go on: waiting requests fail, and the owner hears of it once.
    private func sessionEnded(_ reason: String) {
        state.change { $0.sessionGone = reason }
        deliver(.connectionLost(reason: reason))
    }

    /// Sorts one long-poll batch: replies to our requests, then what the
    /// room tells us. A room event in the batch explains a `hangup` in the
    /// same batch (Janus sends `destroyed`, then hangs up the PeerConnection).
    private func handle(_ messages: [JanusMessage]) {
        var roomEnd: RoomEvent?
        var lost: RoomEvent?
        state.change { state in
            for message in messages {
                if let transaction = message.transaction, state.waiting.contains(transaction), message.janus != "ack" {
                    state.arrived[transaction] = message
                    continue
                }
                switch message.janus {
                case "event":
                    guard let data = message.videoroom else { break }
                    if data.videoroom == "destroyed" {
                        roomEnd = roomEnd ?? .roomEnded(reason: "the meeting was ended")
                    } else if data.leaving == .string("ok") && data.reason == "kicked" {
                        roomEnd = roomEnd ?? .roomEnded(reason: "removed from the meeting")
                    } else if let kicked = data.kicked, kicked == state.participant {
                        roomEnd = roomEnd ?? .roomEnded(reason: "removed from the meeting")
                    }
                case "hangup":
                    lost = lost ?? .connectionLost(reason: "Janus hung up: \(message.reason ?? "no reason given")")
                case "timeout":
                    state.sessionGone = "the Janus session timed out"
                    lost = lost ?? .connectionLost(reason: "the Janus session timed out")
                case "detached":
                    lost = lost ?? .connectionLost(reason: "Janus detached the VideoRoom handle")
                default:
                    break  // keepalive, ack, webrtcup, media, slowlink, trickle
                }
            }
        }
        if let event = roomEnd ?? lost { deliver(event) }
    }

    /// Calls `onEvent` at most once with an end, never while leaving.
    private func deliver(_ event: RoomEvent) {
        let (first, handler) = state.withLock { state in
            defer { state.ended = true }
            return (!state.ended, state.eventHandler)
        }
        if first { handler?(event) }
    }

    // MARK: Messages

    /// A reply in a few words for an error message (never the SDP or a token).
    private static func summary(_ message: JanusMessage) -> String {
        var parts = ["janus: \(message.janus)"]
        if let data = message.videoroom {
            if let kind = data.videoroom { parts.append("videoroom: \(kind)") }
            if let configured = data.configured { parts.append("configured: \(configured)") }
        }
        parts.append(message.jsep.map { "jsep: \($0.type)" } ?? "no jsep")
        return parts.joined(separator: ", ")
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(cFormat: "%.1f", value)
    }
}
