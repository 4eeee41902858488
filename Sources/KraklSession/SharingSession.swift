import Dispatch
import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklRoom

/// What a sharing session is made of, fixed for its life.
public struct SharingConfiguration: Sendable {
    /// plugins.json (nil: the usual search) and the backend in it (nil: its default).
    public var registryPath: String?
    public var backendName: String?
    /// How status lines show the backend ("x11 (display :0)", "file (test pattern)"); nil: its name.
    public var backendLabel: String?
    public var backendOptions: [(key: String, value: JSON)] = []
    /// Run the backend in a child process (true), in this process (false), or as plugins.json says (nil).
    public var backendIsolation: Bool?
    /// The encoder's settings; the codec is the one the answer chose.
    public var encoder = EncoderSettings()
    public var publisher = PublisherConfiguration()
    /// STUN/TURN servers by URL (join code, command line): resolved when joining (host names with
    /// getaddrinfo, at most `resolveTimeout` s, every address used) and added to `publisher`'s.
    public var iceServers: [IceServer] = []
    public var resolveTimeout: Duration = .seconds(2)
    /// ICE + DTLS must be up this long after the answer, else the session ends as connection-lost.
    public var connectTimeout: Duration = .seconds(15)
    /// Also write every encoded picture as raw I420 (tests measure PSNR with it).
    public var dumpInput: String?
    /// Also write one CSV row per encoded frame (`--frame-log`); each session starts the file anew.
    public var frameLog: String?
    /// Capture and encoding start at the room's answer, so the first keyframe is (nearly) ready when
    /// ICE and DTLS are up; false starts them when the connection is up (the behaviour before, kept
    /// for measuring the difference: krakl-rtc-probe `--media-at-connect`).
    public var mediaStartsAtAnswer = true
    /// No answer to ICE consent checks for this long while sharing: the path is taken as broken and
    /// ICE is restarted through the room (consent checks go every 5 s ± 20 %, so this is two missed;
    /// consent itself expires after 30 s, RFC 7675).
    public var restartAfter: Duration = .seconds(12)

    public init() {
        // In a room, receivers ask for what they miss (NACK, PLI/FIR; an SFU forwards a new
        // subscriber's PLI), so the once-a-second refresh of an unchanged screen, most of an idle
        // share's cost (≈ 1.2 % of a core at 1080p), buys nothing there. Recordings keep it.
        // What it also did, raising the quality of what stopped changing, a few passes after the
        // screen settles still do (then nothing until the next change).
        encoder.refreshForReceiversThatAsk()
        // Rooms are SFUs (Janus, Twilio, a WHIP server): a PLI is for a subscriber that may have joined
        // while a keyframe was already leaving, so it is answered rather than taken as a crossing.
        publisher.keyframeRequestSender = .anSfu
    }
}

/// A moment of a session, for status lines and JSON: safe to read from any thread.
public struct SharingStatus: Sendable {
    public var state: SharingLifecycle.State
    public var service: String
    public var identity: String
    public var room: String?
    /// What the room server said of the session ("room RM…, participant PA…, track MT…"; "signaling
    /// reconnecting" while it is resumed), when the service says anything.
    public var roomDetails: String?
    public var backend: String?
    /// The publisher's numbers (nil before the publisher exists).
    public var rtc: RtcStats?
    /// The encoder's numbers over the last second (nil before it encoded).
    public var encoder: EncoderStatistics.Summary?
    /// Where the time to join went.
    public var timings: SharingTimings
    /// The size of the last encoded picture (nil before the first).
    public var width: Int?
    public var height: Int?
}

/// When each step of joining finished (CLOCK_MONOTONIC ms; nil: not yet), for status lines and
/// `krakl-bench room`: where the time from a join code to a picture in the room goes.
public struct SharingTimings: Sendable {
    public var started: Double?
    /// The source exists (the sharing dialog, if any, was answered).
    public var sourceReady: Double?
    /// The room server answered the offer (HTTP).
    public var answered: Double?
    /// ICE and DTLS are up.
    public var connected: Double?

    /// "source 3 ms, room server 25 ms, ICE+DTLS 41 ms", as far as known.
    public var summary: String {
        var parts: [String] = []
        func add(_ name: String, _ from: Double?, _ to: Double?) {
            if let from, let to { parts.append(String(cFormat: "%@ %.0f ms", name, to - from)) }
        }
        add("source", started, sourceReady)
        add("room server", sourceReady, answered)
        add("ICE+DTLS", answered, connected)
        return parts.joined(separator: ", ")
    }
}

/// A session's numbers at the end (or now).
public struct SharingTotals: Sendable {
    public var rtc: RtcStats?
    public var encoder: EncoderStatistics.Summary?
    /// Capture → encoded, ms, a frame each.
    public var captureToEncodedMs: [Double] = []
}

/// One sharing session: owns the capture source, its `MediaPath` (gate →
/// encoder → the publisher as its feed), the publisher and the room driver,
/// and drives them by `SharingLifecycle`. krakl-agent (`--join`, the home
/// screen, the daemon) and krakl-rtc-probe are command lines over it.
///
/// Threads: lifecycle events are handled one at a time on the session's
/// control loop (an `EventLoop`: its own thread, timers in it, and the
/// thread ends with the session, so an agent between sessions holds no
/// thread of it; libdispatch timers would leave libdispatch's manager thread
/// behind for good); blocking steps (creating the source, which may show the
/// portal dialog; HTTP requests to the room; leaving) run in order on a
/// work queue and post their outcome back as events. Frames go from the
/// backend's thread to the encoder thread to the publisher's network thread
/// and never touch either queue.
/// @unchecked Sendable: the control loop's state is `LoopBound`; the owned parts are under `lock`, the loop handle under `loopLock`.
public final class SharingSession: @unchecked Sendable {
    public let configuration: SharingConfiguration
    public let driver: RoomDriver
    public let identity: String
    public let room: String?
    private let logger: BackendLogger

    /// State changes, on the control loop (set before `start`).
    public var onStateChange: (@Sendable (SharingLifecycle.State) -> Void)?
    /// Every publisher event as it happens, on the network thread (set before `start`; the probe logs them).
    public var onPublisherEvent: (@Sendable (PublisherEvent) -> Void)?
    /// The session is over; called once, on the control loop, after everything was freed.
    public var onFinished: (@Sendable (EndReason) -> Void)?
    /// A second receiver of every encoded frame besides the room (set before `start`): the home
    /// screen's local viewer. It never sets the bitrate (the room's estimate does); it may ask for
    /// keyframes with `requestKeyframe()`. Called on the encoder thread: it must not block.
    public var alsoSendTo: (any EncodedFrameSink & Sendable)?

    /// The control loop while a session runs (made by `start`, stopped when it is over).
    private var loop: EventLoop?
    private let loopLock = Lock()
    /// Blocking steps, in order. Plain dispatch work, no timers or sources: its worker threads
    /// retire after 5 s idle.
    private let work = DispatchQueue(label: "krakl-session-work")

    /// What the control loop alone touches, checked there (`LoopBound`); made with the loop by `start`.
    private struct ControlState {
        var lifecycle = SharingLifecycle()
        /// Bumped on every join, so a late timer of an earlier attempt is recognised and ignored.
        var attempt = 0
        /// The connect budget while joining.
        var connectTimer: EventLoop.TimerID?
        /// Watches consent while sharing: its timer, when consent last moved, and how far.
        var pathWatch: (timer: EventLoop.TimerID, responses: Int, changedAt: Double)?
    }
    /// Set by `start` before its loop runs anything, read only on that loop.
    private var control: LoopBound<ControlState>!
    private var lifecycle: SharingLifecycle {
        get { control.value.lifecycle }
        set { control.value.lifecycle = newValue }
    }
    private var attempt: Int {
        get { control.value.attempt }
        set { control.value.attempt = newValue }
    }
    private var connectTimer: EventLoop.TimerID? {
        get { control.value.connectTimer }
        set { control.value.connectTimer = newValue }
    }
    private var pathWatch: (timer: EventLoop.TimerID, responses: Int, changedAt: Double)? {
        get { control.value.pathWatch }
        set { control.value.pathWatch = newValue }
    }

    // Owned parts: made and used by the steps on the work queue (each checks it runs there), torn
    // down by the leave (on the work queue, or beside a create() that holds it), read for status;
    // every access under `lock`.
    private let lock = Lock()
    private var source: (any CaptureSource)?
    private var selection: BackendSelection?
    /// Source → encoder → publisher (made with the source; its encoder when the room has answered).
    private var path: MediaPath?
    private var publisher: Publisher?
    /// The publisher's candidates on their way to the room (held until the room has answered).
    private var candidates: CandidateForwarder?
    /// The encoder's output to the publisher (its numbers are the status's).
    private var sink: FeedSink?
    private var finishedReason: EndReason?
    /// The source is being made (prepareSource), and whether a leave began meanwhile: create() may
    /// wait for a person (the portal's dialog) or hang, and a stop must not wait for it.
    private var makingSource = false
    private var leaveBegun = false
    private var lastTotals = SharingTotals()
    private var timings = SharingTimings()
    /// `lifecycle.state` as last published, for readers on other threads.
    private var currentState: SharingLifecycle.State = .idle
    private let finished = Condition()

    public init(configuration: SharingConfiguration, driver: RoomDriver, identity: String, room: String?,
                logger: @escaping BackendLogger) {
        self.configuration = configuration
        self.driver = driver
        self.identity = identity
        self.room = room
        self.logger = logger
    }

    // MARK: - Control (any thread)

    /// Begins: preparing → joining → sharing. Returns at once. Throws when the control loop's
    /// thread cannot be made (out of descriptors or threads).
    public func start() throws {
        let loop = try EventLoop(name: "krakl-session")
        control = LoopBound(ControlState(), loop: loop)
        loopLock.withLock { self.loop = loop }
        lock.withLock { leaveBegun = false }
        loop.start()
        post(.connect)
    }

    /// Asks to stop; the session leaves and then calls `onFinished(.userStopped)`.
    public func stop() {
        // The control loop may be inside the driver's publish or restart, waiting on a silent server:
        // cut that wait short here, or the stop would queue behind it until the request's time-out.
        driver.abandonJoin()
        post(.stop)
    }

    /// Ends the session because of something its owner decided (e.g. a time limit): as stop, with another reason.
    public func end(_ event: SharingLifecycle.Event) { post(event) }

    /// Waits until the session is over (or `timeout` passed: nil).
    public func waitUntilFinished(timeout: Duration) -> EndReason? {
        finished.lock()
        defer { finished.unlock() }
        let deadline = Date().addingTimeInterval(timeout.inSeconds)
        while finishedReason == nil {
            if !finished.wait(until: deadline) { break }
        }
        return finishedReason
    }

    /// Asks the encoder for a keyframe (a local viewer that joined or lost packets); nothing before
    /// the encoder exists. Any thread; the caller rate-limits (VideoFanout does).
    public func requestKeyframe() {
        lock.withLock { path }?.requestKeyframe()
    }

    /// The lifecycle's state; any thread (also from `onStateChange`, which runs on the control loop).
    public var state: SharingLifecycle.State { lock.withLock { currentState } }

    /// A snapshot for status lines; `window` makes the encoder's numbers those of the last call's window.
    public func status(window: Bool = true) -> SharingStatus {
        let state = self.state
        lock.lock()
        let publisher = self.publisher, pipeline = path?.pipeline, size = sink?.lastSize
        let backend = selection.map { configuration.backendName == $0.entry.name ? configuration.backendLabel ?? $0.entry.name : $0.entry.name }
        lock.unlock()
        return SharingStatus(state: state, service: driver.service, identity: identity, room: room, roomDetails: driver.roomDetails, backend: backend,
                             rtc: publisher?.stats, encoder: pipeline?.statistics.summary(window: window),
                             timings: lock.withLock { timings }, width: size?.width, height: size?.height)
    }

    /// The publisher's and encoder's totals (for the probe's final report); nil parts did not exist.
    /// After the session ended: the numbers they had when it was torn down.
    public var totals: SharingTotals {
        lock.lock()
        defer { lock.unlock() }
        guard publisher != nil || path?.pipeline != nil else { return lastTotals }
        return SharingTotals(rtc: publisher?.stats, encoder: path?.pipeline?.statistics.summary(), captureToEncodedMs: sink?.captureToEncodedMs ?? [])
    }

    // MARK: - The lifecycle, on the control loop

    private func post(_ event: SharingLifecycle.Event) {
        onLoop { [self] in handle(event) }
    }

    /// Runs `work` on the control loop (dropped once the session is over).
    private func onLoop(_ work: @escaping () -> Void) {
        loopLock.withLock { loop }?.post(work)
    }

    /// A timer on the control loop; call on the loop.
    private func after(_ seconds: Double, _ handler: @escaping () -> Void) -> EventLoop.TimerID? {
        loopLock.withLock { loop }?.schedule(after: .seconds(seconds), handler)
    }

    private func cancelTimer(_ id: EventLoop.TimerID?) {
        if let id { loopLock.withLock { loop }?.cancel(id) }
    }

    private func handle(_ event: SharingLifecycle.Event) {
        let before = lifecycle.state
        let now = MonotonicClock.milliseconds()
        switch (before, event) {
        case (.idle, .connect): lock.withLock { timings = SharingTimings(started: now) }
        case (.preparing, .sourceReady): lock.withLock { timings.sourceReady = now }
        case (.joining, .connected): lock.withLock { timings.connected = now }
        default: break
        }
        let actions = lifecycle.handle(event)
        lock.withLock { currentState = lifecycle.state }
        if lifecycle.state != .joining, connectTimer != nil {
            cancelTimer(connectTimer)
            connectTimer = nil
        }
        if lifecycle.state != before {
            watchPath()
            onStateChange?(lifecycle.state)
        }
        for action in actions { perform(action) }
    }

    /// While sharing or reconnecting, a once-a-second look at the publisher's consent answers: none
    /// for `restartAfter` s → the path is interrupted (restart); answers again while reconnecting →
    /// connected. A timer source only while it is needed, so an idle session wakes nothing.
    private func watchPath() {
        let needed = lifecycle.state == .sharing || lifecycle.state == .reconnecting
        if !needed {
            cancelTimer(pathWatch?.timer)
            pathWatch = nil
            return
        }
        let responses = lock.withLock { publisher?.stats.consentResponses ?? 0 }
        if pathWatch != nil {
            pathWatch!.changedAt = MonotonicClock.milliseconds()   // a state change restarts the clock
            pathWatch!.responses = responses
            return
        }
        guard let timer = after(1, { [weak self] in self?.checkPath() }) else { return }
        pathWatch = (timer, responses, MonotonicClock.milliseconds())
    }

    private func checkPath() {
        guard let watch = pathWatch else { return }
        if let next = after(1, { [weak self] in self?.checkPath() }) { pathWatch?.timer = next }
        let responses = lock.withLock { publisher?.stats.consentResponses ?? 0 }
        let now = MonotonicClock.milliseconds()
        if responses != watch.responses {
            pathWatch?.responses = responses
            pathWatch?.changedAt = now
            if lifecycle.state == .reconnecting { handle(.connected) }
        } else if lifecycle.state == .sharing, now - watch.changedAt >= configuration.restartAfter.inMilliseconds {
            handle(.connectionInterrupted("no answer to ICE consent checks for \(Int(configuration.restartAfter.inSeconds)) s"))
        }
    }

    private func perform(_ action: SharingLifecycle.Action) {
        switch action {
        case .prepareSource:
            work.async { [self] in prepareSource() }
        case .join:
            attempt += 1
            let thisAttempt = attempt
            work.async { [self] in join(attempt: thisAttempt) }
        case .startMedia:
            work.async { [self] in startMedia() }
        case .restartIce:
            work.async { [self] in restartIce() }
        case .leave(let reason):
            // While create() runs, the work queue is held by it: the leave goes elsewhere (nothing but
            // the driver exists yet), and prepareSource destroys a source that comes after it.
            let aroundCreate = lock.withLock { () -> Bool in leaveBegun = true; return makingSource }
            (aroundCreate ? DispatchQueue.global() : work).async { [self] in leave(reason) }
        case .finished(let reason):
            // The loop's thread ends after this turn: nothing of the session runs between sessions.
            let loop = loopLock.withLock { () -> EventLoop? in defer { self.loop = nil }; return self.loop }
            loop?.stop()
            finished.lock()
            finishedReason = reason
            finished.broadcast()
            finished.unlock()
            onFinished?(reason)
        }
    }

    // MARK: - Steps, on the work queue

    /// Loads the backend and creates its source: where the person may be asked for permission.
    private func prepareSource() {
        dispatchPrecondition(condition: .onQueue(work))
        // From here until the source exists (or failed), a leave does not queue behind this step.
        guard lock.withLock({ () -> Bool in makingSource = !leaveBegun; return makingSource }) else { return }
        let made: Result<(BackendSelection, MediaPath, any CaptureSource), HostError>
        do throws(HostError) {
            let selection = try BackendSelection(registryPath: configuration.registryPath, name: configuration.backendName,
                                                 overrides: configuration.backendOptions, isolate: configuration.backendIsolation)
            let path = MediaPath(backend: selection.entry.name, logger: logger) { [weak self] event in self?.mediaEvent(event) }
            made = .success((selection, path, try selection.makeSource(sink: path, logger: logger)))
        } catch {
            made = .failure(error)
        }
        lock.lock()
        makingSource = false
        let late = leaveBegun
        if !late, case .success(let (selection, path, source)) = made {
            self.selection = selection
            self.path = path
            self.source = source
        }
        lock.unlock()
        switch made {
        case .success(let (selection, _, source)):
            if late {
                // The session was stopped while the source was being made: it never started.
                do throws(HostError) { try source.destroy() } catch { logger(selection.entry.name, .error, error.description) }
            } else {
                post(.sourceReady)
            }
        case .failure(let error):
            post(.sourceUnavailable(error))
        }
    }

    /// Offer → room server → answer; the connect time-out starts with the answer.
    private func join(attempt: Int) {
        dispatchPrecondition(condition: .onQueue(work))
        // On the work queue, never the control loop: a slow resolver holds this join only.
        var publisherConfiguration = configuration.publisher
        let servers = ResolvedIceServers.resolve(configuration.iceServers, timeout: configuration.resolveTimeout)
        for problem in servers.problems { logger("session", .error, problem) }
        publisherConfiguration.stunServers += servers.stunServers
        publisherConfiguration.turnServers += servers.turnServers
        // A WHIP server may still name TURN servers in its answer; otherwise relay-only cannot work.
        if publisherConfiguration.relayOnly, publisherConfiguration.turnServers.isEmpty, !publisherConfiguration.trickleLater {
            post(.failure("relay-only candidates were asked for (--ice-transport relay) but no TURN server is usable"
                          + (servers.problems.isEmpty ? "" : ": " + servers.problems.joined(separator: "; "))))
            return
        }
        let publisher: Publisher
        do {
            publisher = try Publisher(configuration: publisherConfiguration)
        } catch {
            post(.failure("cannot open the network side: \(error)"))
            return
        }
        let candidates = CandidateForwarder(driver: driver, mid: publisher.offer.mid)
        lock.lock()
        self.publisher = publisher
        self.candidates = candidates
        lock.unlock()
        publisher.onEvent = { [weak self] event in self?.publisherEvent(event) }
        driver.onEvent = { [weak self] event in
            switch event {
            case .roomEnded(let reason): self?.post(.roomEnded(reason))
            case .connectionLost(let reason): self?.post(.connectionLost(reason))
            case .replaced(let reason): self?.post(.replaced(reason))
            case .reconnecting(let reason): self?.logger("session", .warning, "the room's signaling connection was lost (\(reason)); reconnecting")
            case .reconnected: self?.logger("session", .info, "the room's signaling connection was resumed")
            case .notice(let words): self?.logger("session", .warning, words)
            case .remoteCandidate(let text): self?.addRemoteCandidate(text)
            }
        }
        let answer: RoomAnswer
        do throws(RoomError) {
            answer = try driver.publish(offer: publisher.offerSDP, identity: identity)
        } catch {
            post(.joinFailed(error))
            return
        }
        let answeredAt = MonotonicClock.milliseconds()
        lock.withLock { timings.answered = answeredAt }
        // What ICE gathered while the offer was on its way goes now (a WHIP server could not be sent it before).
        candidates.roomAnswered()
        let linked = ResolvedIceServers.resolve(answer.iceServers, timeout: configuration.resolveTimeout)
        for problem in linked.problems { logger("session", .error, "the room server's \(problem)") }
        let stun = linked.stunServers
        let turn = linked.turnServers
        if publisherConfiguration.relayOnly, publisherConfiguration.turnServers.isEmpty, turn.isEmpty {
            post(.failure("relay-only candidates were asked for (--ice-transport relay) but no TURN server is usable"
                          + ((servers.problems + linked.problems).isEmpty ? "" : ": " + (servers.problems + linked.problems).joined(separator: "; "))))
            return
        }
        let parsed: SdpAnswer
        do {
            parsed = try publisher.setAnswer(answer.sdp)
        } catch {
            post(.joinFailed(.badReply("the answer SDP is not usable: \(error)")))
            return
        }
        do {
            try makePipeline(codec: parsed.codec, publisher: publisher)
            publisher.addStunServers(stun)
            publisher.addTurnServers(turn)
            // After the answer's servers, so their candidates come first: then "no more candidates".
            publisher.whenGatheringEnds { candidates.gatheringEnded() }
            if configuration.mediaStartsAtAnswer { post(.answered) }
        } catch {
            post(.failure("\(error)"))
            return
        }
        onLoop { [self] in armConnectTimer(attempt: attempt) }
    }

    /// A candidate the room trickled: to ICE, or a note when it cannot be read.
    private func addRemoteCandidate(_ text: String) {
        guard let publisher = lock.withLock({ self.publisher }) else { return }
        do {
            publisher.addRemoteCandidate(try IceCandidate(parsing: text))
        } catch {
            logger("session", .warning, "the room trickled a candidate that cannot be used (\(error)); ignored")
        }
    }

    /// The connect budget, on the control loop; cancelled as soon as the session is no longer joining
    /// (a timer left pending kept each ended session, with its driver, alive for 15 s).
    private func armConnectTimer(attempt: Int) {
        guard self.attempt == attempt, lifecycle.state == .joining else { return }
        let timeout = configuration.connectTimeout.inSeconds
        cancelTimer(connectTimer)
        connectTimer = after(timeout) { [weak self] in
            guard let self, self.attempt == attempt, lifecycle.state == .joining else { return }
            let words = "no connection to the room's media server within \(Int(timeout)) s of its answer (ICE/DTLS)"
            // A relay that refused us is the reason to give, not the time that passed.
            let stats = lock.withLock { self.publisher?.stats }
            if let stats, let refusal = stats.relayRefusal {
                handle(.relayRefused(refusal, words + "; TURN: " + stats.relayErrors.joined(separator: "; ")))
            } else {
                handle(.connectionLost(words))
            }
        }
    }

    private func makePipeline(codec: VideoCodec, publisher: Publisher) throws {
        var settings = configuration.encoder
        settings.codec = codec
        let sink = FeedSink(publisher, keepsTimes: true)
        guard let path = lock.withLock({ self.path }) else { return }
        let frameLog = try configuration.frameLog.map { (file) throws(EncoderError) in try FrameLog(path: file) }
        try path.makeEncoder(settings: settings, dumpInput: configuration.dumpInput, frameLog: frameLog,
                             output: .feeds(steering: sink, also: alsoSendTo.map { [$0] } ?? []))
        lock.withLock { self.sink = sink }
    }

    /// The media path's news, on the capture or encoder thread: the source's end and the encoder's
    /// failure end the session; the source's errors were logged.
    private func mediaEvent(_ event: MediaPathEvent) {
        switch event {
        case .sourceEnded(let words): post(.sourceEnded(words))
        case .encoderFailed(let error): post(.failure("encoder: \(error.message)"))
        case .sourceError, .frameLimitReached: break
        }
    }

    private func publisherEvent(_ event: PublisherEvent) {
        onPublisherEvent?(event)
        switch event {
        case .connected:
            if !configuration.mediaStartsAtAnswer { post(.answered) }
            post(.connected)
        case .remoteClosed: roomClosedMedia("the room server closed the connection (DTLS close_notify)")
        case .remoteBye(let reason): roomClosedMedia("the room server said goodbye (RTCP BYE\(reason.map { ": \($0)" } ?? ""))")
        case .connectionLost(let reason): post(.connectionLost(reason))
        case .failed(let reason): post(.connectionLost(reason))
        case .relayRefused(let refusal, let reason): post(.relayRefused(refusal, reason))
        case .localCandidate(let candidate): lock.withLock { candidates }?.add(candidate.sdpValue)
        }
    }

    /// The server ended our media session. A room driver with events usually says why at the same
    /// moment (Janus: "destroyed", "kicked"), sometimes a little after the DTLS close_notify; its words
    /// are the person's, so they get a short head start (the first end reason wins).
    private func roomClosedMedia(_ words: String) {
        onLoop { [weak self] in _ = self?.after(Self.roomWordsGrace) { [weak self] in self?.handle(.roomEnded(words)) } }
    }

    /// How long a room driver's explanation may trail the media's end; well inside the 2 s in which
    /// an ended room must bring the agent back to idle.
    static let roomWordsGrace = 0.3

    private func startMedia() {
        dispatchPrecondition(condition: .onQueue(work))
        let (source, path) = lock.withLock { (self.source, self.path) }
        path?.start()
        do throws(HostError) {
            try source?.start()
        } catch {
            post(.sourceUnavailable(error))
        }
    }

    private func restartIce() {
        dispatchPrecondition(condition: .onQueue(work))
        guard let publisher = lock.withLock({ self.publisher }) else { return }
        let offer = publisher.restartIce()
        let answer: String
        // A restart the room cannot do is not the end: consent checks keep the old path's
        // credentials until a new pair is chosen, so the old path may still come back; consent
        // expiry (30 s without an answer, RFC 7675) is what ends the session as connection lost.
        do throws(RoomError) {
            answer = try driver.restart(offer: offer)
        } catch {
            logger("session", .warning, "ICE restart through the room failed (\(error)); waiting for the old path until consent expires")
            return
        }
        do {
            try publisher.setAnswer(answer)
        } catch {
            logger("session", .warning, "the room's answer to the ICE restart is not usable (\(error)); waiting for the old path")
        }
    }

    /// Tears down whatever exists, in the order that tells the room first: the source stops (no new
    /// frames), the publisher sends RTCP BYE and DTLS close_notify, the driver unpublishes and leaves,
    /// then the source and encoder are freed.
    private func leave(_ reason: EndReason) {
        lock.lock()
        let source = self.source, path = self.path, publisher = self.publisher, sink = self.sink
        lock.unlock()
        // Nothing reaches the room once the stop is asked for: the path takes no more frames, the
        // publisher says goodbye and the room is left, and only then is the backend stopped. A
        // backend that hangs in stop() or destroy() is given up after its budget (the source is
        // then dead); before this order its frames (and the encoder's refreshes) went on to the
        // room for the 2 s of a hung stop (RoomSessionTests.aHungStopAddsNothingToTheRoomAfterTheStop).
        path?.finish()
        publisher?.close()
        driver.leave()
        var hung: HostError?
        do throws(HostError) { try source?.stop() } catch { hung = error }
        do throws(HostError) { try source?.destroy() } catch { hung = hung ?? error }
        if let hung, let source { logger(source.backendName, .error, "\(hung.description); the session left the room and freed everything else") }
        let totals = SharingTotals(rtc: publisher?.stats, encoder: path?.pipeline?.statistics.summary(), captureToEncodedMs: sink?.captureToEncodedMs ?? [])
        lock.lock()
        lastTotals = totals
        self.source = nil
        self.path = nil
        self.sink = nil
        self.publisher = nil
        self.candidates = nil
        lock.unlock()
        post(.left)
    }
}
