import Dispatch
import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRTC
import KraklRoom
import KraklSession

/// `krakl-agent daemon`: an idle agent without a terminal, driven through its control socket
/// (docs/daemon.md). One control plane: requests on the socket, signals (through ControlPipe's
/// pipe) and the session's state changes and end all arrive as work on one EventLoop, which
/// alone touches the daemon's state and drives one SharingSession at a time.
func runDaemon(_ arguments: Arguments, logger: @escaping BackendLogger) -> Int32 {
    // Signals first, on the main thread, before any other thread exists (threads inherit the mask).
    let control = ControlPipe.shared
    do {
        try KraklRTC.prepare()
    } catch {
        StandardStream.error("krakl-agent: the WebRTC stack cannot start: \(error)\n")
        return ExitCode.failure
    }
    let daemon: ControlDaemon
    do {
        let place = try DaemonPlace.claim()
        daemon = try ControlDaemon(place: place, arguments: arguments, signals: control.readFD, logger: logger)
    } catch let error as ControlError {
        StandardStream.error("krakl-agent: \(error.description)\n")
        return error.exitStatus
    } catch {
        StandardStream.error("krakl-agent: the daemon cannot start: \(error)\n")
        return ExitCode.failure
    }
    daemon.run()
    return 0
}

/// The daemon's folder, its lock and its listening socket. The lock (flock on daemon.lock, held
/// for the daemon's life and released by the kernel however it ends) makes "is one running" race
/// free; a socket file left by a daemon that crashed answers connect with ECONNREFUSED and is replaced.
struct DaemonPlace {
    let socketPath: String
    let listener: Int32
    let lockFD: Int32
    /// The socket file's inode, so only our own socket is removed at exit.
    let socketInode: ino_t

    static func claim() throws(ControlError) -> DaemonPlace {
        let folder = try ControlSocket.directory()
        try ensurePrivateFolder(folder)
        let socketPath = folder + "/control.sock"
        let lockPath = folder + "/daemon.lock"
        let lockFD = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard lockFD >= 0 else { throw .socket("cannot open \(lockPath): \(String(cString: strerror(errno)))") }
        if flock(lockFD, LOCK_EX | LOCK_NB) != 0 {
            var text = [UInt8](repeating: 0, count: 32)
            let n = read(lockFD, &text, text.count)
            let pid = String(decoding: text.prefix(max(0, n)), as: UTF8.self).trimmingWhitespace()
            close(lockFD)
            throw .alreadyRunning("another krakl-agent daemon\(pid.isEmpty ? "" : " (pid \(pid))") is already running for this user "
                                  + "on \(socketPath): use `krakl-agent status`, or `krakl-agent stop` and then end it")
        }
        let pidText = Array("\(getpid())\n".utf8)
        _ = ftruncate(lockFD, 0)
        _ = pwrite(lockFD, pidText, pidText.count, 0)

        var info = stat()
        if lstat(socketPath, &info) == 0 {
            guard (info.st_mode & S_IFMT) == S_IFSOCK else {
                close(lockFD)
                throw .socket("\(socketPath) exists and is not a socket: remove it if it is not needed")
            }
            do throws(ControlError) {
                let other = try ControlSocket.connect(socketPath)
                close(other)
                close(lockFD)
                throw ControlError.alreadyRunning("another krakl-agent daemon is already answering on \(socketPath)")
            } catch {
                guard case .noDaemon = error else { close(lockFD); throw error }
            }
            print("krakl-agent daemon: replacing a stale control socket (its daemon ended without removing it)")
            unlink(socketPath)
        }

        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard listener >= 0 else { close(lockFD); throw .socket("socket: \(String(cString: strerror(errno)))") }
        let (address, length) = try ControlSocket.address(socketPath)
        var copy = address
        // Made 0600 from the start (umask), not chmod'ed after: no moment when others may connect.
        let oldMask = umask(0o177)
        let bound = withUnsafePointer(to: &copy) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) } }
        let bindError = errno
        umask(oldMask)
        guard bound == 0, chmod(socketPath, 0o600) == 0, listen(listener, 16) == 0 else {
            close(listener)
            close(lockFD)
            throw .socket("cannot listen on \(socketPath): \(String(cString: strerror(bound == 0 ? errno : bindError)))")
        }
        _ = lstat(socketPath, &info)
        return DaemonPlace(socketPath: socketPath, listener: listener, lockFD: lockFD, socketInode: info.st_ino)
    }

    /// Makes `folder` (0700) or checks that the existing one is a real folder of ours, and tightens it to 0700.
    static func ensurePrivateFolder(_ folder: String) throws(ControlError) {
        if mkdir(folder, 0o700) != 0 && errno != EEXIST {
            throw .socket("cannot make \(folder): \(String(cString: strerror(errno)))")
        }
        var info = stat()
        guard lstat(folder, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            throw .socket("\(folder) is not a folder (a symbolic link or a file?): remove it")
        }
        guard info.st_uid == getuid() else {
            throw .socket("\(folder) belongs to uid \(info.st_uid), not to you (uid \(getuid())): XDG_RUNTIME_DIR must be your own folder")
        }
        if info.st_mode & 0o777 != 0o700 { chmod(folder, 0o700) }
    }

    func release() {
        var info = stat()
        if lstat(socketPath, &info) == 0 && info.st_ino == socketInode { unlink(socketPath) }
        close(listener)
        close(lockFD)
    }
}

/// One client connection: what it sent so far and what it waits for.
final class ControlConnection {
    let fd: Int32
    var splitter = BoundedLineSplitter(limit: ControlProtocol.maximumRequest)
    /// Sent a watch request: gets every event line until it goes.
    var watching = false
    /// Waits for a connect or stop to come to its end.
    var awaiting = 0
    /// The client closed its side; closed for good once nothing is awaited.
    var readClosed = false
    var closed = false

    init(fd: Int32) { self.fd = fd }
}

final class ControlDaemon: Sendable {
    private let place: DaemonPlace
    private let arguments: Arguments
    private let signalFD: Int32
    private let logger: BackendLogger
    private let loop: EventLoop
    private let ended = DispatchSemaphore(value: 0)

    private let controller: SessionController

    /// What only the loop's thread touches, checked there (`LoopBound`).
    private struct LoopState {
        var connections: [Int32: ControlConnection] = [:]
        var pendingConnects: [ControlConnection] = []
        var pendingStops: [ControlConnection] = []
        /// connect --scan: the scan before the session, and the clients waiting for it to find a code.
        var scanner: ScreenScanJob?
        var scanSince = MonotonicClock.milliseconds()
        var pendingScans: [ControlConnection] = []
        var quitting = false
    }
    private let onLoop: LoopBound<LoopState>
    /// More clients than this at once are turned away (each costs a descriptor and 64 KB at most).
    static let maximumConnections = 32

    init(place: DaemonPlace, arguments: Arguments, signals: Int32, logger: @escaping BackendLogger) throws {
        self.place = place
        self.arguments = arguments
        self.signalFD = signals
        self.logger = logger
        loop = try EventLoop(name: "krakl-daemon")
        onLoop = LoopBound(LoopState(), loop: loop)
        controller = SessionController(arguments: arguments, loop: loop, logger: logger)
        controller.onEvent { [unowned self] event in sessionEvent(event) }
    }

    /// Serves until a signal ends it (after leaving the room), on the loop's thread; the main thread waits.
    func run() {
        loop.start()
        loop.post { [self] in
            loop.watch(fd: place.listener) { [self] in acceptClients() }
            loop.watch(fd: signalFD) { [self] in readSignals() }
            print("krakl-agent daemon: listening on \(place.socketPath) (pid \(getpid())); "
                  + "`krakl-agent connect CODE` shares, `krakl-agent stop` stops, SIGTERM quits")
            ServiceNotifier.notify("READY=1\nSTATUS=idle: waiting for `krakl-agent connect`\nMAINPID=\(getpid())")
        }
        ended.wait()
        loop.stop()
    }

    // MARK: - Signals

    private func readSignals() {
        for number in ControlPipe.signals(on: signalFD) { quit(signal: number) }
    }

    private func quit(signal number: Int32) {
        guard !onLoop.quitting else { return }
        onLoop.quitting = true
        print("krakl-agent daemon: signal \(number): \(controller.isActive ? "leaving the room, then quitting" : "quitting")")
        ServiceNotifier.notify("STOPPING=1\nSTATUS=quitting")
        if let scanner = onLoop.scanner {
            scanner.stop()   // finishes when the scan has let its screen source go
        } else if !controller.stop() {
            finish()
        }
    }

    /// The last turn: every client is told, the socket is removed, the main thread goes on to exit 0.
    private func finish() {
        for connection in onLoop.connections.values { close(connection, reason: "the daemon is quitting") }
        loop.unwatch(fd: place.listener)
        loop.unwatch(fd: signalFD)
        place.release()
        print("krakl-agent daemon: ended")
        ended.signal()
    }

    // MARK: - Clients

    private func acceptClients() {
        for _ in 0..<16 {
            let fd = Self.acceptCloseOnExec(place.listener)
            guard fd >= 0 else { return }
            let connection = ControlConnection(fd: fd)
            // The folder is 0700 and the socket 0600; the peer's uid is checked anyway (root, or a
            // process given our socket some other way, is still not us).
            let peer = ControlSocket.peerUID(fd)
            guard peer == getuid() else {
                let who = peer.map { "uid \($0)" } ?? "an unknown user"
                logger("daemon", .warning, "refused a control connection from \(who)")
                turnAway(connection, .failure("refused: this daemon belongs to uid \(getuid()) and takes requests from that user only (you are \(who))",
                                              status: ExitCode.controlSocket))
                continue
            }
            guard onLoop.connections.count < Self.maximumConnections else {
                turnAway(connection, .failure("too many control connections at once (\(Self.maximumConnections)); try again", status: ExitCode.daemonRefused))
                continue
            }
            onLoop.connections[fd] = connection
            loop.watch(fd: fd) { [self] in readClient(connection) }
        }
    }

    /// One reply, then the connection is closed. What the client already sent is read and dropped
    /// first (a little, without waiting): a unix socket closed with unread data resets the
    /// connection, and the client would get ECONNRESET instead of the reply and the end.
    private func turnAway(_ connection: ControlConnection, _ message: ControlReply) {
        _ = send(connection, message)
        shutdown(connection.fd, Int32(SHUT_WR))
        var chunk = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<16 where read(connection.fd, &chunk, chunk.count) > 0 {}
        Glibc.close(connection.fd)
    }

    private typealias Accept4 = @convention(c) (Int32, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<socklen_t>?, Int32) -> Int32
    /// Glibc's module map hides accept4 (it needs _GNU_SOURCE): looked up once.
    private static let accept4: Accept4? = dlsym(dlopen(nil, RTLD_NOW), "accept4").map { unsafeBitCast($0, to: Accept4.self) }

    /// A connection made close-on-exec atomically: the session may start a backend host child at any
    /// moment on another thread, which must not inherit a client's socket.
    private static func acceptCloseOnExec(_ listener: Int32) -> Int32 {
        let flags = Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        if let accept4 { return accept4(listener, nil, nil, flags) }
        let fd = accept(listener, nil, nil)
        if fd >= 0 {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        return fd
    }

    private func readClient(_ connection: ControlConnection) {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        // A few reads a turn, so one client sending megabytes cannot starve the others.
        for _ in 0..<4 where !connection.closed && !connection.readClosed {
            let n = read(connection.fd, &chunk, chunk.count)
            if n < 0 && (errno == EAGAIN || errno == EINTR) { return }
            guard n > 0 else {
                connection.readClosed = true
                loop.unwatch(fd: connection.fd)
                if connection.awaiting == 0 { close(connection) }
                return
            }
            for piece in connection.splitter.feed(chunk[0..<n]) {
                switch piece {
                case .tooLong:
                    reply(connection, .failure("request longer than \(ControlProtocol.maximumRequest / 1024) KB: ignored", status: ExitCode.daemonRefused))
                case .line(let bytes):
                    if bytes.allSatisfy({ $0 == 32 || $0 == 9 }) { continue }
                    handle(bytes, from: connection)
                }
                if connection.closed { return }
            }
        }
    }

    private func handle(_ line: [UInt8], from connection: ControlConnection) {
        let request: ControlRequest
        do {
            request = try JSONDecoder().decode(ControlRequest.self, from: Data(line))
        } catch {
            reply(connection, .failure("malformed request: not a JSON object with \"v\" and \"cmd\" (\(Self.shortDescription(error)))", status: ExitCode.daemonRefused))
            return
        }
        guard request.v == ControlProtocol.version else {
            reply(connection, .failure("protocol version \(request.v) is not spoken here (this daemon speaks \(ControlProtocol.version)): "
                                       + "use the krakl-agent that started the daemon", status: ExitCode.daemonRefused))
            return
        }
        switch request.cmd {
        case "status":
            reply(connection, ControlReply(ok: true, event: "status", status: currentStatus()))
        case "connect":
            connect(request, from: connection)
        case "stop":
            stop(from: connection)
        case "watch":
            connection.watching = true
            reply(connection, ControlReply(ok: true, event: "status", status: currentStatus()))
        default:
            reply(connection, .failure("unknown command \"\(request.cmd.prefix(40))\" (commands: status, connect, stop, watch)", status: ExitCode.daemonRefused))
        }
    }

    private static func shortDescription(_ error: Error) -> String {
        if case DecodingError.dataCorrupted = error { return "not valid JSON" }
        if case DecodingError.keyNotFound(let key, _) = error { return "no \"\(key.stringValue)\"" }
        if case DecodingError.typeMismatch(_, let context) = error {
            return "wrong type at \(context.codingPath.map(\.stringValue).joined(separator: "."))"
        }
        return "unreadable"
    }

    /// Writes one line; a client that does not read (its socket buffer full) is dropped rather
    /// than waited for: the loop never blocks on a client.
    private func reply(_ connection: ControlConnection, _ message: ControlReply) {
        guard !connection.closed else { return }
        if !send(connection, message) { close(connection) }
    }

    private func send(_ connection: ControlConnection, _ message: ControlReply) -> Bool {
        let bytes = ControlProtocol.encode(message)
        let n = bytes.withUnsafeBytes { Glibc.send(connection.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
        return n == bytes.count
    }

    private func close(_ connection: ControlConnection, reason: String? = nil) {
        guard !connection.closed else { return }
        if let reason, connection.watching { _ = send(connection, ControlReply(ok: true, event: "closing", message: reason)) }
        connection.closed = true
        loop.unwatch(fd: connection.fd)
        onLoop.connections[connection.fd] = nil
        Glibc.close(connection.fd)
    }

    /// A connect or stop came to its end for this client.
    private func settle(_ connection: ControlConnection, _ message: ControlReply) {
        connection.awaiting -= 1
        reply(connection, message)
        if connection.readClosed && connection.awaiting == 0 && !connection.watching { close(connection) }
    }

    private func broadcast(_ message: ControlReply) {
        for connection in onLoop.connections.values where connection.watching { reply(connection, message) }
    }

    // MARK: - The session

    private func connect(_ request: ControlRequest, from connection: ControlConnection) {
        guard !onLoop.quitting else {
            reply(connection, .failure("the daemon is quitting", status: ExitCode.daemonRefused))
            return
        }
        guard onLoop.scanner == nil else {
            reply(connection, .failure("already scanning the screen for a join code; stop first (krakl-agent stop)", status: ExitCode.daemonRefused))
            return
        }
        if request.scan == true {
            guard request.code == nil && request.qr == nil else {
                reply(connection, .failure("connect takes one of \"code\", \"qr\" or \"scan\"", status: ExitCode.daemonRefused))
                return
            }
            guard !controller.isActive else {
                reply(connection, .failure("already sharing; stop first (krakl-agent stop)", status: ExitCode.daemonRefused))
                return
            }
            startScan(for: connection, camera: request.camera)
            return
        }
        if let refusal = controller.connect(code: request.code, qr: request.qr) {
            reply(connection, .failure(refusal.message, status: refusal.status))
            return
        }
        connection.awaiting += 1
        onLoop.pendingConnects.append(connection)
    }

    private func stop(from connection: ControlConnection) {
        if let scanner = onLoop.scanner {
            scanner.stop()
            connection.awaiting += 1
            onLoop.pendingStops.append(connection)
            return
        }
        guard controller.stop() else {
            reply(connection, ControlReply(ok: true, message: "not sharing; nothing to stop", status: controller.status()))
            return
        }
        connection.awaiting += 1
        onLoop.pendingStops.append(connection)
    }

    /// The controller's status, or "scanning" while a connect --scan looks for its code.
    private func currentStatus() -> ControlStatus {
        var now = controller.status()
        if onLoop.scanner != nil {
            now.state = "scanning"
            now.stateSeconds = ((MonotonicClock.milliseconds() - onLoop.scanSince) / 100).rounded() / 10
        }
        return now
    }

    // MARK: - Scanning (connect --scan)

    /// Scans the screen of the daemon's backend (--scan-timeout bounds it); the client hears the
    /// scan's lines as "scanning" events, then the connect's end as for a code.
    private func startScan(for connection: ControlConnection, camera: String?) {
        var scanning = arguments
        scanning.camera = camera
        do throws(HostError) {
            onLoop.scanner = try ScreenScanJob(arguments: scanning, logger: logger, postingTo: loop) { [weak self] line in
                self?.scanSaid(line)
            } progress: { [weak self] line in
                self?.scanSaid(line)
            } done: { [weak self] outcome in
                self?.scanEnded(outcome)
            }
        } catch {
            reply(connection, .failure("cannot scan the screen: \(error.description)", status: error.exitStatus))
            return
        }
        onLoop.scanSince = MonotonicClock.milliseconds()
        let what = camera == nil ? "the screen" : "a camera's view"
        print("krakl-agent daemon: scanning \(what) for a join code")
        ServiceNotifier.notify("STATUS=scanning \(what) for a join code")
        connection.awaiting += 1
        onLoop.pendingScans.append(connection)
        broadcast(ControlReply(ok: true, event: "state", status: currentStatus()))
    }

    private func scanSaid(_ line: String) {
        guard onLoop.scanner != nil else { return }
        // The client's Ctrl-C leaves the daemon scanning: its stop is `krakl-agent stop`.
        let message = ControlReply(ok: true, event: "scanning", message: line.replacing("Ctrl-C stops", with: "krakl-agent stop stops"))
        for connection in onLoop.pendingScans { reply(connection, message) }
        broadcast(message)
    }

    private func scanEnded(_ outcome: ScreenScanJob.Outcome) {
        onLoop.scanner = nil
        let scans = onLoop.pendingScans, stops = onLoop.pendingStops
        onLoop.pendingScans.removeAll()
        onLoop.pendingStops.removeAll()
        var failure: ControlReply?
        switch outcome {
        case .found(let invitation) where !onLoop.quitting && stops.isEmpty:
            print("krakl-agent daemon: scanning: found a join code")
            if let refusal = controller.connect(code: invitation.code.text, qr: nil) {
                failure = .failure(refusal.message, status: refusal.status)
            } else {
                // From here the clients wait as for a connect with a code: until sharing or the end.
                onLoop.pendingConnects += scans
            }
        case .found, .notFound(0, _):
            failure = .failure("scanning stopped before a join code was found", status: ExitCode.daemonRefused)
        case .notFound(let status, let lastSaid):
            failure = .failure(lastSaid, status: status)
        case .failed(let error):
            failure = .failure("cannot scan the screen: \(error.description)", status: error.exitStatus)
        }
        if var failure {
            print("krakl-agent daemon: \(failure.error ?? "scanning ended"). Idle again.")
            ServiceNotifier.notify("STATUS=idle")
            failure.status = controller.status()
            for connection in scans { settle(connection, failure) }
            broadcast(ControlReply(ok: true, event: "state", status: controller.status()))
        }
        for connection in stops { settle(connection, ControlReply(ok: true, message: "scanning stopped", status: controller.status())) }
        if onLoop.quitting && !controller.isActive { finish() }
    }

    private func sessionEvent(_ event: SessionController.Event) {
        switch event {
        case .connecting(let start):
            print("krakl-agent daemon: \(start.words)")
        case .moved(let state, let now):
            sessionMoved(to: state, now)
        case .ended(let reason, let idle):
            sessionEnded(reason, idle)
        case .tick(let now):
            // Once a second from the moment it shares (before that, the state lines say enough).
            if now.sharingSeconds != nil { broadcast(ControlReply(ok: true, event: "status", status: now)) }
        }
    }

    private func sessionMoved(to state: SharingLifecycle.State, _ now: ControlStatus) {
        print("krakl-agent daemon: \(state.name)")
        if state == .sharing {
            ServiceNotifier.notify("STATUS=sharing in \(now.room ?? "a room") as \(now.identity ?? "?")")
            let connects = onLoop.pendingConnects
            onLoop.pendingConnects.removeAll()
            for connection in connects { settle(connection, ControlReply(ok: true, event: "state", message: "sharing", status: now)) }
        } else {
            ServiceNotifier.notify("STATUS=\(state.name)")
        }
        broadcast(ControlReply(ok: true, event: "state", status: now))
    }

    private func sessionEnded(_ reason: EndReason, _ idle: ControlStatus) {
        print("krakl-agent daemon: \(reason.description) Idle again.")
        ServiceNotifier.notify("STATUS=idle; last session: \(reason.name)")
        let connects = onLoop.pendingConnects, stops = onLoop.pendingStops
        onLoop.pendingConnects.removeAll()
        onLoop.pendingStops.removeAll()
        // A connect that never got to share failed, even when the reason (a stop) is not a failure by itself.
        let connectStatus = reason.exitStatus == 0 ? ExitCode.daemonRefused : reason.exitStatus
        let words = reason == .userStopped ? "stopped before sharing began (\(reason.description))" : reason.description
        for connection in connects {
            settle(connection, ControlReply(ok: false, event: "ended", error: words, exitStatus: connectStatus, status: idle))
        }
        for connection in stops { settle(connection, ControlReply(ok: true, event: "ended", message: reason.description, status: idle)) }
        broadcast(ControlReply(ok: true, event: "ended", message: reason.description, status: idle))
        if onLoop.quitting { finish() }
    }
}
