import Foundation
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
/// @unchecked Sendable: every field is under `state` (an NSCondition the join waits on); the reader thread is the only reader of the socket.
public final class TwilioDriver: RoomDriver, @unchecked Sendable {
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
        get { state.withLock { eventHandler } }
        set { state.withLock { eventHandler = newValue } }
    }

    public let url: URL
    private let token: String
    private let room: String?
    private let timeouts: Timeouts
    private var socketOptions: WebSocket.Options

    private enum Phase: Equatable { case idle, joining, connected, reconnecting, leaving, over }

    // Guarded by `state`; `publish` waits on it.
    private let state = NSCondition()
    private var eventHandler: (@Sendable (RoomEvent) -> Void)?
    private var phase = Phase.idle
    private var socket: WebSocket?
    private var attempt: WebSocket.Attempt?
    private var welcomed = false
    private var negotiatedTimeout = 5000
    private var lastSent: UInt64 = 0
    private var lastReceived: UInt64 = 0
    /// Frames to send once `welcome` came (TCMP: nothing but hello before it).
    private var queued: [String] = []
    private var iced: [IceServer]?
    private var answer: String?
    private var joinError: RoomError?
    private var abandoned = false
    private var ended = false
    private var busyCookie: String?
    /// The last hello: when, and how many in a row without a welcome.
    private var helloSentAt: UInt64 = 0
    private var hellos = 0
    private var welcomedAt: UInt64 = 0
    /// While reconnecting: the end of the window (`session_timeout` from the first loss).
    private var reconnectUntil: UInt64 = 0
    private var readerDone: DispatchSemaphore?
    private var readerThread: Thread?

    // What `connected` said.
    private var session: String?
    private var sessionTimeout: Double
    private(set) var roomSid: String?
    private(set) var participantSid: String?
    private(set) var trackSid: String?

    // Our side of the one peer connection.
    private let peerConnectionID = UUID().uuidString.lowercased()
    private var trackID = UUID().uuidString.lowercased()
    private var ufrag = ""
    private var candidates: [(candidate: String, mid: String)] = []
    private var iceRevision = 0
    private var gatheringComplete = false
    /// The revision last sent. The join thread (on the answer) and the reader (on `connected`) both
    /// publish; without this the same revision went out twice and the server judged the second stale.
    private var publishedIceRevision = 0
    /// Held across building and sending one ICE update, so revisions leave in the order they were
    /// made (the trickling thread and the reader can publish at the same moment).
    private let iceSendOrder = NSLock()
    /// Our offer and the server's first answer (what a re-offer is answered from), the revision of
    /// the last finished negotiation, and the `o=` version of our last description.
    private var ourOffer = ""
    private var stableRevision = 1
    private var sdpVersion = 2
    /// The server's trickled candidates already passed on, and the revision of its last ICE state.
    private var remoteCandidatesSeen: Set<String> = []
    private var remoteIceRevision = 0

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
        sessionTimeout = timeouts.defaultSessionTimeout.inSeconds
        socketOptions = WebSocket.Options()
        socketOptions.caFile = caFile
        socketOptions.proxies = proxies
        // TCMP heartbeats already tell a dead line; our own WebSocket pings would only add traffic.
        socketOptions.pingAfterIdle = .seconds(60)
    }

    /// "room RM…, participant PA…, track MT…", as far as known: for status lines.
    public var roomDetails: String? {
        state.withLock {
            let parts = [roomSid.map { "room \($0)" }, participantSid.map { "participant \($0)" }, trackSid.map { "track \($0)" }].compactMap { $0 }
            var text = parts.joined(separator: ", ")
            if phase == .reconnecting { text += (text.isEmpty ? "" : "; ") + "signaling reconnecting" }
            return text.isEmpty ? nil : text
        }
    }

    // MARK: - RoomDriver

    public func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
        let deadline = MonotonicClock.nanoseconds() + timeouts.join.inNanoseconds
        state.lock()
        guard phase == .idle, !abandoned else {
            state.unlock()
            throw .unreachable("Twilio: the join was cancelled")
        }
        phase = .joining
        if let track = TwilioRenegotiation.msidTrackID(offer) { trackID = track }
        ourOffer = offer
        ufrag = TwilioRenegotiation.attribute("ice-ufrag", in: offer) ?? ""
        let attempt = WebSocket.Attempt()
        self.attempt = attempt
        state.unlock()

        let socket = try WebSocket.connect(to: url, options: socketOptions, attempt: attempt)
        state.lock()
        if abandoned || phase != .joining {
            state.unlock()
            socket.invalidate()
            throw .unreachable("Twilio: the join was cancelled")
        }
        self.socket = socket
        // From here the attempt is done: cancelling it would cut the live socket.
        self.attempt = nil
        state.unlock()
        // The hello before the reader: it times the welcome from the hello it finds sent.
        try sendHello(on: socket, body: nil)
        startReader()

        // iced (or its time-out), then connect.
        try wait(until: min(deadline, MonotonicClock.nanoseconds() + (timeouts.welcome * timeouts.hellos + timeouts.iced).inNanoseconds)) {
            iced != nil || (welcomed && MonotonicClock.nanoseconds() >= welcomedAt + timeouts.iced.inNanoseconds)
        }
        let userAgent = "krakl-agent (Linux)"
        let connect = TwilioMessages.connect(token: token, room: room, trackID: trackID, peerConnectionID: peerConnectionID,
                                             offer: offer, userAgent: userAgent)
        send(TwilioMessages.msg(connect))
        try wait(until: deadline) { answer != nil }
        let (answerSDP, servers) = state.withLock { (answer!, iced ?? []) }
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
        let added = state.withLock {
            let fresh = new.filter { candidate in !candidates.contains { $0.candidate == candidate } }
            guard !fresh.isEmpty else { return false }
            candidates += fresh.map { ($0, mid) }
            iceRevision += 1
            return true
        }
        if added { publishIceState() }
    }

    /// No more local candidates will come: the next ICE update says `complete: true`.
    public func endOfCandidates() {
        state.withLock {
            guard !gatheringComplete else { return }
            gatheringComplete = true
            iceRevision += 1
        }
        publishIceState()
    }

    public func abandonJoin() {
        state.lock()
        // Once connected there is no join to abandon: `leave` says goodbye on the live socket.
        guard phase == .idle || phase == .joining else {
            state.unlock()
            return
        }
        abandoned = true
        let attempt = self.attempt
        state.broadcast()
        state.unlock()
        attempt?.cancel()
    }

    public func leave() {
        state.lock()
        guard phase != .leaving, phase != .over else {
            state.unlock()
            return
        }
        let wasSession = session
        let socket = self.socket
        phase = .leaving
        ended = true
        let done = readerDone
        let onReader = readerThread.map { $0 === Thread.current } ?? false
        state.broadcast()
        let attempt = self.attempt
        state.unlock()
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
        state.withLock {
            phase = .over
            self.socket = nil
            state.broadcast()
        }
    }

    deinit { socket?.invalidate() }

    // MARK: - Sending

    /// Sends now, or after `welcome` when it has not come yet.
    private func send(_ frame: String) {
        state.lock()
        guard welcomed, let socket else {
            queued.append(frame)
            state.unlock()
            return
        }
        lastSent = MonotonicClock.nanoseconds()
        state.unlock()
        try? socket.send(text: frame)
    }

    private func sendHello(on socket: WebSocket, body: [String: Any]?) throws(RoomError) {
        let cookie = state.withLock { busyCookie }
        let hello = TwilioMessages.hello(id: UUID().uuidString.lowercased(), token: token, cookie: cookie, body: body)
        state.withLock {
            lastSent = MonotonicClock.nanoseconds()
            helloSentAt = lastSent
            hellos += 1
        }
        try socket.send(text: hello)
    }

    /// Our cumulative ICE state in one `update` (only once connected: before, `publish` sends it),
    /// each revision once; `again` re-sends the last one (after a resumed session, whose server may
    /// not have kept it).
    private func publishIceState(again: Bool = false) {
        iceSendOrder.lock()
        defer { iceSendOrder.unlock() }
        state.lock()
        guard phase == .connected, let session, iceRevision > 0, again || iceRevision > publishedIceRevision else {
            state.unlock()
            return
        }
        publishedIceRevision = iceRevision
        let ice = TwilioMessages.ice(ufrag: ufrag, revision: iceRevision, candidates: candidates, complete: gatheringComplete)
        let update = TwilioMessages.update(session: session, trackID: trackID, peerConnection: ["id": peerConnectionID, "ice": ice])
        state.unlock()
        send(TwilioMessages.msg(update))
    }

    /// Waits on `state` until `condition` holds (under the lock), the join failed or was abandoned,
    /// or `deadline` passed.
    private func wait(until deadline: UInt64, _ condition: () -> Bool) throws(RoomError) {
        state.lock()
        defer { state.unlock() }
        while true {
            if let joinError { throw joinError }
            if abandoned || phase == .leaving || phase == .over { throw .unreachable("Twilio: the join was cancelled") }
            if condition() { return }
            let now = MonotonicClock.nanoseconds()
            guard now < deadline else {
                if !welcomed { throw .unreachable("Twilio signaling \(url.redactedForLog): no welcome in answer to our hello") }
                throw .unreachable("Twilio signaling \(url.redactedForLog): no connected within \(Int(timeouts.join.inSeconds)) s of joining")
            }
            _ = state.wait(until: Date(timeIntervalSinceNow: min(Double(deadline - now) / 1e9, 0.25)))
        }
    }

    // MARK: - The reader thread

    private func startReader() {
        let done = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            readLoop()
            done.signal()
        }
        thread.name = "krakl-twilio"
        state.withLock {
            readerDone = done
            readerThread = thread
        }
        thread.start()
    }

    private func readLoop() {
        while true {
            let (socket, phase, welcomed, negotiated, lastSent, lastReceived, helloSentAt, hellos) = state.withLock {
                (self.socket, self.phase, self.welcomed, UInt64(self.negotiatedTimeout) * 1_000_000, self.lastSent, self.lastReceived,
                 self.helloSentAt, self.hellos)
            }
            guard let socket, phase != .over else { return }
            let now = MonotonicClock.nanoseconds()
            var wake = now + 1_000_000_000
            if welcomed {
                let beat = lastSent + negotiated - min(negotiated / 2, 200_000_000)
                if now >= beat {
                    state.withLock { self.lastSent = now }
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
                state.withLock { self.lastReceived = MonotonicClock.nanoseconds() }
                let frame: TwilioMessages.Frame
                do throws(TwilioMessages.Malformed) { frame = try TwilioMessages.parseFrame(text) } catch {
                    protocolFailure(socket, error.description)
                    continue
                }
                if handle(frame, on: socket) == .stop { return }
            case .closed(let code, let reason, _):
                if self.state.withLock({ self.phase == .leaving || self.phase == .over }) { return }
                socketLost(socket, Self.closeWords(code: code, reason: reason), code: code)
                if state.withLock({ self.socket == nil }) { return }
            }
        }
    }

    private enum Next { case go, stop }

    private func handle(_ frame: TwilioMessages.Frame, on socket: WebSocket) -> Next {
        switch frame {
        case .welcome(let timeout):
            let flush = state.withLock { () -> [String] in
                welcomed = true
                hellos = 0
                negotiatedTimeout = timeout
                lastReceived = MonotonicClock.nanoseconds()
                lastSent = lastReceived
                welcomedAt = lastReceived
                defer { queued.removeAll() }
                state.broadcast()
                return queued
            }
            for text in flush { try? socket.send(text: text) }
        case .heartbeat, .bye:
            break
        case .unknown(let type):
            // While joining, nothing but the handshake's frames may come; afterwards it is news we skip.
            if state.withLock({ phase == .joining }) {
                failJoin(.badReply("Twilio 53003: the signaling server sent a frame of unknown type \"\(type)\""))
                socket.close(code: 1002, reason: "invalid message")
                return .stop
            }
            deliver(.notice("the Twilio signaling server sent a frame of unknown type \"\(type)\"; ignored"), final: false)
        case .bad(let reason):
            if state.withLock({ !welcomed }) {
                failJoin(.refused(status: 53000, message: "Twilio 53000: the signaling server refused our hello (\(reason))"))
                return .stop
            }
        case .busy(let retryAfter, _, let cookie):
            guard retryAfter >= 0 else {
                failJoin(.serverError(status: 53006, message: "Twilio 53006: the signaling server is busy"))
                return .stop
            }
            state.withLock { busyCookie = cookie }
            usleep(UInt32(min(retryAfter, 10_000)) * 1000)
            state.withLock { hellos = 0 }
            let reconnecting = state.withLock { phase == .reconnecting }
            try? sendHello(on: socket, body: reconnecting ? syncBody() : nil)
        case .message(let rsp):
            return handle(rsp, on: socket)
        }
        return .go
    }

    private func handle(_ rsp: TwilioMessages.Rsp, on socket: WebSocket) -> Next {
        switch rsp {
        case .iced(let servers):
            state.withLock {
                iced = (iced ?? []) + servers
                state.broadcast()
            }
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
            state.withLock {
                for track in room.publishedTracks where track.id == trackID { trackSid = track.sid ?? trackSid }
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
            let (joining, resuming) = state.withLock { (phase == .joining, phase == .reconnecting) }
            if joining {
                failJoin(Self.joinError(code: code, message: message))
            } else if resuming {
                state.withLock { phase = .over }
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
        state.lock()
        guard phase == .connected, let session, let firstAnswer = answer, description.revision > stableRevision else {
            state.unlock()
            return
        }
        let (offer, version, track) = (ourOffer, sdpVersion, trackID)
        state.unlock()
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
        state.withLock {
            stableRevision = description.revision
            sdpVersion += 1
        }
        let update = TwilioMessages.update(session: session, trackID: track, peerConnection: ["id": peerConnectionID, "description": reply])
        send(TwilioMessages.msg(update))
    }

    /// The server's ICE state (cumulative, as ours): the candidates not seen yet go to ICE, but only
    /// for the ufrag of the answer in use and only from a newer revision (`lib/signaling/v2/icebox.js`).
    private func takeRemoteIce(_ ice: TwilioMessages.Ice) {
        let fresh = state.withLock { () -> [String] in
            guard let answer, ice.revision > remoteIceRevision, let ufrag = ice.ufrag, ufrag == TwilioRenegotiation.attribute("ice-ufrag", in: answer) else { return [] }
            remoteIceRevision = ice.revision
            // Bounded: a server that trickles without end cannot grow this past a few hundred.
            let new = ice.candidates.filter { !remoteCandidatesSeen.contains($0) }.prefix(max(0, 512 - remoteCandidatesSeen.count)).map { $0 }
            remoteCandidatesSeen.formUnion(new)
            return new
        }
        for candidate in fresh { deliver(.remoteCandidate(candidate), final: false) }
    }

    /// Takes a connected/synced message; returns what is wrong with it, or nil.
    private func accept(_ room: TwilioMessages.RoomState, resumed: Bool) -> String? {
        guard room.hasParticipant else { return "the server's connected message has no participant" }
        state.lock()
        defer { state.unlock() }
        if !resumed {
            guard phase == .joining else { return nil }
            guard let session = room.session, !session.isEmpty else { return "the server's connected message has no session" }
            guard let pc = room.peerConnections.first(where: { $0.id == peerConnectionID }) ?? room.peerConnections.first,
                  let description = pc.description, description.type == "answer", let sdp = description.sdp else {
                return "the server's connected message has no answer for our peer connection"
            }
            guard description.revision == 1 else {
                return "the server's answer has revision \(description.revision), not our offer's 1"
            }
            self.session = session
            answer = sdp
        } else {
            guard phase == .reconnecting else { return nil }
            if let session = room.session, session != self.session { return "the resumed session is another one" }
        }
        if let timeout = room.sessionTimeout { sessionTimeout = timeout }
        roomSid = room.roomSid ?? roomSid
        participantSid = room.participantSid ?? participantSid
        for track in room.publishedTracks where track.id == trackID { trackSid = track.sid ?? trackSid }
        phase = .connected
        state.broadcast()
        return nil
    }

    private func syncBody() -> [String: Any] {
        state.withLock {
            TwilioMessages.sync(session: session ?? "", token: token, room: room, trackID: trackID, peerConnectionID: peerConnectionID)
        }
    }

    /// The server broke the protocol: while joining, the join fails; afterwards the socket is
    /// treated as lost (and resumed, as the SDK does for 3002 "failed").
    private func protocolFailure(_ socket: WebSocket, _ words: String) {
        if state.withLock({ phase == .joining }) {
            failJoin(.badReply("Twilio 53003: the signaling server sent \(words)"))
            socket.close(code: 1002, reason: "invalid message")
            return
        }
        socket.close(code: 1002, reason: "invalid message")
        socketLost(socket, "the signaling server sent \(words)")
    }

    private func failJoin(_ error: RoomError) {
        state.withLock {
            if joinError == nil { joinError = error }
            state.broadcast()
        }
    }

    /// The server ended our session: tell the session, then say goodbye as the SDK does
    /// (`disconnect`, `bye`, close 1000); `leave` later finds nothing more to do on the socket.
    private func endFromServer(_ event: RoomEvent, socket: WebSocket) {
        // Goodbye first, so a leave that the event starts finds nothing left to send.
        let session = state.withLock { () -> String? in
            defer { self.session = nil; self.socket = nil }
            return self.session
        }
        if let session { try? socket.send(text: TwilioMessages.msg(TwilioMessages.disconnect(session: session))) }
        try? socket.send(text: TwilioMessages.bye)
        socket.close(code: 1000, reason: "Normal")
        deliver(event)
        socket.awaitClose(within: 0.5)
    }

    /// The socket is gone (closed, silent, broken). Before `connected` the join fails; after it we
    /// reconnect within the session timeout, with backoff, and resume by `sync`.
    private func socketLost(_ socket: WebSocket, _ words: String, code: UInt16? = nil) {
        socket.invalidate()
        state.lock()
        let phase = self.phase
        if phase == .joining {
            state.unlock()
            failJoin(.unreachable("Twilio signaling \(url.redactedForLog): \(words)"))
            state.withLock { self.socket = nil }
            return
        }
        guard phase == .connected || phase == .reconnecting else {
            self.socket = nil
            state.unlock()
            return
        }
        // 1000 from the server ends the session without error, as in the SDK.
        if code == 1000 {
            self.socket = nil
            state.unlock()
            deliver(.roomEnded(reason: "the room server closed the signaling connection"))
            return
        }
        // One window from the first loss: a new socket that fails again does not extend it.
        let firstLoss = phase == .connected
        if firstLoss { reconnectUntil = MonotonicClock.nanoseconds() + UInt64(sessionTimeout * 1e9) }
        self.phase = .reconnecting
        welcomed = false
        self.socket = nil
        let window = sessionTimeout
        let until = reconnectUntil
        state.unlock()
        if firstLoss { deliver(.reconnecting(reason: words), final: false) }

        var delay = 0.08
        while MonotonicClock.nanoseconds() < until {
            if state.withLock({ self.phase != .reconnecting }) { return }
            let attempt = WebSocket.Attempt()
            state.withLock { self.attempt = attempt }
            var options = socketOptions
            options.handshakeTimeout = min(options.handshakeTimeout, .nanoseconds(max(100_000_000, until - min(until, MonotonicClock.nanoseconds()))))
            if let fresh = try? WebSocket.connect(to: url, options: options, attempt: attempt) {
                let keep = state.withLock { () -> Bool in
                    guard self.phase == .reconnecting else { return false }
                    self.socket = fresh
                    self.attempt = nil
                    return true
                }
                guard keep else { fresh.invalidate(); return }
                try? sendHello(on: fresh, body: syncBody())
                return   // the read loop goes on with the new socket: welcome, then synced
            }
            usleep(UInt32(delay * 1e6))
            delay = min(delay * 1.5, 2)
        }
        state.withLock { self.phase = .over }
        deliver(.connectionLost(reason: "the signaling connection to Twilio was lost (\(words)) and not resumed within \(Int(window)) s"))
    }

    /// Calls `onEvent`; an end at most once, never while leaving.
    private func deliver(_ event: RoomEvent, final: Bool = true) {
        state.lock()
        let allowed = !ended && phase != .leaving
        if final && allowed { ended = true }
        let handler = eventHandler
        state.unlock()
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
