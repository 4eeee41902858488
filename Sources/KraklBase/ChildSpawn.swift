import FoundationEssentials
import Glibc

/// One way the agent starts its child processes (a conformance group, a backend probe,
/// krakl-backend-host): posix_spawn with the child's descriptors set up by file actions, every
/// other descriptor closed, and the environment given.
public struct ChildSpawn {
    /// What a descriptor of the child is.
    public enum Descriptor {
        /// /dev/null, read-only for stdin, write-only for the others.
        case devNull
        /// A copy of this descriptor of the parent (close-on-exec or not).
        case copy(Int32)
    }

    /// argv[0] is `arguments[0]`; `executable` is what runs.
    public var executable: String
    public var arguments: [String]
    /// The child's descriptors by number; a number not named is inherited (stdin, stdout and
    /// stderr) or closed (3 and up).
    public var descriptors: [Int32: Descriptor]
    /// nil: this process's environment as it is.
    public var environment: [String: String]?
    /// A process group of its own (Ctrl-C in the terminal reaches the parent only), default
    /// signal dispositions (what the parent ignores, an exec would pass on) and an empty mask.
    public var detachedSignals = false
    /// A session of its own (setsid): no controlling terminal, so it outlives the terminal and
    /// the session it was started from (a daemon started on demand). Implies detachedSignals'
    /// signal set-up, without the process group (setsid makes one).
    public var newSession = false

    public init(executable: String, arguments: [String], descriptors: [Int32: Descriptor], environment: [String: String]? = nil) {
        self.executable = executable
        self.arguments = arguments
        self.descriptors = descriptors
        self.environment = environment
    }

    /// This process's environment with the Swift runtime's crash backtracer off: in a child that
    /// runs a backend, it would print a page-long report where the parent prints one line saying
    /// why, take seconds, and return from its handler for a raise()d signal (so the "crashed"
    /// process went on). `replacing`: also when the user set SWIFT_BACKTRACE.
    public static func environmentWithoutBacktrace(replacing: Bool) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        if replacing || environment["SWIFT_BACKTRACE"] == nil { environment["SWIFT_BACKTRACE"] = "enable=no" }
        return environment
    }

    /// Starts the child; its pid, or the errno of the failure.
    public func spawn() -> Result<pid_t, SpawnError> {
        // A source that is itself a target number (fd 3 handed on as fd 3, whose dup2 onto itself
        // would not clear close-on-exec) or another entry's target is moved out of the way first.
        let targets = Set(descriptors.keys)
        var moved: [Int32] = []
        defer { moved.forEach { close($0) } }
        var plan: [(target: Int32, source: Descriptor)] = []
        for target in descriptors.keys.sorted() {
            guard case .copy(let source) = descriptors[target]!, targets.contains(source) else {
                plan.append((target, descriptors[target]!))
                continue
            }
            let copy = fcntl(source, F_DUPFD_CLOEXEC, 10)
            guard copy >= 0 else { return .failure(SpawnError(code: errno)) }
            moved.append(copy)
            plan.append((target, .copy(copy)))
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, source) in plan {
            switch source {
            case .devNull: posix_spawn_file_actions_addopen(&actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case .copy(let fd): posix_spawn_file_actions_adddup2(&actions, fd, target)   // clears close-on-exec on target
            }
        }
        // Nothing else of the parent's (a leaked descriptor would keep a pipe or socket open).
        if let closeFrom = Self.addCloseFrom { _ = closeFrom(&actions, max(3, (targets.max() ?? 2) + 1)) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        if detachedSignals || newSession {
            var defaults = sigset_t(), empty = sigset_t()
            sigemptyset(&empty)
            sigemptyset(&defaults)
            for number in [SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD] { sigaddset(&defaults, number) }
            posix_spawnattr_setsigdefault(&attributes, &defaults)
            posix_spawnattr_setsigmask(&attributes, &empty)
            var flags = Int32(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK)
            if newSession {
                // POSIX_SPAWN_SETSID is 0x80 in glibc's spawn.h (2.26 and later); the Glibc module
                // does not show it.
                flags |= 0x80
            } else {
                posix_spawnattr_setpgroup(&attributes, 0)
                flags |= Int32(POSIX_SPAWN_SETPGROUP)
            }
            posix_spawnattr_setflags(&attributes, Int16(flags))
        }
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let envp = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { envp?.forEach { free($0) } }
        var pid: pid_t = 0
        let status = envp.map { posix_spawn(&pid, executable, &actions, &attributes, argv, $0) }
            ?? posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        return status == 0 ? .success(pid) : .failure(SpawnError(code: status))
    }

    /// posix_spawn_file_actions_addclosefrom_np (glibc 2.34), which the Glibc module does not
    /// show; nil on an older C library, where children inherit what is not close-on-exec.
    private static let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()
}

public struct SpawnError: Error, CustomStringConvertible {
    public let code: Int32
    public var description: String { String(cString: strerror(code)) }
}

/// "SIGSEGV" for 11: the names people search for.
public func signalName(_ number: Int32) -> String {
    let names: [Int32: String] = [
        SIGHUP: "SIGHUP", SIGINT: "SIGINT", SIGQUIT: "SIGQUIT", SIGILL: "SIGILL", SIGTRAP: "SIGTRAP", SIGABRT: "SIGABRT",
        SIGBUS: "SIGBUS", SIGFPE: "SIGFPE", SIGKILL: "SIGKILL", SIGUSR1: "SIGUSR1", SIGSEGV: "SIGSEGV", SIGUSR2: "SIGUSR2",
        SIGPIPE: "SIGPIPE", SIGALRM: "SIGALRM", SIGTERM: "SIGTERM", SIGSYS: "SIGSYS", SIGXCPU: "SIGXCPU", SIGXFSZ: "SIGXFSZ",
    ]
    return names[number] ?? "signal \(number)"
}

/// The kernel's id of the calling thread (what /proc/self/task lists), from /proc/thread-self
/// ("PID/task/TID"): the Glibc module shows neither gettid() nor SYS_gettid. 0 when unreadable.
public func currentKernelThreadID() -> pid_t {
    var buffer = [CChar](repeating: 0, count: 64)
    let count = readlink("/proc/thread-self", &buffer, buffer.count - 1)
    guard count > 0 else { return 0 }
    let text = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return text.split(separator: "/").last.flatMap { pid_t($0) } ?? 0
}
