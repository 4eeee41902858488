// The publisher: one video stream to one peer, as the offerer (WHIP, Janus) or the answerer (WHEP).
//
// Answering API (a WHEP server's viewers), all of it:
//
//   let peer = try Publisher(answering: offerSDP, configuration: PublisherConfiguration(),
//                            iceLite: true, loop: sharedLoop)   // throws PublisherError: .offer (→ 400) or .transport
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
//
// The offerer's side is in PublisherOfferer.swift, the answerer's in PublisherAnswerer.swift, and what
// the transport calls on the network thread in PublisherNetwork.swift.

import KraklBase
import Dispatch
import FoundationEssentials
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
///    (throws `PublisherError.offer` for an offer we cannot serve: say so to the peer, e.g. HTTP 400).
/// 2. Set `onEvent` (or just `onClosed`), `onKeyframeRequest`, `onBitrate`, then `start()`.
/// 3. `send(frame:…)`; frames before ICE + DTLS connect are kept from the newest keyframe on (`EarlyFrames`)
///    and sent first when they do; without such a keyframe, connecting asks for one.
///    When the peer restarts ICE, `restartIce(remote:candidates:)` gives our new credentials (DTLS stays).
/// 4. `close()` as above; a shared loop passed in keeps running.
///
/// `KraklRTC.prepare()` at start-up keeps the process's one-time set-up off the first join.
/// Sendable, checked: what any thread changes is in `state` (Guarded), what the network thread owns in
/// `net` and `transport` (LoopBound to `loop`); the one exception, `certificate`, is marked `nonisolated(unsafe)`.
public final class Publisher: Sendable {
    public let configuration: PublisherConfiguration
    public let role: PeerRole
    /// nonisolated(unsafe): `Certificate` is not Sendable (OpenSSL handles), but it is never changed once made.
    nonisolated(unsafe) public let certificate: Certificate
    public let ssrc: UInt32
    public let rtxSSRC: UInt32
    public let cname: String
    /// Answerer only: our answer to the remote offer (send it back as is). Nil for the offerer.
    public let answerSDP: String?
    /// Answerer only: what we read from the remote offer.
    public let remoteOffer: SdpRemoteOffer?

    /// Called on the network thread; any thread may set it. The offerer starts gathering in `init`, so
    /// events that come before a handler is set (a relay failing at once, a local candidate) wait for it
    /// and are delivered in order when it is set; dropped, a relay-only failure would leave the owner
    /// waiting out the connect time-out instead of saying why.
    public var onEvent: (@Sendable (PublisherEvent) -> Void)? {
        get { state.withLock { $0.eventHandler } }
        set {
            let waiting = state.withLock {
                $0.eventHandler = newValue
                return newValue != nil && !$0.pendingEvents.isEmpty
            }
            if waiting { loop.post { [weak self] in self?.deliverPendingEvents() } }
        }
    }

    /// Network thread: to the handler, or kept for it (after any kept before, so the order holds).
    func emit(_ event: PublisherEvent) {
        let handler: ((PublisherEvent) -> Void)? = state.withLock {
            guard let handler = $0.eventHandler, $0.pendingEvents.isEmpty else {
                // Bounded: a publisher nobody listens to keeps only its first events.
                if $0.pendingEvents.count < 256 { $0.pendingEvents.append(event) }
                return nil
            }
            return handler
        }
        handler?(event)
    }

    /// Network thread: the events kept until a handler was set.
    private func deliverPendingEvents() {
        let kept: (handler: (PublisherEvent) -> Void, events: [PublisherEvent])? = state.withLock {
            guard let handler = $0.eventHandler else { return nil }
            let events = $0.pendingEvents
            $0.pendingEvents.removeAll()
            return (handler, events)
        }
        guard let kept else { return }
        for event in kept.events { kept.handler(event) }
    }
    /// Called once, on the network thread, when the peer ended the session or it failed (consent lost,
    /// DTLS close_notify, RTCP BYE, ICE or DTLS failure), with the reason in words; not after `close()`.
    /// For a server to forget the peer (it should still call `close()` to free the sockets).
    public var onClosed: (@Sendable (String) -> Void)? {
        get { closedHandler.wrappedValue }
        set { closedHandler.wrappedValue = newValue }
    }
    /// The encoder should make the next frame a keyframe (rate-limited). Network thread; must not block.
    public var onKeyframeRequest: (@Sendable () -> Void)? {
        get { keyframeHandler.wrappedValue }
        set { keyframeHandler.wrappedValue = newValue }
    }
    /// The encoder's new target bitrate in bits per second. Network thread; must not block.
    public var onBitrate: (@Sendable (Int) -> Void)? {
        get { bitrateHandler.wrappedValue }
        set { bitrateHandler.wrappedValue = newValue }
    }
    private let closedHandler = Locked<(@Sendable (String) -> Void)?>(wrappedValue: nil)
    private let keyframeHandler = Locked<(@Sendable () -> Void)?>(wrappedValue: nil)
    private let bitrateHandler = Locked<(@Sendable (Int) -> Void)?>(wrappedValue: nil)

    let loop: EventLoop
    /// False when the loop was passed in (shared): `close()` leaves it running.
    let ownsLoop: Bool
    private let transportOnLoop: LoopBound<PeerTransport>
    /// The network thread's (checked): sockets, ICE, DTLS, SRTP.
    var transport: PeerTransport { transportOnLoop.value }
    let statistics = RtcStatsCell()

    /// `close()`'s progress.
    enum Closing { case open, closing, closed }

    /// What any thread reads or changes, under one lock: signalling, the frame queue, `close()`'s progress.
    struct State {
        /// Set on any thread, called on the network thread.
        var eventHandler: (@Sendable (PublisherEvent) -> Void)?
        var pendingEvents: [PublisherEvent] = []
        var closing = Closing.open
        var started = false
        var offer: SdpVideoOffer
        var negotiated: SdpAnswer?
        // Frame queue: any thread in, network thread out.
        var frames: [OutgoingVideoFrame] = []
        var frameQueueOverflowed = false
    }
    let state: Guarded<State>

    /// The network thread's: set and read in work posted to `loop`, checked there (`LoopBound`).
    struct NetworkState {
        var stream: VideoSendStream?
        var media = false
        /// What was encoded before the transport connected, sent first when it does.
        var early = EarlyFrames()
        /// The transport ended: frames from now on go nowhere.
        var mediaEnded = false
        /// Called once gathering has ended, on the network thread: `whenGatheringEnds`.
        var gatheringWaiters: [@Sendable () -> Void] = []
    }
    let net: LoopBound<NetworkState>

    /// Sockets, certificate, SSRCs, the offer and the loop (and for an answerer, `remote` answered);
    /// no network activity yet.
    init(role: PeerRole, configuration: PublisherConfiguration, loop: EventLoop?, answering remote: SdpRemoteOffer? = nil) throws {
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
        let transport = try PeerTransport(role: role, configuration: configuration, loop: self.loop, stats: statistics)
        transportOnLoop = LoopBound(transport, loop: self.loop)
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
        answerSDP = remote.map { Self.answer($0, ourSide: &offer, iceLite: role == .answererLite, label: configuration.label) }
        remoteOffer = remote
        state = Guarded(State(offer: offer))
        statistics.update { $0.targetBitrate = configuration.startBitrate }
        if let remote { answererReady(remote) }
        transport.delegate = self
    }

    /// Answerer: starts ICE (answering the peer's checks) and DTLS. Set the handlers first. Idempotent.
    public func start() {
        let first = state.withLock {
            let first = !$0.started
            $0.started = true
            return first
        }
        guard first else { return }
        if ownsLoop { loop.start() }
        let remote = remoteOffer
        let now = MonotonicClock.nanoseconds()
        loop.post { [self] in
            transport.start()
            if let remote { startAnswering(remote, now: now) }
        }
    }

    deinit {
        if ownsLoop {
            loop.stop(timeout: .seconds(2))
        } else if state.withLock({ $0.closing == .open }), loop.isRunning {
            // Freed without close() on a shared loop: the loop still watches our sockets, so let go of them there.
            let transport = transportOnLoop
            loop.post { transport.value.shutDown(bye: nil) }
        }
    }

    /// The offer as it stands (after `restartIce`, the restarted one). For an answering publisher, our
    /// side's parameters in offer form (credentials, fingerprint, SSRCs); never sent.
    public var offer: SdpVideoOffer { state.withLock { $0.offer } }
    public var offerSDP: String { offer.sdp }

    /// What the answer accepted (codec, extensions, feedback), once `setAnswer` succeeded (offerer only).
    public var answer: SdpAnswer? { state.withLock { $0.negotiated } }

    /// A copy of the current numbers; any thread.
    public var stats: RtcStats { statistics.snapshot }

    func updateStats(_ change: (inout RtcStats) -> Void) { statistics.update(change) }

    func makeStream(_ parameters: VideoSendParameters) -> VideoSendStream {
        let stream = VideoSendStream(configuration: configuration.video, parameters: parameters, ssrc: ssrc, rtxSSRC: rtxSSRC, cname: cname,
                                     stats: statistics, confinedTo: loop)
        stream.onKeyframeRequest = { [unowned self] in onKeyframeRequest?() }
        stream.onBitrate = { [unowned self] in onBitrate?($0) }
        return stream
    }

    /// A candidate the peer trickled.
    public func addRemoteCandidate(_ candidate: IceCandidate) {
        loop.post { [self] in
            transport.ice.addRemoteCandidate(candidate, now: MonotonicClock.nanoseconds())
            transport.service()
        }
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
        let was = state.withLock {
            let was = $0.closing
            if was == .open { $0.closing = .closing }
            return was
        }
        switch was {
        case .closed:
            return
        case .closing:
            // Another thread is closing: wait for it (bounded), unless we are the thread it waits on.
            if !onLoop { state.wait(until: Date().addingTimeInterval(5), for: { $0.closing == .closed }, then: { _, _ in }) }
            return
        case .open:
            break
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
            if ownsLoop { loop.stop(timeout: .seconds(2)) }
        }
        state.change { $0.closing = .closed }
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
        let frame = OutgoingVideoFrame(data: frame, keyframe: keyframe, captureNs: captureNanoseconds, width: width, height: height)
        let capacity = configuration.frameQueueCapacity
        let (wakeNeeded, overflow) = state.withLock {
            $0.frames.append(frame)
            var overflow = false
            if $0.frames.count > capacity {
                let victim = $0.frames.firstIndex { !$0.keyframe } ?? 0
                $0.frames.remove(at: victim)
                overflow = true
            }
            if overflow { $0.frameQueueOverflowed = true }
            return ($0.frames.count == 1 || overflow, overflow)
        }
        if overflow { updateStats { $0.framesDropped += 1 } }
        if wakeNeeded { loop.post { [self] in takeFrames() } }
    }

    // MARK: - Network thread

    func takeQueuedFrames() -> [OutgoingVideoFrame] {
        state.withLock {
            let taken = $0.frames
            $0.frames.removeAll(keepingCapacity: true)
            return taken
        }
    }

    /// Before the transport is up, frames go to `early`; what it gives up counts as dropped.
    func keepEarly(_ taken: [OutgoingVideoFrame]) {
        let discarded = net.early.add(taken)
        if discarded > 0 { updateStats { $0.framesDropped += discarded } }
    }

    private func takeFrames() {
        let now = MonotonicClock.nanoseconds()
        let overflowed = state.withLock {
            let overflowed = $0.frameQueueOverflowed
            $0.frameQueueOverflowed = false
            return overflowed
        }
        let taken = takeQueuedFrames()
        guard net.media, let stream = net.stream else {
            if !net.mediaEnded { keepEarly(taken) } else if !taken.isEmpty { updateStats { $0.framesDropped += taken.count } }
            return
        }
        stream.enqueue(taken, queueOverflowed: overflowed, now: now)
        transport.service()
    }
}

/// A room's publisher is the encoder's feed: frames in, keyframe requests and the estimate out.
extension Publisher: VideoFeed {}
