import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The interactive home screen (docs/home-screen.md), driven as a person would in a terminal:
/// tmux runs the real agent in an 80×24 pane inside the WHIP room's network namespace
/// (RoomSessionTests.WhipRoom); the test types keys (send-keys) and reads the screen
/// (capture-pane). Also: desktop notifications on a private session bus, and the JSON log lines
/// of the non-interactive lifecycle.
@Suite(.serialized, .tags(.integration, .netns)) struct HomeScreenTests {
    /// A tmux server of its own (its socket in a test folder) with one detached pane running `script`.
    final class Pane {
        let socket: String
        let tmux: String

        init(script: String, folder: String, namespace: RtcTestNamespace?, width: Int = 80, height: Int = 24) throws {
            tmux = try #require(Harness.which("tmux"), "tmux is not installed (scripts/setup installs it)")
            socket = folder + "/tmux.sock"
            let config = folder + "/tmux.conf"
            // No status line: the pane is the whole 80×24 window.
            try "set -g status off\nset -g remain-on-exit on\n".write(toFile: config, atomically: true, encoding: .utf8)
            let scriptPath = folder + "/pane.sh"
            try script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
            // The server tmux leaves behind keeps the descriptors it was given: not the test's pipes.
            let line = "'\(tmux)' -S '\(socket)' -f '\(config)' new-session -d -x \(width) -y \(height) '/bin/bash \(scriptPath)' </dev/null >/dev/null 2>'\(folder)/tmux.log'"
            // Nor any other descriptor of the test process (Foundation hears of a child's end through
            // one: held by the server, the start would never be reported), and an empty signal mask
            // (the test's threads block signals, and children inherit the mask).
            let unblocked = ["/usr/bin/python3", "-c", "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                             + "os.closerange(3, 65536); os.execv('/bin/sh', ['sh', '-c', sys.argv[1]])", line]
            let (program, argv) = namespace?.command(unblocked[0], Array(unblocked.dropFirst())) ?? (unblocked[0], Array(unblocked.dropFirst()))
            let started = try Harness.run(program, argv, timeout: 20)
            try #require(started.status == 0, "tmux new-session: \(started) \(procText(folder + "/tmux.log"))")
        }

        deinit { _ = try? Harness.run(tmux, ["-S", socket, "kill-server"], timeout: 10) }

        @discardableResult
        func tmux(_ arguments: [String]) -> Harness.Result? { try? Harness.run(tmux, ["-S", socket] + arguments, timeout: 10) }

        /// Keys as tmux names them ("c", "Enter", "C-c").
        func keys(_ keys: String...) { tmux(["send-keys"] + keys) }

        /// Text typed (or pasted) as it is.
        func type(_ text: String) { tmux(["send-keys", "-l", text]) }

        /// The visible screen; `escapes` keeps the colour and attribute codes, `joined` joins wrapped lines.
        func screen(escapes: Bool = false, joined: Bool = false) -> String {
            tmux(["capture-pane", "-p"] + (escapes ? ["-e"] : []) + (joined ? ["-J"] : []))?.stdout ?? ""
        }

        /// From now on every byte the pane's program writes is appended to `file` (tmux pipe-pane):
        /// a screen drawn and replaced between two captures is still on record.
        func record(to file: String) throws {
            try "".write(toFile: file, atomically: true, encoding: .utf8)
            let result = tmux(["pipe-pane", "-O", "cat >> '\(file)'"])
            try #require(result?.status == 0, "tmux pipe-pane: \(String(describing: result))")
        }

        /// What `record(to:)` wrote, without the escape sequences (cursor moves, colours).
        static func recorded(_ file: String) -> String {
            procText(file).replacingOccurrences(of: "\u{1B}\\[[0-9;?]*[A-Za-z]", with: "", options: .regularExpression)
        }

        var size: String { tmux(["display-message", "-p", "#{pane_width}x#{pane_height}"])?.stdout.trimmingCharacters(in: .whitespacesAndNewlines) ?? "" }

        /// Polls the screen (bounded) until `condition` holds; the last screen either way.
        func waitFor(timeout: Double, _ condition: (String) -> Bool) -> (ok: Bool, screen: String) {
            let deadline = Date().addingTimeInterval(timeout)
            var last = ""
            for _ in 0..<Int(timeout * 10 + 1) {
                last = screen()
                if condition(last) { return (true, last) }
                if Date() >= deadline { break }
                usleep(100_000)
            }
            return (false, last)
        }

        func waitFor(_ needle: String, timeout: Double = 30) -> (ok: Bool, screen: String) { waitFor(timeout: timeout) { $0.contains(needle) } }

        /// No line wrapped: joining wrapped lines changes nothing, and every line leaves the last column free.
        func nothingWraps(width: Int) -> (ok: Bool, detail: String) {
            let plain = screen().split(separator: "\n", omittingEmptySubsequences: false)
            let joined = screen(joined: true).split(separator: "\n", omittingEmptySubsequences: false)
            let long = plain.filter { $0.count > width - 1 }
            return (plain.count == joined.count && long.isEmpty, "rows \(plain.count) vs joined \(joined.count); too long: \(long)")
        }
    }

    /// The bash script the pane runs: the agent with `arguments` (its own environment), then its exit
    /// status and whether the terminal is back in canonical mode. `trap : INT` keeps bash itself alive
    /// when Ctrl-C reaches the whole foreground group (the agent still gets SIGINT).
    static func paneScript(_ room: RoomSessionTests.WhipRoom, arguments: [String], environment: [String: String], folder: String,
                           source: [String] = ["--option", "scene=typing", "--option", "width=640", "--option", "height=360"],
                           unsetting: [String] = []) -> String {
        paneScript(registry: room.registry, arguments: arguments, environment: environment, folder: folder, source: source, unsetting: unsetting)
    }

    /// `unsetting`: variables of the test's environment the agent must not see (DISPLAY, BROWSER).
    static func paneScript(registry: String, arguments: [String], environment: [String: String], folder: String,
                           source: [String] = ["--option", "scene=typing", "--option", "width=640", "--option", "height=360"],
                           unsetting: [String] = []) -> String {
        let quoted = ([Harness.agent, "--address", "127.0.0.2", "--plugins", registry] + source + arguments)
            .map { "'\($0)'" }.joined(separator: " ")
        let env = environment.map { "\($0.key)='\($0.value)'" }.sorted().joined(separator: " ")
        let unset = unsetting.map { "-u \($0) " }.joined()
        return """
        trap : INT
        env -u NO_COLOR \(unset)\(env) \(quoted) 2>'\(folder)/agent.stderr'
        echo "EXIT=$?"
        stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon'
        sleep 600
        """
    }

    /// The agent in the room's namespace with its standard output followed live (stderr goes to a
    /// file): once `needle` is in it, the room closes its peers (it ends once the agent shares: on
    /// the event, not on a timer). Its exit status (-1: still running 20 s later), stdout, stderr.
    static func runUntilTheRoomCloses(_ room: RoomSessionTests.WhipRoom, _ arguments: [String], environment: [String: String] = [:],
                                      closeOn needle: String) throws -> (status: Int32, stdout: String, stderr: String) {
        let errors = try Harness.temporaryDirectory() + "/agent.stderr"
        let pairs = environment.merging(["KRAKL_TEST_STDERR": errors]) { $1 }.map { "\($0.key)=\($0.value)" }.sorted()
        let (program, argv) = room.namespace.command("/usr/bin/env", pairs + ["/bin/sh", "-c", #"exec "$0" "$@" 2>"$KRAKL_TEST_STDERR""#,
                                                                            Harness.agent] + arguments)
        let agent = try DtlsTestProcess(program, argv)
        defer { agent.stop() }
        if agent.waitFor(needle, timeout: 40) { room.server.closePeers() }
        _ = agent.waitForExit(seconds: 20)
        return (agent.exitStatus ?? -1, agent.log, (try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")
    }

    static func hasLiveNumbers(_ screen: String) -> Bool {
        screen.contains("State:     sharing") && screen.contains("Picture:   640x360")
            && screen.range(of: #"Bitrate:   [1-9][0-9]* kbit/s"#, options: .regularExpression) != nil
            && screen.range(of: #"Shared:    0:00:0[1-9]"#, options: .regularExpression) != nil
    }

    @Test func connectShareStopAndQuitInAnEightyByTwentyFourPane() throws {
        guard let room = try RoomSessionTests.WhipRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let (code, _) = try room.codeFile(identity: "Hal's screen")
        let codeText = try String(contentsOfFile: code, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let pane = try Pane(script: Self.paneScript(room, arguments: ["home"], environment: ["KRAKL_NO_NOTIFY": "1"], folder: folder),
                            folder: folder, namespace: room.namespace)
        #expect(pane.size == "80x24", "pane size \(pane.size)")
        let home = pane.waitFor("[c] connect with a join code", timeout: 20)
        try #require(home.ok, "no home screen: \(home.screen)")
        #expect(home.screen.contains("krakl-agent") && home.screen.contains("State:     idle"), "\(home.screen)")

        // q, a picture that is not there: said at home, still idle.
        pane.keys("q")
        pane.type("/nonexistent/code.png")
        pane.keys("Enter")
        let missing = pane.waitFor("Cannot connect", timeout: 10)
        #expect(missing.ok && missing.screen.contains("/nonexistent/code.png") && missing.screen.contains("State:     idle"), "\(missing.screen)")

        // c, the code pasted, Enter: sharing, with live numbers refreshed in place.
        pane.keys("c")
        #expect(pane.waitFor("Paste or type the join code", timeout: 10).ok)
        pane.type(codeText)
        let typed = pane.screen()
        #expect(!typed.contains(String(codeText.suffix(20))), "the whole join code (its token) is on the screen")
        pane.keys("Enter")
        let sharing = pane.waitFor(timeout: 40, Self.hasLiveNumbers)
        print("home screen while sharing:\n\(sharing.screen)")
        #expect(sharing.ok, "no live numbers: \(sharing.screen) \(procText(folder + "/agent.stderr"))")
        #expect(sharing.screen.contains("Identity:  Hal's screen") && sharing.screen.contains("Room:      \(room.server.room) (WHIP)")
                && sharing.screen.contains("Backend:   file (test pattern), scene \"typing\""), "\(sharing.screen)")
        // The selected candidate pair: on the namespace's loopback, host to host over UDP, direct.
        #expect(sharing.screen.range(of: #"Path:      host/udp -> (host|prflx) \(direct\)"#, options: .regularExpression) != nil, "\(sharing.screen)")
        let first = sharing.screen.components(separatedBy: "\n").first { $0.hasPrefix("Shared:") } ?? ""
        let later = pane.waitFor(timeout: 10) { $0.contains("Shared:") && !$0.contains(first) }
        #expect(later.ok, "the time shared did not move on from \(first)")
        let wraps = pane.nothingWraps(width: 80)
        #expect(wraps.ok, "\(wraps.detail)")
        let colours = pane.screen(escapes: true)
        #expect(colours.contains("\u{1B}["), "without NO_COLOR the state is in colour: \(colours)")

        // A smaller terminal (SIGWINCH): drawn again to fit, nothing wraps.
        pane.tmux(["resize-window", "-x", "60", "-y", "20"])
        let small = pane.waitFor(timeout: 10) { screen in
            screen.contains("State:     sharing") && screen.split(separator: "\n").allSatisfy { $0.count <= 59 }
        }
        #expect(small.ok && pane.size == "60x20", "after resizing to 60x20 (\(pane.size)): \(small.screen)")
        let smallWraps = pane.nothingWraps(width: 60)
        #expect(smallWraps.ok, "\(smallWraps.detail)")
        pane.tmux(["resize-window", "-x", "80", "-y", "24"])

        // s stops: home again, saying why; the room saw the DELETE.
        pane.keys("s")
        let stopped = pane.waitFor(timeout: 20) { $0.contains("You stopped sharing.") && $0.contains("State:     idle") }
        #expect(stopped.ok, "after s: \(stopped.screen)")
        #expect(room.server.requests("DELETE", atLeast: 1, timeout: 5).count == 1, "the room never saw DELETE")

        // Again, then Ctrl-C stops sharing and a second Ctrl-C quits, the terminal restored.
        pane.keys("c")
        pane.type(codeText)
        pane.keys("Enter")
        let again = pane.waitFor(timeout: 40) { $0.contains("State:     sharing") && !$0.contains("Last:") }
        #expect(again.ok, "the second share: \(again.screen)")
        pane.keys("C-c")
        let interrupted = pane.waitFor(timeout: 20) { $0.contains("Last:      You stopped sharing.") && $0.contains("State:     idle") }
        #expect(interrupted.ok, "after Ctrl-C: \(interrupted.screen)")
        pane.keys("C-c")
        let quit = pane.waitFor("EXIT=", timeout: 20)
        #expect(quit.screen.contains("EXIT=0"), "after the second Ctrl-C: \(quit.screen)")
        // The shell's terminal is canonical again (stty shows icanon, not -icanon).
        let mode = pane.waitFor("icanon", timeout: 5).screen
        #expect(mode.split(separator: "\n").contains("icanon"), "terminal mode after quitting: \(mode)")
    }

    /// The room ends the share from outside (the WHIP server closes the peer connection): home again
    /// with the host-ended reason. With NO_COLOR nothing is coloured; the session bus's notification
    /// server (a test one, recording calls) saw the start and the end.
    @Test func theRoomEndingReturnsHomeWithTheReasonAndNotifies() throws {
        guard let room = try RoomSessionTests.WhipRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let bus = try PrivateSessionBus(folder: folder)
        let (code, _) = try room.codeFile(identity: "Ivy's screen")
        var environment = ["NO_COLOR": "1"]
        if let bus { environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address } else { environment["KRAKL_NO_NOTIFY"] = "1" }
        let pane = try Pane(script: Self.paneScript(room, arguments: ["--join", "@" + code], environment: environment, folder: folder)
                                .replacingOccurrences(of: "env -u NO_COLOR ", with: "env "),
                            folder: folder, namespace: room.namespace)
        let sharing = pane.waitFor("State:     sharing", timeout: 40)
        #expect(sharing.ok, "never shared: \(sharing.screen) \(procText(folder + "/agent.stderr"))")
        room.server.closePeers()
        let ended = pane.waitFor(timeout: 30) { $0.contains("Sharing was ended by the room") && $0.contains("State:     idle") }
        print("home screen after the room ended:\n\(ended.screen)")
        #expect(ended.ok, "after the server closed: \(ended.screen)")
        #expect(ended.screen.contains("[c] connect with a join code"), "not back home: \(ended.screen)")
        let escapes = pane.screen(escapes: true)
        #expect(!escapes.contains("\u{1B}["), "NO_COLOR, yet colour or attribute codes: \(escapes.debugDescription)")
        #expect(pane.nothingWraps(width: 80).ok)
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not quit: \(pane.screen())")

        bus?.expectStartAndEnd(room: room.server.room, identity: "Ivy's screen", end: "Sharing was ended by the room")
    }

    /// A Janus room destroyed from outside (its host, through the Janus API) while the home screen
    /// shares into it: home again with the host-ended reason, ready to connect.
    @Test func aJanusRoomDestroyedFromOutsideReturnsHome() throws {
        guard let room = try RoomSessionTests.JanusRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let identity = "Uma's screen"
        let (code, _) = try room.codeFile(identity: identity)
        let pane = try Pane(script: Self.paneScript(registry: room.registry, arguments: ["--join", "@" + code], environment: ["KRAKL_NO_NOTIFY": "1"],
                                                    folder: folder),
                            folder: folder, namespace: room.namespace)
        let sharing = pane.waitFor(timeout: 40) { $0.contains("State:     sharing") && $0.contains("Identity:  \(identity)") }
        try #require(sharing.ok, "never shared: \(sharing.screen) \(procText(folder + "/agent.stderr"))")
        #expect(sharing.screen.contains("Room:      \(room.room) (Janus VideoRoom)"), "\(sharing.screen)")

        let ended = try room.host(["end", "--how", "destroy", "--display", identity])
        #expect(ended["result"] as? String == "destroyed", "the host's destroy: \(ended)")
        let home = pane.waitFor(timeout: 20) { $0.contains("State:     idle") && $0.contains("the meeting was ended") }
        print("home screen after the Janus room was destroyed:\n\(home.screen)")
        #expect(home.ok, "after the room was destroyed: \(home.screen) \(procText(folder + "/agent.stderr").suffix(600))")
        #expect(home.screen.contains("Last:      Sharing was ended by the room") && home.screen.contains("[c] connect with a join code"),
                "not home with the reason: \(home.screen)")
        #expect(pane.nothingWraps(width: 80).ok)
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not quit: \(pane.screen())")
    }

    /// s scans the screen (the file backend playing a clip where the room's join code appears after
    /// a second), shows its progress, finds the code and shares.
    /// The webcam's key: w starts a camera scan (the PipeWire backend's camera mode); with no
    /// PipeWire for this user it says so on the home screen, which stays usable (w again, x quits).
    @Test func theWebcamKeyScansACameraAndSaysWhyNot() throws {
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let runtime = folder + "/run"
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true)
        chmod(runtime, 0o700)
        let pane = try Pane(script: Self.paneScript(registry: registry, arguments: ["home"],
                                                    environment: ["KRAKL_NO_NOTIFY": "1", "XDG_RUNTIME_DIR": runtime], folder: folder,
                                                    unsetting: ["PIPEWIRE_REMOTE", "PIPEWIRE_RUNTIME_DIR"]),
                            folder: folder, namespace: nil)
        try #require(pane.waitFor("[w] read the code with the webcam", timeout: 20).ok, "no home screen: \(pane.screen())")
        pane.keys("w")
        let told = pane.waitFor(timeout: 20) { $0.contains("Cannot scan:") }
        #expect(told.ok && told.screen.contains("PipeWire is not running"), "\(told.screen)")
        #expect(told.screen.contains("[w] read the code with the webcam"), "the home screen's keys are gone: \(told.screen)")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not quit: \(pane.screen())")
    }

    @Test func scanTheScreenThenShare() throws {
        guard try ScreenScanTests.prerequisites(), let room = try RoomSessionTests.WhipRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let (code, _) = try room.codeFile(identity: "Kim's screen")
        let codeText = try String(contentsOfFile: code, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let clip = try ScreenScanTests.clip(try ScreenScanTests.qrPNG(codeText, pixels: 3, in: folder), size: "800x600", seconds: 12, fps: 5,
                                            appearsAt: 6, x: 100, y: 50, in: folder)
        let pane = try Pane(script: Self.paneScript(room, arguments: ["home"], environment: ["KRAKL_NO_NOTIFY": "1"], folder: folder,
                                                    source: ["--backend", "file", "--option", "path=" + clip, "--option", "loop=true"]),
                            folder: folder, namespace: room.namespace)
        try #require(pane.waitFor("[s] scan the screen", timeout: 20).ok, "no home screen: \(pane.screen())")
        // The code shows 6 s into the clip, but a loaded machine may not capture the pane in that
        // time: the scanning screen is judged on everything the agent drew, not on one capture.
        let drawn = folder + "/pane.out"
        try pane.record(to: drawn)
        pane.keys("s")
        let scanning = pane.waitFor(timeout: 10) { $0.contains("frames looked at") || $0.contains("State:     sharing") }
        let everything = Pane.recorded(drawn)
        #expect(everything.contains("[s] stop scanning") && everything.contains("scanning the screen for a join code")
                && everything.contains("frames looked at"), "no scanning progress drawn; last screen: \(scanning.screen); drawn: \(everything.suffix(2000))")
        let sharing = pane.waitFor(timeout: 40) { $0.contains("State:     sharing") && $0.contains("Identity:  Kim's screen") }
        print("after scanning:\n\(sharing.screen)")
        #expect(sharing.ok, "the scanned code did not share: \(sharing.screen) \(procText(folder + "/agent.stderr"))")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not leave and quit: \(pane.screen())")
        #expect(room.server.requests("DELETE", atLeast: 1, timeout: 5).count == 1, "the room never saw DELETE")
    }

    /// A dbus-daemon of the test's own with the notification server on it (nil and SKIP without dbus-daemon).
    final class PrivateSessionBus {
        let daemon: DtlsTestProcess
        let server: DtlsTestProcess
        let address: String

        init?(folder: String) throws {
            guard let dbus = Harness.which("dbus-daemon") else {
                skipTest("dbus-daemon is not installed (scripts/setup installs dbus-bin): notifications not checked")
                return nil
            }
            let path = folder + "/bus"
            daemon = try DtlsTestProcess(dbus, ["--session", "--nofork", "--nopidfile", "--address", "unix:path=\(path)", "--print-address"])
            address = try #require(daemon.value(after: "unix:path=", timeout: 10).map { "unix:path=" + $0 }, "dbus-daemon: \(daemon.log)")
            server = try DtlsTestProcess("/opt/krakl-venv/bin/python", [Harness.repoRoot + "/Tests/Fixtures/notification_server.py", "--address", address])
            try #require(server.waitFor("ready", timeout: 15), "the notification server: \(server.log)")
        }

        deinit {
            server.stop()
            daemon.stop()
        }

        func waitForNotifications(count: Int, timeout: Double) -> [[String: Any]] {
            let deadline = Date().addingTimeInterval(timeout)
            var calls: [[String: Any]] = []
            while Date() < deadline {
                calls = WhipTestServer.events(server.log).filter { $0["event"] as? String == "notify" }
                if calls.count >= count { break }
                _ = server.waitFor("\u{1}never\u{1}", timeout: 0.2)
            }
            return calls
        }

        /// Two notifications from krakl-agent: sharing started in `room` as `identity`, then its end (words starting with `end`).
        func expectStartAndEnd(room: String, identity: String, end: String) {
            let calls = waitForNotifications(count: 2, timeout: 10)
            print("notifications: \(calls)")
            #expect(calls.count == 2, "Notify calls: \(calls) \(server.log)")
            let bodies = calls.map { $0["body"] as? String ?? "" }
            #expect(bodies.first == "Your screen is being shared in \(room) as \(identity)", "\(bodies)")
            #expect(bodies.last?.hasPrefix(end) == true, "\(bodies)")
            #expect(calls.allSatisfy { $0["app_name"] as? String == "krakl-agent" })
        }
    }

    /// Without a terminal the lifecycle is lines; --log-format json makes each one a JSON object.
    @Test func jsonLogLinesEachParse() throws {
        guard let room = try RoomSessionTests.WhipRoom() else { return }
        let (code, _) = try room.codeFile(identity: "Jo")
        // The room ends once a status line (once a second while sharing) is out.
        let result = try Self.runUntilTheRoomCloses(room, ["--join", "@" + code, "--once", "--log-format", "json", "--address", "127.0.0.2",
                                                           "--plugins", room.registry, "--option", "scene=typing",
                                                           "--option", "width=640", "--option", "height=360"],
                                                    environment: ["KRAKL_NO_NOTIFY": "1"], closeOn: #""event":"status""#)
        #expect(result.status == 30, "exit \(result.status) (30: the room ended): \(result.stdout) \(result.stderr)")
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.count >= 4, "\(result.stdout)")
        var objects: [[String: Any]] = []
        for line in lines {
            let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            #expect(object != nil, "not a JSON object: \(line)")
            if let object { objects.append(object) }
        }
        #expect(objects.allSatisfy { ($0["time"] as? String)?.contains("T") == true && $0["event"] is String }, "\(objects)")
        #expect(objects.contains { $0["event"] as? String == "state" && $0["state"] as? String == "sharing" && $0["identity"] as? String == "Jo" })
        let numbers = objects.compactMap { $0["event"] as? String == "status" ? $0["numbers"] as? [String: Any] : nil }
        #expect(numbers.contains { ($0["framesSent"] as? Int ?? 0) > 0 && $0["kbps"] is Double && $0["width"] as? Int == 640 }, "\(numbers)")
        // The selected candidate pair's types and protocol: host to host over UDP on the namespace's loopback.
        #expect(numbers.contains { ["host/udp -> host", "host/udp -> prflx"].contains($0["path"] as? String ?? "") }, "\(numbers)")
        let end = objects.last ?? [:]
        #expect(end["event"] as? String == "ended" && end["reason"] as? String == "room-ended" && end["exitStatus"] as? Int == 30
                && (end["message"] as? String ?? "").hasPrefix("Sharing was ended by the room"), "\(end)")
    }

    /// The notifications reach a real notification server: Debian's dunst, on an Xvfb display and
    /// the test's own session bus, which prints each notification it takes (-print) and keeps them
    /// in its history (dunstctl). What it shows is judged, not what the agent meant to send.
    @Test func notificationsReachARealNotificationServer() throws {
        guard let dunst = Harness.which("dunst"), let dunstctl = Harness.which("dunstctl"), let dbus = Harness.which("dbus-daemon") else {
            skipTest("dunst or dbus-daemon is not installed (scripts/setup installs dunst and dbus-bin)")
            return
        }
        guard let room = try RoomSessionTests.WhipRoom(), let x = try XvfbServer(width: 800, height: 600) else { return }
        let folder = try Harness.temporaryDirectory()
        let bus = try DtlsTestProcess(dbus, ["--session", "--nofork", "--nopidfile", "--address", "unix:path=\(folder)/bus", "--print-address"])
        defer { bus.stop() }
        let address = try #require(bus.value(after: "unix:path=", timeout: 10).map { "unix:path=" + $0 }, "dbus-daemon: \(bus.log)")
        let server = try DtlsTestProcess("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=\(address)", "DISPLAY=\(x.display)", dunst, "-print"])
        defer { server.stop() }
        // Ready once it owns the name: dunstctl answers.
        var ready = false
        for _ in 0..<100 where !ready {
            ready = try Harness.run("/usr/bin/env", ["DBUS_SESSION_BUS_ADDRESS=\(address)", dunstctl, "count", "history"], timeout: 5).status == 0
            if !ready { usleep(100_000) }
        }
        try #require(ready, "dunst never answered on the bus: \(server.log)")
        let (code, _) = try room.codeFile(identity: "Dun's screen")
        let result = try Self.runUntilTheRoomCloses(room, ["--join", "@" + code, "--once", "--headless", "--address", "127.0.0.2",
                                                           "--plugins", room.registry, "--option", "scene=typing",
                                                           "--option", "width=640", "--option", "height=360"],
                                                    environment: ["DBUS_SESSION_BUS_ADDRESS": address], closeOn: "sharing the screen")
        #expect(result.status == 30, "exit \(result.status): \(result.stdout) \(result.stderr)")
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline && server.log.components(separatedBy: "appname: 'krakl-agent'").count < 3 { usleep(100_000) }
        let shown = server.log.components(separatedBy: "appname: 'krakl-agent'").dropFirst()
        print("dunst printed \(shown.count) notifications from krakl-agent: \(shown.map { $0.split(separator: "\n").filter { $0.contains("body:") } })")
        #expect(shown.count == 2, "\(server.log)")
        #expect(shown.first?.contains("body: 'Your screen is being shared in \(room.server.room) as Dun's screen'") == true, "\(server.log)")
        #expect(shown.last?.contains("body: 'Sharing was ended by the room") == true, "\(server.log)")
    }

    /// The lines mode notifies too: sharing's start, then its end with the reason (the room ended it).
    @Test func linesModeNotifiesTheStartAndTheEnd() throws {
        guard let room = try RoomSessionTests.WhipRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        guard let bus = try PrivateSessionBus(folder: folder) else { return }
        let (code, _) = try room.codeFile(identity: "Lin's screen")
        let result = try Self.runUntilTheRoomCloses(room, ["--join", "@" + code, "--once", "--headless", "--address", "127.0.0.2",
                                                           "--plugins", room.registry, "--option", "scene=typing",
                                                           "--option", "width=640", "--option", "height=360"],
                                                    environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address], closeOn: "sharing the screen")
        #expect(result.status == 30 && result.stdout.contains("Sharing was ended by the room"), "exit \(result.status): \(result.stdout) \(result.stderr)")
        bus.expectStartAndEnd(room: room.server.room, identity: "Lin's screen", end: "Sharing was ended by the room")
    }

    @Test func homeWithoutATerminalSaysWhatToDo() throws {
        try Harness.requireBuild()
        let result = try Harness.run(Harness.agent, ["home"], timeout: 20)
        #expect(result.status == 2 && result.stderr.contains("needs a terminal") && result.stderr.contains("--join"), "\(result)")
        let bad = try Harness.run(Harness.agent, ["--join", "x", "--log-format", "yaml"], timeout: 20)
        #expect(bad.status == 2 && bad.stderr.contains("use text or json"), "\(bad)")
    }
}
