import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklRoom

/// One sharing session at a time, driven from its owner's EventLoop: the connect / stop / status
/// logic the agent's front ends (the daemon's control socket, the home screen's keys, `--join`'s
/// lines) share. Everything here runs on that loop: requests come from the owner, the session's
/// state changes and end (which happen on the session's own loop) are posted to it, and a
/// once-a-second timer on it measures the rates while a session runs. The owner hears of each step
/// through `onEvent`. What is the agent's stays there and comes in through `Setup` (the room driver
/// and the session's settings from its command line, the exit status each end stands for: the
/// agent alone numbers them) and `SessionNotifier` (desktop notifications); the agent also reads a
/// join code from a QR picture before it calls `connect` (Sources/Agent/Session/SessionConnect.swift).
/// Sendable, checked: the session's callbacks (on its own loop) reach it only through `loop.post`,
/// and its mutable state is `LoopBound` to that loop (a touch from another thread traps).
public final class SessionController: Sendable {
    public enum Event: Sendable {
        /// A session was started; the words say where to (room, service, identity, shortened token).
        case connecting(Start)
        /// The lifecycle moved (the status is taken after the move).
        case moved(SharingLifecycle.State, ControlStatus)
        /// The session is over; the controller is idle again.
        case ended(EndReason, ControlStatus)
        /// Once a second while a session runs: fresh numbers.
        case tick(ControlStatus)
    }

    /// Where a session that was started goes.
    public struct Start: Sendable {
        /// "connecting to room R on SERVICE as "I" (token …)".
        public let words: String
        public let invitation: Invitation
        /// "room R", or the service's URL without secrets.
        public let place: String
        /// The room service's name (WHIP, Janus).
        public let service: String
    }

    /// Why a connect was not started: words for the person and what it was (the agent turns the
    /// reason into an exit status, docs/exit-codes.md).
    public struct Refusal: Error {
        public enum Reason: Equatable, Sendable {
            /// A session runs already.
            case alreadySharing
            /// The join code's text is no usable join code.
            case joinCode(JoinCodeError)
            /// The session's own loop could not be made.
            case cannotStart
        }
        public let message: String
        public let reason: Reason

        public init(message: String, reason: Reason) {
            self.message = message
            self.reason = reason
        }

        /// A connect while a session runs.
        public static let alreadySharing = Refusal(message: "already sharing; stop first (krakl-agent stop)", reason: .alreadySharing)
    }

    /// What the owner decides for every session.
    public struct Setup: Sendable {
        /// The room driver a join code asks for and the session's settings (the agent: from its command line).
        public var prepare: @Sendable (Invitation) -> (driver: RoomDriver, configuration: SharingConfiguration)
        /// The status `krakl-agent --join … --once` exits with when a session ends this way, kept
        /// with the last end (`ControlEnd.exitStatus`).
        public var exitStatus: @Sendable (EndReason) -> Int32
        /// What is captured, for the status ("source NAME", "scene NAME"), when it was named.
        public var source: String?

        public init(prepare: @escaping @Sendable (Invitation) -> (driver: RoomDriver, configuration: SharingConfiguration),
                    exitStatus: @escaping @Sendable (EndReason) -> Int32, source: String? = nil) {
            self.prepare = prepare
            self.exitStatus = exitStatus
            self.source = source
        }
    }

    private let setup: Setup
    private let loop: EventLoop
    private let logger: BackendLogger
    private let notifier: (any SessionNotifier)?

    /// What only the loop's thread touches, checked there (`LoopBound`).
    private struct LoopState {
        /// The owner's: told each step (set once, before the loop runs or on it).
        var onEvent: (Event) -> Void = { _ in }
        var session: SharingSession?
        var sessionNumber = 0
        var sharingSince: Double?
        var stateSince = MonotonicClock.milliseconds()
        var lastEnd: ControlEnd?
        var ticker: EventLoop.TimerID?
        var meter: (at: Double, bytes: Int, frames: Int)?
        var rates: (kbps: Double, fps: Double)?
    }
    private let onLoop: LoopBound<LoopState>

    public init(setup: Setup, loop: EventLoop, logger: @escaping BackendLogger, notifier: (any SessionNotifier)? = nil) {
        self.setup = setup
        self.loop = loop
        onLoop = LoopBound(LoopState(), loop: loop)
        self.logger = logger
        self.notifier = notifier
    }

    /// Where each step goes: the owner's handler, set once it exists (before its loop runs, or on it).
    public func onEvent(_ handler: @escaping (Event) -> Void) { onLoop.onEvent = handler }

    private func tell(_ event: Event) { onLoop.onEvent(event) }

    /// Before the process exits: lets the last notification out (bounded).
    public func finish() { notifier?.finish() }

    /// Each session's encoded frames also go here (the home screen's local viewer); set on the loop.
    public let alsoSendTo = Locked<(any EncodedFrameSink & Sendable)?>(wrappedValue: nil)

    /// The running session's encoder makes a keyframe soon (a local viewer asked); nothing when idle.
    public func requestKeyframe() { onLoop.session?.requestKeyframe() }

    /// A session runs (from connect until its end).
    public var isActive: Bool { onLoop.session != nil }

    /// Starts a session with a join code's text. Returns nil once the session was started (its
    /// progress arrives as events), or why it was not.
    public func connect(code: String) -> Refusal? {
        guard onLoop.session == nil else { return .alreadySharing }
        let invitation: Invitation
        do throws(JoinCodeError) {
            invitation = try Invitation.read(code, now: Date())
        } catch {
            return Refusal(message: error.description, reason: .joinCode(error))
        }
        let (driver, configuration) = setup.prepare(invitation)
        let session = SharingSession(configuration: configuration, driver: driver,
                                     identity: invitation.identity, room: invitation.room, logger: logger)
        session.alsoSendTo = alsoSendTo.wrappedValue
        onLoop.sessionNumber += 1
        let number = onLoop.sessionNumber
        // Both arrive on the session's own loop and are handed to this one: the owner's state has one thread.
        session.onStateChange = { [weak self] state in self?.loop.post { self?.sessionMoved(number, to: state) } }
        session.onFinished = { [weak self] reason in self?.loop.post { self?.sessionEnded(number, reason) } }
        do {
            try session.start()
        } catch {
            return Refusal(message: "cannot start the session: \(error)", reason: .cannotStart)
        }
        onLoop.session = session
        onLoop.sharingSince = nil
        onLoop.stateSince = MonotonicClock.milliseconds()
        onLoop.meter = nil
        onLoop.rates = nil
        startTicker()
        let place = invitation.room.map { "room \($0)" } ?? invitation.code.url.redactedForLog
        tell(.connecting(Start(words: "connecting to \(place) on \(driver.service) as \"\(invitation.identity)\" (token \(invitation.token.shortened))",
                                  invitation: invitation, place: place, service: driver.service)))
        return nil
    }

    /// Asks the running session to leave; false when there is none.
    @discardableResult
    public func stop() -> Bool {
        guard let session = onLoop.session else { return false }
        session.stop()
        return true
    }

    private func sessionMoved(_ number: Int, to state: SharingLifecycle.State) {
        guard number == onLoop.sessionNumber, onLoop.session != nil else { return }
        // Idle again: `sessionEnded` comes next and tells it with this session's end; a status now
        // would still carry the previous session's (`watch` printed "last session: You stopped
        // sharing." when a room ended).
        if state == .idle { return }
        onLoop.stateSince = MonotonicClock.milliseconds()
        var firstShare = false
        if state == .sharing && onLoop.sharingSince == nil {
            onLoop.sharingSince = MonotonicClock.milliseconds()
            firstShare = true
        }
        let now = status()
        if firstShare { notifier?.sharingStarted(room: now.room, identity: now.identity ?? "you") }
        tell(.moved(state, now))
    }

    private func sessionEnded(_ number: Int, _ reason: EndReason) {
        guard number == onLoop.sessionNumber else { return }
        let shared = onLoop.sharingSince != nil
        onLoop.session = nil
        onLoop.sharingSince = nil
        onLoop.stateSince = MonotonicClock.milliseconds()
        stopTicker()
        onLoop.lastEnd = ControlEnd(reason: reason.name, message: reason.description, exitStatus: setup.exitStatus(reason))
        // Everything of the session is freed by now (onFinished comes last): give the pages back.
        HeapRelease.trim()
        notifier?.sharingEnded(reason, shared: shared)
        tell(.ended(reason, status()))
    }

    /// Once a second while a session runs: the rates are measured and the owner told.
    private func startTicker() {
        guard onLoop.ticker == nil else { return }
        onLoop.ticker = loop.schedule(after: .seconds(1)) { [weak self] in self?.tick() }
    }

    private func stopTicker() {
        if let ticker = onLoop.ticker { loop.cancel(ticker) }
        onLoop.ticker = nil
    }

    private func tick() {
        onLoop.ticker = nil
        guard let session = onLoop.session else { return }
        if let rtc = session.status(window: false).rtc {
            let now = MonotonicClock.milliseconds()
            if let meter = onLoop.meter, now > meter.at {
                let seconds = (now - meter.at) / 1000
                onLoop.rates = (Double(rtc.bytesSent - meter.bytes) * 8 / 1000 / seconds, Double(rtc.framesSent - meter.frames) / seconds)
            }
            onLoop.meter = (now, rtc.bytesSent, rtc.framesSent)
        }
        startTicker()
        tell(.tick(status()))
    }

    /// The running session's own snapshot (its timings, for words about long steps); nil when idle.
    public func sessionStatus() -> SharingStatus? { onLoop.session?.status(window: false) }

    /// The snapshot `status` replies with and screens show.
    public func status() -> ControlStatus {
        var result = ControlStatus(state: "idle", pid: getpid(), lastEnd: onLoop.lastEnd)
        result.stateSeconds = Self.tenths(MonotonicClock.milliseconds() - onLoop.stateSince)
        guard let session = onLoop.session else { return result }
        let now = session.status(window: false)
        // A session that reached idle on its own loop is still leaving here until its end is
        // posted (`sessionEnded`): "idle" now would carry the previous session's end, and `watch`
        // printed "last session: You stopped sharing." just before a room's own end.
        result.state = now.state == .idle ? "leaving" : now.state.name
        result.room = now.room
        result.identity = now.identity
        result.service = now.service
        result.roomDetails = now.roomDetails
        result.backend = now.backend
        result.source = setup.source
        result.width = now.width
        result.height = now.height
        result.sharingSeconds = onLoop.sharingSince.map { Self.tenths(MonotonicClock.milliseconds() - $0) }
        if let rtc = now.rtc {
            result.connection = rtc.state
            result.path = rtc.selectedPath
            result.rttMs = rtc.roundTripMilliseconds
            result.silentSeconds = rtc.lastRtcpReceivedMs.map { Self.tenths(MonotonicClock.milliseconds() - $0) }
            result.lossPercent = rtc.fractionLost.map { $0 * 100 }
            result.framesSent = rtc.framesSent
            result.bytesSent = rtc.bytesSent
        }
        result.kbps = onLoop.rates.map { ($0.kbps * 10).rounded() / 10 }
        result.fps = onLoop.rates.map { ($0.fps * 10).rounded() / 10 }
        return result
    }

    /// Milliseconds as seconds to a tenth.
    private static func tenths(_ milliseconds: Double) -> Double { (milliseconds / 100).rounded() / 10 }
}

/// Where a session's start and end are told to the person outside the front end (the agent: desktop
/// notifications). Any thread; must not block.
public protocol SessionNotifier: Sendable {
    /// The session shares (the first time it reached sharing).
    func sharingStarted(room: String?, identity: String)
    /// The session ended; `shared`: it got as far as sharing.
    func sharingEnded(_ reason: EndReason, shared: Bool)
    /// Before the process exits: lets the last notification out (bounded).
    func finish()
}
