import Dispatch
import FoundationEssentials
import Glibc
import KraklBase

/// Twilio Programmable Video rooms (docs/rooms.md, "Twilio"): a WebSocket to Twilio's signaling
/// server carrying TCMP frames with RSP v2 messages, as twilio-video.js speaks them.
///
/// A join: WebSocket → `hello` whose body asks for ICE servers → `welcome` (the heartbeat interval)
/// → `iced` (Twilio's TURN servers) → `connect` with the token, the room, our one video track
/// ("screen") and the offer, subscribing to nothing → `connected` with the answer, the room,
/// participant and track SIDs. Then: heartbeats both ways, our ICE candidates in `update`s, and the
/// server's news: `disconnected` with `status:"completed"` is the room ended by its owner (Twilio
/// 53118). A socket lost after `connected` is resumed with `sync` on a new socket within the
/// server's `session_timeout`.
///
/// Threads: `publish`, `leave` and `abandonJoin` come from the session; one reader thread per
/// driver reads the socket, keeps the heartbeats and reconnects; `onEvent` is called from it.
/// The reader thread is the only reader of the socket.
public final class TwilioDriver: RoomDriver, Sendable {
    public struct Timeouts: Sendable {
        /// Each `hello` waits this long for `welcome`; three hellos at most (as the SDK).
        public var welcome: Duration = .seconds(5)
        public var hellos = 3
        /// After `welcome`, the server's `iced` (then we connect without its ICE servers).
        public var iced: Duration = .seconds(5)
        /// From the first byte to `connected`, in all.
        public var join: Duration = .seconds(15)
        /// Leaving: `disconnect`, `bye`, close 1000 and the server's close, in all.
        public var leave: Duration = .seconds(2)
        /// The reconnect window when the server names none (`options.session_timeout`).
        public var defaultSessionTimeout: Duration = .seconds(30)
        public init() {}
    }

    public let service = "Twilio Video"

    public var onEvent: (@Sendable (RoomEvent) -> Void)? {
        get { state.withLock { $0.eventHandler } }
        set { state.withLock { $0.eventHandler = newValue } }
    }

    public let url: URL
    private let token: String
    private let room: String?
    private let timeouts: Timeouts
    private let socketOptions: WebSocket.Options

    private enum Phase: Equatable { case idle, joining, connected, reconnecting, leaving, over }

    private struct State: Sendable {
        var eventHandler: (@Sendable (RoomEvent) -> Void)?
        var phase = Phase.idle
        var socket: WebSocket?
        var attempt: WebSocket.Attempt?
        var welcomed = false
        var negotiatedTimeout = 5000
        var lastSent: UInt64 = 0
        var lastReceived: UInt64 = 0
        /// Frames to send once `welcome` came (TCMP: nothing but hello before it).
        var queued: [String] = []
        var iced: [IceServer]?
        var answer: String?
        var joinError: RoomError?
        var abandoned = false
        var ended = false
        var busyCookie: String?
        /// The last hello: when, and how many in a row without a welcome.
        var helloSentAt: UInt64 = 0
        var hellos = 0
        var welcomedAt: UInt64 = 0
        /// While reconnecting: the end of the window (`session_timeout` from the first loss).
        var reconnectUntil: UInt64 = 0
        var readerDone: DispatchSemaphore?
        /// The reader thread (a pthread_t: a Thread is not Sendable).
        var readerThread: pthread_t?

        // What `connected` said.
        var session: String?
        var sessionTimeout: Double
        var roomSid: String?
        var participantSid: String?
        var trackSid: String?

        // Our side of the one peer connection.
        var trackID = UUID().uuidString.lowercased()
        var ufrag = ""
        var candidates: [(candidate: String, mid: String)] = []
        var iceRevision = 0
        var gatheringComplete = false
        /// The revision last sent. The join thread (on the answer) and the reader (on `connected`) both
        /// publish; without this the same revision went out twice and the server judged the second stale.
        var publishedIceRevision = 0
        /// Our offer and the server's first answer (what a re-offer is answered from), the revision of
        /// the last finished negotiation, and the `o=` version of our last description.
        var ourOffer = ""
        var stableRevision = 1
        var sdpVersion = 2
        /// The server's trickled candidates already passed on, and the revision of its last ICE state.
        var remoteCandidatesSeen: Set<String> = []
        var remoteIceRevision = 0
    }
    /// Every field but the fixed ones; `publish` waits on it (`change` wakes it).
    private let state: Guarded<State>

    private let peerConnectionID = UUID().uuidString.lowercased()
    /// Held across building and sending one ICE update, so revisions leave in the order they were
    /// made (the trickling thread and the reader can publish at the same moment).
    private let iceSendOrder = Lock()

    /// - Parameters:
    ///   - signalingURL: `wss://global.vss.twilio.com/signaling` or a region's or a test server's.
    ///   - token: the Twilio access token (a credential: never logged).
    ///   - room: the room name (the token's `grants.video.room`, else the code's `r`); nil lets the
    ///     token decide.
    public init(signalingURL: URL, token: String, room: String?, timeouts: Timeouts = Timeouts(), caFile: String? = nil,
                proxies: ProxySettings? = nil) {
        url = signalingURL
        self.token = token
        self.room = room
        self.timeouts = timeouts
        state = Guarded(State(sessionTimeout: timeouts.defaultSessionTimeout.inSeconds))
        var socketOptions = WebSocket.Options()
        socketOptions.caFile = caFile
        socketOptions.proxies = proxies
        // TCMP heartbeats already tell a dead line; our own WebSocket pings would only add traffic.
        socketOptions.pingAfterIdle = .seconds(60)
        self.socketOptions = socketOptions
    }

    /// "room RM…, participant PA…, track MT…", as far as known: for status lines.
    public var roomDetails: String? {
        state.withLock { state in
            let parts = [state.roomSid.map { "room \($0)" }, state.participantSid.map { "participant \($0)" }, state.trackSid.map { "track \($0)" }]
                .compactMap { $0 }
            var text = parts.joined(separator: ", ")
            if state.phase == .reconnecting { text += (text.isEmpty ? "" : "; ") + "signaling reconnecting" }
            return text.isEmpty ? nil : text
        }
    }

    // MARK: - RoomDriver

    public func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
        let deadline = MonotonicClock.nanoseconds() + timeouts.join.inNanoseconds
        let started = state.withLock { state -> WebSocket.Attempt? in
            guard state.phase == .idle, !state.abandoned else { return nil }
            state.phase = .joining
            if let track = TwilioRenegotiation.msidTrackID(offer) { state.trackID = track }
            state.ourOffer = offer
            state.ufrag = TwilioRenegotiation.attribute("ice-ufrag", in: offer) ?? ""
            let attempt = WebSocket.Attempt()
            state.attempt = attempt
            return attempt
        }
        guard let attempt = started else { throw .unreachable("Twilio: the join was cancelled") }

        let socket = try WebSocket.connect(to: url, options: socketOptions, attempt: attempt)
        let kept = state.withLock { state -> Bool in
            if state.abandoned || state.phase != .joining { return false }
            state.socket = socket
            // From here the attempt is done: cancelling it would cut the live socket.
            state.attempt = nil
            return true
        }
        guard kept else {
            socket.invalidate()
            throw .unreachable("Twilio: the join was cancelled")
        }
        // The hello before the reader: it times the welcome from the hello it finds sent.
        try sendHello(on: socket, body: nil)
        startReader()

        // iced (or its time-out), then connect.
        try wait(until: min(deadline, MonotonicClock.nanoseconds() + (timeouts.welcome * timeouts.hellos + timeouts.iced).inNanoseconds)) { state in
            state.iced != nil || (state.welcomed && MonotonicClock.nanoseconds() >= state.welcomedAt + timeouts.iced.inNanoseconds)
        }
        let userAgent = "krakl-agent (Linux)"
        let connect = TwilioMessages.connect(token: token, room: room, trackID: state.withLock { $0.trackID }, peerConnectionID: peerConnectionID,
                                             offer: offer, userAgent: userAgent)
        send(TwilioMessages.msg(connect))
        try wait(until: deadline) { $0.answer != nil }
        let (answerSDP, servers) = state.withLock { ($0.answer!, $0.iced ?? []) }
        // Candidates found while joining go out now, in one update.
        publishIceState()
        return RoomAnswer(sdp: answerSDP, iceServers: servers)
    }

    /// Twilio has no in-place ICE restart through this driver yet: the session then waits for the
    /// old path (consent) as for WHIP servers without PATCH.
    public func restart(offer: String) throws(RoomError) -> String {
        throw .restartUnsupported("the Twilio driver does not renegotiate ICE (docs/rooms.md)")
    }

    public func trickle(candidate: String, mid: String) {
        trickle(candidates: [candidate], mid: mid)
    }

    /// Cumulative, as twilio-video.js sends them: one `update` with every candidate so far, its revision one higher.
    public func trickle(candidates new: [String], mid: String) {
        let added = state.withLock { state in
            let fresh = new.filter { candidate in !state.candidates.contains { $0.candidate == candidate } }
            guard !fresh.isEmpty else { return false }
            state.candidates += fresh.map { ($0, mid) }
            state.iceRevision += 1
            return true
        }
        if added { publishIceState() }
    }

    /// No more local candidates will come: the next ICE update says `complete: true`.
    public func endOfCandidates() {
        state.withLock { state in
            guard !state.gatheringComplete else { return }
            state.gatheringComplete = true
            state.iceRevision += 1
        }
        publishIceState()
    }

    public func abandonJoin() {
        let attempt = state.change { state -> WebSocket.Attempt?? in
            // Once connected there is no join to abandon: `leave` says goodbye on the live socket.
            guard state.phase == .idle || state.phase == .joining else { return nil }
            state.abandoned = true
            return .some(state.attempt)
        }
        guard let attempt else { return }
        attempt?.cancel()
    }

    public func leave() {
        let leaving = state.change { state -> (session: String?, socket: WebSocket?, done: DispatchSemaphore?, onReader: Bool, attempt: WebSocket.Attempt?)? in
            guard state.phase != .leaving, state.phase != .over else { return nil }
            state.phase = .leaving
            state.ended = true
            return (state.session, state.socket, state.readerDone, state.readerThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false, state.attempt)
        }
        guard let (wasSession, socket, done, onReader, attempt) = leaving else { return }
        attempt?.cancel()

        let deadline = MonotonicClock.nanoseconds() + timeouts.leave.inNanoseconds
        if let socket {
            if let wasSession { try? socket.send(text: TwilioMessages.msg(TwilioMessages.disconnect(session: wasSession))) }
            try? socket.send(text: TwilioMessages.bye)
            socket.close(code: 1000, reason: "Normal")
            // The reader sees the server's close (or the time-out) and ends.
            if let done, !onReader {
                let left = deadline > MonotonicClock.nanoseconds() ? Double(deadline - MonotonicClock.nanoseconds()) / 1e9 : 0
                _ = done.wait(timeout: .now() + left)
            }
            socket.invalidate()
        }
        state.change { state in
            state.phase = .over
            state.socket = nil
        }
    }

    deinit { state.withLock { $0.socket }?.invalidate() }

    // MARK: - Sending

    /// Sends now, or after `welcome` when it has not come yet.
    private func send(_ frame: String) {
        let socket = state.withLock { state -> WebSocket? in
            guard state.welcomed, let socket = state.socket else {
                state.queued.append(frame)
                return nil
            }
            state.lastSent = MonotonicClock.nanoseconds()
            return socket
        }
        try? socket?.send(text: frame)
    }

    private func sendHello(on socket: WebSocket, body: [String: Any]?) throws(RoomError) {
        let cookie = state.withLock { $0.busyCookie }
        let hello = TwilioMessages.hello(id: UUID().uuidString.lowercased(), token: token, cookie: cookie, body: body)
        state.withLock { state in
            state.lastSent = MonotonicClock.nanoseconds()
            state.helloSentAt = state.lastSent
            state.hellos += 1
        }
        try socket.send(text: hello)
    }

    /// Our cumulative ICE state in one `update` (only once connected: before, `publish` sends it),
    /// each revision once; `again` re-sends the last one (after a resumed session, whose server may
    /// not have kept it).
    private func publishIceState(again: Bool = false) {
        iceSendOrder.lock()
        defer { iceSendOrder.unlock() }
        let update = state.withLock { state -> [String: Any]? in
            guard state.phase == .connected, let session = state.session, state.iceRevision > 0,
                  again || state.iceRevision > state.publishedIceRevision else { return nil }
            state.publishedIceRevision = state.iceRevision
            let ice = TwilioMessages.ice(ufrag: state.ufrag, revision: state.iceRevision, candidates: state.candidates, complete: state.gatheringComplete)
            return TwilioMessages.update(session: session, trackID: state.trackID, peerConnection: ["id": peerConnectionID, "ice": ice])
        }
        if let update { send(TwilioMessages.msg(update)) }
    }

    /// Waits on `state` until `condition` holds (under the lock), the join failed or was abandoned,
    /// or `deadline` passed.
    private func wait(until deadline: UInt64, _ condition: (State) -> Bool) throws(RoomError) {
        /// nil while the wait goes on.
        func end(_ state: State) -> Result<Void, RoomError>? {
            if let joinError = state.joinError { return .failure(joinError) }
            if state.abandoned || state.phase == .leaving || state.phase == .over { return .failure(.unreachable("Twilio: the join was cancelled")) }
            if condition(state) { return .success(()) }
            guard MonotonicClock.nanoseconds() < deadline else {
                if !state.welcomed { return .failure(.unreachable("Twilio signaling \(url.redactedForLog): no welcome in answer to our hello")) }
                return .failure(.unreachable("Twilio signaling \(url.redactedForLog): no connected within \(Int(timeouts.join.inSeconds)) s of joining"))
            }
            return nil
        }
        while true {
            let now = MonotonicClock.nanoseconds()
            // At most 0.25 s at a time: the condition can come true by time alone (`iced`'s wait).
            let slice = Date(timeIntervalSinceNow: min(Double(deadline - min(deadline, now)) / 1e9, 0.25))
            if let result = state.wait(until: slice, for: { end($0) != nil }, then: { state, _ in end(state) }) { return try result.get() }
        }
    }

    // MARK: - The reader thread

    private func startReader() {
        let done = DispatchSemaphore(value: 0)
        state.withLock { $0.readerDone = done }
        startThread(name: "krakl-twilio") { [self] in
            // First thing: a leave from an onEvent handler runs on this thread and must know it.
            state.withLock { $0.readerThread = pthread_self() }
            readLoop()
            // Cleared at the end: a later thread may be given the same pthread_t.
            state.withLock { $0.readerThread = nil }
            done.signal()
        }
    }

    private func readLoop() {
        while true {
            let (socket, phase, welcomed, negotiated, lastSent, lastReceived, helloSentAt, hellos) = state.withLock { state in
                (state.socket, state.phase, state.welcomed, UInt64(state.negotiatedTimeout) * 1_000_000, state.lastSent, state.lastReceived,
                 state.helloSentAt, state.hellos)
            }
            guard let socket, phase != .over else { return }
            let now = MonotonicClock.nanoseconds()
            var wake = now + 1_000_000_000
            if welcomed {
                let beat = lastSent + negotiated - min(negotiated / 2, 200_000_000)
                if now >= beat {
                    state.withLock { $0.lastSent = now }
                    try? socket.send(text: TwilioMessages.heartbeat)
                    continue
                }
                if now >= lastReceived + 3 * negotiated {
                    socketLost(socket, "no heartbeat from the server for \(3 * negotiated / 1_000_000) ms")
                    continue
                }
                wake = min(wake, beat, lastReceived + 3 * negotiated)
            } else if hellos > 0, phase == .joining || phase == .reconnecting {
                let welcomeBy = helloSentAt + timeouts.welcome.inNanoseconds
                if now >= welcomeBy {
                    if hellos >= timeouts.hellos, phase == .reconnecting {
                        socketLost(socket, "no welcome after \(hellos) hellos on the new socket")
                        continue
                    }
                    if hellos >= timeouts.hellos {
                        failJoin(.unreachable("Twilio signaling \(url.redactedForLog): no welcome after \(hellos) hellos (\(Int(timeouts.welcome.inSeconds)) s each)"))
                        return
                    }
                    try? sendHello(on: socket, body: phase == .reconnecting ? syncBody() : nil)
                    continue
                }
                wake = min(wake, welcomeBy)
            }
            switch socket.receive(until: wake) {
            case .timedOut:
                continue
            case .binary:
                protocolFailure(socket, "a binary frame (TCMP frames are JSON text)")
            case .text(let text):
                state.withLock { $0.lastReceived = MonotonicClock.nanoseconds() }
                let frame: TwilioMessages.Frame
                do throws(TwilioMessages.Malformed) { frame = try TwilioMessages.parseFrame(text) } catch {
                    protocolFailure(socket, error.description)
                    continue
                }
                if handle(frame, on: socket) == .stop { return }
            case .closed(let code, let reason, _):
                if state.withLock({ $0.phase == .leaving || $0.phase == .over }) { return }
                socketLost(socket, Self.closeWords(code: code, reason: reason), code: code)
                if state.withLock({ $0.socket == nil }) { return }
            }
        }
    }

    private enum Next { case go, stop }

    private func handle(_ frame: TwilioMessages.Frame, on socket: WebSocket) -> Next {
        switch frame {
        case .welcome(let timeout):
            let flush = state.change { state -> [String] in
                state.welcomed = true
                state.hellos = 0
                state.negotiatedTimeout = timeout
                state.lastReceived = MonotonicClock.nanoseconds()
                state.lastSent = state.lastReceived
                state.welcomedAt = state.lastReceived
                defer { state.queued.removeAll() }
                return state.queued
            }
            for text in flush { try? socket.send(text: text) }
        case .heartbeat, .bye:
            break
        case .unknown(let type):
            // While joining, nothing but the handshake's frames may come; afterwards it is news we skip.
            if state.withLock({ $0.phase == .joining }) {
                failJoin(.badReply("Twilio 53003: the signaling server sent a frame of unknown type \"\(type)\""))
                socket.close(code: 1002, reason: "invalid message")
                return .stop
            }
            deliver(.notice("the Twilio signaling server sent a frame of unknown type \"\(type)\"; ignored"), final: false)
        case .bad(let reason):
            if state.withLock({ !$0.welcomed }) {
                failJoin(.refused(status: 53000, message: "Twilio 53000: the signaling server refused our hello (\(reason))"))
                return .stop
            }
        case .busy(let retryAfter, _, let cookie):
            guard retryAfter >= 0 else {
                failJoin(.serverError(status: 53006, message: "Twilio 53006: the signaling server is busy"))
                return .stop
            }
            state.withLock { $0.busyCookie = cookie }
            usleep(UInt32(min(retryAfter, 10_000)) * 1000)
            state.withLock { $0.hellos = 0 }
            let reconnecting = state.withLock { $0.phase == .reconnecting }
            try? sendHello(on: socket, body: reconnecting ? syncBody() : nil)
        case .message(let rsp):
            return handle(rsp, on: socket)
        }
        return .go
    }

    private func handle(_ rsp: TwilioMessages.Rsp, on socket: WebSocket) -> Next {
        switch rsp {
        case .iced(let servers):
            state.change { state in state.iced = (state.iced ?? []) + servers }
        case .connected(let room), .synced(let room):
            let resumed: Bool
            if case .synced = rsp { resumed = true } else { resumed = false }
            if let problem = accept(room, resumed: resumed) {
                if resumed {
                    deliver(.connectionLost(reason: "Twilio: the server's answer to our reconnect is not usable: \(problem)"))
                } else {
                    failJoin(.badReply("Twilio 53003: \(problem)"))
                }
                return .stop
            }
            if resumed { deliver(.reconnected, final: false) }
            publishIceState(again: resumed)
        case .update(let room):
            state.withLock { state in
                for track in room.publishedTracks where track.id == state.trackID { state.trackSid = track.sid ?? state.trackSid }
            }
            if let pc = room.peerConnections.first(where: { $0.id == peerConnectionID }) {
                if let description = pc.description { renegotiate(description) }
                if let ice = pc.ice { takeRemoteIce(ice) }
            }
        case .disconnected(let status):
            let words = status == "completed" ? "the meeting was ended (Twilio 53118)" : "the room server disconnected us (Twilio \(status ?? "no status"))"
            endFromServer(.roomEnded(reason: words), socket: socket)
            return .stop
        case .error(let code, let message):
            let (joining, resuming) = state.withLock { ($0.phase == .joining, $0.phase == .reconnecting) }
            if joining {
                failJoin(Self.joinError(code: code, message: message))
            } else if resuming {
                state.withLock { $0.phase = .over }
                deliver(.connectionLost(reason: "the room server refused to resume our session (Twilio \(code): \(message))"))
                return .stop
            } else if code == 53205 {
                endFromServer(.replaced(reason: "the same identity joined the room elsewhere (Twilio 53205: \(message))"), socket: socket)
            } else {
                endFromServer(.roomEnded(reason: "the room server ended our session (Twilio \(code): \(message))"), socket: socket)
            }
            return .stop
        case .ignored:
            break
        }
        return .go
    }

    /// The server's side of a renegotiation (`lib/signaling/v2/peerconnection.js` in the SDK): an
    /// offer newer than the last finished negotiation is answered on the same transport (our video
    /// as it is, anything new rejected); `create-offer` gets our offer again with its revision; a
    /// late or repeated description is ignored. Nothing here ends the session: an offer we cannot
    /// answer is reported and skipped, and the media goes on as negotiated.
    private func renegotiate(_ description: TwilioMessages.Description) {
        let current = state.withLock { state -> (session: String, firstAnswer: String, offer: String, version: Int, track: String)? in
            guard state.phase == .connected, let session = state.session, let firstAnswer = state.answer,
                  description.revision > state.stableRevision else { return nil }
            return (session, firstAnswer, state.ourOffer, state.sdpVersion, state.trackID)
        }
        guard let (session, firstAnswer, offer, version, track) = current else { return }
        let reply: [String: Any]
        switch description.type {
        case "offer":
            guard let sdp = description.sdp else {
                deliver(.notice("the Twilio server sent an offer without SDP (revision \(description.revision)); ignored"), final: false)
                return
            }
            do throws(TwilioRenegotiation.Failure) {
                let answerSDP = try TwilioRenegotiation.answer(toServerOffer: sdp, ourOffer: offer, firstAnswer: firstAnswer, version: version)
                reply = ["type": "answer", "revision": description.revision, "sdp": answerSDP]
            } catch {
                deliver(.notice("cannot answer the Twilio server's offer (revision \(description.revision)): \(error); the media goes on as negotiated"), final: false)
                return
            }
        case "create-offer":
            // Our offer as it is (same ICE credentials, no restart), newly versioned.
            reply = ["type": "offer", "revision": description.revision, "sdp": TwilioRenegotiation.reversioned(offer, version: version)]
        default:
            return
        }
        state.withLock { state in
            state.stableRevision = description.revision
            state.sdpVersion += 1
        }
        let update = TwilioMessages.update(session: session, trackID: track, peerConnection: ["id": peerConnectionID, "description": reply])
        send(TwilioMessages.msg(update))
    }

    /// The server's ICE state (cumulative, as ours): the candidates not seen yet go to ICE, but only
    /// for the ufrag of the answer in use and only from a newer revision (`lib/signaling/v2/icebox.js`).
    private func takeRemoteIce(_ ice: TwilioMessages.Ice) {
        let fresh = state.withLock { state -> [String] in
            guard let answer = state.answer, ice.revision > state.remoteIceRevision, let ufrag = ice.ufrag,
                  ufrag == TwilioRenegotiation.attribute("ice-ufrag", in: answer) else { return [] }
            state.remoteIceRevision = ice.revision
            // Bounded: a server that trickles without end cannot grow this past a few hundred.
            let new = ice.candidates.filter { !state.remoteCandidatesSeen.contains($0) }.prefix(max(0, 512 - state.remoteCandidatesSeen.count)).map { $0 }
            state.remoteCandidatesSeen.formUnion(new)
            return new
        }
        for candidate in fresh { deliver(.remoteCandidate(candidate), final: false) }
    }

    /// Takes a connected/synced message; returns what is wrong with it, or nil.
    private func accept(_ room: TwilioMessages.RoomState, resumed: Bool) -> String? {
        guard room.hasParticipant else { return "the server's connected message has no participant" }
        return state.change { state -> String? in
            if !resumed {
                guard state.phase == .joining else { return nil }
                guard let session = room.session, !session.isEmpty else { return "the server's connected message has no session" }
                guard let pc = room.peerConnections.first(where: { $0.id == peerConnectionID }) ?? room.peerConnections.first,
                      let description = pc.description, description.type == "answer", let sdp = description.sdp else {
                    return "the server's connected message has no answer for our peer connection"
                }
                guard description.revision == 1 else {
                    return "the server's answer has revision \(description.revision), not our offer's 1"
                }
                state.session = session
                state.answer = sdp
            } else {
                guard state.phase == .reconnecting else { return nil }
                if let session = room.session, session != state.session { return "the resumed session is another one" }
            }
            if let timeout = room.sessionTimeout { state.sessionTimeout = timeout }
            state.roomSid = room.roomSid ?? state.roomSid
            state.participantSid = room.participantSid ?? state.participantSid
            for track in room.publishedTracks where track.id == state.trackID { state.trackSid = track.sid ?? state.trackSid }
            state.phase = .connected
            return nil
        }
    }

    private func syncBody() -> [String: Any] {
        state.withLock { state in
            TwilioMessages.sync(session: state.session ?? "", token: token, room: room, trackID: state.trackID, peerConnectionID: peerConnectionID)
        }
    }

    /// The server broke the protocol: while joining, the join fails; afterwards the socket is
    /// treated as lost (and resumed, as the SDK does for 3002 "failed").
    private func protocolFailure(_ socket: WebSocket, _ words: String) {
        if state.withLock({ $0.phase == .joining }) {
            failJoin(.badReply("Twilio 53003: the signaling server sent \(words)"))
            socket.close(code: 1002, reason: "invalid message")
            return
        }
        socket.close(code: 1002, reason: "invalid message")
        socketLost(socket, "the signaling server sent \(words)")
    }

    private func failJoin(_ error: RoomError) {
        state.change { state in
            if state.joinError == nil { state.joinError = error }
        }
    }

    /// The server ended our session: tell the session, then say goodbye as the SDK does
    /// (`disconnect`, `bye`, close 1000); `leave` later finds nothing more to do on the socket.
    private func endFromServer(_ event: RoomEvent, socket: WebSocket) {
        // Goodbye first, so a leave that the event starts finds nothing left to send.
        let session = state.withLock { state -> String? in
            defer { state.session = nil; state.socket = nil }
            return state.session
        }
        if let session { try? socket.send(text: TwilioMessages.msg(TwilioMessages.disconnect(session: session))) }
        try? socket.send(text: TwilioMessages.bye)
        socket.close(code: 1000, reason: "Normal")
        deliver(event)
        socket.awaitClose(within: .milliseconds(500))
    }

    /// The socket is gone (closed, silent, broken). Before `connected` the join fails; after it we
    /// reconnect within the session timeout, with backoff, and resume by `sync`.
    private func socketLost(_ socket: WebSocket, _ words: String, code: UInt16? = nil) {
        socket.invalidate()
        enum Loss { case joining, over, closedByServer, reconnect(firstLoss: Bool, window: Double, until: UInt64) }
        let loss = state.withLock { state -> Loss in
            let phase = state.phase
            if phase == .joining { return .joining }
            state.socket = nil
            guard phase == .connected || phase == .reconnecting else { return .over }
            // 1000 from the server ends the session without error, as in the SDK.
            if code == 1000 { return .closedByServer }
            // One window from the first loss: a new socket that fails again does not extend it.
            let firstLoss = phase == .connected
            if firstLoss { state.reconnectUntil = MonotonicClock.nanoseconds() + UInt64(state.sessionTimeout * 1e9) }
            state.phase = .reconnecting
            state.welcomed = false
            return .reconnect(firstLoss: firstLoss, window: state.sessionTimeout, until: state.reconnectUntil)
        }
        let (firstLoss, window, until): (Bool, Double, UInt64)
        switch loss {
        case .joining:
            failJoin(.unreachable("Twilio signaling \(url.redactedForLog): \(words)"))
            state.withLock { $0.socket = nil }
            return
        case .over:
            return
        case .closedByServer:
            deliver(.roomEnded(reason: "the room server closed the signaling connection"))
            return
        case .reconnect(let first, let span, let end):
            (firstLoss, window, until) = (first, span, end)
        }
        if firstLoss { deliver(.reconnecting(reason: words), final: false) }

        var delay = 0.08
        while MonotonicClock.nanoseconds() < until {
            if state.withLock({ $0.phase != .reconnecting }) { return }
            let attempt = WebSocket.Attempt()
            state.withLock { $0.attempt = attempt }
            var options = socketOptions
            options.handshakeTimeout = min(options.handshakeTimeout, .nanoseconds(max(100_000_000, until - min(until, MonotonicClock.nanoseconds()))))
            if let fresh = try? WebSocket.connect(to: url, options: options, attempt: attempt) {
                let keep = state.withLock { state -> Bool in
                    guard state.phase == .reconnecting else { return false }
                    state.socket = fresh
                    state.attempt = nil
                    return true
                }
                guard keep else { fresh.invalidate(); return }
                try? sendHello(on: fresh, body: syncBody())
                return   // the read loop goes on with the new socket: welcome, then synced
            }
            usleep(UInt32(delay * 1e6))
            delay = min(delay * 1.5, 2)
        }
        state.withLock { $0.phase = .over }
        deliver(.connectionLost(reason: "the signaling connection to Twilio was lost (\(words)) and not resumed within \(Int(window)) s"))
    }

    /// Calls `onEvent`; an end at most once, never while leaving.
    private func deliver(_ event: RoomEvent, final: Bool = true) {
        let (allowed, handler) = state.withLock { state in
            let allowed = !state.ended && state.phase != .leaving
            if final && allowed { state.ended = true }
            return (allowed, state.eventHandler)
        }
        if allowed { handler?(event) }
    }

    // MARK: - Words

    /// An RSP error while joining, as the agent's typed refusal (docs/exit-codes.md).
    static func joinError(code: Int, message: String) -> RoomError {
        let words = "Twilio \(code): \(message)"
        switch code {
        case 20101...20107, 20151, 20157: return .unauthorized(status: code, message: words)
        case 53106: return .noSuchRoom(status: code, message: words)
        case 53105: return .roomFull(message: words)
        case 53205: return .refused(status: code, message: words + " (another participant with this identity is in the room)")
        case 53006: return .serverError(status: code, message: words)
        default: return .refused(status: code, message: words)
        }
    }

    static func closeWords(code: UInt16, reason: String) -> String {
        let clipped = TwilioMessages.clip(reason, 120)
        return "the socket closed with \(code)" + (clipped.isEmpty ? "" : " (\(clipped))")
    }

}
