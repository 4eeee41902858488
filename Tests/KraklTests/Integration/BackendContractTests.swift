import Foundation
import Glibc
import KraklBackendABI
@testable import KraklBase
@testable import KraklHost
import KraklRoom
import KraklRTC
import KraklSession
import Testing

/// The host's side of the backend contract, against Tests/Fixtures/misbehaving_backend.c: a
/// backend that hangs, returns what the ABI does not define, delivers when it must not, lies
/// about damage, sizes or time, floods, calls from two threads or after destroy, or writes
/// escape sequences, never takes the agent down, hangs it, or gets bad data past the host.
/// In-process tests drive BackendSource; real-agent tests check what a person sees (exit
/// statuses, one-line errors, a recording finalized after SIGTERM).
@Suite("Backend contract at the host", .tags(.integration, .netns))
struct BackendContractTests {
    // MARK: - Fixture and helpers

    static let fixture = BuiltOnce {
        try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/misbehaving_backend.c",
                                   into: try Harness.temporaryDirectory(), name: "misbehaving")
    }

    static func library() throws -> BackendLibrary {
        try BackendLibrary.load(path: try fixture.get(), backend: "misbehaving")
    }

    /// A plugins.json in a fresh folder naming the fixture "misbehaving" (the default).
    static func registry(extra: String = "") throws -> String {
        let dir = try Harness.temporaryDirectory()
        let path = dir + "/plugins.json"
        try "{\"version\": 1, \"default\": \"misbehaving\", \"backends\": {\(extra)\"misbehaving\": {\"library\": \"\(try fixture.get())\"}}}"
            .write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func options(_ behaviour: String, _ extra: [String: String] = [:]) -> JSONObject {
        var object = JSONObject()
        object["misbehave"] = .string(behaviour)
        for (key, value) in extra.sorted(by: { $0.key < $1.key }) { object[key] = .number(value) }
        return object
    }

    /// Small budgets, so a hang costs the test half a second, not the standard seconds.
    static var quickBudgets: CallBudgets {
        var budgets = CallBudgets()
        budgets.create = .milliseconds(500)
        budgets.start = .milliseconds(500)
        budgets.stop = .milliseconds(500)
        budgets.destroy = .milliseconds(500)
        return budgets
    }

    static func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = MonotonicClock.nanoseconds()
        try body()
        return Double(MonotonicClock.nanoseconds() - start) / 1e9
    }

    // MARK: - Watchdog (issue 13 item 2)

    @Test func aStopThatNeverReturnsIsGivenUpAfterItsBudgetAndTheSourceIsDead() throws {
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("hang-stop"),
                                       sink: sink, logger: { _, _, _ in }, budgets: Self.quickBudgets)
        try source.start()
        #expect(sink.waitForFrames(3, timeout: 10) >= 3)
        var thrown: HostError?
        let took = Self.seconds { do throws(HostError) { try source.stop() } catch { thrown = error } }
        #expect(thrown == .backendHung(backend: "misbehaving", call: "stop", budgetSeconds: 0.5))
        // A hang guard (20x the 0.5 s budget); the error above judges that the budget ended the call.
        #expect(took < 10, "stop() took \(took) s")
        // Dead: later calls are refused with the same error and never reach the backend (a destroy()
        // while stop() still runs would be a use-after-free in any real backend).
        #expect(throws: HostError.backendHung(backend: "misbehaving", call: "stop", budgetSeconds: 0.5)) { try source.destroy() }
        #expect(throws: HostError.backendHung(backend: "misbehaving", call: "stop", budgetSeconds: 0.5)) { try source.start() }
        // The capture thread of the hung source goes on delivering; none of it reaches the sink.
        let counted = sink.frameCount
        sink.observe(for: 0.3)
        #expect(sink.frameCount == counted, "\(sink.frameCount - counted) frames of a dead source reached the sink")
    }

    @Test func aDestroyThatNeverReturnsIsGivenUp() throws {
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("hang-destroy"),
                                       sink: ContractSink(), logger: { _, _, _ in }, budgets: Self.quickBudgets)
        try source.start()
        try source.stop()
        #expect(throws: HostError.backendHung(backend: "misbehaving", call: "destroy", budgetSeconds: 0.5)) { try source.destroy() }
    }

    @Test func aStartOrCreateThatNeverReturnsIsGivenUp() throws {
        let library = try Self.library()
        let source = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("hang-start"),
                                       sink: ContractSink(), logger: { _, _, _ in }, budgets: Self.quickBudgets)
        #expect(throws: HostError.backendHung(backend: "misbehaving", call: "start", budgetSeconds: 0.5)) { try source.start() }
        #expect(throws: HostError.backendHung(backend: "misbehaving", call: "create", budgetSeconds: 0.5)) {
            _ = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("hang-create"),
                                  sink: nil, logger: { _, _, _ in }, budgets: Self.quickBudgets)
        }
    }

    /// Releasing a started source whose stop() hangs (a session torn down, a scan that returned)
    /// costs the stop budget, not forever.
    @Test func releasingAHungSourceDoesNotBlockPastItsBudget() throws {
        let library = try Self.library()
        var source: BackendSource? = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("hang-stop"),
                                                       sink: ContractSink(), logger: { _, _, _ in }, budgets: Self.quickBudgets)
        try source?.start()
        let took = Self.seconds { source = nil }
        #expect(source == nil)
        // A hang guard (20x the 0.5 s stop budget): releasing it must not wait for the hung stop().
        #expect(took < 10, "deinit took \(took) s")
    }

    /// A source that came and went leaves no control thread behind (the no-leaks rule of
    /// conformance and the session's thread counts).
    @Test func controlThreadsEndWithTheirSources() throws {
        let library = try Self.library()
        func cycle() throws -> Set<pid_t> {
            let sink = ContractSink()
            let source = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("none"), sink: sink, logger: { _, _, _ in })
            try source.start()
            _ = sink.waitForFrames(1, timeout: 5)
            let used: Set<pid_t> = [source.controlThreadID, sink.deliveringThreadID]
            try source.destroy()
            return used
        }
        // The threads of each cycle by their kernel ids: the host's control thread and the backend's
        // capture thread (the one that delivered the frames). Other suites make and end threads in
        // this process meanwhile, so the count of all threads would judge nothing exact.
        var threads: Set<pid_t> = []
        for _ in 0..<10 { threads.formUnion(try cycle()) }
        #expect(threads.count == 20 && !threads.contains(0), "one control and one capture thread a cycle: \(threads.sorted())")
        func alive() -> [pid_t] {
            let tasks = Set(((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []).compactMap { pid_t($0) })
            return threads.filter { tasks.contains($0) }.sorted()
        }
        let deadline = Date().addingTimeInterval(5)
        while !alive().isEmpty && Date() < deadline { ContractSink().observe(for: 0.02) }
        #expect(alive().isEmpty, "threads of destroyed sources still running: \(alive())")
    }

    // MARK: - Return values (item 3)

    @Test func returnValuesTheABIDoesNotDefineAreFailures() throws {
        let library = try Self.library()
        func createError(_ behaviour: String) -> HostError? {
            do throws(HostError) {
                _ = try BackendSource(library: library, backendName: "misbehaving", options: Self.options(behaviour), sink: nil, logger: { _, _, _ in })
                return nil
            } catch { return error }
        }
        let intMin = createError("create-intmin")
        #expect(intMin == .createFailed(backend: "misbehaving", code: Int32.min, message: "the backend gave no reason"))
        #expect(intMin?.description.contains("returned -2147483648, which the ABI does not define") == true, "\(String(describing: intMin))")
        let positive = createError("create-positive")
        #expect(positive?.description.contains("returned 5, which the ABI does not define") == true, "\(String(describing: positive))")
        #expect(positive?.description.contains("EINVAL") == false)

        let sink = ContractSink()
        let started = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("start-positive"), sink: sink, logger: { _, _, _ in })
        #expect(throws: HostError.startFailed(backend: "misbehaving", code: 7, message: "start() failed")) { try started.start() }
        #expect(!started.isStarted)
        // The host called stop() after the undefined start(): the fixture's thread is joined, nothing more arrives.
        let counted = sink.frameCount
        sink.observe(for: 0.2)
        #expect(sink.frameCount == counted)

        let stopped = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("stop-positive"), sink: nil, logger: { _, _, _ in })
        try stopped.start()
        try stopped.stop()
        #expect(stopped.violations.contains { $0.kind == .undefinedReturnValue && $0.first.contains("stop() returned 3") })

        // A defined error from stop() is no breach, but it is said (issue 23, item 4.15).
        let said = LogLines()
        let failing = try BackendSource(library: library, backendName: "misbehaving", options: Self.options("stop-eio"), sink: nil,
                                        logger: said.logger)
        try failing.start()
        try failing.stop()
        #expect(!said.matching("stop() reported an error: EIO").isEmpty, "\(said.all)")

        // A NULL frame or event, an event of an undefined type: ignored, said once, counted (item 4.14).
        for (behaviour, words) in [("null-frame", "ignored host->frame(NULL)"), ("null-event", "ignored host->event(NULL)"),
                                   ("unknown-event", "ignored an event of type 42")] {
            let lines = LogLines()
            let sink = ContractSink()
            let source = try BackendSource(library: library, backendName: "misbehaving", options: Self.options(behaviour), sink: sink, logger: lines.logger)
            try source.start()
            sink.observe(for: 0.5)
            try source.stop()
            try source.destroy()
            #expect(lines.matching(words).count == 1, "\(behaviour): \(lines.all)")
            #expect(source.violations.contains { $0.kind == .malformedCallback && $0.count >= 1 }, "\(behaviour): \(source.violations)")
        }
    }

    @Test func errnoNamesAreTotalOverInt32() {
        #expect(errnoName(Int32.min) == "error -2147483648, not a negative errno")
        #expect(errnoName(-22) == "EINVAL")
        #expect(errnoName(-4095) == "errno 4095")
        #expect(errnoName(0) == "no error code")
        #expect(returnValueName(5) == "returned 5, which the ABI does not define")
        #expect(returnValueName(Int32.min) == "returned -2147483648, which the ABI does not define")
        #expect(returnValueName(-2) == "ENOENT")
    }

    // MARK: - Delivery contract (item 8)

    @Test func thePartialFirstFrameAfterEachStartIsTreatedAsWhollyDamaged() throws {
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("partial-first"),
                                       sink: sink, logger: { _, _, _ in })
        for run in 0..<2 {
            let before = sink.frameCount
            try source.start()
            #expect(sink.waitForFrames(before + 3, timeout: 10) >= before + 3)
            try source.stop()
            let frames = sink.snapshot()
            #expect(frames[before].damageCount == 0, "run \(run): the first frame after start() kept partial damage")
            #expect(frames[before + 1].damageCount == 2, "run \(run): later frames keep their damage")
        }
        #expect(source.violations.contains { $0.kind == .partialFirstFrame && $0.count == 2 })
        try source.destroy()
    }

    @Test func framesAfterStopReturnedAreDroppedAndCounted() throws {
        let sink = ContractSink()
        let lines = LogLines()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("after-stop"),
                                       sink: sink, logger: lines.logger)
        try source.start()
        #expect(sink.waitForFrames(3, timeout: 10) >= 3)
        try source.stop()
        let counted = sink.frameCount
        // The fixture delivers for 300 ms after stop() returned: the host must have counted some by then.
        let deadline = Date().addingTimeInterval(10)
        while !(source.violations.contains { $0.kind == .frameAfterStop }) && Date() < deadline { sink.observe(for: 0.02) }
        #expect(sink.frameCount == counted, "\(sink.frameCount - counted) frames after stop() reached the sink")
        #expect(source.violations.contains { $0.kind == .frameAfterStop })
        #expect(lines.matching("after stop() returned").count == 1, "\(lines.all)")
        try source.destroy()
    }

    @Test func framesAndEventsFromInsideCreateAreDropped() throws {
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("deliver-in-create"),
                                       sink: sink, logger: { _, _, _ in })
        #expect(sink.frameCount == 0)
        #expect(sink.eventCount == 0)
        let kinds = source.violations.map(\.kind)
        #expect(kinds.contains(.frameInCreate) && kinds.contains(.eventOutsideDelivery), "\(kinds)")
        try source.destroy()
    }

    @Test func aSizeChangeWithoutAnEventIsTreatedAsAFormatChange() throws {
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                       options: Self.options("size-change", ["after_ms": "100"]), sink: sink, logger: { _, _, _ in })
        try source.start()
        let deadline = Date().addingTimeInterval(10)
        while !(sink.snapshot().contains { $0.width == 160 }) && Date() < deadline { sink.observe(for: 0.02) }
        try source.stop()
        let frames = sink.snapshot()
        let first = try #require(frames.firstIndex { $0.width == 160 }, "the size never changed")
        #expect(frames[first].damageCount == 0, "the first frame at the new size kept partial damage")
        #expect(source.violations.contains { $0.kind == .unannouncedFormatChange })
        try source.destroy()
    }

    @Test func anAnnouncedFormatThatNeverComesIsLoggedOnce() throws {
        let lines = LogLines()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                       options: Self.options("format-no-frame", ["after_ms": "50"]), sink: ContractSink(), logger: lines.logger)
        try source.start()
        let deadline = Date().addingTimeInterval(10)
        while !(source.violations.contains { $0.kind == .announcedFormatNeverCame }) && Date() < deadline { ContractSink().observe(for: 0.02) }
        try source.stop()
        #expect(lines.matching("announced BGRx 640x480 but the next frame is BGRx 320x240").count == 1, "\(lines.all)")
        try source.destroy()
    }

    @Test(arguments: ["ts-back", "ts-ahead", "ts-constant"])
    func timestampsReachingTheSinkIncreaseAndStayNearNow(behaviour: String) throws {
        let sink = ContractSink()
        let lines = LogLines()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                       options: Self.options(behaviour, ["after_ms": "50", "fps": "100"]), sink: sink, logger: lines.logger)
        try source.start()
        #expect(sink.waitForFrames(30, timeout: 10) >= 30)
        try source.stop()
        try source.destroy()
        let frames = sink.snapshot()
        for (index, frame) in frames.enumerated() {
            if index > 0 { #expect(frame.timestamp > frames[index - 1].timestamp, "frame \(index): not after the previous one") }
            #expect(frame.timestamp <= frame.receivedNs, "frame \(index): \(frame.timestamp) is after its arrival \(frame.receivedNs)")
            #expect(frame.receivedNs - min(frame.timestamp, frame.receivedNs) <= 10_000_000_000, "frame \(index): more than 10 s old")
        }
        #expect(source.violations.contains { $0.kind == .timestamps })
        #expect(lines.matching("the host uses its own receive times").count == 1, "\(lines.all)")
    }

    @Test func deliveriesFromTwoThreadsAtOnceAreSerialized() throws {
        let sink = ContractSink()
        sink.holdMicroseconds = 300   // each delivery stays a while in the sink, so the two threads collide
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                       options: Self.options("two-threads", ["after_ms": "0"]), sink: sink, logger: { _, _, _ in })
        try source.start()
        let deadline = Date().addingTimeInterval(10)
        while !(source.violations.contains { $0.kind == .concurrentCallbacks }) && Date() < deadline { sink.observe(for: 0.02) }
        try source.stop()
        try source.destroy()
        #expect(source.violations.contains { $0.kind == .concurrentCallbacks })
        #expect(!sink.overlapped, "two deliveries were inside the sink at the same time")
    }

    /// A flood is cut at the host: over any stretch, the sink gets at most the cap's rate plus its
    /// burst (a bound a slow machine cannot break: it only gets fewer).
    @Test func aFloodingBackendIsCappedAtTheHost() throws {
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving", options: Self.options("flood"),
                                       sink: sink, logger: { _, _, _ in }, maximumFrameRate: 100)
        let started = MonotonicClock.nanoseconds()
        try source.start()
        sink.observe(for: 1.0)
        try source.stop()
        let elapsed = Double(MonotonicClock.nanoseconds() - started) / 1e9
        try source.destroy()
        let dropped = source.violations.first { $0.kind == .overRate }?.count ?? 0
        #expect(Double(sink.frameCount) <= 100 * elapsed + 13, "\(sink.frameCount) frames in \(elapsed) s through a 100/s cap")
        #expect(dropped > 0)
        print("flood through a 100/s cap: \(sink.frameCount) frames passed, \(dropped) dropped in \(String(format: "%.2f", elapsed)) s")
    }

    /// A thread the backend left behind calls log and frame after destroy() returned and the
    /// source was released: nothing reaches the sink or the logger, and nothing freed is touched
    /// (the process would crash under the old host).
    @Test func callbacksAfterDestroyAreDropped() throws {
        let sink = ContractSink()
        let lines = LogLines()
        var source: BackendSource? = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                                       options: Self.options("after-destroy"), sink: sink, logger: lines.logger)
        try source?.start()
        #expect(sink.waitForFrames(2, timeout: 10) >= 2)
        try source?.destroy()
        source = nil
        let counted = sink.frameCount
        sink.observe(for: 0.5)   // the orphan calls for 200 ms
        #expect(sink.frameCount == counted)
        #expect(lines.matching("still calling").isEmpty, "\(lines.all)")
    }

    // MARK: - Backend text (item 9)

    @Test func backendTextHasItsControlCharactersEscaped() throws {
        #expect(BackendText.sanitized("\u{1B}[2Jred\r\nbell\u{07} ok é ✓") == "\\x1b[2Jred\\x0d\\x0abell\\x07 ok é ✓")
        #expect(BackendText.sanitized("\u{9B}31m \u{202E}txt") == "\\x9b31m \\u{202e}txt")
        let lines = LogLines()
        let sink = ContractSink()
        let source = try BackendSource(library: try Self.library(), backendName: "misbehaving",
                                       options: Self.options("escape-log", ["after_ms": "0"]), sink: sink, logger: lines.logger)
        try source.start()
        let deadline = Date().addingTimeInterval(10)
        while sink.eventCount == 0 && Date() < deadline { sink.observe(for: 0.02) }
        try source.stop()
        try source.destroy()
        let texts = lines.all + sink.eventMessages
        #expect(texts.count >= 2, "\(texts)")
        for text in texts {
            #expect(!text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "raw control character in \(text.debugDescription)")
        }
        #expect(texts.contains { $0.contains("\\x1b]0;pwned title") })
    }

    // MARK: - The real agent: what a person sees

    /// Runs the agent on the fixture, capturing stdout and stderr, for signal tests.
    final class AgentRun {
        let process = Process()
        let out = Pipe(), err = Pipe()
        let folder: String
        init(_ arguments: [String]) throws {
            folder = try Harness.temporaryDirectory()
            process.executableURL = URL(fileURLWithPath: Harness.agent)
            process.arguments = arguments
            process.currentDirectoryURL = URL(fileURLWithPath: folder)
            process.standardOutput = out
            process.standardError = err
            process.standardInput = FileHandle.nullDevice
            try process.run()
            stdout = OutputReader(out)
            stderr = OutputReader(err)
        }
        private var stdout: OutputReader!, stderr: OutputReader!
        /// Ends it (after `seconds` without an exit, SIGKILL) and returns status, stdout, stderr.
        func finish(within seconds: Double) -> (exited: Bool, status: Int32, stdout: String, stderr: String) {
            let exited = Harness.waitForExit(process, seconds: seconds)
            if !exited {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
            return (exited, process.terminationReason == .exit ? process.terminationStatus : 128 + process.terminationStatus,
                    stdout.text(within: 10), stderr.text(within: 10))
        }
        deinit { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
    }

    /// SIGTERM/SIGINT end a run whose backend hangs in stop() or destroy(): within the budget,
    /// exit 22 naming the call, and the recording finalized (ffprobe reads it whole). Before
    /// the watchdog only SIGKILL ended it, and the recording was lost.
    @Test(arguments: [("hang-stop", SIGTERM, "stop"), ("hang-destroy", SIGINT, "destroy")])
    func aSignalEndsARunWhoseBackendHangs(behaviour: String, signal: Int32, call: String) throws {
        try Harness.requireBuild()
        let registry = try Self.registry()
        let run = try AgentRun(["--plugins", registry, "--option", "misbehave=\(behaviour)", "-q", "--record", "hang.webm"])
        let recording = run.folder + "/hang.webm"
        // Running once the recording has its first frames (bounded poll).
        let deadline = Date().addingTimeInterval(20)
        while ((try? FileManager.default.attributesOfItem(atPath: recording)[.size] as? Int) ?? 0) < 2000 && Date() < deadline {
            _ = Harness.waitForExit(run.process, seconds: 0.05)
        }
        kill(run.process.processIdentifier, signal)
        let signalled = MonotonicClock.nanoseconds()
        let result = run.finish(within: 60)
        let took = Double(MonotonicClock.nanoseconds() - signalled) / 1e9
        #expect(result.exited, "still running 60 s after the signal")
        #expect(result.status == 22, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("backend misbehaving hung: its \(call)() did not return within"), "\(result.stderr)")
        // A hang guard (10x the 5 s of the stop and destroy budgets); the exit status and message judge the end.
        #expect(took < 50, "ended \(took) s after the signal")
        if let ffprobe = Harness.which("ffprobe") {
            let probe = try Harness.run(ffprobe, ["-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames", "-of", "csv=p=0", recording])
            #expect(probe.status == 0 && (Int(probe.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) > 0,
                    "the recording is not whole: \(probe.stdout) \(probe.stderr)")
        } else {
            skipTest("ffprobe is not installed (scripts/setup installs it)")
        }
    }

    /// Nothing is added after the stop was asked for: with `--seconds 2` on a backend whose stop()
    /// hangs, the recording ends with the run's 2 s, not 5 s later when the watchdog gave up on
    /// stop() and destroy() (it held 61 frames over 5.0 s: the encoder's idle refreshes went on).
    @Test func nothingIsRecordedAfterTheStopWhileStopHangs() throws {
        try Harness.requireBuild()
        guard let ffprobe = Harness.which("ffprobe") else { skipTest("ffprobe is not installed (scripts/setup installs it)"); return }
        let registry = try Self.registry()
        let run = try AgentRun(["--plugins", registry, "--option", "misbehave=hang-stop", "-q", "--seconds", "2", "--refresh", "0.2",
                                "--record", "hang.webm"])
        let result = run.finish(within: 30)
        #expect(result.exited && result.status == 22, "exit \(result.status): \(result.stderr)")
        #expect(result.stdout.contains("stopped: 2.0 seconds elapsed"), "\(result.stdout)")
        let probe = try Harness.run(ffprobe, ["-v", "error", "-show_entries", "packet=pts_time", "-of", "csv=p=0", run.folder + "/hang.webm"])
        let times = probe.stdout.split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: .whitespaces)) }
        let last = times.max() ?? .infinity
        print("hang-stop with --seconds 2: \(times.count) frames recorded, the last at \(last) s")
        #expect(!times.isEmpty && last < 2.5, "the recording goes on to \(last) s (\(times.count) frames): frames were added after the stop")
    }

    static func threadNames(_ pid: Int32) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []).map {
            ((try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/comm", encoding: .utf8)) ?? "?").trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    /// Whether a thread of `pid` (or of a child of it) is named `name`: a readiness signal that
    /// needs nothing from the program's output.
    static func hasThread(named name: String, in pid: Int32) -> Bool {
        // Children by their parent in /proc/N/stat (the field after the ")" of the name, then the state).
        var pids = [pid]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let child = Int32(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { continue }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 1, Int32(fields[1]) == pid { pids.append(child) }
        }
        for p in pids {
            for task in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(p)/task")) ?? [] {
                let comm = (try? String(contentsOfFile: "/proc/\(p)/task/\(task)/comm", encoding: .utf8)) ?? ""
                if comm.trimmingCharacters(in: .whitespacesAndNewlines) == name { return true }
            }
        }
        return false
    }

    /// A signal ends a run whose backend has not returned from create() (a sharing dialog that
    /// waits, or a hang), in process and isolated: exit 0 with the reason, the outputs opened so far
    /// completed. Before, every signal but SIGKILL was ignored until the 900 s budget ran out.
    @Test(arguments: [["--no-isolate"], ["--isolate"]])
    func aSignalEndsARunWhoseBackendIsStillInCreate(isolation: [String]) throws {
        try Harness.requireBuild()
        let run = try AgentRun(["--plugins", try Self.registry(), "--option", "misbehave=hang-create", "-q",
                                "--record", "never.webm", "--stats-json", "stats.json"] + isolation)
        // In create(): the agent's thread that makes the source is there (bounded poll).
        let deadline = Date().addingTimeInterval(20)
        while !Self.hasThread(named: "krakl-create", in: run.process.processIdentifier) && Date() < deadline {
            _ = Harness.waitForExit(run.process, seconds: 0.05)
        }
        #expect(Self.hasThread(named: "krakl-create", in: run.process.processIdentifier),
                "never saw the agent making the source; its threads: \(Self.threadNames(run.process.processIdentifier))")
        kill(run.process.processIdentifier, SIGTERM)
        let result = run.finish(within: 10)
        #expect(result.exited, "still running 10 s after SIGTERM")
        #expect(result.status == 0, "exit \(result.status): \(result.stdout) \(result.stderr)")
        #expect(result.stdout.contains("terminated (SIGTERM) while backend misbehaving was still starting"), "\(result.stdout)")
        let stats = try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: run.folder + "/stats.json"))) as? [String: Any]
        #expect(stats?["captured_frames"] as? Int == 0, "stats.json: \(String(describing: stats))")
        #expect(!FileManager.default.fileExists(atPath: run.folder + "/never.webm"), "a recording without frames was left")
    }

    @Test(arguments: [("create-intmin", Int32(11), "returned -2147483648, which the ABI does not define"),
                      ("create-positive", Int32(11), "returned 5, which the ABI does not define"),
                      ("start-positive", Int32(12), "returned 7, which the ABI does not define"),
                      ("hang-start", Int32(22), "its start() did not return within 5 s")])
    func undefinedReturnValuesAndHangsExitWithTheirStatus(behaviour: String, status: Int32, words: String) throws {
        try Harness.requireBuild()
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", try Self.registry(), "--option", "misbehave=\(behaviour)", "--frames", "5", "-q"], timeout: 30)
        #expect(!result.timedOut)
        #expect(result.status == status, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains(words), "\(result.stderr)")
        #expect(result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
    }

    /// A backend whose timestamps stand still, run 30 s ahead or step back still gives a recording
    /// whose frames go forward in time (before: 150 frames all at time 0; 30 s ahead or a step
    /// back crashed the agent at its first refresh frame).
    @Test(arguments: ["ts-constant", "ts-ahead", "ts-back"])
    func aRecordingOfABackendWithBadTimestampsGoesForwardInTime(behaviour: String) throws {
        try Harness.requireBuild()
        guard let ffprobe = Harness.which("ffprobe") else {
            skipTest("ffprobe is not installed (scripts/setup installs it)")
            return
        }
        let dir = try Harness.temporaryDirectory()
        let result = try Harness.agent(["--plugins", try Self.registry(), "--option", "misbehave=\(behaviour)", "--option", "after_ms=100",
                                        "--frames", "45", "-q", "--record", dir + "/times.webm"], timeout: 30)
        #expect(result.status == 0, "exit \(result.status): \(result.stderr)")
        let probe = try Harness.run(ffprobe, ["-v", "error", "-show_entries", "packet=pts_time", "-of", "csv=p=0", dir + "/times.webm"])
        let times = probe.stdout.split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: .whitespaces)) }
        #expect(times.count >= 40, "\(times.count) frames: \(probe.stderr)")
        #expect(zip(times, times.dropFirst()).allSatisfy { $0 < $1 }, "times do not go forward: \(times.prefix(20))")
    }

    /// A picture that shrinks mid-run (here without the FORMAT_CHANGED event, which the host
    /// makes up for; the encoder sees the same either way) is recorded on: the encoder's rolling
    /// refresh band was left below the new picture's last row and trapped (4 of 8 such runs).
    @Test func aPictureThatShrinksMidRunIsRecordedOn() throws {
        try Harness.requireBuild()
        let registry = try Self.registry()
        for after in stride(from: 200, through: 900, by: 100) {
            let dir = try Harness.temporaryDirectory()
            let result = try Harness.agent(["--plugins", registry, "--option", "misbehave=size-change", "--option", "after_ms=\(after)",
                                            "--frames", "45", "-q", "--record", dir + "/shrink.webm"], timeout: 30)
            #expect(result.status == 0, "after_ms=\(after): exit \(result.status): \(result.stderr.prefix(300))")
        }
    }

    @Test func escapeSequencesFromABackendNeverReachTheTerminal() throws {
        try Harness.requireBuild()
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", try Self.registry(), "--option", "misbehave=escape-log", "--option", "after_ms=0",
                                        "--frames", "10", "-q"], timeout: 30)
        #expect(result.status == 13, "the ERROR event fails the run: exit \(result.status)")
        #expect(!result.stderr.utf8.contains(0x1B) && !result.stdout.utf8.contains(0x1B), "\(result.stderr.debugDescription)")
        #expect(result.stderr.contains("\\x1b[2Jcleared"), "\(result.stderr)")
    }

    @Test func aFloodingBackendCostsTheAgentNoMoreThanTheCap() throws {
        try Harness.requireBuild()
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", try Self.registry(), "--option", "misbehave=flood", "--seconds", "2", "-q"], timeout: 30)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.contains("dropped frames beyond 240 a second"), "\(result.stderr)")
        let frames = result.stdout.split(separator: "\n").first { $0.hasPrefix("summary:") }.flatMap { Int($0.split(separator: " ")[1]) }
        let count = try #require(frames, "\(result.stdout)")
        // 2 s at 240/s plus the burst, and a little slack for the run's own start and end.
        #expect(count <= 240 * 3, "\(count) frames in 2 s")
    }

    // MARK: - A sharing session (in a network namespace of its own, against Janus)

    /// A backend that hangs in stop() does not keep a session from leaving: the person's stop
    /// still ends it (as they asked) within the stop budget plus the leave, the room no longer
    /// lists the agent, and the hang is logged. One that hangs in start() ends the session with
    /// that as its reason (exit 22 for `--join --once`), and it too leaves the room.
    @Test func aSessionWhoseBackendHangsStillLeavesTheRoom() throws {
        guard let inside = try InNamespace.enter(suite: "BackendContractTests", timeout: 200, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        try KraklRTC.prepare()
        let registry = try Self.registry()
        let secret = "contract-\(UUID().uuidString.prefix(8))"
        for behaviour in ["hang-stop", "hang-start"] {
            let room = try janus.createRoom(secret: secret)
            let identity = "contract \(behaviour)"
            var configuration = SharingConfiguration()
            configuration.registryPath = registry
            configuration.backendOptions = [("misbehave", .string(behaviour))]
            configuration.publisher.addresses.allowed = [IPAddress("127.0.0.2")!]
            configuration.publisher.label = identity
            let lines = LogLines()
            let session = SharingSession(configuration: configuration, driver: JanusDriver(baseURL: JanusTestbed.api, room: "\(room)"),
                                         identity: identity, room: "\(room)", logger: lines.logger)
            let sharing = DispatchSemaphore(value: 0)
            session.onStateChange = { if $0 == .sharing { sharing.signal() } }
            try session.start()
            let reason: EndReason?
            if behaviour == "hang-stop" {
                try #require(sharing.wait(timeout: .now() + 20) == .success, "never shared (state \(session.state))")
                session.stop()
                reason = session.waitUntilFinished(timeout: .seconds(20))
                #expect(reason == .userStopped, "\(String(describing: reason))")
                #expect(lines.all.filter { $0.contains("hung: its stop() did not return within 2 s") && $0.contains("the session left the room") }.count == 1,
                        "\(lines.all)")
            } else {
                reason = session.waitUntilFinished(timeout: .seconds(40))
                #expect(reason == .sourceUnavailable(.backendHung(backend: "misbehaving", call: "start", budgetSeconds: 5)),
                        "\(String(describing: reason))")
            }
            #expect(session.state == .idle)
            let left = try janus.waitParticipants(room, seconds: 5) { !$0.contains { $0["display"] as? String == identity } }
            #expect(!left.contains { $0["display"] as? String == identity }, "\(behaviour): still in the room: \(left)")
        }
    }

    // MARK: - plugins.json and `backends` (item 9)

    @Test func anOversizedRegistryIsRefusedBeforeItIsRead() throws {
        try Harness.requireBuild()
        let path = try Harness.temporaryDirectory() + "/plugins.json"
        // Sparse: 50 MB that cost no disk and no time to make.
        let fd = open(path, O_WRONLY | O_CREAT, 0o644)
        try #require(fd >= 0)
        ftruncate(fd, 50 << 20)
        close(fd)
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", path, "--frames", "1"], timeout: 30)
        #expect(result.status == 4, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("it is 52428800 bytes; a registry may be at most 1024 KiB"), "\(result.stderr)")
    }

    @Test func aDirectoryOrFIFOAsRegistryIsNamedAndNeverBlocks() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let folder = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", dir, "--frames", "1"], timeout: 30)
        #expect(folder.status == 4)
        #expect(folder.stderr.contains("it is a directory, not a file"), "\(folder.stderr)")
        let fifo = dir + "/plugins.json"
        try #require(mkfifo(fifo, 0o644) == 0)
        let piped = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", fifo, "--frames", "1"], timeout: 30)
        #expect(!piped.timedOut, "blocked on the FIFO")
        #expect(piped.status == 4)
        #expect(piped.stderr.contains("it is a FIFO (named pipe), not a regular file"), "\(piped.stderr)")
    }

    @Test(arguments: [("exit", "does not load: exited with status 4 in its constructor"),
                      ("crash", "does not load: crashed (SIGSEGV) in its constructor")])
    func backendsGoesOnPastALibraryWhoseConstructorKillsItsLoader(how: String, words: String) throws {
        try Harness.requireBuild()
        // The fixture first, so "goes on" is visible: the file backend after it is still listed.
        let registry = try Self.registry(extra: "\"file\": {\"library\": \"\(Harness.library("BackendFile"))\"}, ")
        let result = try Harness.agent(["backends", "--plugins", registry], timeout: 60, environment: ["KRAKL_FIXTURE_CONSTRUCTOR": how])
        #expect(result.status == 0, "exit \(result.status): \(result.stderr)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains { $0.contains("misbehaving") && $0.contains("FAILS") && $0.contains(words) }, "\(result.stdout)")
        #expect(lines.contains { $0.contains("file") && $0.contains("loads    ABI 1.1") }, "\(result.stdout)")
    }

    // MARK: - The guide (header and guide section)

    /// The guide's build line, taken from docs/backend-guide.md as written, builds the example
    /// even without the example's own `#define _POSIX_C_SOURCE` (an author who copied the
    /// pieces shown in the guide), under its strict -std=c99 -Werror.
    @Test func theGuidesBuildLineBuildsTheExample() throws {
        let guide = try String(contentsOfFile: Harness.repoRoot + "/docs/backend-guide.md", encoding: .utf8)
        let building = try #require(guide.components(separatedBy: "## Building").dropFirst().first, "no Building section")
        let block = try #require(building.components(separatedBy: "```").dropFirst().first, "no build command in Building")
        let command = block.replacingOccurrences(of: "\\\n", with: " ").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(command.hasPrefix("cc ") && command.contains("-std=c99") && command.contains("-Werror"), "\(command)")

        let dir = try Harness.temporaryDirectory()
        let example = try String(contentsOfFile: Harness.repoRoot + "/examples/c-backend/bouncing_box.c", encoding: .utf8)
        let stripped = example.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !$0.hasPrefix("#define _POSIX_C_SOURCE") }.joined(separator: "\n")
        #expect(stripped != example, "the example no longer defines _POSIX_C_SOURCE itself; this test strips that line")
        for (name, text) in [("stripped", stripped), ("as shipped", example)] {
            let folder = dir + "/" + name.replacingOccurrences(of: " ", with: "-")
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try text.write(toFile: folder + "/bouncing_box.c", atomically: true, encoding: .utf8)
            let line = command.replacingOccurrences(of: "../../Sources/KraklBackendABI/include", with: Harness.header)
            let built = try Harness.run("/bin/sh", ["-c", line], currentDirectory: folder)
            #expect(built.status == 0, "\(name): `\(line)` failed:\n\(built.stderr)")
            #expect(FileManager.default.fileExists(atPath: folder + "/libbouncing_box.so"))
        }
    }
}

/// Collects what reaches the sink, and notices two deliveries inside it at once.
final class ContractSink: FrameSink, @unchecked Sendable {
    struct Frame {
        let width: Int, height: Int, damageCount: UInt32, timestamp: UInt64, receivedNs: UInt64
    }
    private let condition = Condition()
    private var frames: [Frame] = []
    private var events: [SourceEvent] = []
    private var inside = false
    private(set) var overlapped = false
    /// How long each frame stays in the sink (to make overlapping deliveries collide).
    var holdMicroseconds: UInt32 = 0

    /// The kernel id of the thread that delivered the last frame (0 before any).
    var deliveringThreadID: pid_t { condition.lock(); defer { condition.unlock() }; return _deliveringThreadID }
    private var _deliveringThreadID: pid_t = 0

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let received = MonotonicClock.nanoseconds()
        let f = pointer.pointee
        let thread = currentKernelThreadID()
        condition.lock()
        _deliveringThreadID = thread
        if inside { overlapped = true }
        inside = true
        frames.append(Frame(width: Int(f.width), height: Int(f.height), damageCount: f.damage_count, timestamp: f.timestamp_ns, receivedNs: received))
        condition.unlock()
        if holdMicroseconds > 0 { usleep(holdMicroseconds) }
        condition.lock()
        inside = false
        condition.broadcast()
        condition.unlock()
    }

    func event(_ event: SourceEvent) {
        condition.lock()
        events.append(event)
        condition.broadcast()
        condition.unlock()
    }

    var frameCount: Int { condition.withLock { frames.count } }
    var eventCount: Int { condition.withLock { events.count } }
    var eventMessages: [String] { condition.withLock { events.compactMap(\.message) } }
    func snapshot() -> [Frame] { condition.withLock { frames } }

    /// Waits (bounded) until `count` frames arrived; returns how many did.
    func waitForFrames(_ count: Int, timeout: Double) -> Int {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { frames.count < count }, until: Date().addingTimeInterval(timeout))
        return frames.count
    }

    /// An observation window (not a wait for readiness): lets `seconds` pass.
    func observe(for seconds: Double) {
        condition.lock()
        _ = condition.wait(while: { true }, until: Date().addingTimeInterval(seconds))
        condition.unlock()
    }
}

/// A logger that keeps its lines.
final class LogLines: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    var logger: BackendLogger { { [self] _, _, message in lock.withLock { lines.append(message) } } }
    var all: [String] { lock.withLock { lines } }
    func matching(_ text: String) -> [String] { all.filter { $0.contains(text) } }
}
