import Foundation
import Glibc

/// A child process of the suite running one group of checks: its fd 3 is a
/// pipe the parent reads (the step protocol of ConformanceChannel), its
/// stdout goes to the parent's stderr (a backend's printf must not mix with
/// the result lines), its stdin is /dev/null.
final class ConformanceProcess {
    let pid: pid_t
    let reader: Int32
    private var buffer: [UInt8] = []

    /// Spawns `arguments[0]` with `arguments`; nil with the reason when it cannot.
    static func spawn(_ arguments: [String]) -> Result<ConformanceProcess, SpawnError> {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return .failure(SpawnError(reason: "pipe: \(String(cString: strerror(errno)))")) }
        // Only the child's fd 3 may hold the write end (its end is what tells the parent it is gone).
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var (reader, writer) = (fds[0], fds[1])
        // dup2 onto fd 3 clears close-on-exec; from fd 3 itself it would not.
        if writer == ConformanceChannel.descriptor {
            writer = fcntl(writer, F_DUPFD_CLOEXEC, 10)
            close(ConformanceChannel.descriptor)
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, 2, 1)
        posix_spawn_file_actions_adddup2(&actions, writer, ConformanceChannel.descriptor)
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        // The Swift runtime's crash backtracer would print pages for a backend's
        // crash, take seconds, and return from its handler for a raise()d signal
        // (so the "crashed" process went on): the FAIL line says what happened.
        var environment = ProcessInfo.processInfo.environment
        environment["SWIFT_BACKTRACE"] = "enable=no"
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { envp.forEach { free($0) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, arguments[0], &actions, nil, argv, envp)
        close(writer)
        guard status == 0 else {
            close(reader)
            return .failure(SpawnError(reason: "\(arguments[0]): \(String(cString: strerror(status)))"))
        }
        _ = fcntl(reader, F_SETFL, fcntl(reader, F_GETFL) | O_NONBLOCK)
        return .success(ConformanceProcess(pid: pid, reader: reader))
    }

    struct SpawnError: Error { let reason: String }

    private init(pid: pid_t, reader: Int32) {
        self.pid = pid
        self.reader = reader
    }

    deinit { close(reader) }

    /// Waits up to `seconds` for output; returns the complete lines read.
    func lines(waiting seconds: Double) -> [String] {
        var pfd = pollfd(fd: reader, events: Int16(POLLIN), revents: 0)
        _ = poll(&pfd, 1, Int32(max(0, min(seconds, 1)) * 1000))
        return drain()
    }

    /// Reads whatever is there now (non-blocking) and returns the complete lines.
    func drain() -> [String] {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(reader, &chunk, chunk.count)
            if n > 0 { buffer += chunk[0..<n]; continue }
            if n < 0 && errno == EINTR { continue }
            break
        }
        var lines: [String] = []
        while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
            lines.append(String(decoding: buffer[..<newline], as: UTF8.self))
            buffer.removeSubrange(...newline)
        }
        return lines
    }

    /// How the process ended, or nil while it runs.
    func exitStatus() -> Int32? {
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        return result == pid ? status : nil
    }

    /// SIGKILL, then waits for it (bounded: a process stuck in the kernel may take a moment).
    func kill() -> Int32? {
        Glibc.kill(pid, SIGKILL)
        let deadline = MonotonicClock.nanoseconds() + 5_000_000_000
        while MonotonicClock.nanoseconds() < deadline {
            if let status = exitStatus() { return status }
            usleep(10_000)
        }
        return nil
    }
}

/// How a wait status reads in a FAIL line.
enum WaitStatus {
    static func signal(_ status: Int32) -> Int32? { status & 0x7f != 0 && status & 0x7f != 0x7f ? status & 0x7f : nil }
    static func exitCode(_ status: Int32) -> Int32 { (status >> 8) & 0xff }

    static func signalName(_ signal: Int32) -> String {
        let names: [Int32: String] = [SIGSEGV: "SIGSEGV", SIGBUS: "SIGBUS", SIGABRT: "SIGABRT", SIGILL: "SIGILL", SIGFPE: "SIGFPE",
                                      SIGTRAP: "SIGTRAP", SIGKILL: "SIGKILL", SIGTERM: "SIGTERM", SIGINT: "SIGINT", SIGPIPE: "SIGPIPE",
                                      SIGSYS: "SIGSYS", SIGHUP: "SIGHUP", SIGQUIT: "SIGQUIT"]
        return names[signal] ?? "signal \(signal)"
    }
}
