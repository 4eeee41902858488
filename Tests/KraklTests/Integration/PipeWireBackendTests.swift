import Foundation
import Testing

/// The headless ScreenCast stack of scripts/pipewire-stack (dbus-daemon,
/// pipewire, wireplumber, sway, xdg-desktop-portal-wlr, xdg-desktop-portal),
/// run as an unprivileged user because sway refuses root; stopped (every
/// process of it killed, its folder removed) on deinit.
final class PipeWireStack {
    let folder: String
    let environment: [String: String]
    let uid: String
    let gid: String

    static let script = Harness.repoRoot + "/scripts/pipewire-stack"

    /// nil (after printing SKIP and why) when a piece of the stack is missing.
    /// `flags` are scripts/pipewire-stack start's (--no-portal, --deny, …).
    init?(_ flags: [String] = []) throws {
        let withPortal = !flags.contains("--no-portal") && !flags.contains("--no-pipewire")
        var needed = ["dbus-daemon", "setpriv", "cc"]
        if !flags.contains("--no-pipewire") { needed += ["pipewire", "wireplumber", "pw-cli"] }
        if withPortal { needed += ["sway", "swaymsg", "swaybg"] }
        if let missing = needed.first(where: { Harness.which($0) == nil }) {
            skipTest("\(missing) is not installed (scripts/setup installs the PipeWire portal stack)")
            return nil
        }
        if withPortal, let missing = ["/usr/libexec/xdg-desktop-portal", "/usr/libexec/xdg-desktop-portal-wlr"].first(where: { !FileManager.default.isExecutableFile(atPath: $0) }) {
            skipTest("\(missing) is not installed (scripts/setup installs the PipeWire portal stack)")
            return nil
        }
        guard getuid() == 0 else {
            skipTest("the PipeWire stack is started as root, which drops to uid 65534 (sway refuses to run as root)")
            return nil
        }
        let started = try Harness.run("/bin/bash", [Self.script, "start"] + flags, timeout: 60)
        try #require(started.status == 0, "pipewire-stack start: \(started.stderr)")
        let envFile = started.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        folder = (envFile as NSString).deletingLastPathComponent
        var environment: [String: String] = [:]
        for line in try String(contentsOfFile: envFile, encoding: .utf8).split(separator: "\n") where line.hasPrefix("export ") {
            let pair = line.dropFirst("export ".count)
            guard let eq = pair.firstIndex(of: "=") else { continue }
            environment[String(pair[..<eq])] = String(pair[pair.index(after: eq)...]).replacingOccurrences(of: "'", with: "")
        }
        self.environment = environment
        uid = environment["KRAKL_STACK_UID"] ?? "65534"
        gid = environment["KRAKL_STACK_GID"] ?? "65534"
    }

    deinit { _ = try? Harness.run("/bin/bash", [Self.script, "stop", folder], timeout: 30) }

    /// The command line that runs `arguments` as the stack's user with its environment.
    func asUser(_ arguments: [String], extra: [String: String] = [:]) -> [String] {
        let env = environment.merging(extra) { $1 }.merging(["PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"]) { a, _ in a }
        return ["--reuid=\(uid)", "--regid=\(gid)", "--clear-groups", "/usr/bin/env", "-i"]
            + env.keys.sorted().map { "\($0)=\(env[$0]!)" } + arguments
    }

    /// Runs a program to completion as the stack's user.
    @discardableResult
    func run(_ arguments: [String], timeout: Double = 60, extra: [String: String] = [:]) throws -> Harness.Result {
        try Harness.run("/usr/bin/setpriv", asUser(arguments, extra: extra), timeout: timeout, currentDirectory: folder)
    }

    /// Starts a program as the stack's user and leaves it running (the
    /// stack's stop kills it: it carries the stack's environment).
    /// `output`: a file for its stdout and stderr (else /dev/null).
    func spawn(_ arguments: [String], output: String? = nil) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = asUser(arguments)
        process.currentDirectoryURL = URL(fileURLWithPath: folder)
        var sink = FileHandle.nullDevice
        if let output {
            _ = FileManager.default.createFile(atPath: output, contents: nil)
            sink = try #require(FileHandle(forWritingAtPath: output), "cannot write \(output)")
        }
        process.standardOutput = sink
        process.standardError = sink
        process.standardInput = FileHandle.nullDevice
        try process.run()
        return process
    }

    func swaymsg(_ arguments: String...) throws {
        let result = try run(["swaymsg"] + arguments, timeout: 10)
        try #require(result.status == 0, "swaymsg \(arguments): \(result.stdout)\(result.stderr)")
    }

    /// A terminal that rewrites the time in place on one line (small damage,
    /// and the screen keeps changing: portal-wlr sends nothing for a static screen).
    func startClockTerminal() throws -> Process {
        try spawn(["foot", "sh", "-c", "while :; do printf '\\r%s' \"$(date +%T.%N)\"; sleep 0.05; done"])
    }

    /// Process ids of this stack's processes whose command line contains `name`.
    func pids(of name: String) -> [Int32] {
        let marker = "KRAKL_STACK_DIR=\(folder)"
        return ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { Int32($0) }.filter { pid in
            guard let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"),
                  let environ = FileManager.default.contents(atPath: "/proc/\(pid)/environ") else { return false }
            return String(decoding: cmdline, as: UTF8.self).contains(name)
                && String(decoding: environ, as: UTF8.self).split(separator: "\0").contains { $0 == marker }
        }
    }

    /// Polls (bounded) until `pw-cli ls Node` lists a node named `name`; returns its id.
    func waitForNode(named name: String, timeout: Double = 10) throws -> Int? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let listed = try run(["pw-cli", "ls", "Node"], timeout: 5).stdout
            var id: Int?
            for line in listed.split(separator: "\n") {
                if let range = line.range(of: "id "), line.contains("type PipeWire:Interface:Node") {
                    id = Int(line[range.upperBound...].prefix { $0.isNumber })
                }
                if line.contains("node.name = \"\(name)\"") { return id }
            }
            usleep(50_000)
        }
        return nil
    }
}

/// tests/Fixtures/pipewire_probe.c: loads the backend as the stack's user
/// (the test runner is root) and prints a line per frame and event.
final class PipeWireProbe {
    let process = Process()
    private let input = Pipe(), output = Pipe()
    private(set) var text = ""

    private static let tool = BuiltOnce {
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let path = folder + "/pipewire_probe"
        let cc = try Harness.run("/usr/bin/cc", ["-std=c99", "-D_DEFAULT_SOURCE", "-Wall", "-Werror", "-O1", "-pthread", "-I", Harness.header,
                                                 Harness.repoRoot + "/Tests/Fixtures/pipewire_probe.c", "-o", path, "-ldl"])
        try #require(cc.status == 0, "cc pipewire_probe: \(cc.stderr)")
        return path
    }

    static func build() throws -> String { try tool.get() }

    init(_ stack: PipeWireStack, options: [String]) throws {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = stack.asUser([try Self.build(), Harness.library("BackendPipeWire")] + options)
        process.currentDirectoryURL = URL(fileURLWithPath: stack.folder)
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    func send(_ command: String) { input.fileHandleForWriting.write(Data((command + "\n").utf8)) }

    /// Reads output until `done` holds for it, it ends, or `timeout` passes.
    @discardableResult
    func read(timeout: Double = 20, until done: (String) -> Bool) -> Bool {
        readOutput(output.fileHandleForReading.fileDescriptor, into: &text, timeout: timeout, until: done)
    }

    @discardableResult
    func read(until needle: String, timeout: Double = 20) -> Bool { read(timeout: timeout) { $0.contains(needle) } }

    /// Parsed `frame` lines.
    var frames: [(width: Int, height: Int, damage: Int, area: Int, center: String)] {
        text.split(separator: "\n").filter { $0.hasPrefix("frame ") }.map { line in
            var fields: [String: String] = [:]
            for part in line.split(separator: " ") { let kv = part.split(separator: "=", maxSplits: 1); if kv.count == 2 { fields[String(kv[0])] = String(kv[1]) } }
            let size = (fields["size"] ?? "0x0").split(separator: "x").compactMap { Int($0) }
            return (size.first ?? 0, size.last ?? 0, Int(fields["damage"] ?? "") ?? -1, Int(fields["area"] ?? "") ?? -1, fields["center"] ?? "")
        }
    }

    /// Quits (destroying the source) and waits, bounded.
    func finish() {
        send("quit")
        read(timeout: 10) { $0.contains("destroyed") || $0.contains("create-failed") }
        if !Harness.waitForExit(process, seconds: 10) { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }

    deinit { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
}

/// The PipeWire backend against the real headless portal stack, as the
/// unprivileged user the stack runs as.
@Suite("PipeWire backend under the headless portal stack", .serialized, .tags(.integration))
struct PipeWireBackendTests {
    /// The agent runs as the stack's user: the build folder must be readable by it.
    func requireReadableBuild(_ stack: PipeWireStack) throws {
        try Harness.requireBuild()
        let check = try stack.run(["/bin/sh", "-c", "test -r '\(Harness.library("BackendPipeWire"))' && test -x '\(Harness.agent)'"], timeout: 10)
        try #require(check.status == 0, "the stack's user (uid \(stack.uid)) cannot read \(Harness.buildDir); the tests need a world-readable build folder")
    }

    @Test func conformanceOnAPortalStream() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        _ = try stack.startClockTerminal()
        let result = try stack.run([Harness.agent, "conformance", Harness.library("BackendPipeWire")], timeout: 240)
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(!result.stdout.contains("FAIL"), "\(result.stdout)")
        #expect(result.stdout.contains("PASS  delivers-frames") && result.stdout.contains("PASS  restart") && result.stdout.contains("PASS  no-leaks"), "\(result.stdout)")
    }

    /// Frames have the output's size, and its content: the background colour sway is told to paint.
    @Test func framesShowTheScreen() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        let probe = try PipeWireProbe(stack, options: [])
        defer { probe.finish() }
        #expect(probe.read(until: "started 0"), "\(probe.text)")
        try stack.swaymsg("output", "HEADLESS-1", "bg", "#cc3300", "solid_color")
        #expect(probe.read(until: "center=cc3300"), "no frame with the new background: \(probe.text)")
        let frame = try #require(probe.frames.last { $0.center == "cc3300" })
        #expect(frame.width == 1280 && frame.height == 720, "\(frame)")
        #expect(probe.text.contains("corner=cc3300"), "\(probe.text)")
    }

    /// A terminal rewriting one line: damage rectangles cover a sliver of the screen.
    @Test func terminalTextDamageIsSmall() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        let probe = try PipeWireProbe(stack, options: [])
        defer { probe.finish() }
        #expect(probe.read(until: "started 0"), "\(probe.text)")
        _ = try stack.startClockTerminal()
        // The terminal's window appearing repaints everything; then only its line changes.
        #expect(probe.read(timeout: 30) { $0.components(separatedBy: "\nframe ").count > 30 }, "\(probe.text)")
        let later = probe.frames.dropFirst(10)
        let screen = 1280 * 720
        let shares = later.map { Double($0.area) / Double(screen) }
        let median = shares.sorted()[shares.count / 2]
        print("terminal damage: \(later.count) frames, median share \(String(format: "%.2f", median * 100)) %, max \(String(format: "%.2f", (shares.max() ?? 0) * 100)) %")
        #expect(later.allSatisfy { $0.damage > 0 }, "frames after the first carry damage rectangles")
        #expect(median < 0.1, "median damage share \(median)")
    }

    /// The first run stores the portal's restore token (0600 in a 0700
    /// folder); the second offers it, and the portal hands the matching
    /// restore data to its backend (seen on the bus).
    @Test func secondRunReusesTheRestoreToken() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        let monitor = Process()
        let monitorOut = Pipe()
        monitor.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        monitor.arguments = stack.asUser(["dbus-monitor", "--session", "type='method_call',interface='org.freedesktop.impl.portal.ScreenCast',member='SelectSources'"])
        monitor.standardOutput = monitorOut
        monitor.standardError = FileHandle.nullDevice
        try monitor.run()
        defer { if monitor.isRunning { kill(monitor.processIdentifier, SIGKILL); monitor.waitUntilExit() } }

        let first = try PipeWireProbe(stack, options: [])
        #expect(first.read(until: "started 0"), "\(first.text)")
        first.finish()
        #expect(first.text.contains("stored a new restore token"), "\(first.text)")
        #expect(!first.text.contains("offering the stored restore token"), "\(first.text)")
        let state = try #require(stack.environment["XDG_STATE_HOME"])
        let tokenFile = state + "/krakl/pipewire-restore-token-monitor"
        let attributes = try FileManager.default.attributesOfItem(atPath: tokenFile)
        #expect((attributes[.posixPermissions] as? Int) == 0o600, "token file mode \(String(describing: attributes[.posixPermissions]))")
        let folderAttributes = try FileManager.default.attributesOfItem(atPath: state + "/krakl")
        #expect((folderAttributes[.posixPermissions] as? Int) == 0o700, "token folder mode")

        let second = try PipeWireProbe(stack, options: [])
        #expect(second.read(until: "started 0"), "\(second.text)")
        second.finish()
        #expect(second.text.contains("offering the stored restore token"), "\(second.text)")

        // Two SelectSources reached portal-wlr; the second carried restore data.
        // SIGKILL: children of the test runner block SIGTERM (see XvfbServer.kill).
        kill(monitor.processIdentifier, SIGKILL)
        monitor.waitUntilExit()
        let bus = String(decoding: monitorOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let calls = bus.components(separatedBy: "member=SelectSources").dropFirst()
        #expect(calls.count == 2, "\(calls.count) SelectSources calls seen: \(bus)")
        #expect(calls.first.map { !$0.contains("restore_data") } == true, "the first call had restore data")
        #expect(calls.last?.contains("restore_data") == true, "the portal did not pass restore data on: \(bus)")

        // restore=false forgets it.
        let forget = try PipeWireProbe(stack, options: ["restore=false"])
        #expect(forget.read(until: "started 0"), "\(forget.text)")
        forget.finish()
        #expect(!FileManager.default.fileExists(atPath: tokenFile), "restore=false left the token file")
    }

    /// A new output mode: FORMAT_CHANGED, then frames at the new size.
    @Test func modeChangeRenegotiatesAndContinues() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        _ = try stack.startClockTerminal()
        let probe = try PipeWireProbe(stack, options: [])
        defer { probe.finish() }
        #expect(probe.read(until: "size=1280x720"), "\(probe.text)")
        try stack.swaymsg("output", "HEADLESS-1", "mode", "1024x768")
        #expect(probe.read(until: "event format-changed error=0 size=1024x768"), "\(probe.text)")
        #expect(probe.read(timeout: 20) { $0.components(separatedBy: "size=1024x768 format").count > 3 }, "frames did not continue at 1024x768: \(probe.text)")
        let after = probe.text.components(separatedBy: "event format-changed")[1]
        #expect(after.contains("size=1024x768 format=1 damage=0"), "the first frame at the new size is whole")
        #expect(!after.contains("size=1280x720 format"), "a frame of the old size after the change")
    }

    /// The screen cast stops (portal-wlr killed): SOURCE_ENDED, and no frame after it.
    @Test func stoppedSessionEndsTheSource() throws {
        guard let stack = try PipeWireStack() else { return }
        try requireReadableBuild(stack)
        _ = try stack.startClockTerminal()
        let probe = try PipeWireProbe(stack, options: [])
        defer { probe.finish() }
        #expect(probe.read(until: "frame seq=2 "), "\(probe.text)")
        let pids = stack.pids(of: "xdg-desktop-portal-wlr")
        try #require(!pids.isEmpty, "portal-wlr not found")
        pids.forEach { kill($0, SIGKILL) }
        #expect(probe.read(until: "event source-ended", timeout: 15), "\(probe.text)")
        probe.read(timeout: 0.5) { _ in false } // an observation window
        let after = probe.text.components(separatedBy: "event source-ended")[1]
        #expect(!after.contains("frame seq="), "a frame after SOURCE_ENDED: \(after)")
        print("ended: \(probe.text.split(separator: "\n").first { $0.hasPrefix("event source-ended") } ?? "")")
    }

    /// Direct node mode against a videotestsrc ! pipewiresink node, by name and by id.
    @Test func directNodeByNameAndId() throws {
        guard let stack = try PipeWireStack(["--no-portal"]) else { return }
        try requireReadableBuild(stack)
        guard Harness.which("gst-launch-1.0") != nil else { skipTest("gst-launch-1.0 is not installed"); return }
        let name = "krakl-test-source"
        _ = try stack.spawn(["gst-launch-1.0", "videotestsrc", "is-live=true", "!", "video/x-raw,format=BGRx,width=640,height=480", "!",
                             "pipewiresink", "mode=provide", "stream-properties=props,media.class=Video/Source,node.name=\(name)"])
        // 30 s: a first gst-launch on a fresh machine builds GStreamer's plugin registry, and a loaded
        // full run once took over 10 s to show the node.
        let id = try #require(try stack.waitForNode(named: name, timeout: 30), "the gst node never appeared")
        let probe = try PipeWireProbe(stack, options: ["node=\(name)"])
        #expect(probe.read(timeout: 20) { $0.components(separatedBy: "size=640x480").count > 5 }, "\(probe.text)")
        // The probe stays connected while conformance runs. The suite's groups run in
        // processes one after another, each connecting anew; with no consumer left between
        // them the gst node gave no frames at all in about half the runs (in every run with
        // 0.5 s more between processes), with the probe connected in none of 4.
        let conformance = try stack.run([Harness.agent, "conformance", Harness.library("BackendPipeWire"), "--option", "node=\(id)"], timeout: 120)
        probe.finish()
        #expect(conformance.status == 0 && !conformance.stdout.contains("FAIL"), "\(conformance.stdout)\(conformance.stderr)")
    }

    /// The person says no, for real: portal-wlr's chooser (pipewire-stack
    /// start --deny) picks no output, so the portal answers SelectSources
    /// (portal-wlr 0.7 asks there, not in Start) with response 1. The agent
    /// says so at once, with exit status 20, and stores no restore token.
    @Test func deniedSharingIsAClearErrorNotAHang() throws {
        guard let stack = try PipeWireStack(["--deny"]) else { return }
        try requireReadableBuild(stack)
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        chmod((registry as NSString).deletingLastPathComponent, 0o755)
        let started = Date()
        let result = try stack.run([Harness.agent, "--plugins", registry, "--backend", "pipewire", "--no-record", "--frames", "1"], timeout: 60)
        let elapsed = Date().timeIntervalSince(started)
        print(String(format: "denied: exit %d after %.2f s: %@", result.status, elapsed, result.stderr.split(separator: "\n").last.map(String.init) ?? ""))
        // A hang guard (10x a 2 s target; the portal answered at once): the status and message judge the outcome.
        #expect(!result.timedOut && elapsed < 20, "the agent took \(elapsed) s (the portal answered at once)")
        #expect(result.status == 20, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("sharing was not allowed") && result.stderr.contains("(EACCES)"), "\(result.stderr)")
        // Response 1 itself (not the session closing): the request was cancelled, in SelectSources.
        #expect(result.stderr.contains("cancelled or denied (SelectSources)"), "\(result.stderr)")
        let state = try #require(stack.environment["XDG_STATE_HOME"])
        let stored = (try? FileManager.default.contentsOfDirectory(atPath: state + "/krakl")) ?? []
        #expect(!stored.contains { $0.hasPrefix("pipewire-restore-token") }, "a denied request stored a token: \(stored)")
    }

    /// A portal that never answers (pipewire-stack start --no-answer: the
    /// chooser never returns): with timeout=2 the agent gives up after about
    /// 2 s with ETIMEDOUT, exit status 21, while the chooser is still open.
    @Test func unansweredPortalTimesOut() throws {
        guard let stack = try PipeWireStack(["--no-answer"]) else { return }
        try requireReadableBuild(stack)
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        chmod((registry as NSString).deletingLastPathComponent, 0o755)
        let started = Date()
        let result = try stack.run([Harness.agent, "--plugins", registry, "--backend", "pipewire", "--no-record", "--frames", "1",
                                    "--option", "timeout=2"], timeout: 60)
        let elapsed = Date().timeIntervalSince(started)
        print(String(format: "no answer: exit %d after %.2f s: %@", result.status, elapsed, result.stderr.split(separator: "\n").last.map(String.init) ?? ""))
        // At least the 2 s time-out waited (the order judged); the upper bound is a hang guard (10x the time-out).
        #expect(!result.timedOut && elapsed >= 2 && elapsed < 20, "the agent took \(elapsed) s with timeout=2")
        #expect(result.status == 21, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("gave no answer to SelectSources within 2 s") && result.stderr.contains("(ETIMEDOUT)"), "\(result.stderr)")
        // The portal was still waiting on its chooser: no answer, not a failure.
        #expect(!stack.pids(of: "sleep").isEmpty, "the chooser is gone: portal-wlr did not wait for it")
        let state = try #require(stack.environment["XDG_STATE_HOME"])
        let stored = (try? FileManager.default.contentsOfDirectory(atPath: state + "/krakl")) ?? []
        #expect(!stored.contains { $0.hasPrefix("pipewire-restore-token") }, "a request with no answer stored a token: \(stored)")
    }

    /// No portal, no PipeWire, no such node, a bad option: each a clear
    /// message, its own errno, and the exit status that errno maps to.
    @Test func clearErrors() throws {
        guard let stack = try PipeWireStack(["--no-portal"]) else { return }
        try requireReadableBuild(stack)
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        chmod((registry as NSString).deletingLastPathComponent, 0o755)
        let empty = try Harness.temporaryDirectory()
        chmod(empty, 0o777)
        // Exit statuses (krakl-agent --help): 18 the system lacks a portal, 17 no
        // such node, 19 a service is not running, 16 a rejected option.
        let cases: [([String], [String: String], String, String, Int32)] = [
            ([], [:], "no desktop portal on the session bus", "(EOPNOTSUPP)", 18),
            (["node=424242"], [:], "no PipeWire node 424242", "(ENODEV)", 17),
            (["node=42"], ["PIPEWIRE_RUNTIME_DIR": empty, "XDG_RUNTIME_DIR": empty], "PipeWire is not running", "(ECONNREFUSED)", 19),
            ([], ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(empty)/no-bus"], "cannot connect to the D-Bus session bus", "(ENXIO)", 19),
            (["cursor=blinking"], [:], "option cursor=blinking is not valid", "(EINVAL)", 16),
        ]
        for (options, extra, message, errno, status) in cases {
            let result = try stack.run([Harness.agent, "--plugins", registry, "--backend", "pipewire", "--no-record", "--frames", "1"]
                                       + options.flatMap { ["--option", $0] }, timeout: 60, extra: extra)
            #expect(result.status == status && result.stderr.contains(message) && result.stderr.contains(errno),
                    "\(options) \(extra): exit \(result.status): \(result.stderr)")
        }
    }
}
