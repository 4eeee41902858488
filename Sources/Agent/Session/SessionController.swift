import Foundation
import Glibc
import KraklBase
import KraklCore
import KraklEncoder
import KraklRTC
import KraklRoom
import KraklSession

/// One sharing session at a time, driven from its owner's EventLoop: the connect / stop / status
/// logic the daemon (control socket) and the home screen (terminal keys) share. Everything here
/// runs on that loop: requests come from the owner, the session's state changes and end (which
/// happen on the session's own loop) are posted to it, and a once-a-second timer on it measures
/// the rates while a session runs. The owner hears of each step through `onEvent`.
/// Sendable, checked: the session's callbacks (on its own loop) reach it only through `loop.post`,
/// and its mutable state is `LoopBound` to that loop (a touch from another thread traps).
final class SessionController: Sendable {
    enum Event {
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
    struct Start {
        /// "connecting to room R on SERVICE as "I" (token …)".
        let words: String
        let invitation: Invitation
        /// "room R", or the service's URL without secrets.
        let place: String
        /// The room service's name (WHIP, Janus).
        let service: String
    }

    /// Why a connect was not started: words for the person and the exit status (docs/exit-codes.md).
    struct Refusal: Error {
        let message: String
        let status: Int32
    }

    private let arguments: Arguments
    private let loop: EventLoop
    private let logger: BackendLogger
    private let notifier: DesktopNotifier?

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

    init(arguments: Arguments, loop: EventLoop, logger: @escaping BackendLogger, notifier: DesktopNotifier? = DesktopNotifier.sessionBus()) {
        self.arguments = arguments
        self.loop = loop
        onLoop = LoopBound(LoopState(), loop: loop)
        self.logger = logger
        self.notifier = notifier
    }

    /// Where each step goes: the owner's handler, set once it exists (before its loop runs, or on it).
    func onEvent(_ handler: @escaping (Event) -> Void) { onLoop.onEvent = handler }

    private func tell(_ event: Event) { onLoop.onEvent(event) }

    /// Before the process exits: lets the last notification out (bounded).
    func finish() { notifier?.finish() }

    /// Each session's encoded frames also go here (the home screen's local viewer); set on the loop.
    let alsoSendTo = Locked<(any EncodedFrameSink & Sendable)?>(wrappedValue: nil)

    /// The running session's encoder makes a keyframe soon (a local viewer asked); nothing when idle.
    func requestKeyframe() { onLoop.session?.requestKeyframe() }

    /// A session runs (from connect until its end).
    var isActive: Bool { onLoop.session != nil }

    /// Starts a session with a join code's text, or the join code of the QR code in the picture at
    /// the absolute path `qr`. Returns nil once the session was started (its progress arrives as
    /// events), or why it was not.
    func connect(code: String?, qr: String?) -> Refusal? {
        guard onLoop.session == nil else { return Refusal(message: "already sharing; stop first (krakl-agent stop)", status: ExitCode.daemonRefused) }
        var text: String
        if let path = qr {
            guard path.hasPrefix("/") else { return Refusal(message: "connect: the QR picture's path must be absolute (the client makes it so)", status: ExitCode.daemonRefused) }
            switch readQRFile(path: path) {
            case .success(let found): text = found
            case .failure(let failure): return Refusal(message: failure.message, status: failure.status)
            }
        } else if let code {
            text = code
        } else {
            return Refusal(message: "connect needs \"code\" (the join code's text) or \"qr\" (a picture's path)", status: ExitCode.daemonRefused)
        }
        let invitation: Invitation
        do throws(JoinCodeError) {
            invitation = try Invitation.read(text, now: Date())
        } catch {
            return Refusal(message: error.description, status: error.exitStatus)
        }
        text = ""
        let driver = makeDriver(invitation, arguments: arguments)
        let session = SharingSession(configuration: sharingConfiguration(arguments, invitation: invitation, logger: logger), driver: driver,
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
            return Refusal(message: "cannot start the session: \(error)", status: ExitCode.failure)
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
    func stop() -> Bool {
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
        onLoop.lastEnd = ControlEnd(reason: reason.name, message: reason.description, exitStatus: reason.exitStatus)
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
    func sessionStatus() -> SharingStatus? { onLoop.session?.status(window: false) }

    /// The snapshot `status` replies with and screens show.
    func status() -> ControlStatus {
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
        result.source = arguments.options.first { $0.key == "source" || $0.key == "scene" }.map { "\($0.key) \($0.value.serialized)" }
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
