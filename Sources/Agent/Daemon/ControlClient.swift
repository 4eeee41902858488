import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import KraklSession

/// The commands that talk to a running daemon (docs/daemon.md).
enum ControlCommand: Equatable {
    case status, connect(ConnectTarget), stop, watch

    /// Where `krakl-agent connect` takes its join code from.
    /// `.scan(camera:)`: the daemon's screen (nil) or a camera ("" the first).
    enum ConnectTarget: Equatable { case code(JoinCodeSource), qr(String), scan(camera: String?) }

    static func connectTarget(_ word: String?, qr: String?, scan: Bool, camera: String? = nil) throws(HostError) -> ConnectTarget {
        switch (word, qr, scan) {
        case (let word?, nil, false): return .code(JoinCodeSource(word))
        case (nil, let path?, false): return .qr(path)
        case (nil, nil, true): return .scan(camera: camera)
        case (nil, nil, false): throw .usage("connect needs a join code: krakl-agent connect CODE|@FILE|-|--qr FILE|--scan")
        default: throw .usage("connect takes one of CODE, @FILE, -, --qr FILE or --scan")
        }
    }
}

/// Sends one request to the daemon and prints what it says; the exit status follows the reply
/// (docs/exit-codes.md: 60–64 for the control socket, the end reasons' statuses for connect).
func runControlClient(_ command: ControlCommand, json: Bool) -> Int32 {
    let request: ControlRequest
    switch command {
    case .status: request = ControlRequest("status")
    case .stop: request = ControlRequest("stop")
    case .watch: request = ControlRequest("watch")
    case .connect(.scan(let camera)):
        request = ControlRequest("connect", scan: true, camera: camera)
    case .connect(.qr(let path)):
        // The daemon reads the picture itself (same user, so the same files), from an absolute path.
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        request = ControlRequest("connect", qr: absolute)
    case .connect(.code(let source)):
        if case .argument = source {
            StandardStream.error("krakl-agent: warning: a join code given as an argument is visible to every user of this computer (ps); "
                  + "prefer connect @FILE or connect -\n")
        }
        do throws(HostError) {
            let text = try source.read().trimmingWhitespace()
            guard !text.isEmpty else { throw HostError.usage("connect: no join code given (the input was empty)") }
            // A link (`open`) is judged here as the daemon judges a code, so that one which is no join
            // code is refused with the code's own words and status even when no daemon runs.
            if case .link = source {
                do throws(JoinCodeError) { _ = try Invitation.read(text, now: Date()) } catch {
                    StandardStream.error("krakl-agent: \(error.description)\n")
                    return error.exitStatus
                }
            }
            request = ControlRequest("connect", code: text)
        } catch {
            StandardStream.error("krakl-agent: \(error.description)\n")
            return error.exitStatus
        }
    }
    do throws(ControlError) {
        let connection: ControlClientConnection
        do throws(ControlError) {
            connection = try ControlClientConnection(path: try ControlSocket.path())
        } catch .noDaemon(let words) {
            // A join link clicked with no daemon running: start one, then hand it the code.
            guard case .connect(.code(.link)) = command else { throw .noDaemon(words) }
            connection = try DaemonOnDemand.start()
        }
        defer { connection.close() }
        try connection.send(request)
        switch command {
        case .watch:
            while let reply = try connection.nextReply(allowEnd: true) {
                if json { print(reply.line) } else { print(ControlText.watchLine(reply.reply)) }
                if !reply.reply.ok { return reply.reply.exitStatus ?? ExitCode.daemonRefused }
            }
            return 0
        default:
            guard var (reply, line) = try connection.nextReply(allowEnd: false) else { return ExitCode.daemonReplyUnusable }
            // connect --scan: the scan's progress comes first, a line each.
            while reply.ok && reply.event == "scanning" {
                print(json ? line : ControlText.watchLine(reply))
                guard let next = try connection.nextReply(allowEnd: false) else { return ExitCode.daemonReplyUnusable }
                (reply, line) = next
            }
            if !reply.ok {
                StandardStream.error("krakl-agent: \(reply.error ?? "the daemon refused without saying why")\n")
                return reply.exitStatus ?? ExitCode.daemonRefused
            }
            if json { print(line) } else {
                switch command {
                case .status: print(ControlText.status(reply.status))
                case .stop: print("krakl-agent: \(reply.message ?? "stopped")")
                default: print("krakl-agent: \(ControlText.sharing(reply.status))")
                }
            }
            return 0
        }
    } catch {
        StandardStream.error("krakl-agent: \(error.description)\n")
        return error.exitStatus
    }
}

/// A client's connection: requests out, reply lines in (bounded).
final class ControlClientConnection {
    private let fd: Int32
    private var splitter = BoundedLineSplitter(limit: ControlProtocol.maximumReply)
    private var lines: [[UInt8]] = []

    init(path: String) throws(ControlError) { fd = try ControlSocket.connect(path) }

    func close() { Glibc.close(fd) }

    /// The daemon closed before taking a request. Its reply may still be waiting (a daemon that turns
    /// a connection away answers and closes at once), so that is read before this is an error.
    private var sendFailed = false

    func send(_ request: ControlRequest) throws(ControlError) {
        if !ControlSocket.writeAll(fd, ControlProtocol.encode(request)) { sendFailed = true }
    }

    /// The next reply and its line as sent; nil when the daemon closed the connection and `allowEnd`.
    func nextReply(allowEnd: Bool) throws(ControlError) -> (reply: ControlReply, line: String)? {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while lines.isEmpty {
            let n = read(fd, &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                if sendFailed { throw .badReply("the daemon closed the connection before taking the request") }
                if allowEnd { return nil }
                throw .badReply("the daemon closed the connection without a reply (did it quit?)")
            }
            for piece in splitter.feed(chunk[0..<n]) {
                guard case .line(let bytes) = piece else { throw .badReply("the daemon sent a reply over 1 MB") }
                lines.append(bytes)
            }
        }
        let bytes = lines.removeFirst()
        guard let reply = try? JSONDecoder().decode(ControlReply.self, from: Data(bytes)) else {
            throw .badReply("the daemon's reply is not usable: \(String(decoding: bytes.prefix(200), as: UTF8.self))")
        }
        guard reply.v == ControlProtocol.version else {
            throw .badReply("the daemon speaks protocol version \(reply.v), this client \(ControlProtocol.version): restart the daemon")
        }
        return (reply, String(decoding: bytes, as: UTF8.self))
    }
}

/// The daemon's replies in plain words.
enum ControlText {
    static func status(_ status: ControlStatus?) -> String {
        guard let status else { return "krakl-agent: the daemon sent no status" }
        if status.state == "scanning" {
            return String(cFormat: "krakl-agent: scanning for a join code for %.0f s (daemon pid \(status.pid))", status.stateSeconds ?? 0)
        }
        var text = status.state == "idle" ? "krakl-agent: idle (daemon pid \(status.pid))" : "krakl-agent: \(sharing(status))"
        if status.state == "idle", let end = status.lastEnd { text += "; last session: \(end.message)" }
        return text
    }

    /// "sharing in room R as "Ann" (whip, backend file) for 12 s | connected host/udp -> host | rtt 3 ms | loss 0.0 % | 2400 kbit/s | 30.0 fps"
    static func sharing(_ status: ControlStatus?) -> String {
        guard let status else { return "sharing" }
        var text = "\(status.state) in \(status.room.map { "room \($0)" } ?? "the room") as \"\(status.identity ?? "?")\""
        text += " (\(status.service ?? "?")\(status.roomDetails.map { ": \($0)" } ?? "")\(status.backend.map { ", backend \($0)" } ?? ""))"
        if let seconds = status.sharingSeconds { text += String(cFormat: " for %.0f s", seconds) }
        if let connection = status.connection { text += " | \(connection)" + (status.path.map { " \($0)" } ?? "") }
        if status.rttMs != nil || status.silentSeconds != nil { text += " | rtt \(status.rttWords)" }
        if let loss = status.lossPercent { text += String(cFormat: " | loss %.1f %%", loss) }
        if let kbps = status.kbps, let fps = status.fps { text += String(cFormat: " | %.0f kbit/s | %.1f fps", kbps, fps) }
        return text
    }

    static func watchLine(_ reply: ControlReply) -> String {
        if !reply.ok { return "krakl-agent: \(reply.error ?? "error")" }
        switch reply.event {
        case "ended": return "krakl-agent: \(reply.message ?? "the session ended"); idle"
        case "closing": return "krakl-agent: \(reply.message ?? "the daemon is quitting")"
        case "scanning": return "krakl-agent: scanning: \(reply.message ?? "")"
        default: return status(reply.status)
        }
    }
}
