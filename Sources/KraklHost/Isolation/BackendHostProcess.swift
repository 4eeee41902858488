import KraklBase
import FoundationEssentials
import Glibc

/// How the child process ended, in the words the agent shows.
public enum ChildEnd: Equatable, Sendable {
    case exited(Int32)
    case signalled(Int32)
    /// The agent killed it: a call overran its budget (the call's name), or it broke the protocol.
    case killedAfterHang(String)
    case killedForProtocol(String)

    /// For a source-ended event: "the backend crashed: SIGSEGV", "the backend exited with status 3".
    public var sentence: String {
        switch self {
        case .exited(let status): return "the backend exited with status \(status)"
        case .signalled(let signal): return "the backend crashed: \(signalName(signal))"
        case .killedAfterHang(let call): return "the backend hung in \(call)() and was killed"
        case .killedForProtocol(let problem): return "the backend's process broke the isolation protocol (\(problem)) and was killed"
        }
    }

    /// For HostError.backendCrashed's "backend NAME crashed: …".
    public var reason: String {
        switch self {
        case .exited(let status): return "its process exited with status \(status)"
        case .signalled(let signal): return signalName(signal)
        case .killedAfterHang(let call): return "it hung in \(call)() and was killed"
        case .killedForProtocol(let problem): return "its process broke the isolation protocol (\(problem)) and was killed"
        }
    }
}

/// krakl-backend-host, spawned for one source: its pid, reaped exactly once.
final class BackendHostProcess: Sendable {
    let pid: pid_t
    private struct Fate {
        var ended: ChildEnd?
        var killedFor: ChildEnd?
    }
    private let fate = Guarded(Fate())

    /// Where the helper is: $KRAKL_BACKEND_HOST, else an installed agent's
    /// PREFIX/lib/krakl-agent/krakl-backend-host (not in PREFIX/bin: it is no command for people),
    /// else next to the running executable (the agent in .build/…, or the test runner, which
    /// SwiftPM puts in the same folder).
    static func executablePath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["KRAKL_BACKEND_HOST"], !path.isEmpty { return path }
        if let installed = InstalledLayout.installedFile("krakl-backend-host") { return installed }
        let exe = InstalledLayout.executable
        var folder = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // A test runner may sit inside a bundle folder below the build folder.
        for _ in 0..<4 where !FileManager.default.isExecutableFile(atPath: folder.appendingPathComponent("krakl-backend-host").path) {
            folder.deleteLastPathComponent()
        }
        let found = folder.appendingPathComponent("krakl-backend-host").path
        return FileManager.default.isExecutableFile(atPath: found) ? found
            : URL(fileURLWithPath: exe).deletingLastPathComponent().appendingPathComponent("krakl-backend-host").path
    }

    /// posix_spawn()s the helper with `socket` as its fd 3, stdin from /dev/null, in a process
    /// group of its own (Ctrl-C in the terminal goes to the agent, which stops the backend in
    /// order, not to the backend), with default signal dispositions (the agent ignores SIGINT
    /// and SIGTERM, which an exec would pass on) and an empty signal mask.
    init(executable: String, arguments: [String], socket: Int32) throws(HostError) {
        guard access(executable, X_OK) == 0 else {
            throw .libraryUnloadable(path: executable, reason: "the isolated-mode helper is missing or not executable; build it (swift build) or point $KRAKL_BACKEND_HOST at krakl-backend-host")
        }
        // The helper is a Swift program: without this, a backend's crash prints the Swift runtime's
        // page-long crash report on the agent's stderr, where the agent prints one line saying why.
        var child = ChildSpawn(executable: executable, arguments: [executable] + arguments, descriptors: [0: .devNull, 3: .copy(socket)],
                               environment: ChildSpawn.environmentWithoutBacktrace(replacing: false))
        child.detachedSignals = true
        switch child.spawn() {
        case .success(let spawned): pid = spawned
        case .failure(let error): throw .libraryUnloadable(path: executable, reason: "cannot start the isolated-mode helper: \(error)")
        }
    }

    /// SIGKILL, remembering why (the reason wins over the signal when it is reaped).
    func kill(because reason: ChildEnd) {
        fate.withLock { fate in
            guard fate.ended == nil else { return }
            if fate.killedFor == nil { fate.killedFor = reason }
            _ = Glibc.kill(pid, SIGKILL)
        }
    }

    /// Reaps the child: waits up to `grace` seconds for it to end by itself (its socket closed,
    /// so it is on its way out), then kills it. Returns how it ended; idempotent.
    @discardableResult
    func reap(grace: Double) -> ChildEnd {
        if let ended = fate.withLock({ $0.ended }) { return ended }
        var status: Int32 = 0
        let deadline = MonotonicClock.nanoseconds() + UInt64(grace * 1e9)
        var result = waitpid(pid, &status, WNOHANG)
        while result == 0 && MonotonicClock.nanoseconds() < deadline {
            usleep(2000)
            result = waitpid(pid, &status, WNOHANG)
        }
        if result == 0 {
            // It closed the socket (or never will) but lives on: nobody else will end it.
            kill(because: .killedForProtocol("it closed its socket but did not exit"))
            while true {
                result = waitpid(pid, &status, 0)
                if result >= 0 || errno != EINTR { break }
            }
        }
        return fate.withLock { fate in
            if let ended = fate.ended { return ended }
            let end: ChildEnd
            if let killedFor = fate.killedFor { end = killedFor }
            else if result < 0 { end = .exited(-1) }
            else if status & 0x7F == 0 { end = .exited((status >> 8) & 0xFF) }
            else { end = .signalled(status & 0x7F) }
            fate.ended = end
            return end
        }
    }
}
