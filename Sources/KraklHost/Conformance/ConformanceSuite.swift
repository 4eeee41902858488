import KraklBase
import FoundationEssentials
import Glibc

/// `krakl-agent conformance LIB.so`: the checks every backend must pass. One
/// line per check (PASS / FAIL / SKIP with the reason), then
/// `conformance: N passed, N failed, N skipped`; any FAIL fails the run.
///
/// The suite must survive the backend it judges: each group of checks runs
/// in a child process (ConformanceChild) that announces every backend call
/// it enters. A child that crashes becomes "FAIL check: the backend crashed
/// with SIGSEGV during stop()"; one that overruns a call's budget is killed
/// and becomes "FAIL check: stop() did not return within 3 s". So every run
/// ends within `ConformanceBudget.total(expectEnd:)` seconds.
public final class ConformanceSuite {
    let path: String
    let options: JSONObject
    let expectEnd: Bool
    let budget: ConformanceBudget
    let childCommand: (ConformanceGroup) -> [String]
    let output: (String) -> Void
    public private(set) var results: [(outcome: ConformanceOutcome, check: String, detail: String)] = []

    /// - Parameters:
    ///   - options: passed to create() in every check (except the bad-option ones, which add to them).
    ///   - expectEnd: the options make the source end by itself; check SOURCE_ENDED.
    ///   - timeout: how long to wait for a first frame or the end, and the budget of create() and start().
    ///   - childCommand: the command line (program first) that runs one group in a child process.
    public init(path: String, options: JSONObject, expectEnd: Bool, timeout: Duration,
                childCommand: @escaping (ConformanceGroup) -> [String], output: @escaping (String) -> Void) {
        self.path = path
        self.options = options
        self.expectEnd = expectEnd
        budget = ConformanceBudget(timeout: timeout)
        self.childCommand = childCommand
        self.output = output
    }

    public var failed: Int { results.filter { $0.outcome == .fail }.count }

    private func report(_ outcome: ConformanceOutcome, _ check: String, _ detail: String) {
        results.append((outcome, check, detail))
        let text = ConformanceText.safe(detail)
        output("\(outcome.rawValue)  \(check)\(text.isEmpty ? "" : ": \(text)")")
    }

    /// Runs every group; returns true when no check failed.
    @discardableResult
    public func run() -> Bool {
        let groups = ConformanceGroup.allCases.filter { $0 != .end || expectEnd }
        output("conformance: \(path): \(groups.reduce(0) { $0 + $1.checks.count }) checks in \(groups.count) processes, at most \(Int(budget.total(expectEnd: expectEnd).rounded(.up))) s")
        var skipReason: String?
        for group in ConformanceGroup.allCases {
            if group == .end && !expectEnd {
                report(.skip, "source-ended", "not asked to end: pass --expect-end with options that make the source end (e.g. --option frames=30)")
                continue
            }
            if let skipReason {
                for check in group.checks { report(.skip, check, skipReason) }
                continue
            }
            let created = runGroup(group)
            if group == .load && !results.contains(where: { $0.check == "abi-handshake" && $0.outcome == .pass }) {
                skipReason = "the library did not load"
            }
            if group == .create && !created { skipReason = "create() failed with these options" }
        }
        output("conformance: \(results.filter { $0.outcome == .pass }.count) passed, \(failed) failed, \(results.filter { $0.outcome == .skip }.count) skipped")
        return failed == 0
    }

    /// What the parent knows of a child while it runs.
    private struct ChildState {
        var check: String
        var call: (what: String, since: UInt64)?
        var deadline: UInt64
        var created = false
        var done = false
        var reported: Set<String> = []
    }

    /// Runs one group in its child process; returns whether create() worked in it.
    private func runGroup(_ group: ConformanceGroup) -> Bool {
        let started = MonotonicClock.nanoseconds()
        let cap = started + Self.nanoseconds(budget.cap(of: group))
        let process: ConformanceProcess
        switch ConformanceProcess.spawn(childCommand(group)) {
        case .success(let spawned): process = spawned
        case .failure(let error):
            for check in group.checks { report(.fail, check, "could not start the check's process: \(error.reason)") }
            return false
        }
        var state = ChildState(check: group.checks[0], deadline: min(cap, started + Self.nanoseconds(budget.load + budget.slack)))
        var status: Int32?
        var timedOut = false
        while status == nil {
            let now = MonotonicClock.nanoseconds()
            if now >= state.deadline {
                timedOut = true
                status = process.kill()
                break
            }
            for line in process.lines(waiting: Double(state.deadline - now) / 1e9) { handle(line, &state, cap: cap) }
            status = process.exitStatus()
        }
        for line in process.drain() { handle(line, &state, cap: cap) }

        if !state.reported.contains(state.check) || !state.done {
            let failure: String
            let during = state.call.map { "during \($0.what)" } ?? "on a thread of its own, between the host's calls"
            if timedOut {
                if let call = state.call {
                    failure = "\(call.what) did not return within \(Self.seconds(Double(MonotonicClock.nanoseconds() - call.since) / 1e9)) s"
                } else {
                    failure = "the check did not finish within its bound (\(Self.seconds(Double(state.deadline - started) / 1e9)) s after its process started)"
                }
            } else if let status, let signal = WaitStatus.signal(status) {
                failure = "the backend crashed with \(signalName(signal)) \(during)"
            } else if let status {
                failure = "the backend ended the process (exit status \(WaitStatus.exitCode(status))) \(during)"
            } else {
                failure = "the check's process could not be ended"
            }
            let check = state.reported.contains(state.check) ? group.checks.first { !state.reported.contains($0) } : state.check
            if let check {
                report(.fail, check, failure)
                state.reported.insert(check)
            } else {
                // Every check was reported, then the process died (e.g. a thread left
                // behind crashed it): still a broken contract, shown on the last check.
                report(.fail, group.checks.last!, "after its checks: \(failure)")
            }
        }
        for check in group.checks where !state.reported.contains(check) {
            report(.skip, check, "not reached: the process ended at the FAIL above")
        }
        return state.created
    }

    private func handle(_ line: String, _ state: inout ChildState, cap: UInt64) {
        let words = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false).map(String.init)
        guard let verb = words.first else { return }
        let now = MonotonicClock.nanoseconds()
        // Quick work between the announced steps gets a few seconds.
        var next = now + Self.nanoseconds(budget.slack + 3)
        switch verb {
        case "check" where words.count >= 2:
            state.check = words[1]
        case "call" where words.count >= 3:
            let seconds = Double(words[2]) ?? budget.timeout
            state.call = (words[1], now)
            next = now + Self.nanoseconds(seconds + budget.slack)
        case "return":
            state.call = nil
        case "wait" where words.count >= 2:
            next = now + Self.nanoseconds((Double(words[1]) ?? budget.timeout) + budget.slack)
        case "result" where words.count >= 3:
            guard let outcome = ConformanceOutcome(rawValue: words[1]) else { return }
            state.reported.insert(words[2])
            report(outcome, words[2], words.count > 3 ? words[3] : "")
        case "created":
            state.created = true
        case "done":
            state.done = true
        default:
            return
        }
        state.deadline = min(cap, next)
    }

    private static func nanoseconds(_ seconds: Double) -> UInt64 { UInt64(max(0, seconds) * 1e9) }
    private static func seconds(_ value: Double) -> String { String(cFormat: "%.0f", value.rounded(.down)) }
}
