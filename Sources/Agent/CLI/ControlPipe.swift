import Glibc
import Synchronization

/// The agent's one way to take signals: signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, and what
/// `catchSignals` adds) arrive as bytes on a pipe, written by an async-signal-safe handler. The
/// lines mode, the home screen and the daemon watch `readFD` on their EventLoop; the capture run
/// (`run`) waits on it with `wait`. No libdispatch signal sources: they would start libdispatch's
/// manager thread, which never ends.
final class ControlPipe: Sendable {
    enum Wake { case signal(Int32), timeout }

    /// An atomic: the signal handler reads it (a lock-free load is async-signal-safe), and
    /// `wake` from any thread.
    static let writeFD = Atomic<Int32>(-1)
    let readFD: Int32

    /// The process's one control pipe (made, and the handlers installed, on first use).
    static let shared = ControlPipe()

    private init() {
        var ends: [Int32] = [-1, -1]
        if pipe(&ends) != 0 { ends = [-1, -1] }
        for fd in ends where fd >= 0 {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        readFD = ends[0]
        Self.writeFD.store(ends[1], ordering: .releasing)
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
                _ = write(ControlPipe.writeFD.load(ordering: .relaxed), &byte, 1)
                errno = saved
            }
            sigaddset(&wanted, number)
        }
        // A parent may have started us with these blocked (a mask is inherited: Foundation's Process
        // from a process whose libdispatch blocks them does so); blocked, the handler would never run.
        // Threads made later inherit this thread's mask.
        sigprocmask(SIG_UNBLOCK, &wanted, nil)
    }

    /// Any thread: wakes `wait` with `.timeout` (something changed: look again). A full pipe already
    /// means "wake up".
    static func wake() {
        var byte: UInt8 = 255
        _ = write(writeFD.load(ordering: .acquiring), &byte, 1)
    }

    /// For an event loop watching `readFD`: the signals that arrived since the last call (the
    /// wake-up bytes are dropped: a loop hears of those its own way).
    static func signals(on fd: Int32) -> [Int32] {
        var bytes = [UInt8](repeating: 0, count: 64)
        let n = read(fd, &bytes, bytes.count)
        guard n > 0 else { return [] }
        return bytes.prefix(n).filter { $0 != 255 }.map { Int32($0) }
    }

    /// Waits up to `timeout` s for a signal or a `wake`.
    func wait(timeout: Double) -> Wake {
        var fd = pollfd(fd: readFD, events: Int16(POLLIN), revents: 0)
        guard poll(&fd, 1, Int32(timeout * 1000)) > 0 else { return .timeout }
        var byte: UInt8 = 0
        guard read(readFD, &byte, 1) == 1, byte != 255 else { return .timeout }
        return .signal(Int32(byte))
    }
}
