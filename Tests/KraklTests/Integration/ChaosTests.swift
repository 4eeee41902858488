import Foundation
import Testing

/// 200 recording runs of the real agent on a backend that misbehaves in a way and at a time chosen
/// from a seed (Tests/Fixtures/misbehaving_backend.c, `misbehave=random`): timestamps that go
/// back or stand still, calls that hang or return nonsense, crashes on the capture thread, floods,
/// frames after stop, escape sequences in its text. Every run must end by itself (or by the
/// SIGTERM some runs get at a random moment) within its bound, with a status the documentation
/// lists, and every recording that got a first frame must play in ffprobe.
///
/// Behaviours that kill their process (SIGSEGV, abort) only run isolated (`--isolate`): in-process,
/// a backend's crash is the agent's crash by definition, which is what isolation is for.
@Suite(.serialized, .tags(.integration)) struct ChaosTests {
    static let runs = 200
    /// --seconds of each run: long enough for every behaviour (after_ms < 1000) to fire.
    static let runSeconds = 1.5
    /// A run's bound: its length, the watchdog's budgets for a hung start, stop and destroy,
    /// and start-up, with room for a loaded machine.
    static let runBound = 20.0

    struct Outcome {
        let seed: Int
        let isolated: Bool
        let behaviour: String
        let signalled: Bool
        let status: Int32
        let seconds: Double
        let encodedFrames: Int
        let problem: String?
    }

    @Test func twoHundredMisbehavingBackendsNeverTakeTheAgentDown() throws {
        try Harness.requireBuild()
        guard let ffprobe = Harness.which("ffprobe") else { return skipTest("ffprobe is not installed (scripts/setup installs ffmpeg)") }
        let dir = try Harness.temporaryDirectory()
        _ = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/misbehaving_backend.c", into: dir, name: "misbehaving")
        try "{\"version\": 1, \"default\": \"chaos\", \"backends\": {\"chaos\": {\"library\": \"\(dir)/libmisbehaving.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        let documented = try documentedStatuses()

        let outcomes = ChaosOutcomes()
        // One run at a time. Two at a time (both cores, floods included) starved the suites that run
        // beside this one: a CI run's aiortc receiver under 5 % loss froze 2.5 s (its limit is 1 s).
        for seed in 1...Self.runs {
            outcomes.add(run(seed: seed, dir: dir, ffprobe: ffprobe, documented: documented))
        }
        let all = outcomes.all.sorted { $0.seed < $1.seed }
        #expect(all.count == Self.runs)

        // The table a reader of the log wants: which behaviour ended how.
        var byBehaviour: [String: [Outcome]] = [:]
        for outcome in all { byBehaviour[outcome.behaviour + (outcome.isolated ? " (isolated)" : ""), default: []].append(outcome) }
        print("chaos: \(all.count) runs; behaviour: runs, exit statuses, slowest end, runs with a first frame")
        for (behaviour, group) in byBehaviour.sorted(by: { $0.key < $1.key }) {
            let statuses = Set(group.map(\.status)).sorted().map(String.init).joined(separator: ",")
            print(String(format: "  %-28@ %3d runs  status %@  slowest %.1f s  recorded %d", behaviour as NSString, group.count,
                         statuses, group.map(\.seconds).max() ?? 0, group.filter { $0.encodedFrames > 0 }.count))
        }
        let failed = all.filter { $0.problem != nil }
        for outcome in failed.prefix(20) {
            Issue.record("seed \(outcome.seed) (\(outcome.behaviour)\(outcome.isolated ? ", isolated" : "")): \(outcome.problem!)")
        }
        print("chaos: \(all.count - failed.count) passed, \(failed.count) failed")
        // Isolation must have been exercised with the behaviours that need it.
        #expect(all.contains { $0.isolated && $0.behaviour.hasPrefix("crash") })
    }

    /// One run: odd seeds isolated with every behaviour, even seeds in-process with the
    /// behaviours that do not kill a process; every third run is sent SIGTERM at a moment
    /// between 0.5 and 1.4 s after it started instead of running to its end.
    func run(seed: Int, dir: String, ffprobe: String, documented: Set<Int32>) -> Outcome {
        let isolated = seed % 2 == 1
        let signalled = seed % 3 == 0
        let recording = dir + "/chaos-\(seed).webm"
        var arguments = ["--plugins", dir + "/plugins.json", "--option", "misbehave=\(isolated ? "random" : "random-safe")",
                         "--option", "seed=\(seed)", "--record", recording, "--seconds", String(Self.runSeconds), "--verbose"]
        arguments.append(isolated ? "--isolate" : "--no-isolate")
        let timeout = signalled ? 0.5 + Double((seed * 7919) % 900) / 1000 : Self.runBound
        let started = Date()
        let result: Harness.Result
        do {
            result = try Harness.run(Harness.agent, arguments, timeout: timeout, currentDirectory: dir)
        } catch {
            return Outcome(seed: seed, isolated: isolated, behaviour: "?", signalled: signalled, status: -1, seconds: 0,
                           encodedFrames: 0, problem: "could not run the agent: \(error)")
        }
        let seconds = Date().timeIntervalSince(started)
        let behaviour = result.stderr.range(of: "random misbehaviour ").map { range in
            String(result.stderr[range.upperBound...].prefix { $0 != " " })
        } ?? "?"
        let encoded = result.stdout.range(of: "encoded: ").flatMap { range in
            Int(result.stdout[range.upperBound...].prefix { $0.isNumber })
        } ?? 0

        var problem: String?
        if result.status > 128 && !documented.contains(result.status) {
            problem = "the agent died on signal \(result.status - 128)"
        } else if !documented.contains(result.status) {
            problem = "exit status \(result.status) is not in docs/exit-codes.md"
        } else if seconds > (signalled ? timeout + (behaviour == "hang-start" ? 5 : 4) : Self.runBound) {
            // A signalled run gets 5 s between SIGTERM and SIGKILL from the harness: ending in 4 is "cleanly".
            // A start() that hangs holds the run for its budget (5 s, CallBudgets.start) signal or not: the
            // agent waits for the call in flight before it ends (seed 51: SIGTERM 0.6 s into the hang, 4.03 s
            // to end); ending before the harness's SIGKILL is what it promises then.
            problem = String(format: "took %.1f s", seconds)
        } else if result.timedOut && !signalled {
            problem = "did not end within \(Self.runBound) s"
        } else if encoded > 0 {
            let probe = try? Harness.run(ffprobe, ["-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
                                                   "stream=nb_read_frames", "-of", "csv=p=0", recording], timeout: 30)
            let decoded = Int(probe?.stdout.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 0
            if decoded < 1 {
                problem = "encoded \(encoded) frames but ffprobe decodes \(decoded) from \(recording): \(probe?.stderr.prefix(300) ?? "")"
            }
        }
        if problem != nil {
            problem! += "; stderr: " + String(result.stderr.suffix(600)).replacingOccurrences(of: "\n", with: " | ")
        }
        try? FileManager.default.removeItem(atPath: recording)
        return Outcome(seed: seed, isolated: isolated, behaviour: behaviour, signalled: signalled, status: result.status,
                       seconds: seconds, encodedFrames: encoded, problem: problem)
    }

    /// The statuses docs/exit-codes.md lists for the recording run (its first table).
    func documentedStatuses() throws -> Set<Int32> {
        let text = try String(contentsOfFile: Harness.repoRoot + "/docs/exit-codes.md", encoding: .utf8)
        let firstTable = text.components(separatedBy: "\n## ").first ?? text
        var statuses: Set<Int32> = []
        for line in firstTable.split(separator: "\n") where line.hasPrefix("|") {
            let cell = line.split(separator: "|").first?.trimmingCharacters(in: .whitespaces) ?? ""
            if let status = Int32(cell) { statuses.insert(status) }
        }
        try #require(statuses.contains(0) && statuses.contains(22), "docs/exit-codes.md's first table was not read")
        return statuses
    }
}

/// Outcomes collected from the two workers.
final class ChaosOutcomes: @unchecked Sendable {
    private let lock = NSLock()
    private var outcomes: [ChaosTests.Outcome] = []
    func add(_ outcome: ChaosTests.Outcome) { lock.withLock { outcomes.append(outcome) } }
    var all: [ChaosTests.Outcome] { lock.withLock { outcomes } }
}
