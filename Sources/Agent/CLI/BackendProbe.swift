import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// Loads a backend library in a child process (this same executable, run with a hidden
/// subcommand), so a library whose constructor exits, crashes or hangs takes down only the
/// child: `krakl-agent backends` reports it and goes on with the next one. The child writes what
/// it got to descriptor 3, one marker line per stage, so the parent knows where it died.
enum BackendProbe {
    /// argv[1] of the child. Not in --help: only the agent starts it.
    static let subcommand = "__probe-backend"
    /// How long one library may take to load.
    static let budgetSeconds = 10.0

    enum Outcome: Equatable {
        case loads(abi: String, description: String)
        case fails(String)
    }

    // MARK: child

    /// The child's whole life: markers and a result on fd 3; its own stdout and stderr are the
    /// library's to scribble on (the parent discards them).
    static func runChild(path: String) -> Int32 {
        func say(_ line: String) {
            let text = line + "\n"
            _ = text.withCString { write(3, $0, strlen($0)) }
        }
        say("constructor")
        // Loaded here first (the constructor runs now); BackendLibrary.load finds it loaded.
        if access(path, F_OK) == 0 { _ = dlopen(path, RTLD_NOW | RTLD_LOCAL) }
        say("entry")
        do throws(HostError) {
            let library = try BackendLibrary.load(path: path, backend: URL(fileURLWithPath: path).lastPathComponent)
            say("loads\t\(library.abiMajor).\(library.abiMinor)\t\(BackendText.sanitized(library.description))")
        } catch {
            say("fails\t\(BackendText.sanitized(error.description))")
        }
        return 0
    }

    // MARK: parent

    /// Probes `path` in a child; never blocks longer than `budgetSeconds` (plus a moment to reap).
    static func probe(path: String) -> Outcome {
        var channel: [Int32] = [-1, -1]
        guard pipe(&channel) == 0 else { return .fails("cannot probe it: \(String(cString: strerror(errno)))") }
        // Neither end may leak into the child beyond its fd 3 (an inherited read end would keep the
        // channel open after the child died).
        channel.forEach { _ = fcntl($0, F_SETFD, FD_CLOEXEC) }
        defer { close(channel[0]) }
        let child = ChildSpawn(executable: "/proc/self/exe", arguments: ["krakl-agent", subcommand, path],
                               descriptors: [0: .devNull, 1: .devNull, 2: .devNull, 3: .copy(channel[1])])
        let spawned = child.spawn()
        close(channel[1])
        let pid: pid_t
        switch spawned {
        case .success(let child): pid = child
        case .failure(let error): return .fails("cannot probe it: \(error)")
        }

        let deadline = MonotonicClock.milliseconds() + budgetSeconds * 1000
        var output = ""
        readOutput(channel[0], into: &output, deadline: deadline)
        var exit: Int32 = 0
        var reaped = false
        while !reaped && MonotonicClock.milliseconds() < deadline {
            let result = waitpid(pid, &exit, WNOHANG)
            if result == pid || (result < 0 && errno != EINTR) { reaped = true } else { usleep(10_000) }
        }
        if !reaped {
            kill(pid, SIGKILL)
            waitpid(pid, &exit, 0)
            return .fails("does not load: did not finish loading within \(Int(budgetSeconds)) s (\(stage(output)))")
        }
        let lines = output.split(separator: "\n", omittingEmptySubsequences: true)
        if let last = lines.last {
            let fields = last.split(separator: "\t", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
            if fields.first == "loads", fields.count == 3 { return .loads(abi: fields[1], description: fields[2]) }
            if fields.first == "fails", fields.count == 2 { return .fails(fields[1]) }
        }
        let how: String
        if exit & 0x7F == 0 {
            how = "exited with status \((exit >> 8) & 0xFF)"
        } else {
            let number = exit & 0x7F
            how = "crashed (\(signalName(number)))"
        }
        return .fails("does not load: \(how) \(stage(output))")
    }

    /// Where the child was when it died, from its last marker.
    private static func stage(_ output: String) -> String {
        switch output.split(separator: "\n").last {
        case "constructor": return "in its constructor (while being loaded)"
        case "entry": return "in krakl_backend_v1()"
        default: return "before loading it"
        }
    }

    /// Reads the child's markers until it closes the channel or the deadline passes (a short,
    /// bounded amount: one line per stage).
    private static func readOutput(_ fd: Int32, into text: inout String, deadline: Double) {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while text.utf8.count < 65536 {
            let left = Int32(max(0, deadline - MonotonicClock.milliseconds()))
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, left)
            if ready < 0 && errno == EINTR { continue }
            guard left > 0, ready > 0 else { return }
            let n = read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            text += String(decoding: buffer[0..<n], as: UTF8.self)
        }
    }
}
