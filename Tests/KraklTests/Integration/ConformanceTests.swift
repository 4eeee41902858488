import Foundation
import Testing

/// The conformance suite on every in-tree backend that runs in CI, on the
/// C example built out of tree from the header alone, and on deliberately
/// broken backends (so the suite is shown to fail when it should).
@Suite("Backend conformance", .tags(.integration))
struct ConformanceTests {
    func conformance(_ library: String, _ options: [String], expectEnd: Bool = true) throws -> Harness.Result {
        try Harness.agent(["conformance", library] + options.flatMap { ["--option", $0] } + (expectEnd ? ["--expect-end"] : []), timeout: 120)
    }

    func expectAllPass(_ result: Harness.Result, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 0, "exit \(result.status)\n\(result.stdout)\(result.stderr)", sourceLocation: sourceLocation)
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.filter { $0.hasPrefix("PASS") }.count == 25, "\(result.stdout)", sourceLocation: sourceLocation)
        #expect(result.stdout.contains("conformance: 25 passed, 0 failed, 0 skipped"), "\(result.stdout)", sourceLocation: sourceLocation)
        #expect(!lines.contains { $0.hasPrefix("FAIL") || $0.hasPrefix("SKIP") }, "\(result.stdout)", sourceLocation: sourceLocation)
    }

    @Test(arguments: ["static", "typing", "scrolling", "video"])
    func fileBackendScenesConform(scene: String) throws {
        try Harness.requireBuild()
        expectAllPass(try conformance(Harness.library("BackendFile"), ["scene=\(scene)", "width=320", "height=240", "frames=40", "fps=60"]))
    }

    @Test func fileBackendY4MConforms() throws {
        try Harness.requireBuild()
        guard let ffmpeg = Harness.which("ffmpeg") else {
            skipTest("ffmpeg is not installed (scripts/setup installs it)")
            return
        }
        let dir = try Harness.temporaryDirectory()
        let clip = dir + "/testsrc.y4m"
        let made = try Harness.run(ffmpeg, ["-v", "error", "-f", "lavfi", "-i", "testsrc2=s=320x240:r=30:d=1", "-pix_fmt", "yuv420p", clip])
        try #require(made.status == 0, "\(made.stderr)")
        expectAllPass(try conformance(Harness.library("BackendFile"), ["path=\(clip)", "fps=60"]))
    }

    /// The drop-in proof: the example is copied with only the public header
    /// into an empty folder, compiled with `cc -shared`, registered in a
    /// plugins.json, run with --backend, and passes conformance.
    @Test func cExampleBuiltOutOfTreeFromTheHeaderAlone() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let fm = FileManager.default
        try fm.copyItem(atPath: Harness.header + "/krakl_backend.h", toPath: dir + "/krakl_backend.h")
        try fm.copyItem(atPath: Harness.repoRoot + "/examples/c-backend/bouncing_box.c", toPath: dir + "/bouncing_box.c")
        let cc = try Harness.run("/usr/bin/cc", ["-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", "-pthread",
                                                 "-I", dir, dir + "/bouncing_box.c", "-o", dir + "/libbouncing_box.so"], currentDirectory: dir)
        try #require(cc.status == 0, "cc: \(cc.stderr)")
        try fm.copyItem(atPath: Harness.repoRoot + "/examples/c-backend/plugins.json", toPath: dir + "/plugins.json")

        expectAllPass(try conformance(dir + "/libbouncing_box.so", ["frames=60"]))

        let run = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", dir + "/plugins.json", "--backend", "bouncing-box", "--frames", "45", "-q"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout.contains("summary: 45 frames"), "\(run.stdout)")
    }

    @Test func aNewerMinorTableWithExtraMembersIsAccepted() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let library = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: dir, name: "fixture", defines: ["-DBIGGER_TABLE"])
        let result = try conformance(library, [], expectEnd: false)
        #expect(result.status == 0, "\(result.stdout)")
        #expect(result.stdout.contains("ABI minor 7 is newer than the agent's 1, extra members ignored"), "\(result.stdout)")
    }

    /// A backend built for ABI 1.0 (a 56-byte table, no list_sources) keeps
    /// working with this 1.1 agent: the size rule at work.
    @Test func anABI10TableStillLoadsAndPasses() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let library = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: dir, name: "fixture", defines: ["-DTABLE_SIZE=56"])
        let result = try conformance(library, [], expectEnd: false)
        #expect(result.status == 0, "\(result.stdout)")
        #expect(result.stdout.contains("table is 56 bytes (agent knows 64)"), "\(result.stdout)")
        try "{\"version\": 1, \"default\": \"fixture\", \"backends\": {\"fixture\": {\"library\": \"libfixture.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        let sources = try Harness.agent(["sources", "--plugins", dir + "/plugins.json"])
        #expect(sources.status == 0 && sources.stdout.contains("does not list sources"), "\(sources.stdout)\(sources.stderr)")
    }

    @Test(arguments: [("-DLATE_FRAMES", "FAIL  no-frame-after-stop"),
                      ("-DBAD_DAMAGE", "FAIL  damage-inside-frame"),
                      ("-DBAD_STRIDE", "FAIL  frames-valid")])
    func brokenBackendsFail(define: String, failure: String) throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let library = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: dir, name: "broken", defines: [define])
        let result = try conformance(library, [], expectEnd: false)
        #expect(result.status == 1, "a broken backend (\(define)) passed:\n\(result.stdout)")
        #expect(result.stdout.contains(failure), "\(result.stdout)")
        #expect(result.stdout.contains("SKIP  source-ended"))
    }

    // MARK: the misbehaving fixture: each broken contract fails its check, and the suite survives

    static let misbehaving = BuiltOnce {
        try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/misbehaving_backend.c", into: try Harness.temporaryDirectory(), name: "misbehaving")
    }

    /// Runs conformance on the fixture with `--timeout 3`, and checks what every run
    /// must show however the backend behaves: it ended by itself within the bound it
    /// printed, every check has exactly one line, and the summary line is there.
    func judge(_ behaviour: String, _ extra: [String] = [], expectEnd: Bool = false, environment: [String: String]? = nil,
               sourceLocation: SourceLocation = #_sourceLocation) throws -> Harness.Result {
        try Harness.requireBuild()
        let library = try Self.misbehaving.get()
        let arguments = ["conformance", library, "--timeout", "3", "--option", "misbehave=\(behaviour)"]
            + extra.flatMap { ["--option", $0] } + (expectEnd ? ["--expect-end"] : [])
        let started = Date()
        // The harness's own limit is far above the suite's bound: reaching it is a failure.
        let result = try Harness.agent(arguments, timeout: 400, environment: environment)
        let elapsed = Date().timeIntervalSince(started)
        #expect(!result.timedOut, "conformance did not end: \(result.stdout)", sourceLocation: sourceLocation)
        let bound = try result.stdout.firstMatch(of: Regex(#"at most (\d+) s"#)).flatMap { Double($0.output[1].substring ?? "") }
        #expect(bound != nil && elapsed <= bound! + 5, "took \(elapsed) s, bound \(bound ?? -1) s\n\(result.stdout)", sourceLocation: sourceLocation)
        let lines = result.stdout.split(separator: "\n").filter { $0.hasPrefix("PASS") || $0.hasPrefix("FAIL") || $0.hasPrefix("SKIP") }
        let names = lines.map { $0.dropFirst(6).prefix { $0 != ":" } }
        #expect(names.count == 25 && Set(names).count == 25, "each check once:\n\(result.stdout)", sourceLocation: sourceLocation)
        #expect(try result.stdout.contains(Regex(#"conformance: \d+ passed, \d+ failed, \d+ skipped\n"#)), "\(result.stdout)", sourceLocation: sourceLocation)
        return result
    }

    @Test func aWellBehavedFixturePasses() throws {
        let result = try judge("none")
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(result.stdout.contains("conformance: 24 passed, 0 failed, 1 skipped"), "\(result.stdout)")
        let ending = try judge("end", ["after_ms=500"], expectEnd: true)
        #expect(ending.status == 0 && ending.stdout.contains("conformance: 25 passed, 0 failed, 0 skipped"), "\(ending.stdout)\(ending.stderr)")
    }

    /// Each behaviour breaks the contract one way; the FAIL line names the check and
    /// says what happened (the call that crashed or hung, the value returned).
    @Test(arguments: [
        ("two-threads", "FAIL  callbacks-one-thread: after start() #1, host->frame/event came from two different threads"),
        // Issue 23, item 4.14: silently ignored before, now reported and failed.
        ("null-frame", "FAIL  callbacks-well-formed: host->frame(NULL)"),
        ("null-event", "FAIL  callbacks-well-formed: host->event(NULL)"),
        ("unknown-event", "FAIL  callbacks-well-formed: an event of type 42"),
        ("two-threads", "FAIL  callbacks-serial: host->frame was called while another frame or event callback"),
        ("deliver-in-create", "FAIL  nothing-before-start: host->frame was called from inside create()"),
        ("partial-first", "FAIL  first-frame-whole: frame 1 after start() #1 names 2 damage rectangle(s)"),
        ("list-crash", "FAIL  list-sources: the backend crashed with SIGSEGV during list_sources()"),
        ("start-positive", "FAIL  return-values: start() returned 7"),
        ("stop-positive", "FAIL  return-values: stop() returned 3"),
        ("create-positive", "FAIL  create-destroy: create() returned 5"),
        ("create-intmin", "FAIL  create-destroy: create() returned -2147483648, which is not a negative errno"),
        ("after-destroy", "FAIL  nothing-after-destroy: host->log was called after destroy() returned"),
        ("crash-start", "FAIL  delivers-frames: the backend crashed with SIGSEGV during start()"),
        ("crash-thread", "FAIL  delivers-frames: the backend crashed with SIGSEGV on a thread of its own"),
        ("abort-thread", "FAIL  delivers-frames: the backend crashed with SIGABRT on a thread of its own"),
        ("exit-thread", "FAIL  delivers-frames: the backend ended the process (exit status 3)"),
        ("crash-create", "FAIL  create-destroy: the backend crashed with SIGSEGV during create()"),
        ("hang-create", "FAIL  create-destroy: create() did not return within"),
        ("hang-start", "FAIL  delivers-frames: start() did not return within"),
        ("hang-stop", "FAIL  stop-within-1s: stop() did not return within"),
        ("hang-destroy", "FAIL  create-destroy: destroy() did not return within"),
        ("slow-stop", "FAIL  stop-within-1s: stop() took"),
        ("ts-back", "FAIL  timestamps-monotonic: frame"),
        ("ts-constant", "FAIL  timestamps-monotonic: frame 2 after start() #1"),
        ("ts-ahead", "FAIL  timestamps-near-clock: frame 1 after start() #1: timestamp"),
        ("size-change", "FAIL  size-changes-announced: frame"),
        ("format-no-frame", "FAIL  size-changes-announced: FORMAT_CHANGED announced 640x480 BGRx but the next frame"),
        ("after-stop", "FAIL  no-frame-after-stop"),
    ])
    func aBrokenContractFailsItsCheck(behaviour: String, failure: String) throws {
        let result = try judge(behaviour)
        #expect(result.status == 1, "\(behaviour) passed:\n\(result.stdout)\(result.stderr)")
        #expect(result.stdout.contains(failure), "\(behaviour):\n\(result.stdout)")
        // The run went on after a crash or a hang: later groups still reported.
        #expect(result.stdout.contains("SKIP  source-ended: not asked to end"), "\(result.stdout)")
    }

    /// A hung stop() in the last group too: the suite still ends, and the bound it
    /// prints covers it (the parent kills what overran).
    @Test func aHungStopFailsEveryGroupThatStopsAndTheRunStillEnds() throws {
        let result = try judge("hang-stop", expectEnd: true)
        #expect(result.status == 1)
        #expect(result.stdout.contains("FAIL  no-leaks: stop() did not return within"), "\(result.stdout)")
        #expect(result.stdout.contains("FAIL  source-ended: no SOURCE_ENDED event") || result.stdout.contains("FAIL  source-ended: stop() did not return"), "\(result.stdout)")
    }

    /// A library whose constructor ends the process that loads it fails the
    /// handshake (in the child), and the rest is skipped, not lost.
    @Test func aConstructorThatExitsFailsTheHandshake() throws {
        let result = try judge("none", environment: ["KRAKL_FIXTURE_CONSTRUCTOR": "exit"])
        #expect(result.status == 1)
        #expect(result.stdout.contains("FAIL  abi-handshake: the backend ended the process (exit status 4) during dlopen"), "\(result.stdout)")
        #expect(result.stdout.contains("SKIP  delivers-frames: the library did not load"), "\(result.stdout)")
    }

    /// A source that never delivers fails delivers-frames; the frame checks say they saw
    /// nothing rather than pass.
    @Test func aSilentSourceFailsDeliveryAndSkipsTheFrameChecks() throws {
        let result = try judge("silent")
        #expect(result.status == 1)
        #expect(result.stdout.contains("FAIL  delivers-frames: no frame within 3.0 s of start()"), "\(result.stdout)")
        for check in ["frames-valid", "first-frame-whole", "timestamps-monotonic", "callbacks-serial"] {
            #expect(result.stdout.contains("SKIP  \(check): no frame arrived to judge"), "\(result.stdout)")
        }
    }

    /// A flood of frames (no pacing) is judged over a bounded window, not followed forever.
    @Test func aFloodingBackendIsJudgedWithinTheBound() throws {
        let result = try judge("flood")
        #expect(result.stdout.contains("PASS  delivers-frames"), "\(result.stdout)")
    }

    /// Killing the parent leaves no child behind with a hung backend in it.
    @Test func childrenEndWithTheParent() throws {
        try Harness.requireBuild()
        let library = try Self.misbehaving.get()
        let agent = try RunningAgent(["conformance", library, "--timeout", "30", "--option", "misbehave=hang-start"])
        #expect(agent.read(until: "PASS  list-sources", timeout: 60), "\(agent.output)")
        // The delivery group's child is now in start(), which never returns.
        let parent = agent.process.processIdentifier
        let deliveryChild = { () -> [pid_t] in
            let text = procText("/proc/\(parent)/task/\(parent)/children")
            return text.split(separator: " ").compactMap { pid_t($0) }.filter { pid in
                let command = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
                return String(decoding: command, as: UTF8.self).contains("\u{0}delivery\u{0}")
            }
        }
        var child = deliveryChild()
        let deadline = Date().addingTimeInterval(10)
        while child.isEmpty && Date() < deadline { usleep(20_000); child = deliveryChild() }
        try #require(child.count == 1, "the suite's delivery process was not found")
        agent.signal(SIGKILL)
        agent.process.waitUntilExit()
        var gone = false
        let end = Date().addingTimeInterval(10)
        while !gone && Date() < end {
            gone = kill(child[0], 0) != 0 || ((try? String(contentsOfFile: "/proc/\(child[0])/stat", encoding: .utf8))?.contains(") Z ") ?? true)
            if !gone { usleep(20_000) }
        }
        #expect(gone, "child \(child[0]) outlived the suite")
    }
}
