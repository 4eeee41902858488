import Foundation
import Testing

/// The conformance suite on every in-tree backend that runs in CI, on the
/// C example built out of tree from the header alone, and on deliberately
/// broken backends (so the suite is shown to fail when it should).
@Suite("Backend conformance")
struct ConformanceTests {
    func conformance(_ library: String, _ options: [String], expectEnd: Bool = true) throws -> Harness.Result {
        try Harness.agent(["conformance", library] + options.flatMap { ["--option", $0] } + (expectEnd ? ["--expect-end"] : []), timeout: 120)
    }

    func expectAllPass(_ result: Harness.Result, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 0, "exit \(result.status)\n\(result.stdout)\(result.stderr)", sourceLocation: sourceLocation)
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.filter { $0.hasPrefix("PASS") }.count == 16, "\(result.stdout)", sourceLocation: sourceLocation)
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

        let run = try Harness.agent(["--plugins", dir + "/plugins.json", "--backend", "bouncing-box", "--frames", "45", "-q"])
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
}
