import Dispatch
import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRTC
import KraklRoom
import KraklSession

/// What the lines mode does first: share with a join code, or scan the screen for one.
enum LinesStart {
    case code(JoinCodeSource), scan
}

/// `krakl-agent --join …`, `--qr FILE` or `--scan` without the home screen: a line per event (text,
/// or JSON with --log-format json), one session (with --once) or one after another, each next
/// join code a line of stdin, until stdin ends or a signal other than Ctrl-C.
///
/// One control plane, as the daemon and the home screen: signals (ControlPipe's pipe), stdin
/// while waiting for the next code, the scan's lines and the session's steps (through
/// SessionController) all arrive on one EventLoop, which alone touches this state; the status
/// line is SessionController's once-a-second timer on it. The main thread only waits for the end.
final class LinesMode: Sendable {
    private let arguments: Arguments
    private let logger: BackendLogger
    private let log: LifecycleLog
    private let signalFD: Int32
    private let loop: EventLoop
    private let ended = DispatchSemaphore(value: 0)
    private let controller: SessionController
    private let isTerminal = isatty(STDOUT_FILENO) == 1

    /// What only the loop's thread touches, checked there (`LoopBound`).
    private struct LoopState {
        var exitStatus: Int32 = 0
        var finished = false
        /// SIGTERM, SIGHUP or SIGQUIT came while sharing: quit once the room was left.
        var quitAfterSession = false
        var current: SessionController.Start?
        var previous = SharingLifecycle.State.idle
        /// Whole seconds in the current state at which the next "still …" line is due.
        var nextProgress = 5
        var scanner: ScreenScanJob?
        var input = BoundedLineSplitter(limit: JoinCode.maximumLength + 64)
        var lines: [BoundedLineSplitter.Piece] = []
        var inputEnded = false
        var readingInput = false
    }
    private let onLoop: LoopBound<LoopState>

    init(arguments: Arguments, logger: @escaping BackendLogger, signals: Int32) throws {
        self.arguments = arguments
        self.logger = logger
        log = LifecycleLog(format: arguments.logFormat)
        signalFD = signals
        loop = try EventLoop(name: "krakl-lines")
        onLoop = LoopBound(LoopState(), loop: loop)
        controller = SessionController(arguments: arguments, loop: loop, logger: logger)
        controller.onEvent { [unowned self] event in sessionEvent(event) }
    }

    /// Runs to the end; returns the exit status (the last session's end, or why none could start).
    func run(first: LinesStart) -> Int32 {
        loop.start()
        loop.post { [self] in
            loop.watch(fd: signalFD) { [self] in readSignals() }
            switch first {
            case .scan: startScan()
            case .code(.standardInput): nextCode()
            case .code(let source):
                do throws(HostError) { share(try source.read()) } catch {
                    log.event("error", error.description, error: true)
                    finish(error.exitStatus)
                }
            }
        }
        ended.wait()
        loop.stop()
        controller.finish()
        return onLoop.exitStatus
    }

    private func finish(_ status: Int32) {
        guard !onLoop.finished else { return }
        onLoop.finished = true
        onLoop.exitStatus = status
        loop.unwatch(fd: signalFD)
        if onLoop.readingInput { loop.unwatch(fd: STDIN_FILENO) }
        ended.signal()
    }

    // MARK: - Signals and stdin

    private func readSignals() {
        for number in ControlPipe.signals(on: signalFD) {
            if let scanner = onLoop.scanner {
                scanner.stop()
            } else if controller.isActive {
                // Ctrl-C only stops the session; the others quit once the room was left.
                if number != SIGINT { onLoop.quitAfterSession = true }
                controller.stop()
            } else {
                finish(onLoop.exitStatus)
            }
        }
    }

    /// The next line of stdin is the next join code; an empty line or the end of stdin quits.
    private func nextCode() {
        guard !onLoop.lines.isEmpty else {
            if onLoop.inputEnded { finish(onLoop.exitStatus); return }
            if !onLoop.readingInput {
                onLoop.readingInput = true
                loop.watch(fd: STDIN_FILENO) { [self] in readInput() }
            }
            return
        }
        switch onLoop.lines.removeFirst() {
        case .line(let bytes):
            let text = String(decoding: bytes, as: UTF8.self)
            if text.isEmpty && !arguments.once { finish(onLoop.exitStatus); return }
            share(text)
        case .tooLong:
            log.event("error", "a line longer than a join code can be (\(JoinCode.maximumLength) bytes) is not one", error: true)
            onLoop.exitStatus = 40
            afterSession()
        }
    }

    /// What stdin has now (poll said it is readable: one read does not block); a partial last line
    /// counts as a line when stdin ends.
    private func readInput() {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let n = read(STDIN_FILENO, &chunk, chunk.count)
        if n < 0 && (errno == EINTR || errno == EAGAIN) { return }
        if n > 0 {
            onLoop.lines += onLoop.input.feed(chunk[0..<n])
        } else {
            onLoop.inputEnded = true
            onLoop.lines += onLoop.input.feed([UInt8(ascii: "\n")][...])
        }
        guard !onLoop.lines.isEmpty || onLoop.inputEnded else { return }
        onLoop.readingInput = false
        loop.unwatch(fd: STDIN_FILENO)
        nextCode()
    }

    // MARK: - Scanning

    private func startScan() {
        do throws(HostError) {
            onLoop.scanner = try ScreenScanJob(arguments: arguments, logger: logger, postingTo: loop) { [weak self] line in
                self?.scanSaid(line)
            } progress: { [weak self] line in
                self?.scanProgress(line)
            } done: { [weak self] outcome in
                self?.scanEnded(outcome)
            }
        } catch {
            StandardStream.error("krakl-agent: \(error.description)\n")
            finish(error.exitStatus)
        }
    }

    private func scanSaid(_ line: String) {
        if isTerminal && !arguments.quiet { print("\r\u{1B}[K", terminator: "") }
        print("krakl-agent: \(line)")
    }

    private func scanProgress(_ line: String) {
        guard !arguments.quiet, onLoop.scanner != nil else { return }
        if isTerminal { print("\r\u{1B}[K" + line, terminator: ""); StandardStream.flushOutput() } else { print(line) }
    }

    private func scanEnded(_ outcome: ScreenScanJob.Outcome) {
        onLoop.scanner = nil
        switch outcome {
        case .found(let invitation):
            if arguments.scanOnly {
                print(invitation.summary)
                finish(0)
            } else {
                share(invitation.code.text)
            }
        case .notFound(let status, _):
            finish(status)
        case .failed(let error):
            StandardStream.error("krakl-agent: \(error.description)\n")
            finish(error.exitStatus)
        }
    }

    // MARK: - The session

    private func share(_ text: String) {
        guard let refusal = controller.connect(code: text, qr: nil) else { return }
        log.event("error", refusal.message, error: true)
        onLoop.exitStatus = refusal.status
        afterSession()
    }

    /// Once a session ended (or could not start): quit, or idle until the next code.
    private func afterSession() {
        if arguments.once || onLoop.quitAfterSession { finish(onLoop.exitStatus); return }
        log.event("idle", state: .idle, "idle. Paste the next join code and press Enter (Ctrl-D or Ctrl-C quits).")
        nextCode()
    }

    private func sessionEvent(_ event: SessionController.Event) {
        switch event {
        case .connecting(let start):
            onLoop.current = start
            onLoop.previous = .idle
            onLoop.nextProgress = 5
        case .moved(let state, _):
            moved(to: state)
        case .tick(let now):
            tick(now)
        case .ended(let reason, _):
            if isTerminal && !arguments.quiet && log.format == .text { print("") }
            log.event("ended", state: .idle, reason.description, reason: reason, room: onLoop.current?.invitation.room, identity: onLoop.current?.invitation.identity)
            onLoop.exitStatus = reason.exitStatus
            afterSession()
        }
    }

    private func moved(to state: SharingLifecycle.State) {
        defer { onLoop.previous = state; onLoop.nextProgress = 5 }
        guard let current = onLoop.current else { return }
        let invitation = current.invitation
        let room = invitation.room, identity = invitation.identity
        if state == .sharing && onLoop.previous == .reconnecting {
            log.event("state", state: state, "the connection is back; sharing again", room: room, identity: identity)
            return
        }
        let words: String
        switch state {
        case .preparing:
            // Which screen, and why: a room must never get the test pattern without being told.
            let choice = chooseScreenBackend(registryPath: arguments.plugins, given: arguments.backend)
            words = "preparing the screen source" + (choice.name.map { " (backend \($0): \(choice.why))" } ?? "") + "…"
        case .joining: words = "joining \(current.place) on \(current.service) as \"\(identity)\" (token \(invitation.token.shortened))…"
        case .sharing:
            let status = controller.sessionStatus()
            let timings = status?.timings.summary ?? ""
            let details = status?.roomDetails.map { "; \($0)" } ?? ""
            words = "sharing the screen in \(current.place) as \"\(identity)\" (\(timings)\(details)); Ctrl-C stops"
        case .reconnecting: words = "the connection dropped; restarting ICE through the room…"
        case .leaving(let reason):
            // A join the room refused left nothing to leave worth a line: the reason follows at once.
            if case .joinRefused = reason { return }
            if case .tokenExpired = reason { return }
            words = "leaving the room…"
        case .idle: return
        }
        log.event("state", state: state, words, room: room, identity: identity)
    }

    /// Once a second while a session runs: long steps say how long they have taken (every 5 s,
    /// and what bounds them); while sharing, the status line (text) or the numbers (JSON).
    private func tick(_ now: ControlStatus) {
        guard let session = controller.sessionStatus(), let current = onLoop.current else { return }
        let room = current.invitation.room, identity = current.invitation.identity
        let waited = Int(now.stateSeconds ?? 0)
        if waited >= onLoop.nextProgress && (session.state == .preparing || session.state == .joining) {
            onLoop.nextProgress = (waited / 5 + 1) * 5
            let words = session.state == .preparing
                ? "still preparing the screen source (\(waited) s; a sharing dialog may be waiting for an answer)…"
                : "still joining (\(waited) s): " + (session.timings.answered == nil ? "waiting for the room server's answer…"
                    : "connecting ICE/DTLS, gives up \(Int(arguments.connectTimeout)) s after the room server answered…")
            log.event("progress", state: session.state, words, room: room, identity: identity)
        }
        guard !arguments.quiet, session.state == .sharing || session.state == .reconnecting else { return }
        guard let connection = now.connection, let kbps = now.kbps, let fps = now.fps else { return }
        if log.format == .json {
            log.numbers(LifecycleLog.Numbers(connection: connection, path: now.path, rttMs: now.rttMs, lossPercent: now.lossPercent, kbps: kbps, fps: fps,
                                             framesSent: now.framesSent ?? 0, bytesSent: now.bytesSent ?? 0, width: now.width, height: now.height),
                        state: session.state)
            return
        }
        let rtt = now.rttWords
        let loss = now.lossPercent.map { String(cFormat: "%.1f %%", $0) } ?? "-"
        let link = now.path.map { "\(connection) \($0)" } ?? connection
        let line = String(cFormat: "%@ | %@ as \"%@\" | %@ | %@ | rtt %@ | loss %@ | %5.0f kbit/s | %4.1f fps",
                          session.state.name, now.room ?? "-", identity, now.service ?? "-", link, rtt, loss, kbps, fps)
        if isTerminal { print("\r\u{1B}[K" + line, terminator: ""); StandardStream.flushOutput() } else { print(line) }
    }
}

/// The lines mode from the command line: the `ps` warning, the process's one-time set-up, then `LinesMode`.
func runLines(_ arguments: Arguments, first: LinesStart, logger: @escaping BackendLogger) -> Int32 {
    if case .code(.argument) = first {
        StandardStream.error("krakl-agent: warning: a join code given as an argument is visible to every user of this computer (ps); "
              + "prefer --join @FILE, --join - or KRAKL_JOIN\n")
    }
    // Signals first, on the main thread, before any other thread exists (threads inherit the mask).
    let control = ControlPipe.shared
    // One-time process set-up (libsrtp, OpenSSL) now, not inside the first connect.
    if !(arguments.scanOnly && { if case .scan = first { return true } else { return false } }()) {
        do {
            try KraklRTC.prepare()
        } catch {
            StandardStream.error("krakl-agent: the WebRTC stack cannot start: \(error)\n")
            return ExitCode.failure
        }
    }
    do {
        return try LinesMode(arguments: arguments, logger: logger, signals: control.readFD).run(first: first)
    } catch {
        StandardStream.error("krakl-agent: cannot start: \(error)\n")
        return ExitCode.failure
    }
}
