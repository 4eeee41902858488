// The publisher: one video stream to one peer, as the offerer (WHIP, Janus) or the answerer (WHEP).
//
// Answering API (a WHEP server's viewers), all of it:
//
//   let peer = try Publisher(answering: offerSDP, configuration: PublisherConfiguration(),
//                            iceLite: true, loop: sharedLoop)   // throws SdpError (→ 400) or NetworkError
//   peer.answerSDP!                                // the answer to return (201), complete: no trickle from us
//   peer.onClosed = { reason in … }                // once, network thread: consent lost, close_notify, BYE, ICE/DTLS failure
//   peer.onKeyframeRequest = { … }; peer.onBitrate = { bps in … }   // or fanout.add(peer) (VideoFanout) instead
//   peer.start()                                   // ICE + DTLS; media after they connect (a keyframe made before, or a request)
//   peer.send(frame:keyframe:captureNanoseconds:width:height:)     // any thread, never blocks
//   peer.addRemoteCandidate(_:)                    // a trickled candidate (WHEP PATCH)
//   peer.restartIce(remote:candidates:)            // the peer's ICE restart (WHEP PATCH with new credentials): ours back
//   peer.stats                                     // RtcStats snapshot, any thread
//   peer.close()                                   // RTCP BYE + close_notify, sockets freed; a shared loop keeps running
//
// `loop`: one started EventLoop for all viewers (its owner stops it after closing them); nil gives the
// peer a thread of its own. An ICE restart keeps DTLS and the media stream: only ICE starts over.

import KraklBase
import Foundation
import Glibc

/// A send-only WebRTC video publisher: ICE → DTLS → SRTP → RTP with pacing,
/// RTCP feedback (NACK, PLI/FIR, REMB, transport-wide-cc, receiver reports)
/// and a send-side bandwidth estimate, on a network thread.
///
/// It is the signalling and threading shell around two parts: a `PeerTransport` (sockets, ICE, DTLS,
/// SRTP) and a `VideoSendStream` (packetizing, history, pacer, protection, RTCP rules, estimate).
/// It plays either role of the offer/answer exchange.
///
/// As the offerer (WHIP, Janus):
/// 1. `init(configuration:)` gathers host candidates, binds sockets and writes `offerSDP`.
/// 2. Set `onEvent`, `onKeyframeRequest`, `onBitrate` (before the answer).
/// 3. `setAnswer(_:)` with the peer's SDP; ICE checks start at once.
/// 4. From any thread, `send(frame:…)` each encoded frame; it never blocks.
/// 5. `close()` sends BYE and close_notify, closes the sockets and stops the thread.
///
/// As the answerer (a WHEP viewer's offer):
/// 1. `init(answering:configuration:iceLite:loop:)` reads the offer and writes `answerSDP`
///    (throws `SdpError` for an offer we cannot serve: say so to the peer, e.g. HTTP 400).
/// 2. Set `onEvent` (or just `onClosed`), `onKeyframeRequest`, `onBitrate`, then `start()`.
/// 3. `send(frame:…)`; frames before ICE + DTLS connect are kept from the newest keyframe on (`EarlyFrames`)
///    and sent first when they do; without such a keyframe, connecting asks for one.
///    When the peer restarts ICE, `restartIce(remote:candidates:)` gives our new credentials (DTLS stays).
/// 4. `close()` as above; a shared loop passed in keeps running.
///
/// `KraklRTC.prepare()` at start-up keeps the process's one-time set-up off the first join.
/// @unchecked Sendable: signalling state is under `stateLock`, closing under `closeCondition`, the network state `LoopBound` to `loop`.
public final class Publisher: @unchecked Sendable {
    public let configuration: PublisherConfiguration
    public let role: PeerRole
    public let certificate: Certificate
    public let ssrc: UInt32
    public let rtxSSRC: UInt32
    public let cname: String
    /// Answerer only: our answer to the remote offer (send it back as is). Nil for the offerer.
    public private(set) var answerSDP: String?
    /// Answerer only: what we read from the remote offer.
    public private(set) var remoteOffer: SdpRemoteOffer?

    /// Called on the network thread; any thread may set it. The offerer starts gathering in `init`, so
    /// events that come before a handler is set (a relay failing at once, a local candidate) wait for it
    /// and are delivered in order when it is set; dropped, a relay-only failure would leave the owner
    /// waiting out the connect time-out instead of saying why.
    public var onEvent: ((PublisherEvent) -> Void)? {
        get { stateLock.lock(); defer { stateLock.unlock() }; return eventHandler }
        set {
            stateLock.lock()
            eventHandler = newValue
            let waiting = newValue != nil && !pendingEvents.isEmpty
            stateLock.unlock()
            if waiting { loop.post { [weak self] in self?.deliverPendingEvents() } }
        }
    }

    /// Network thread: to the handler, or kept for it (after any kept before, so the order holds).
    private func emit(_ event: PublisherEvent) {
        stateLock.lock()
        guard let handler = eventHandler, pendingEvents.isEmpty else {
            // Bounded: a publisher nobody listens to keeps only its first events.
            if pendingEvents.count < 256 { pendingEvents.append(event) }
            stateLock.unlock()
            return
        }
        stateLock.unlock()
        handler(event)
    }

    /// Network thread: the events kept until a handler was set.
    private func deliverPendingEvents() {
        stateLock.lock()
        guard let handler = eventHandler else { stateLock.unlock(); return }
        let events = pendingEvents
        pendingEvents.removeAll()
        stateLock.unlock()
        for event in events { handler(event) }
    }
    /// Called once, on the network thread, when the peer ended the session or it failed (consent lost,
    /// DTLS close_notify, RTCP BYE, ICE or DTLS failure), with the reason in words; not after `close()`.
    /// For a server to forget the peer (it should still call `close()` to free the sockets).
    @Locked public var onClosed: (@Sendable (String) -> Void)? = nil
    /// The encoder should make the next frame a keyframe (rate-limited). Network thread; must not block.
    @Locked public var onKeyframeRequest: (@Sendable () -> Void)? = nil
    /// The encoder's new target bitrate in bits per second. Network thread; must not block.
    @Locked public var onBitrate: (@Sendable (Int) -> Void)? = nil
    private var eventHandler: ((PublisherEvent) -> Void)?
    private var pendingEvents: [PublisherEvent] = []

    private let loop: EventLoop
    /// False when the loop was passed in (shared): `close()` leaves it running.
    private let ownsLoop: Bool
    private let transport: PeerTransport
    private let stateLock = NSLock()
    /// `close()`'s progress; guarded by `closeCondition`.
    private enum Closing { case open, closing, closed }
    private var closing = Closing.open
    private let closeCondition = NSCondition()
    private var started = false
    private var currentOffer: SdpVideoOffer
    private let statistics = RtcStatsCell()

    // Frame queue: any thread in, network thread out.
    private var frames: [OutgoingVideoFrame] = []
    private var frameQueueOverflowed = false
    private var negotiated: SdpAnswer?

    /// The network thread's: set and read in work posted to `loop`, checked there (`LoopBound`).
    private struct NetworkState {
        var stream: VideoSendStream?
        var media = false
        /// What was encoded before the transport connected, sent first when it does.
        var early = EarlyFrames()
        /// The transport ended: frames from now on go nowhere.
        var mediaEnded = false
        /// Called once gathering has ended, on the network thread: `whenGatheringEnds`.
        var gatheringWaiters: [@Sendable () -> Void] = []
    }
    private let net: LoopBound<NetworkState>

    /// Sockets, certificate, SSRCs and the loop; no network activity yet.
    private init(role: PeerRole, configuration: PublisherConfiguration, loop: EventLoop?) throws {
        self.configuration = configuration
        self.role = role
        if let loop {
            self.loop = loop
            ownsLoop = false
        } else {
            self.loop = try EventLoop(name: "krakl-rtc")
            ownsLoop = true
        }
        net = LoopBound(NetworkState(), loop: self.loop)
        transport = try PeerTransport(role: role, configuration: configuration, loop: self.loop, stats: statistics)
        certificate = transport.certificate
        var random = SystemRandomNumberGenerator()
        ssrc = UInt32.random(in: 1...UInt32.max, using: &random)
        var second = UInt32.random(in: 1...UInt32.max, using: &random)
        while second == ssrc { second = UInt32.random(in: 1...UInt32.max, using: &random) }
        rtxSSRC = second
        cname = configuration.cname ?? "krakl-" + (0..<8).map { _ in "\(UInt8.random(in: 0...9, using: &random))" }.joined()
        let stream = configuration.label.map(SdpVideoOffer.streamID(from:)) ?? "krakl-screen"
        var offer = SdpVideoOffer(sessionID: UInt64.random(in: 1...(UInt64(1) << 62), using: &random), iceUfrag: transport.ice.local.ufrag,
                                  icePwd: transport.ice.local.pwd, fingerprint: certificate.fingerprint, streamID: stream,
                                  trackID: "screen", ssrc: ssrc, rtxSSRC: rtxSSRC, cname: cname)
        offer.codecs = configuration.codecs
        if let label = configuration.label { offer.sessionName = label }
        offer.candidates = transport.ice.localCandidates
        offer.trickle = !configuration.stunServers.isEmpty || !configuration.turnServers.isEmpty || configuration.trickleLater
        offer.endOfCandidates = !offer.trickle
        currentOffer = offer
        statistics.update { $0.targetBitrate = configuration.startBitrate }
    }

    /// The offerer: gathers host candidates (binding one UDP socket per address), makes the
    /// session's certificate and the offer, and starts the network thread.
    public convenience init(configuration: PublisherConfiguration = PublisherConfiguration()) throws {
        try self.init(role: .offerer, configuration: configuration, loop: nil)
        transport.delegate = self
        start()
    }

    /// The answerer: reads a remote offer (e.g. a browser's or a WHEP player's recvonly offer with
    /// audio, video and a data channel), accepts its first video section with a codec of
    /// `configuration.codecs` (VP8 preferred, else VP9), rejects every other section (port 0, RFC 8829
    /// §5.3.1) and writes `answerSDP`: send-only video, our candidates, `a=setup:passive` unless the
    /// offer insists on being passive. Nothing is sent until `start()`.
    /// - Parameters:
    ///   - iceLite: answer as an ICE-lite server (`a=ice-lite`; answers checks, never sends any): right
    ///     for a server reached on its host candidates. False: full ICE as the controlled agent.
    ///   - loop: a network loop to share with other peers (the caller starts and stops it); nil: one of its own.
    /// - Throws: `SdpError` when the offer is malformed or has no video section we can send, and
    ///   `NetworkError` when no address can be bound.
    public convenience init(answering offer: String, configuration: PublisherConfiguration = PublisherConfiguration(), iceLite: Bool = true,
                            loop: EventLoop? = nil) throws {
        var remote = try SdpRemoteOffer(parsing: offer, codecs: configuration.codecs.map(\.codec))
        if configuration.playoutDelay == nil { remote.extensions[.playoutDelay] = nil }
        guard !(iceLite && remote.iceLite) else { throw SdpError.offerNotAnswerable("both sides are ICE-lite: one side must run full ICE (RFC 8445 §6.1.1)") }
        try self.init(role: iceLite ? .answererLite : .answerer, configuration: configuration, loop: loop)
        var answer = SdpVideoAnswer(offer: remote, sessionID: currentOffer.sessionID, iceUfrag: transport.ice.local.ufrag,
                                    icePwd: transport.ice.local.pwd, fingerprint: certificate.fingerprint, streamID: currentOffer.streamID,
                                    trackID: currentOffer.trackID, ssrc: ssrc, rtxSSRC: remote.rtxPayloadType == nil ? nil : rtxSSRC, cname: cname)
        answer.iceLite = iceLite
        answer.candidates = transport.ice.localCandidates
        if let label = configuration.label { answer.sessionName = label }
        answerSDP = answer.sdp
        remoteOffer = remote
        // `offer` readers get our side's parameters in offer form (never sent).
        currentOffer.setup = answer.setup
        currentOffer.mid = remote.mid
        currentOffer.trickle = false
        updateStats {
            $0.codec = remote.codec.sdpName
            $0.state = "checking"
            $0.dtlsRole = answer.setup == .active ? "client" : "server"
        }
        transport.delegate = self
    }

    /// Answerer: starts ICE (answering the peer's checks) and DTLS. Set the handlers first. Idempotent.
    public func start() {
        stateLock.lock()
        let first = !started
        started = true
        stateLock.unlock()
        guard first else { return }
        if ownsLoop { loop.start() }
        let remote = remoteOffer
        let now = MonotonicClock.nanoseconds()
        loop.post { [self] in
            transport.start()
            if let remote {
                net.stream = makeStream(VideoSendParameters(codec: remote.codec, payloadType: remote.payloadType,
                                                        rtxPayloadType: remote.rtxPayloadType, extensions: remote.extensions, mid: remote.mid))
                // Our setup answers theirs: passive (the usual answer to actpass) makes us the DTLS server.
                let dtlsRole: DtlsRole = SdpVideoAnswer.setup(answering: remote.setup) == .active ? .client : .server
                transport.setRemote(credentials: IceCredentials(ufrag: remote.iceUfrag, pwd: remote.icePwd), candidates: remote.candidates,
                                    connectionAddress: remote.connectionAddress, port: remote.port, fingerprint: remote.fingerprint,
                                    dtlsRole: dtlsRole, first: true, now: now)
                transport.service()
            }
        }
    }

    deinit {
        if ownsLoop {
            loop.stop(timeout: 2)
        } else if closing == .open, loop.isRunning {
            // Freed without close() on a shared loop: the loop still watches our sockets, so let go of them there.
            let transport = transport
            loop.post { transport.shutDown(bye: nil) }
        }
    }

    /// The offer as it stands (after `restartIce`, the restarted one). For an answering publisher, our
    /// side's parameters in offer form (credentials, fingerprint, SSRCs); never sent.
    public var offer: SdpVideoOffer { stateLock.lock(); defer { stateLock.unlock() }; return currentOffer }
    public var offerSDP: String { offer.sdp }

    /// What the answer accepted (codec, extensions, feedback), once `setAnswer` succeeded (offerer only).
    public var answer: SdpAnswer? { stateLock.lock(); defer { stateLock.unlock() }; return negotiated }

    /// A copy of the current numbers; any thread.
    public var stats: RtcStats { statistics.snapshot }

    private func updateStats(_ change: (inout RtcStats) -> Void) { statistics.update(change) }

    private func makeStream(_ parameters: VideoSendParameters) -> VideoSendStream {
        let stream = VideoSendStream(configuration: configuration.video, parameters: parameters, ssrc: ssrc, rtxSSRC: rtxSSRC, cname: cname,
                                     stats: statistics, confinedTo: loop)
        stream.onKeyframeRequest = { [unowned self] in onKeyframeRequest?() }
        stream.onBitrate = { [unowned self] in onBitrate?($0) }
        return stream
    }

    // MARK: - Signalling (any thread)

    /// Parses the peer's answer and starts ICE; the DTLS role follows its a=setup.
    /// A second answer after `restartIce()` only renews ICE. Throws SdpError for an unusable answer.
    @discardableResult
    public func setAnswer(_ sdp: String) throws -> SdpAnswer {
        let parsed = try SdpAnswer(parsing: sdp, offer: offer)
        setAnswer(parsed)
        return parsed
    }

    public func setAnswer(_ answer: SdpAnswer) {
        precondition(role == .offerer, "setAnswer is for the offering publisher; an answering one has its remote offer already")
        let now = MonotonicClock.nanoseconds()
        stateLock.lock()
        let first = negotiated == nil
        negotiated = answer
        let offerMid = currentOffer.mid
        stateLock.unlock()
        if !first { updateStats { $0.iceRestarts += 1 } }
        if first {
            updateStats {
                $0.codec = answer.codec.sdpName
                $0.state = "checking"
                $0.dtlsRole = answer.setup == .active ? "server" : "client"
            }
        }
        loop.post { [self] in
            if first { net.stream = makeStream(VideoSendParameters(answer: answer, offerMid: offerMid)) }
            transport.setRemote(credentials: IceCredentials(ufrag: answer.iceUfrag, pwd: answer.icePwd), candidates: answer.candidates,
                                connectionAddress: answer.connectionAddress, port: answer.port, fingerprint: answer.fingerprint,
                                dtlsRole: answer.setup == .active ? .server : .client, first: first, now: now)
            transport.service()
        }
    }

    /// STUN servers learned after the offer (e.g. from the answer's WHIP `Link` headers): their
    /// server-reflexive candidates come as `.localCandidate` events, for the room driver to trickle.
    public func addStunServers(_ servers: [TransportAddress]) {
        guard !servers.isEmpty else { return }
        loop.post { [self] in
            transport.ice.addStunServers(servers, now: MonotonicClock.nanoseconds())
            transport.service()
        }
    }

    /// Calls `handler` once, on the network thread, when no candidate is being gathered any more
    /// (every STUN request for a server-reflexive candidate and every TURN allocation answered or
    /// given up), at once when none is: the moment to tell the room "no more candidates". Call it
    /// after `addStunServers`/`addTurnServers`, so their gathering counts.
    public func whenGatheringEnds(_ handler: @escaping @Sendable () -> Void) {
        loop.post { [self] in
            net.gatheringWaiters.append(handler)
            transport.service()
        }
    }

    /// TURN servers learned after the offer (a WHIP server's `Link` headers): their relay
    /// candidates come as `.localCandidate` events, for the room driver to trickle.
    public func addTurnServers(_ servers: [TurnServer]) {
        guard !servers.isEmpty else { return }
        loop.post { [self] in
            transport.openTurnStreams(servers)
            transport.ice.addTurnServers(servers, now: MonotonicClock.nanoseconds())
            transport.service()
        }
    }

    /// A candidate the peer trickled.
    public func addRemoteCandidate(_ candidate: IceCandidate) {
        loop.post { [self] in
            transport.ice.addRemoteCandidate(candidate, now: MonotonicClock.nanoseconds())
            transport.service()
        }
    }

    /// ICE restart (RFC 8445 §9): new credentials; returns the new offer for the peer. Media keeps
    /// flowing on the current pair until the answer to this offer (`setAnswer`) nominates a new one.
    /// Offerer only (an answerer restarts when the peer asks: `restartIce(remote:candidates:)`).
    public func restartIce() -> String {
        precondition(role == .offerer, "restartIce is for the offering publisher")
        let credentials = IceCredentials.random()
        stateLock.lock()
        currentOffer.iceUfrag = credentials.ufrag
        currentOffer.icePwd = credentials.pwd
        currentOffer.sessionVersion += 1
        let sdp = currentOffer.sdp
        stateLock.unlock()
        loop.post { [self] in
            transport.ice.restart(credentials: credentials, now: MonotonicClock.nanoseconds())
            transport.service()
        }
        return sdp
    }

    /// Answerer: the peer restarted ICE (RFC 8445 §9): `remote` and `candidates` are its new offer's
    /// (a WHEP PATCH's sdpfrag, RFC 9725 §4.3.2). Makes our new credentials and returns them with our
    /// candidates, for the answer fragment. Only ICE starts over: DTLS (no new handshake), SRTP and the
    /// send stream go on, and media stays on the selected pair until the peer's new checks nominate one;
    /// then the old generation's checks are refused.
    ///
    /// Returns once the network thread has the new credentials (bounded, 2 s), so checks the peer sends
    /// as soon as it reads our answer find them in place. Nil when the peer is closed or not started.
    public func restartIce(remote: IceCredentials, candidates: [IceCandidate]) -> (credentials: IceCredentials, candidates: [IceCandidate])? {
        precondition(role != .offerer, "restartIce(remote:candidates:) is for an answering publisher; the offerer calls restartIce()")
        let ready: Bool = stateLock.withLock { started }
        guard ready, closeCondition.withLock({ closing == .open }) else { return nil }
        let credentials = IceCredentials.random()
        stateLock.withLock {
            currentOffer.iceUfrag = credentials.ufrag
            currentOffer.icePwd = credentials.pwd
            currentOffer.sessionVersion += 1
        }
        let result = Guarded<[IceCandidate]?>(nil)
        let work = { [self] in
            guard !transport.finished else { return }
            transport.restartIce(local: credentials, remote: remote, candidates: candidates, now: MonotonicClock.nanoseconds())
            let candidates = transport.ice.localCandidates
            result.withLock { $0 = candidates }
        }
        if loop.isLoopThread {
            work()
        } else {
            let done = DispatchSemaphore(value: 0)
            loop.post { work(); done.signal() }
            guard done.wait(timeout: .now() + 2) == .success else { return nil }
        }
        guard let candidates = result.withLock({ $0 }) else { return nil }
        return (credentials, candidates)
    }

    /// Sends RTCP BYE and DTLS close_notify, closes the sockets and stops the network thread (only
    /// when it is the publisher's own; a shared loop keeps running).
    ///
    /// Bounded (at most ~4 s, when the network thread is stuck in a handler; milliseconds
    /// otherwise) and idempotent: a second call returns once the first has finished. From the
    /// network thread (an `onEvent` handler) it does the same without waiting: an own thread ends
    /// after the current handler. Events stop with it. The event loop's wake-up pipe is freed
    /// with the publisher.
    public func close() {
        let onLoop = loop.isLoopThread
        closeCondition.lock()
        switch closing {
        case .closed:
            closeCondition.unlock()
            return
        case .closing:
            // Another thread is closing: wait for it (bounded), unless we are the thread it waits on.
            let deadline = Date().addingTimeInterval(5)
            while !onLoop, closing != .closed, closeCondition.wait(until: deadline) {}
            closeCondition.unlock()
            return
        case .open:
            closing = .closing
            closeCondition.unlock()
        }
        if onLoop {
            shutDown()
            if ownsLoop { loop.stop() }
        } else if !loop.isRunning {
            // Never started (an answerer closed before `start()`), or the shared loop is gone: nothing runs it.
            shutDown()
        } else {
            let done = DispatchSemaphore(value: 0)
            loop.post { [self] in
                shutDown()
                done.signal()
            }
            // The posted work runs before the loop stops, even when it comes late.
            _ = done.wait(timeout: .now() + 2)
            if ownsLoop { loop.stop(timeout: 2) }
        }
        closeCondition.lock()
        closing = .closed
        closeCondition.broadcast()
        closeCondition.unlock()
    }

    /// Network thread: says goodbye to the peer and lets go of the sockets.
    private func shutDown() {
        loop.preconditionInLoop()
        transport.shutDown(bye: net.stream?.bye)
        net.media = false
        net.mediaEnded = true
        net.stream?.stop()
        _ = takeQueuedFrames()
        net.early.clear()
        updateStats { if $0.state == "connected" || $0.state == "checking" || $0.state == "new" { $0.state = "closed" } }
    }

    // MARK: - Frames (any thread, never blocks)

    /// Hands one encoded frame to the network thread. When `frameQueueCapacity` frames already wait,
    /// the oldest non-key frame is dropped and a keyframe is requested.
    public func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {
        stateLock.lock()
        frames.append(OutgoingVideoFrame(data: frame, keyframe: keyframe, captureNs: captureNanoseconds, width: width, height: height))
        var overflow = false
        var dropped = 0
        if frames.count > configuration.frameQueueCapacity {
            let victim = frames.firstIndex { !$0.keyframe } ?? 0
            frames.remove(at: victim)
            dropped = 1
            overflow = true
        }
        let wakeNeeded = frames.count == 1 || overflow
        if overflow { frameQueueOverflowed = true }
        stateLock.unlock()
        if dropped > 0 { updateStats { $0.framesDropped += dropped } }
        if wakeNeeded { loop.post { [self] in takeFrames() } }
    }

    // MARK: - Network thread

    private func takeQueuedFrames() -> [OutgoingVideoFrame] {
        stateLock.lock()
        let taken = frames
        frames.removeAll(keepingCapacity: true)
        stateLock.unlock()
        return taken
    }

    /// Before the transport is up, frames go to `early`; what it gives up counts as dropped.
    private func keepEarly(_ taken: [OutgoingVideoFrame]) {
        let discarded = net.early.add(taken)
        if discarded > 0 { updateStats { $0.framesDropped += discarded } }
    }

    private func takeFrames() {
        let now = MonotonicClock.nanoseconds()
        stateLock.lock()
        let overflowed = frameQueueOverflowed
        frameQueueOverflowed = false
        stateLock.unlock()
        let taken = takeQueuedFrames()
        guard net.media, let stream = net.stream else {
            if !net.mediaEnded { keepEarly(taken) } else if !taken.isEmpty { updateStats { $0.framesDropped += taken.count } }
            return
        }
        stream.enqueue(taken, queueOverflowed: overflowed, now: now)
        transport.service()
    }
}

extension Publisher: PeerTransportDelegate {
    func transportService(now: UInt64) {
        if !net.gatheringWaiters.isEmpty, !transport.ice.isGathering {
            let waiters = net.gatheringWaiters
            net.gatheringWaiters.removeAll()
            for waiter in waiters { waiter() }
        }
        net.stream?.poll(now: now, pathReady: transport.pathReady, clock: MonotonicClock.nanoseconds, unixNanoseconds: Publisher.unixNanoseconds,
                     transmit: { [transport] plain, rtcp in transport.transmit(plain, rtcp: rtcp) })
    }

    func transportNextDeadline(now: UInt64) -> UInt64? { net.stream?.nextDeadline(now: now) }

    func transportConnected(milliseconds: Double) {
        net.media = true
        emit(.connected(milliseconds: milliseconds))
        // A chain encoded while connecting (from its keyframe on) goes first; without one, the
        // receiver needs a keyframe and the stream asks the encoder for it.
        keepEarly(takeQueuedFrames())
        let now = MonotonicClock.nanoseconds()
        let (chain, stale) = net.early.take(now: now)
        if stale > 0 { updateStats { $0.framesDropped += stale } }
        net.stream?.start(now: now, keyframeReady: !chain.isEmpty)
        if !chain.isEmpty {
            updateStats { $0.earlyFramesSent += chain.count }
            net.stream?.enqueue(chain, queueOverflowed: false, now: now)
        }
    }

    func transportReceivedRtcp(_ plain: [UInt8], now: UInt64) {
        guard let stream = net.stream else { return }
        if let bye = stream.handleRtcp(plain, now: now, unixNanoseconds: Publisher.unixNanoseconds) {
            transport.end(.remoteBye(reason: bye.reason), state: "closed")
            return
        }
        transport.service()
    }

    func transportEnded(_ event: PublisherEvent) {
        net.media = false
        net.mediaEnded = true
        net.early.clear()
        net.stream?.stop()
        emit(event)
        let reason: String
        switch event {
        case .remoteClosed: reason = "the peer closed the connection (DTLS close_notify)"
        case .remoteBye(let text): reason = "the peer said goodbye (RTCP BYE\(text.map { ": \($0)" } ?? ""))"
        case .connectionLost(let text), .failed(let text), .relayRefused(_, let text): reason = text
        case .connected, .localCandidate: return
        }
        onClosed?(reason)
    }

    func transportLocalCandidate(_ candidate: IceCandidate) { emit(.localCandidate(candidate)) }

    /// CLOCK_REALTIME, for RTCP's NTP timestamps.
    static func unixNanoseconds() -> UInt64 {
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        return UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec)
    }

    /// The peer's words without control characters (they end up in logs and terminals).
    static func printable(_ text: String) -> String { VideoSendStream.printable(text) }
}

/// A room's publisher is the encoder's feed: frames in, keyframe requests and the estimate out.
extension Publisher: VideoFeed {}
