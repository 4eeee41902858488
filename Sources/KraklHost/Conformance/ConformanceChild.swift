import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// One group of conformance checks, run in a child process of
/// `krakl-agent conformance` (which spawns `krakl-agent conformance
/// --run-group NAME LIB ...`). It loads the backend, drives it and reports
/// each step and result on fd 3; whatever the backend does to this process
/// (crash, exit, hang) the parent turns into a FAIL line.
public enum ConformanceChild {
    /// Runs `group` and ends the process (_exit: backend threads may still
    /// be running, and exit handlers must not race them).
    public static func run(group name: String, path: String, options: JSONObject, expectEnd: Bool,
                           timeout: Duration, logger: @escaping BackendLogger) -> Never {
        guard fcntl(ConformanceChannel.descriptor, F_GETFD) >= 0, let group = ConformanceGroup(rawValue: name) else {
            StandardStream.error("krakl-agent: --run-group is used by `krakl-agent conformance` itself, for its child processes\n")
            _exit(2)
        }
        let channel = ConformanceChannel(fd: ConformanceChannel.descriptor)
        endWithParent(channel.fd)
        let runner = GroupRunner(path: path, options: options, expectEnd: expectEnd, budget: ConformanceBudget(timeout: timeout),
                                 logger: logger, channel: channel)
        runner.run(group)
        channel.send("done")
        _exit(0)
    }

    /// The parent holds the pipe's read end: when it goes (killed, Ctrl-C),
    /// the write end reports an error, and this process must not outlive it
    /// with a hung backend in it.
    private static func endWithParent(_ fd: Int32) {
        startThread {
            var pfd = pollfd(fd: fd, events: 0, revents: 0)
            while true {
                let n = poll(&pfd, 1, -1)
                if n > 0 && pfd.revents & Int16(POLLERR | POLLHUP | POLLNVAL) != 0 { _exit(2) }
                if n < 0 && errno != EINTR { _exit(2) }
            }
        }
    }
}
