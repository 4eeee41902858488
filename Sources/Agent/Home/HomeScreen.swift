import Dispatch
import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklSession
import KraklViewer

/// The interactive home screen (docs/home-terminal.value.md): the product name, the state, and keys to
/// connect (a join code, a QR picture, the screen scanned), stop and quit; while sharing, the
/// room, identity, backend, picture size, fps, bitrate, RTT, loss and time shared, kept current
/// in place. When a session ends it is back home, saying why.
///
/// One control plane: terminal keys (stdin), signals (ControlPipe's pipe, SIGWINCH included) and
/// the session's steps (through SessionController, the daemon's session logic) all arrive on one
/// EventLoop, which alone touches the screen's state; the main thread only waits for it to end.
final class HomeScreen: Sendable {
    /// What the keys are doing now.
    enum Input: Equatable {
        case keys
        /// A join code or a picture's path being typed (or pasted).
        case code(String), picture(String)
    }

    private let arguments: Arguments
    private let logger: BackendLogger
    /// The terminal, drawn on the loop's thread only (and restored once the loop has ended).
    private let terminal: LoopBound<TerminalScreen>
    private let signalFD: Int32
    private let loop: EventLoop
    private let ended = DispatchSemaphore(value: 0)
    private let controller: SessionController

    /// What only the loop's thread touches, checked there (`LoopBound`).
    private struct LoopState {
        var input = Input.keys
        var status: ControlStatus
        /// One line about the last thing that happened (a refusal, "stopping…"), shown under the state.
        var notice: String?
        /// Why the last session ended (EndReason's words), shown at home.
        var lastEnd: String?
        var quitAfterSession = false
        /// A Ctrl-C stopped the running session: the next one quits, even while it is still leaving.
        var interrupted = false
        var scanner: ScreenScanJob?
        var quitting = false
        /// The local preview viewer (`v`), from the first `v` until quitting.
        var viewer: HomeViewer?
    }
    private let onLoop: LoopBound<LoopState>
    /// Every session's frames go here; the viewer plugs into it when it starts.
    private let viewerSink = FeedSink(nil, onlyCodec: .vp8)

    init(arguments: Arguments, logger: @escaping BackendLogger, signals: Int32, screen: TerminalScreen) throws {
        self.arguments = arguments
        self.logger = logger
        signalFD = signals
        loop = try EventLoop(name: "krakl-home")
        terminal = LoopBound(screen, loop: loop)
        onLoop = LoopBound(LoopState(status: ControlStatus(state: "idle", pid: getpid())), loop: loop)
        controller = SessionController(arguments: arguments, loop: loop, logger: logger)
        controller.onEvent { [unowned self] event in sessionEvent(event) }
        controller.alsoSendTo.wrappedValue = viewerSink
    }

    /// Runs until the person quits (or a signal other than Ctrl-C), then gives the terminal back.
    /// `first` connects at once (the join code of --join, --qr or --scan).
    func run(first: HomeStart?) {
        loop.start()
        loop.post { [self] in
            loop.watch(fd: terminal.value.input) { [self] in readKeys() }
            loop.watch(fd: signalFD) { [self] in readSignals() }
            switch first {
            case .code(let text)?: connect(code: text, qr: nil)
            case .picture(let path)?: connect(code: nil, qr: path)
            case .scan?: startScan(camera: arguments.camera)
            case nil: break
            }
            redraw()
        }
        ended.wait()
        loop.stop()
        terminal.value.restore()
        controller.finish()
    }

    // MARK: - Input

    private func readSignals() {
        for number in ControlPipe.signals(on: signalFD) {
            switch number {
            case SIGWINCH:
                terminal.value.measure()
                redraw()
            case SIGINT:
                // Ctrl-C: cancels scanning or typing; stops sharing first; a second one (or one at home) quits.
                if onLoop.scanner != nil {
                    stopScan(words: "Scanning stopped.")
                } else if onLoop.input != .keys {
                    onLoop.input = .keys
                    onLoop.notice = nil
                } else if controller.isActive && !onLoop.interrupted {
                    onLoop.interrupted = true
                    onLoop.notice = "Stopping… (Ctrl-C again quits)"
                    controller.stop()
                } else {
                    quit()
                }
            default:
                quit()
            }
        }
        redraw()
    }

    private func readKeys() {
        var bytes = [UInt8](repeating: 0, count: 8192)
        let n = read(terminal.value.input, &bytes, bytes.count)
        if n == 0 {
            // The terminal went away: as a quit.
            loop.unwatch(fd: terminal.value.input)
            quit()
            return
        }
        guard n > 0 else { return }
        var index = 0
        while index < n {
            let byte = bytes[index]
            index += 1
            // An escape sequence (arrows, function keys): skipped whole; a lone Esc cancels typing.
            if byte == 0x1B {
                if index < n && (bytes[index] == UInt8(ascii: "[") || bytes[index] == UInt8(ascii: "O")) {
                    index += 1
                    while index < n && !(0x40...0x7E).contains(bytes[index]) { index += 1 }
                    index += 1
                    continue
                }
                if onLoop.input != .keys { onLoop.input = .keys; onLoop.notice = nil }
                continue
            }
            switch onLoop.input {
            case .keys: key(byte)
            case .code(var text):
                if edit(&text, byte) { submitCode(text) } else if onLoop.input != .keys { onLoop.input = .code(text) }
            case .picture(var text):
                if edit(&text, byte) { submitPicture(text) } else if onLoop.input != .keys { onLoop.input = .picture(text) }
            }
        }
        redraw()
    }

    /// One byte of a typed line; true when Enter ends it.
    private func edit(_ text: inout String, _ byte: UInt8) -> Bool {
        switch byte {
        case 13, 10: return true
        case 127, 8: if !text.isEmpty { text.removeLast() }
        case 21: text = ""   // Ctrl-U
        case 32...126 where text.utf8.count < JoinCode.maximumLength + 64: text.append(Character(UnicodeScalar(byte)))
        default: break
        }
        return false
    }

    private func key(_ byte: UInt8) {
        let active = controller.isActive
        switch Character(UnicodeScalar(byte)) {
        case "c" where !active && onLoop.scanner == nil:
            onLoop.input = .code("")
            onLoop.notice = nil
        case "q" where !active && onLoop.scanner == nil:
            onLoop.input = .picture("")
            onLoop.notice = nil
        case "s" where active:
            onLoop.notice = "Stopping…"
            controller.stop()
        case "s" where !active && onLoop.scanner == nil:
            startScan(camera: nil)
        // The camera's key: "c" already connects with a typed code.
        case "w" where !active && onLoop.scanner == nil:
            startScan(camera: arguments.camera ?? "")
        case "s" where onLoop.scanner != nil, "w" where onLoop.scanner != nil:
            stopScan(words: "Scanning stopped.")
        case "v":
            openViewer()
        case "x":
            quit()
        default:
            break
        }
    }

    private func submitCode(_ text: String) {
        onLoop.input = .keys
        let trimmed = text.trimmingSpaces()
        guard !trimmed.isEmpty else { onLoop.notice = nil; return }
        connect(code: trimmed, qr: nil)
    }

    private func submitPicture(_ text: String) {
        onLoop.input = .keys
        var path = text.trimmingSpaces()
        guard !path.isEmpty else { onLoop.notice = nil; return }
        if path.hasPrefix("~/"), let home = ProcessInfo.processInfo.environment["HOME"] { path = home + path.dropFirst() }
        if !path.hasPrefix("/") { path = FileManager.default.currentDirectoryPath + "/" + path }
        connect(code: nil, qr: path)
    }

    private func connect(code: String?, qr: String?) {
        if let refusal = controller.connect(code: code, qr: qr) {
            onLoop.notice = "Cannot connect: \(refusal.message)"
        } else {
            onLoop.notice = nil
            onLoop.lastEnd = nil
            onLoop.interrupted = false
            onLoop.status = controller.status()
        }
    }

    private func quit() {
        guard !onLoop.quitting else { return }
        if let scanner = onLoop.scanner {
            // The scan's thread owns a capture source: it is let go before the process ends.
            onLoop.quitAfterSession = true
            onLoop.notice = "Stopping the scan, then quitting…"
            scanner.stop()
            redraw()
            return
        }
        if controller.isActive {
            onLoop.quitAfterSession = true
            onLoop.notice = "Leaving the room, then quitting…"
            controller.stop()
            redraw()
            return
        }
        onLoop.quitting = true
        onLoop.viewer?.stop()
        onLoop.viewer = nil
        loop.unwatch(fd: terminal.value.input)
        loop.unwatch(fd: signalFD)
        ended.signal()
    }

    // MARK: - Scanning

    /// Scans the screen (`camera` nil) or a camera ("" the first) for a join code, then shares.
    private func startScan(camera: String?) {
        onLoop.notice = nil
        do throws(HostError) {
            var scanning = arguments
            scanning.scanOnly = false
            scanning.camera = camera
            onLoop.scanner = try ScreenScanJob(arguments: scanning, logger: logger, postingTo: loop) { [weak self] line in
                self?.scanProgress("Scanning: " + line)
            } progress: { [weak self] line in
                self?.scanProgress(line.prefix(1).uppercased() + line.dropFirst())
            } done: { [weak self] outcome in
                self?.scanEnded(outcome)
            }
        } catch {
            onLoop.notice = "Cannot scan: \(error.description)"
        }
    }

    private func stopScan(words: String) {
        onLoop.scanner?.stop()
        onLoop.notice = words
    }

    private func scanProgress(_ words: String) {
        guard onLoop.scanner != nil else { return }
        onLoop.notice = words
        redraw()
    }

    private func scanEnded(_ outcome: ScreenScanJob.Outcome) {
        onLoop.scanner = nil
        if onLoop.quitAfterSession {
            onLoop.quitAfterSession = false
            quit()
            return
        }
        switch outcome {
        case .found(let invitation): connect(code: invitation.code.text, qr: nil)
        case .notFound(let status, let lastSaid): onLoop.notice = status == 0 ? "Scanning stopped." : "Scanning: \(lastSaid)"
        case .failed(let error): onLoop.notice = "Cannot scan: \(error.description)"
        }
        redraw()
    }

    // MARK: - The local viewer

    /// `v`: the viewer's server starts (once; a bind failure is said, nothing ends), then its page
    /// is opened in the browser, or its URL is shown to open by hand.
    private func openViewer() {
        if onLoop.viewer == nil {
            do throws(ViewerServerError) {
                let loop = self.loop
                onLoop.viewer = try HomeViewer(arguments, sink: viewerSink, logger: logger, keyframe: { [weak self] in
                    loop.post { self?.controller.requestKeyframe() }
                }, viewersChanged: { [weak self] in
                    loop.post { self?.redraw() }
                })
            } catch {
                onLoop.notice = "Cannot start the viewer: \(error.description)"
                return
            }
            onLoop.viewer?.sharing(controller.status().state == "sharing")
        }
        guard let viewer = onLoop.viewer else { return }
        let url = viewer.localURL
        switch BrowserOpener.open(url) {
        case .opened(let how): onLoop.notice = "Viewer: opened in your browser (\(how)): \(url)"
        case .notOpened(let why): onLoop.notice = "Viewer: open this URL: \(url) (not opened: \(why))"
        }
    }

    // MARK: - The session

    private func sessionEvent(_ event: SessionController.Event) {
        switch event {
        case .connecting:
            break
        case .moved(let state, let now):
            onLoop.status = now
            if state == .sharing { onLoop.viewer?.sharing(true) }
        case .tick(let now):
            onLoop.status = now
        case .ended(let reason, let idle):
            onLoop.status = idle
            onLoop.viewer?.sharing(false)
            onLoop.lastEnd = reason.description
            onLoop.notice = nil
            onLoop.interrupted = false
            if onLoop.quitAfterSession {
                onLoop.quitAfterSession = false
                quit()
                return
            }
        }
        redraw()
    }

    // MARK: - Drawing

    private func redraw() {
        guard !onLoop.quitting else { return }
        var lines: [String] = []
        let title = terminal.value.fit("krakl-agent · screen sharing into video rooms")
        lines.append(terminal.value.emphasis(title, colour: 36))
        lines.append("")
        let active = controller.isActive
        if active {
            lines += sessionLines()
        } else if onLoop.scanner != nil {
            lines.append(terminal.value.fit("State:     scanning the screen for a join code's QR code"))
        } else {
            lines.append(terminal.value.emphasis(terminal.value.fit("State:     idle, not sharing"), colour: 33))
            if let lastEnd = onLoop.lastEnd { lines += terminal.value.wrap(lastEnd, label: "Last:      ") }
        }
        if let viewer = onLoop.viewer {
            let watching = viewer.viewerCount
            lines.append(terminal.value.fit("Viewer:    \(viewer.localURL) · \(watching == 1 ? "1 viewer" : "\(watching) viewers")"))
        }
        if let notice = onLoop.notice {
            lines.append("")
            lines += terminal.value.wrap(notice, limit: 3)
        }
        var cursor: (row: Int, column: Int)?
        switch onLoop.input {
        case .keys:
            lines.append("")
            lines += keyLines(active: active)
        case .code(let text):
            lines.append("")
            lines.append(terminal.value.fit("Paste or type the join code, then Enter (Esc cancels):"))
            // A join code holds a token: only its start and its length are shown.
            let shown = text.isEmpty ? "" : String(text.prefix(12)) + (text.count > 12 ? "… (\(text.count) characters)" : "")
            lines.append(terminal.value.fit("> " + shown))
            cursor = (lines.count - 1, min(lines.last!.count, terminal.value.columns - 2))
        case .picture(let text):
            lines.append("")
            lines.append(terminal.value.fit("The QR code picture's path (PNG, JPEG, PNM), then Enter (Esc cancels):"))
            let room = max(10, terminal.value.columns - 4)
            lines.append("> " + (text.count <= room ? text : "…" + text.suffix(room - 1)))
            cursor = (lines.count - 1, min(lines.last!.count, terminal.value.columns - 2))
        }
        terminal.value.draw(lines, cursor: cursor)
    }

    private func keyLines(active: Bool) -> [String] {
        if active {
            return [terminal.value.fit("[s] stop sharing   [v] viewer   Ctrl-C stops, a second Ctrl-C quits")]
        }
        if onLoop.scanner != nil { return [terminal.value.fit("[s] stop scanning   [x] quit")] }
        return [terminal.value.fit("[c] connect with a join code   [q] a QR code picture   [s] scan the screen"),
                terminal.value.fit("[w] read the code with the webcam   [v] viewer   [x] quit")]
    }

    private func sessionLines() -> [String] {
        let now = onLoop.status
        var lines: [String] = []
        let state: String
        switch now.state {
        case "preparing": state = "preparing the screen source… \(Self.seconds(now.stateSeconds))"
        case "joining":
            state = "joining the room (room server, then ICE/DTLS)… \(Self.seconds(now.stateSeconds)); "
                + "gives up after \(Int(arguments.connectTimeout)) s without media"
        case "reconnecting": state = "the connection dropped; reconnecting… \(Self.seconds(now.stateSeconds))"
        case "leaving": state = "leaving the room…"
        default: state = now.state
        }
        lines.append(terminal.value.emphasis(terminal.value.fit("State:     " + state), colour: now.state == "sharing" ? 32 : 33))
        lines.append(terminal.value.fit("Room:      \(now.room ?? "-") (\(now.service ?? "-"))"))
        if let details = now.roomDetails { lines.append(terminal.value.fit("           \(details)")) }
        lines.append(terminal.value.fit("Identity:  \(now.identity ?? "-")"))
        lines.append(terminal.value.fit("Backend:   \(now.backend ?? "-")" + (now.source.map { ", \($0)" } ?? "")))
        let size = now.width.flatMap { w in now.height.map { "\(w)x\($0)" } } ?? "-"
        lines.append(terminal.value.fit("Picture:   \(size), \(now.fps.map { String(cFormat: "%.1f", $0) } ?? "-") fps"))
        lines.append(terminal.value.fit("Bitrate:   \(now.kbps.map { String(cFormat: "%.0f kbit/s", $0) } ?? "-")"))
        lines.append(terminal.value.fit("RTT:       \(now.rttWords)"
                                + "      Loss: \(now.lossPercent.map { String(cFormat: "%.1f %%", $0) } ?? "-")"
                                + "      Connection: \(now.connection ?? "-")"))
        lines.append(terminal.value.fit("Path:      \(now.path.map(Self.pathWords) ?? "-")"))
        lines.append(terminal.value.fit("Shared:    \(now.sharingSeconds.map(Self.clock) ?? "not yet")"))
        return lines
    }

    private static func seconds(_ value: Double?) -> String { "\(Int(value ?? 0)) s" }

    /// "relay/tls -> host" → "relay/tls -> host (through a TURN relay, TLS)": what a person wants to
    /// know of the pair is whether media goes direct and over what.
    static func pathWords(_ path: String) -> String {
        guard path.hasPrefix("relay/") else { return path + (path.hasSuffix("relay") ? " (through the room's TURN relay)" : " (direct)") }
        let proto = path.dropFirst("relay/".count).prefix { $0 != " " }.uppercased()
        return path + " (through a TURN relay, \(proto))"
    }

    /// 75.3 → "0:01:15".
    private static func clock(_ seconds: Double) -> String {
        let whole = Int(seconds)
        return String(cFormat: "%d:%02d:%02d", whole / 3600, whole / 60 % 60, whole % 60)
    }
}

/// What the home screen does first, from the command line.
enum HomeStart {
    case code(String), picture(String), scan
}

/// `krakl-agent home`, or --join/--qr/--scan on a terminal: the home screen until the person quits.
func runHome(_ arguments: Arguments, first: HomeStart?, logger: @escaping BackendLogger) -> Int32 {
    let control = ControlPipe.shared
    control.catchSignals([SIGWINCH])
    do {
        try KraklRTC.prepare()
    } catch {
        StandardStream.error("krakl-agent: the WebRTC stack cannot start: \(error)\n")
        return ExitCode.failure
    }
    let screen = TerminalScreen(environment: ProcessInfo.processInfo.environment)
    do throws(HostError) {
        try screen.enter()
    } catch {
        StandardStream.error("krakl-agent: \(error.description)\n")
        return error.exitStatus
    }
    let home: HomeScreen
    do {
        // Log lines would scribble over the screen: they go to stderr only when it is not the
        // terminal (2>file), or with --verbose.
        let silent: BackendLogger = { _, _, _ in }
        let screenLogger = isatty(STDERR_FILENO) == 1 && !arguments.verbose ? silent : logger
        home = try HomeScreen(arguments: arguments, logger: screenLogger, signals: control.readFD, screen: screen)
    } catch {
        screen.restore()
        StandardStream.error("krakl-agent: the home screen cannot start: \(error)\n")
        return ExitCode.failure
    }
    home.run(first: first)
    return 0
}
