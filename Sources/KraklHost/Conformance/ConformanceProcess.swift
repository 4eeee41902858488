import KraklBase
import FoundationEssentials
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
        let (reader, writer) = (fds[0], fds[1])
        // The FAIL line says what a backend's crash was, not the Swift runtime's backtracer.
        let child = ChildSpawn(executable: arguments[0], arguments: arguments,
                               descriptors: [0: .devNull, 1: .copy(2), ConformanceChannel.descriptor: .copy(writer)],
                               environment: ChildSpawn.environmentWithoutBacktrace(replacing: true))
        let spawned = child.spawn()
        close(writer)
        switch spawned {
        case .failure(let error):
            close(reader)
            return .failure(SpawnError(reason: "\(arguments[0]): \(error)"))
        case .success(let pid):
            _ = fcntl(reader, F_SETFL, fcntl(reader, F_GETFL) | O_NONBLOCK)
            return .success(ConformanceProcess(pid: pid, reader: reader))
        }
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
}
