import KraklBase
import Glibc

/// The time each step of the suite may take, from `--timeout` (T), in seconds: the numbers the
/// line protocol to the parent carries and the docs' bound is written in. The
/// parent process enforces them: a call that overruns its budget is reported
/// as hung and its process killed, so the whole run ends within `total(expectEnd:)`.
public struct ConformanceBudget: Sendable {
    public let timeout: Double
    public init(timeout: Duration) { self.timeout = timeout.inSeconds }

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
    static let clockBehind: UInt64 = 10_000_000_000

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
                                "callbacks-serial", "callbacks-one-thread", "callbacks-well-formed", "return-values", "nothing-after-destroy"]
        case .leaks: return ["no-leaks"]
        case .end: return ["source-ended"]
        }
    }
}
