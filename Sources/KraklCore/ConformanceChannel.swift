import Glibc

/// The time each step of the suite may take, from `--timeout` (T). The
/// parent process enforces them: a call that overruns its budget is reported
/// as hung and its process killed, so the whole run ends within `total`.
public struct ConformanceBudget: Sendable {
    public let timeout: Double
    public init(timeout: Double) { self.timeout = timeout }

    /// dlopen and the entry point (constructors of the library and its dependencies).
    public var load: Double { 20 }
    /// create(), start() and list_sources() may block (open a display, ask the portal).
    public var create: Double { timeout }
    public var start: Double { timeout }
    public var list: Double { timeout }
    /// The header promises one second; stop-within-1s judges that, this is where a stop() counts as hung.
    public var stop: Double { 3 }
    public var destroy: Double { 3 }
    /// The delivery checks look at frames for this long after the first (or until `windowFrames`).
    public var window: Double { min(2, timeout) }
    public var windowFrames: Int { 60 }
    /// How long after stop(), SOURCE_ENDED or destroy() the suite watches for callbacks that must not come.
    public var afterStop: Double { 0.3 }
    /// Added to every step's budget before the parent gives up on it (process start, scheduling).
    public var slack: Double { 2 }

    /// A timestamp may be at most this far ahead of CLOCK_MONOTONIC when it arrives, or this old.
    static let clockAhead: UInt64 = 10_000_000
    static let clockBehind: UInt64 = 5_000_000_000

    /// The hard bound of one group's process, whatever it does; see `total`.
    public func cap(of group: ConformanceGroup) -> Double {
        let t = timeout
        switch group {
        case .load: return load + 10
        case .create: return 4 * (create + destroy) + afterStop + 10
        case .list: return list + 10
        case .delivery: return 4 * t + create + window + 2 * stop + destroy + 3 * afterStop + 10
        case .leaks: return 2 * t + 60
        case .end: return create + start + t + afterStop + stop + destroy + 10
        }
    }

    /// Every run of the suite ends within this many seconds, however the backend
    /// misbehaves: 12 × T + window + 143 s, and 3 × T + 17 s more for the end
    /// group (311 s with the default --timeout 10); docs/backend-guide.md states it.
    public func total(expectEnd: Bool) -> Double {
        ConformanceGroup.allCases.filter { $0 != .end || expectEnd }.reduce(0) { $0 + cap(of: $1) }
    }
}

/// The checks, in the groups that run in one child process each. A group's
/// checks share what they need (a loaded library, one started source); a
/// crash or hang in one group cannot hide the results of the others.
public enum ConformanceGroup: String, CaseIterable, Sendable {
    case load, create, list, delivery, leaks, end

    /// The checks of the group, in the order they are reported. Names are
    /// stable: tests and docs/backend-guide.md refer to them.
    public var checks: [String] {
        switch self {
        case .load: return ["abi-handshake", "table-size"]
        case .create: return ["create-destroy", "nothing-before-start", "rejects-malformed-options", "rejects-non-object-options", "rejects-unknown-option"]
        case .list: return ["list-sources"]
        case .delivery: return ["delivers-frames", "frames-valid", "first-frame-whole", "damage-inside-frame", "size-changes-announced",
                                "timestamps-near-clock", "stop-within-1s", "no-frame-after-stop", "restart", "timestamps-monotonic",
                                "callbacks-serial", "callbacks-one-thread", "return-values", "nothing-after-destroy"]
        case .leaks: return ["no-leaks"]
        case .end: return ["source-ended"]
        }
    }
}

/// The child's side of the pipe to the parent (fd 3): one line per step, so
/// the parent knows which check and which backend call were running when
/// the process crashed or hung.
///
///     check NAME              the check the following steps belong to
///     call WHAT BUDGET        entering a backend call (e.g. "stop()") allowed BUDGET s
///     return WHAT             the call returned
///     wait SECONDS            a bounded wait (frames, an observation window)
///     result OUTCOME NAME DETAIL
///     created                 create() with the given options worked
///     done                    the group finished
public final class ConformanceChannel {
    public static let descriptor: Int32 = 3
    let fd: Int32

    init(fd: Int32) { self.fd = fd }

    func send(_ line: String) {
        let bytes = Array((ConformanceText.safe(line) + "\n").utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            // The parent is gone: nobody is left to report to.
            if n <= 0 { _exit(2) }
            offset += n
        }
    }

    func check(_ name: String) { send("check \(name)") }
    func wait(_ seconds: Double) { send("wait \(seconds)") }
    func result(_ outcome: ConformanceOutcome, _ check: String, _ detail: String) { send("result \(outcome.rawValue) \(check) \(detail)") }

    @discardableResult
    func call<T, E: Error>(_ what: String, budget: Double, _ body: () throws(E) -> T) throws(E) -> T {
        send("call \(what) \(budget)")
        defer { send("return \(what)") }
        return try body()
    }
}

public enum ConformanceOutcome: String, Sendable { case pass = "PASS", fail = "FAIL", skip = "SKIP" }

enum ConformanceText {
    /// Backend text (log lines, error messages) on one line, without
    /// control characters: it goes through a line protocol and to a terminal.
    static func safe(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { scalar in
            scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) ? " " : scalar
        }))
    }
}
