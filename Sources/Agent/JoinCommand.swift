import Foundation
import KraklCore
import KraklRTC
import KraklRoom
import KraklSession

/// Where the join code comes from: `--join CODE`, `--join @FILE`, `--join -` (stdin) or `KRAKL_JOIN`.
enum JoinCodeSource: Equatable {
    case argument(String)
    case file(String)
    case standardInput
    case environment(String)
    /// Read from a QR code (`--qr`): not on the command line, so no `ps` warning.
    case scanned(String)

    init(_ value: String) {
        if value == "-" { self = .standardInput } else if value.hasPrefix("@") { self = .file(String(value.dropFirst())) } else { self = .argument(value) }
    }

    /// The code's text, read once.
    func read() throws(HostError) -> String {
        switch self {
        case .argument(let text), .environment(let text), .scanned(let text):
            return text
        case .file(let path):
            // A join code is at most 4 KB; a bigger file is not one (and is not read whole).
            guard let handle = FileHandle(forReadingAtPath: path) else {
                throw .usage("--join @\(path): cannot read that file")
            }
            defer { try? handle.close() }
            let data = (try? handle.read(upToCount: JoinCode.maximumLength + 64)) ?? Data()
            return String(decoding: data, as: UTF8.self)
        case .standardInput:
            return StandardInputLine.read(limit: JoinCode.maximumLength + 64)
        }
    }
}

extension JoinCodeError {
    /// Exit statuses 39–43 (docs/exit-codes.md).
    var exitStatus: Int32 {
        switch self {
        case .tokenExpired, .tokenNotYetValid: return 39
        case .malformedCode: return 40
        case .unsupportedVersion: return 41
        case .malformedToken: return 42
        case .roomMismatch, .noRoom: return 43
        }
    }
}

/// The room driver a join code asks for.
func makeDriver(_ invitation: Invitation) -> RoomDriver {
    switch invitation.code.service {
    case .whip:
        return WhipDriver(endpoint: invitation.code.url, token: invitation.code.token,
                          allowTokenAcrossOrigins: invitation.code.tokenAcrossOrigins)
    case .janus:
        return JanusDriver(baseURL: invitation.code.url, room: invitation.room ?? "")
    }
}

/// The session's settings from the command line and the join code.
func sharingConfiguration(_ arguments: Arguments, invitation: Invitation, logger: BackendLogger) -> SharingConfiguration {
    var configuration = SharingConfiguration()
    configuration.registryPath = arguments.plugins
    configuration.backendName = arguments.backend
    configuration.backendOptions = arguments.options
    configuration.backendIsolation = arguments.isolate
    let refresh = configuration.encoder.refreshInterval
    configuration.encoder = arguments.encoder
    if !arguments.refreshGiven { configuration.encoder.refreshInterval = refresh }
    configuration.encoder.bitrateKbps = arguments.encoder.bitrateKbps
    configuration.publisher.startBitrate = Double(arguments.encoder.bitrateKbps) * 1000
    configuration.publisher.startBitrate = min(max(configuration.publisher.startBitrate, configuration.publisher.minimumBitrate),
                                               configuration.publisher.maximumBitrate)
    if !arguments.addresses.isEmpty { configuration.publisher.addresses.allowed = arguments.addresses }
    configuration.connectTimeout = arguments.connectTimeout
    configuration.publisher.label = invitation.identity
    // A WHIP server may name STUN servers in its answer (Link headers): candidates may trickle then.
    configuration.publisher.trickleLater = invitation.code.service == .whip
    configuration.publisher.relayOnly = arguments.relayOnly
    // Resolved by the session when it joins (names, bounded in time), never here.
    configuration.iceServers = invitation.code.iceServers + arguments.iceServers
    return configuration
}

/// `krakl-agent --join …`: one session (with --once), or one after another until stdin ends.
func runJoin(_ arguments: Arguments, source: JoinCodeSource, logger: @escaping BackendLogger) -> Int32 {
    if case .argument = source {
        fputs("krakl-agent: warning: a join code given as an argument is visible to every user of this computer (ps); "
              + "prefer --join @FILE, --join - or KRAKL_JOIN\n", stderr)
    }
    // One-time process set-up (libsrtp, OpenSSL) now, not inside the first connect.
    do {
        try KraklRTC.prepare()
    } catch {
        fputs("krakl-agent: the WebRTC stack cannot start: \(error)\n", stderr)
        return 44
    }
    let control = ControlPipe.shared
    let log = LifecycleLog(format: arguments.logFormat)
    var next: JoinCodeSource? = source
    var status: Int32 = 0
    var idle = false
    while let current = next {
        if idle {
            // Idle: a signal quits, a line is the next code.
            var wake = ControlPipe.Wake.timeout
            while case .timeout = wake { wake = control.wait(timeout: 3600, input: true) }
            if case .signal = wake { return status }
        }
        let text: String
        do throws(HostError) { text = try current.read() } catch {
            log.event("error", error.description, error: true)
            return error.exitStatus
        }
        if current == .standardInput && text.isEmpty && !arguments.once { return status }
        let (ended, quit) = shareOnce(text, arguments: arguments, control: control, log: log, logger: logger)
        status = ended
        if arguments.once || quit { return status }
        // Back to idle: ready for the next code, which comes from stdin.
        log.event("idle", state: .idle, "idle. Paste the next join code and press Enter (Ctrl-D or Ctrl-C quits).")
        next = .standardInput
        idle = true
    }
    return status
}

/// Reads the code and runs one session to its end; returns the exit status of its end, and whether
/// a signal asked the process to end too (SIGTERM, SIGHUP; Ctrl-C only stops the session).
func shareOnce(_ text: String, arguments: Arguments, control: ControlPipe, log: LifecycleLog,
               logger: @escaping BackendLogger) -> (status: Int32, quit: Bool) {
    let invitation: Invitation
    do throws(JoinCodeError) {
        invitation = try Invitation.read(text, now: Date())
    } catch {
        log.event("error", error.description, error: true)
        return (error.exitStatus, false)
    }
    let driver = makeDriver(invitation)
    let session = SharingSession(configuration: sharingConfiguration(arguments, invitation: invitation, logger: logger), driver: driver,
                                 identity: invitation.identity, room: invitation.room, logger: logger)
    let where_ = invitation.room.map { "room \($0)" } ?? invitation.code.url.redactedForLog
    final class Previous: @unchecked Sendable {
        var state = SharingLifecycle.State.idle
        /// When the state was entered (CLOCK_MONOTONIC ms), for the "still joining" lines.
        var since = MonotonicClock.milliseconds()
    }
    let previous = Previous()
    let room = invitation.room, identity = invitation.identity
    let notifier = DesktopNotifier.sessionBus()
    final class Shared: @unchecked Sendable { var yes = false }
    let shared = Shared()
    session.onStateChange = { state in
        defer { previous.state = state; previous.since = MonotonicClock.milliseconds() }
        if state == .sharing && previous.state == .reconnecting {
            log.event("state", state: state, "the connection is back; sharing again", room: room, identity: identity)
            return
        }
        let words: String
        switch state {
        case .preparing: words = "preparing the screen source…"
        case .joining: words = "joining \(where_) on \(driver.service) as \"\(invitation.identity)\" (token \(invitation.token.shortened))…"
        case .sharing:
            if !shared.yes { notifier?.sharingStarted(room: room, identity: identity) }
            shared.yes = true
            words = "sharing the screen in \(where_) as \"\(invitation.identity)\" (\(session.status().timings.summary)); Ctrl-C stops"
        case .reconnecting: words = "the connection dropped; restarting ICE through the room…"
        case .leaving: words = "leaving the room…"
        case .idle: return
        }
        log.event("state", state: state, words, room: room, identity: identity)
    }
    session.onFinished = { _ in ControlPipe.sessionEnded() }
    do {
        try session.start()
    } catch {
        log.event("error", "cannot start the session: \(error)", error: true)
        return (EndReason.failure("\(error)").exitStatus, false)
    }
    let meter = StatusMeter()
    let isTerminal = isatty(STDOUT_FILENO) == 1
    var quit = false
    var nextStatus = MonotonicClock.milliseconds() + 1000
    while session.waitUntilFinished(timeout: 0) == nil {
        let wake = control.wait(timeout: max(0.01, (nextStatus - MonotonicClock.milliseconds()) / 1000))
        if case .signal(let number) = wake {
            if number != SIGINT { quit = true }
            session.stop()
        }
        guard MonotonicClock.milliseconds() >= nextStatus else { continue }
        nextStatus += 1000
        let status = session.status()
        // Long steps say how long they have taken, every 5 s, and what bounds them.
        let waited = Int((MonotonicClock.milliseconds() - previous.since) / 1000)
        if waited >= 5 && waited % 5 == 0 && (status.state == .preparing || status.state == .joining) {
            let words = status.state == .preparing
                ? "still preparing the screen source (\(waited) s; a sharing dialog may be waiting for an answer)…"
                : "still joining (\(waited) s): " + (status.timings.answered == nil ? "waiting for the room server's answer…"
                    : "connecting ICE/DTLS, gives up \(Int(arguments.connectTimeout)) s after the room server answered…")
            log.event("progress", state: status.state, words, room: room, identity: identity)
        }
        guard !arguments.quiet else { continue }
        guard status.state == .sharing || status.state == .reconnecting else { continue }
        if log.format == .json {
            if let numbers = meter.numbers(status) { log.numbers(numbers, state: status.state) }
            continue
        }
        guard let line = meter.line(status) else { continue }
        if isTerminal { print("\r\u{1B}[K" + line, terminator: ""); fflush(stdout) } else { print(line) }
    }
    let reason = session.waitUntilFinished(timeout: 0) ?? .failure("the session ended without a reason")
    if isTerminal && !arguments.quiet && log.format == .text { print("") }
    log.event("ended", state: .idle, reason.description, reason: reason, room: room, identity: identity)
    notifier?.sharingEnded(reason, shared: shared.yes)
    notifier?.finish()
    return (reason.exitStatus, quit)
}

/// The live status line: per-second rates from the publisher's counters.
final class StatusMeter {
    private var last: (at: Double, bytes: Int, frames: Int)?

    /// The numbers since the last call (nil on the first, or before the publisher exists).
    func numbers(_ status: SharingStatus) -> LifecycleLog.Numbers? {
        guard let rtc = status.rtc else { return nil }
        let now = MonotonicClock.milliseconds()
        defer { last = (now, rtc.bytesSent, rtc.framesSent) }
        guard let last, now > last.at else { return nil }
        let seconds = (now - last.at) / 1000
        let kbps = Double(rtc.bytesSent - last.bytes) * 8 / 1000 / seconds
        let fps = Double(rtc.framesSent - last.frames) / seconds
        return LifecycleLog.Numbers(connection: rtc.state, rttMs: rtc.roundTripMilliseconds, lossPercent: rtc.fractionLost.map { $0 * 100 },
                                    kbps: (kbps * 10).rounded() / 10, fps: (fps * 10).rounded() / 10, framesSent: rtc.framesSent,
                                    bytesSent: rtc.bytesSent, width: status.width, height: status.height)
    }

    func line(_ status: SharingStatus) -> String? {
        guard let rtc = status.rtc, let numbers = numbers(status) else { return nil }
        let kbps = numbers.kbps, fps = numbers.fps
        let rtt = rtc.roundTripMilliseconds.map { String(format: "%.0f ms", $0) } ?? "-"
        let loss = rtc.fractionLost.map { String(format: "%.1f %%", $0 * 100) } ?? "-"
        return String(format: "%@ | %@ as \"%@\" | %@ | %@ | rtt %@ | loss %@ | %5.0f kbit/s | %4.1f fps",
                      status.state.name, status.room ?? "-", status.identity, status.service, rtc.state, rtt, loss, kbps, fps)
    }
}

/// One line from fd 0, read with read(2). Not the standard library's `readLine`: it retries
/// getline while errno is EINTR, and at end of input getline fails without touching errno, so a
/// stale EINTR from an earlier Ctrl-C made an idle agent spin at full CPU once stdin closed.
enum StandardInputLine {
    /// The line without its newline; "" at end of input or on a read error. A line longer than
    /// `limit` is cut there (the rest, up to 1 MiB, is read and dropped, so the next line starts clean).
    static func read(limit: Int) -> String {
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        var interruptions = 0
        var total = 0
        while total < 1 << 20 {
            total += 1
            let n = Glibc.read(STDIN_FILENO, &byte, 1)
            if n < 0 && errno == EINTR && interruptions < 100 { interruptions += 1; continue }
            guard n == 1, byte != UInt8(ascii: "\n") else { break }
            if bytes.count < limit { bytes.append(byte) }
        }
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        return String(decoding: bytes, as: UTF8.self)
    }
}
