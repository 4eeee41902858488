import Glibc

/// The main thread's one place to wait, and the agent's one way to take signals: signals
/// (SIGINT, SIGTERM, SIGHUP, SIGQUIT, and what `catchSignals` adds) arrive as bytes on a pipe, written
/// by an async-signal-safe handler, and the session's end as a byte too; `wait`
/// polls that pipe and, while idle, stdin. No libdispatch signal sources: they would start
/// libdispatch's manager thread, which never ends, and an agent between sessions holds no
/// thread but its main one.
final class ControlPipe {
    enum Wake { case signal(Int32), sessionEnded, input, timeout }

    nonisolated(unsafe) static var writeFD: Int32 = -1
    let readFD: Int32

    /// The process's one control pipe (made, and the handlers installed, on first use).
    nonisolated(unsafe) static let shared = ControlPipe()

    private init() {
        var ends: [Int32] = [-1, -1]
        if pipe(&ends) != 0 { ends = [-1, -1] }
        for fd in ends where fd >= 0 {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        readFD = ends[0]
        Self.writeFD = ends[1]
        // SIGQUIT (Ctrl-\) is a quit like SIGTERM everywhere in the agent: caught, no crash report
        // (the Swift runtime's backtracer would print "Program crashed" and the run would go on).
        catchSignals([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
        signal(SIGPIPE, SIG_IGN)   // a closed stdout or socket is an error to handle, not a death
    }

    /// Main thread, before other threads start: `numbers` arrive through `wait` as `.signal` too
    /// (the recording run adds SIGPIPE and SIGUSR1). A caught SIGPIPE still makes the
    /// write that raised it fail with EPIPE, as an ignored one would.
    func catchSignals(_ numbers: [Int32]) {
        var wanted = sigset_t()
        sigemptyset(&wanted)
        for number in numbers {
            signal(number) { number in
                // Async-signal-safe: one write(2), errno kept for the code the signal interrupted.
                let saved = errno
                var byte = UInt8(truncatingIfNeeded: number)
                _ = write(ControlPipe.writeFD, &byte, 1)
                errno = saved
            }
            sigaddset(&wanted, number)
        }
        // A parent may have started us with these blocked (a mask is inherited: Foundation's Process
        // from a process whose libdispatch blocks them does so); blocked, the handler would never run.
        // Threads made later inherit this thread's mask.
        sigprocmask(SIG_UNBLOCK, &wanted, nil)
    }

    /// Any thread: wakes `wait` with `.sessionEnded`.
    static func sessionEnded() {
        var byte: UInt8 = 0
        _ = write(writeFD, &byte, 1)
    }

    /// Any thread: wakes `wait` with `.timeout` (something changed: look again). A full pipe already
    /// means "wake up".
    static func wake() {
        var byte: UInt8 = 255
        _ = write(writeFD, &byte, 1)
    }

    /// For an event loop watching `readFD`: the signals that arrived since the last call (the
    /// session-ended and wake-up bytes are dropped: a loop hears of those its own way).
    static func signals(on fd: Int32) -> [Int32] {
        var bytes = [UInt8](repeating: 0, count: 64)
        let n = read(fd, &bytes, bytes.count)
        guard n > 0 else { return [] }
        return bytes.prefix(n).filter { $0 != 0 && $0 != 255 }.map { Int32($0) }
    }

    /// Waits up to `timeout` s for a signal, the session's end or (with `input`) readable stdin.
    func wait(timeout: Double, input: Bool = false) -> Wake {
        var fds = [pollfd(fd: readFD, events: Int16(POLLIN), revents: 0)]
        if input { fds.append(pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0)) }
        let ready = poll(&fds, nfds_t(fds.count), Int32(timeout * 1000))
        guard ready > 0 else { return .timeout }
        if fds[0].revents != 0 {
            var byte: UInt8 = 0
            if read(readFD, &byte, 1) == 1 {
                if byte == 255 { return .timeout }
                return byte == 0 ? .sessionEnded : .signal(Int32(byte))
            }
        }
        if input && fds.count > 1 && fds[1].revents != 0 { return .input }
        return .timeout
    }
}
