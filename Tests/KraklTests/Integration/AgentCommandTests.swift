import Foundation
import Testing

/// The agent's own commands, run as a person would run them.
@Suite("krakl-agent commands", .tags(.integration))
struct AgentCommandTests {
    @Test func backendsListsEveryEntryAndWhetherItLoads() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let result = try Harness.agent(["backends", "--plugins", registry])
        #expect(result.status == 0, "\(result.stderr)")
        for name in ["file", "x11", "pipewire"] {
            #expect(result.stdout.contains("  \(name) ") && result.stdout.range(of: "\\b\(name)\\s+loads\\s+ABI 1\\.1", options: .regularExpression) != nil,
                    "\(name) not listed as loading:\n\(result.stdout)")
        }
        #expect(result.stdout.contains("X11 screen capture: XDamage-tracked"))
        #expect(result.stdout.contains("PipeWire screen capture through the ScreenCast portal"))
    }

    @Test func backendsSaysWhyAnEntryDoesNotLoad() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        try """
        {"version": 1, "default": "file", "backends": {
          "file": {"library": "\(Harness.library("BackendFile"))"},
          "ghost": {"library": "nowhere/libghost.so", "description": "a backend not built"}}}
        """.write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        let result = try Harness.agent(["backends", "--plugins", dir + "/plugins.json"])
        #expect(result.status == 0)
        #expect(result.stdout.range(of: "file\\s+loads", options: .regularExpression) != nil, "\(result.stdout)")
        #expect(result.stdout.range(of: "ghost\\s+FAILS", options: .regularExpression) != nil && result.stdout.contains("nowhere/libghost.so does not exist"), "\(result.stdout)")
    }

    /// A plugins.json that starts with a UTF-8 byte-order mark (some editors write one) is read
    /// (issue 23, item 4.16); one without "default" lets the screen choose, and says so.
    @Test func aByteOrderMarkAndNoDefaultAreFine() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let text = "\u{FEFF}" + """
        {"version": 1, "backends": {"file": {"library": "\(Harness.library("BackendFile"))"}}}
        """
        try text.write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/plugins.json")).prefix(3) == Data([0xEF, 0xBB, 0xBF]))
        let result = try Harness.agent(["backends", "--plugins", dir + "/plugins.json"], environment: ["DISPLAY": "", "WAYLAND_DISPLAY": ""])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("(default: the screen's: file here, no screen found"), "\(result.stdout)")
    }

    /// `--version` names the libraries the agent runs with, as loaded (issue 23, item 3): the
    /// versions are compared with what Debian's own tools say of the installed packages.
    @Test func versionNamesTheLibrariesItRunsWith() throws {
        try Harness.requireBuild()
        let result = try Harness.agent(["--version"])
        #expect(result.status == 0 && result.stdout.hasPrefix("krakl-agent "), "\(result)")
        // A build folder's agent has no build-info beside it (an installed one does: InstallTests):
        // it names the commit its checkout is at, as git itself says.
        let head = try Harness.run("/usr/bin/git", ["-C", Harness.repoRoot, "rev-parse", "HEAD"]).stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(head.count == 40, "git rev-parse HEAD: \(head)")
        #expect(result.stdout.contains("\ncommit: \(head) (development build in \(Harness.repoRoot): "), "\(result.stdout)")
        let openssl = try Harness.run("/usr/bin/openssl", ["version"]).stdout.split(separator: " ").dropFirst().first.map(String.init) ?? "?"
        #expect(result.stdout.contains("OpenSSL \(openssl)"), "openssl version says \(openssl): \(result.stdout)")
        let vpx = try Harness.run("/usr/bin/dpkg-query", ["-W", "-f=${Version}", "libvpx7"]).stdout   // e.g. 1.12.0-1+deb12u4
        #expect(result.stdout.contains("libvpx v\(vpx.prefix { $0 != "-" })"), "libvpx7 is \(vpx): \(result.stdout)")
        let zbar = try Harness.run("/usr/bin/dpkg-query", ["-W", "-f=${Version}", "libzbar0"]).stdout  // e.g. 0.23.92-7+deb12u1
        #expect(result.stdout.contains("zbar \(zbar.prefix { $0 != "-" })"), "libzbar0 is \(zbar): \(result.stdout)")
    }

    @Test func captureRunPrintsStatusAndSummary() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--backend", "file", "--option", "scene=typing",
                                        "--option", "width=640", "--option", "height=480", "--frames", "60"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("capturing from file [fps=30 scene=typing width=640 height=480]"), "\(result.stdout)")
        // Live status once a second (the run takes two seconds at 30 fps).
        #expect(result.stdout.range(of: "frames \\|\\s+[0-9.]+ fps \\| damage\\s+[0-9.]+% \\| latency p50", options: .regularExpression) != nil, "\(result.stdout)")
        #expect(result.stdout.contains("stopped: 60 frames captured"))
        #expect(result.stdout.contains("summary: 60 frames in"))
        #expect(result.stdout.contains("delivery latency (capture timestamp to host): p50"))
    }

    @Test func ctrlCStopsCleanly() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--option", "width=320", "--option", "height=240", "--no-record"])
        #expect(agent.read(until: " fps |"), "no status line: \(agent.output)")
        #expect(agent.stop() == 0)
        #expect(agent.output.contains("stopped: interrupted (Ctrl-C)") && agent.output.contains("summary:"), "\(agent.output)")
    }

    @Test func sourceEndIsANormalEnd() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "-o", "width=320", "-o", "height=240", "-o", "frames=10", "-o", "fps=60", "-q"])
        #expect(result.status == 0)
        #expect(result.stdout.contains("stopped: the source ended: played 10 frame intervals"), "\(result.stdout)")
    }

    @Test func defaultRegistryIsFoundNextToTheRepository() throws {
        try Harness.requireBuild()
        // Run from an unrelated folder with no --plugins: the agent finds the
        // repository's plugins.json by walking up from its own executable.
        let result = try Harness.run(Harness.agent, ["backends"], currentDirectory: "/")
        #expect(result.stdout.contains("Backends in \(Harness.repoRoot)/plugins.json"), "\(result.stdout)\(result.stderr)")
    }
}
