import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The product's whole workflow in a real browser (issue 14 part 4): the
/// development conference room (scripts/dev-room: Janus, the token server and
/// the conference page, in the test's own network namespace), Chromium driven
/// by selenium (Tests/Fixtures/conference_browser.py) pressing "Share a
/// screen", krakl-agent joining from the QR code on the page, the page's tile
/// showing the agent's frame stamps advancing, and "End meeting" sending the
/// agent back to idle with the room-ended reason.
@Suite(.serialized, .tags(.integration, .browser, .netns)) struct ConferenceRoomBrowserTests {
    static let python = "/opt/krakl-venv/bin/python"
    static let chromium = "/usr/bin/chromium"
    static let chromedriver = "/usr/bin/chromedriver"
    static var devRoom: String { Harness.repoRoot + "/scripts/dev-room" }
    static var browserScript: String { Harness.repoRoot + "/Tests/Fixtures/conference_browser.py" }
    static let pageURL = "http://127.0.0.1:8089/"

    /// Every component, or false after SKIP naming the missing one.
    static func prerequisites() throws -> Bool {
        for (path, package) in [(chromium, "chromium"), (chromedriver, "chromium-driver"),
                                ("/usr/share/javascript/janus-gateway/janus.js", "libjs-janus-gateway"),
                                ("/usr/share/javascript/webrtc-adapter/adapter.js", "libjs-webrtc-adapter"),
                                ("/usr/share/javascript/qrcode-generator/qrcode.js", "node-qrcode-generator")]
        where !FileManager.default.fileExists(atPath: path) {
            skipTest("\(path) is missing (Debian \(package); scripts/setup installs it)")
            return false
        }
        guard Harness.which("janus") != nil else { skipTest("janus is not installed (scripts/setup installs it)"); return false }
        guard FileManager.default.isExecutableFile(atPath: python),
              try Harness.run(python, ["-c", "import selenium, jwt"]).status == 0 else {
            skipTest("selenium or pyjwt missing in \(python) (scripts/setup installs them)")
            return false
        }
        return true
    }

    /// A person at the conference page: one JSON command in, one JSON line out.
    final class Browser {
        let process: DtlsTestProcess
        private var answered = 0

        init(in namespace: RtcTestNamespace, extra: [String] = [], environment: [String: String] = [:]) throws {
            var arguments = [ConferenceRoomBrowserTests.browserScript, "--url", ConferenceRoomBrowserTests.pageURL] + extra
            var program = ConferenceRoomBrowserTests.python
            if !environment.isEmpty {
                arguments = environment.map { "\($0)=\($1)" } + [program] + arguments
                program = "/usr/bin/env"
            }
            let (ip, argv) = namespace.command(program, arguments)
            process = try DtlsTestProcess(ip, argv)
        }

        /// The replies so far (lines of JSON objects with "ok").
        var replies: [[String: Any]] {
            process.log.split(whereSeparator: \.isNewline).compactMap { line in
                guard line.hasPrefix("{\"ok\"") else { return nil }
                return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            }
        }

        /// Waits (bounded) for the next reply.
        func nextReply(timeout: Double) -> [String: Any]? {
            let deadline = MonotonicClock.milliseconds() + timeout * 1000
            while MonotonicClock.milliseconds() < deadline {
                let all = replies
                if all.count > answered {
                    answered += 1
                    return all[answered - 1]
                }
                if !process.isRunning { break }
                usleep(20_000)
            }
            return nil
        }

        func post(_ command: [String: Any]) {
            let data = (try? JSONSerialization.data(withJSONObject: command)) ?? Data()
            process.type(String(decoding: data, as: UTF8.self) + "\n")
        }

        /// Sends a command and waits (bounded) for its reply; a failed or missing reply fails the test.
        func send(_ command: [String: Any], timeout: Double = 60) throws -> [String: Any] {
            post(command)
            let reply = try #require(nextReply(timeout: timeout), "no reply to \(command) in \(timeout) s: \(process.log.suffix(1500))")
            try #require(reply["ok"] as? Bool == true, "browser: \(reply)")
            return reply
        }

        func quit() {
            post(["cmd": "quit"])
            _ = process.waitForExit(seconds: 10)
            process.stop()
        }
    }

    /// scripts/dev-room in `namespace`, ready; stopped when its stdin closes (stop()).
    static func startRoom(in namespace: RtcTestNamespace) throws -> DtlsTestProcess {
        let room = try DtlsTestProcess("/bin/bash", [devRoom, "--netns", namespace.name, "--quiet", "--until-stdin-closes"])
        try #require(room.waitFor("Conference page: \(pageURL)", timeout: 30), "dev-room did not start: \(room.log)")
        return room
    }

    static func agent(in namespace: RtcTestNamespace, _ arguments: [String]) throws -> DtlsTestProcess {
        let (program, argv) = namespace.command(Harness.agent, arguments + ["--address", "127.0.0.2"])
        return try DtlsTestProcess(program, argv)
    }

    /// Checks a `watch` reply: the tile labelled `name` shows video whose stamps advance; prints getStats.
    static func checkTile(_ watched: [String: Any], name: String, run: String) {
        let samples = watched["samples"] as? Int ?? 0, read = watched["stamps_read"] as? Int ?? 0
        let first = watched["first_frame"] as? Int ?? 0, last = watched["last_frame"] as? Int ?? 0
        let stats = watched["stats"] as? [String: Any] ?? [:]
        func number(_ key: String) -> Double { (stats[key] as? NSNumber)?.doubleValue ?? .nan }
        let jitterMs = number("jitterBufferDelay") / max(1, number("jitterBufferEmittedCount")) * 1000
        print(String(format: "%@: tile \"%@\" playing after %.0f ms; %d of %d canvas reads had a stamp, frames %d → %d (%d distinct), sizes %@; "
                     + "getStats: framesDecoded %.0f, freezeCount %.0f, totalFreezesDuration %.3f s, jitterBufferDelay %.3f s (%.1f ms a frame)",
                     run, name, watched["waited_ms"] as? Double ?? -1, read, samples, first, last, watched["distinct_frames"] as? Int ?? 0,
                     "\(watched["sizes"] ?? "-")", number("framesDecoded"), number("freezeCount"), number("totalFreezesDuration"),
                     number("jitterBufferDelay"), jitterMs))
        #expect(watched["tile_seen"] as? Bool == true, "no playing tile labelled \(name): \(watched)")
        #expect((watched["labels"] as? [String] ?? []).contains(name), "tile labels: \(watched["labels"] ?? "-")")
        #expect(samples >= 10 && read >= samples * 9 / 10, "stamps unreadable in the page: \(read) of \(samples)")
        #expect(last > first && (watched["distinct_frames"] as? Int ?? 0) >= 10, "the stamp did not advance: \(first) → \(last)")
        #expect(watched["decreasing"] as? Int == 0, "frame stamps went backwards in the page")
        // Frames flow (a small number, not a rate: krakl-bench roomshare measures that).
        #expect(number("framesDecoded") >= 10, "Chromium decoded \(number("framesDecoded")) frames")
    }

    /// Ends the meeting from the page and checks the agent went back to idle with the room-ended
    /// reason within 2 s of the click; then (with `quit`) ends its stdin and checks it exits 30 (room ended).
    static func endMeeting(_ browser: Browser, agent: DtlsTestProcess, run: String, quit: Bool = true) throws {
        browser.post(["cmd": "end"])
        let idle = agent.waitFor("krakl-agent: idle.", timeout: 15)
        let idleAt = MonotonicClock.milliseconds()
        let ended = try #require(browser.nextReply(timeout: 30), "no reply to end: \(browser.process.log.suffix(1000))")
        let clickedAt = ended["t_ms"] as? Double ?? .infinity
        let ms = idleAt - clickedAt
        print(String(format: "%@: \"End meeting\" → the agent idle %.0f ms later (page: %@, tiles left %d)", run, ms,
                     ended["status"] as? String ?? "-", ended["tiles_after"] as? Int ?? -1))
        #expect(ended["ended_shown"] as? Bool == true, "the page did not show the end: \(ended)")
        #expect(ended["tiles_after"] as? Int == 0, "tiles left on the page after the end: \(ended)")
        #expect(idle, "the agent did not go idle: \(agent.log.suffix(600))")
        #expect(agent.log.contains("Sharing was ended by the room: the meeting was ended."), "\(agent.log.suffix(500))")
        #expect(ms <= 20_000, "a hang guard (10x the 2 s target): the agent was idle \(ms) ms after the click")
        guard quit else { return }
        // Idle waits for the next code on stdin; its end quits with the last session's status.
        agent.stop()
        #expect(agent.exitStatus == 30, "exit \(agent.exitStatus.map(String.init) ?? "none") after idle (30 = room ended)")
    }

    /// The reference page writes codes with docs/join-codes.md's functions, unchanged (the docs'
    /// block is checked under Node and against the agent's parser by JoinCodeTests).
    @Test func thePageUsesTheDocumentedSnippetUnchanged() throws {
        let docs = try String(contentsOfFile: Harness.repoRoot + "/docs/join-codes.md", encoding: .utf8)
        let page = try String(contentsOfFile: Harness.repoRoot + "/examples/conference-room/conference.js", encoding: .utf8)
        let begin = try #require(docs.range(of: "<!-- join-code-snippet:begin -->\n```javascript\n"))
        let end = try #require(docs.range(of: "```\n<!-- join-code-snippet:end -->"))
        let snippet = String(docs[begin.upperBound..<end.lowerBound])
        #expect(snippet.contains("function makeJoinCode") && page.contains(snippet), "conference.js differs from the docs' snippet")
    }

    @Test func shareFromTheConferencePageQRCodeAndEndTheMeeting() throws {
        guard try Self.prerequisites() else { return }
        try Harness.requireBuild()
        guard let namespace = try RtcTestNamespace() else { return }
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let room = try Self.startRoom(in: namespace)
        defer { room.stop() }
        let browser = try Browser(in: namespace)
        defer { browser.quit() }
        let ready = try #require(browser.nextReply(timeout: 60), "Chromium did not start: \(browser.process.log.suffix(1500))")
        print("conference room: Chromium \(ready["browser"] ?? "?") in namespace \(namespace.name)")
        let opened = try browser.send(["cmd": "open"])
        #expect(opened["joined"] as? Bool == true, "the page did not join the room: \(opened)")

        let name = "Ada's screen"
        let screenshot = folder + "/page.png"
        let shared = try browser.send(["cmd": "share", "name": name, "screenshot": screenshot])
        #expect(shared["shown"] as? Bool == true && (shared["code_start"] as? String ?? "").hasPrefix("krakl:v=1;k=janus;"), "\(shared)")

        let agent = try Self.agent(in: namespace, ["--qr", screenshot, "--backend", "file", "--plugins", registry,
                                                   "--option", "scene=typing", "--option", "width=640", "--option", "height=360"])
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(800))")
        #expect(agent.log.contains("as \"\(name)\""), "\(agent.log.prefix(600))")

        let watched = try browser.send(["cmd": "watch", "name": name, "seconds": 3, "timeout": 30])
        Self.checkTile(watched, name: name, run: "conference room --qr")
        try Self.endMeeting(browser, agent: agent, run: "conference room --qr", quit: false)

        // A new meeting; the idle agent takes the next code pasted on its stdin, and its tile goes
        // away when the person stops sharing (Ctrl-C: the agent leaves, Janus tells the page).
        let restarted = try browser.send(["cmd": "restart"])
        #expect(restarted["joined"] as? Bool == true, "the page did not join the new meeting: \(restarted)")
        let second = "Ada's second screen"
        let again = try browser.send(["cmd": "share", "name": second, "return_code": true])
        let code = try #require(again["code"] as? String, "no code: \(again["error"] ?? "-")")
        agent.type(code + "\n")
        #expect(agent.waitFor("sharing the screen in room 4242 as \"\(second)\"", timeout: 30), "no second share: \(agent.log.suffix(800))")
        Self.checkTile(try browser.send(["cmd": "watch", "name": second, "seconds": 2, "timeout": 30]), name: second,
                       run: "conference room, second meeting")
        agent.signal(SIGINT)
        let gone = try browser.send(["cmd": "gone", "name": second, "timeout": 10])
        print(String(format: "conference room: Ctrl-C → the tile gone from the page %.0f ms later", gone["waited_ms"] as? Double ?? -1))
        #expect(gone["gone"] as? Bool == true, "the tile stayed after the agent stopped: \(gone)")
        #expect(agent.waitFor("You stopped sharing.", timeout: 10) && agent.waitFor("Paste the next join code", timeout: 5),
                "\(agent.log.suffix(600))")
        // The end of stdin (Ctrl-D) quits an idle agent with the last session's status: the person stopped, 0.
        // Also after a session stopped by SIGINT: a stale EINTR once made the standard library's readLine
        // spin at full CPU here instead of ending (StandardInputLine reads with read(2) now).
        agent.closeInput()
        #expect(agent.waitForExit(seconds: 10), "the idle agent did not quit at the end of its input")
        #expect(agent.exitStatus == 0, "exit \(agent.exitStatus.map(String.init) ?? "none") after the person stopped (0): \(agent.log.suffix(700))")
        // The token is a credential: no more than its first 8 characters reach the agent's output.
        let whole = try NSRegularExpression(pattern: "eyJ[A-Za-z0-9_-]{20,}\\.")
        #expect(whole.firstMatch(in: agent.log, range: NSRange(agent.log.startIndex..., in: agent.log)) == nil,
                "a token's header and more appeared in the agent's output")
    }

    /// The `--scan` variant: the conference page in Chromium with a real window on an Xvfb screen;
    /// the agent scans that screen with the X11 backend, finds the page's code, joins, and publishes
    /// the screen (the page itself, so the tile shows the page showing the tile). No frame stamps
    /// on a real screen: the tile must play at the screen's size and Chromium must decode frames.
    @Test func scanTheConferencePageOnAnX11ScreenAndShareIt() throws {
        guard try Self.prerequisites() else { return }
        try Harness.requireBuild()
        let (width, height) = (1280, 800)
        guard let xvfb = try XvfbServer(width: width, height: height) else { return }
        guard let namespace = try RtcTestNamespace() else { return }
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let room = try Self.startRoom(in: namespace)
        defer { room.stop() }
        // Chromium inside the namespace reaches the X server through its socket file (/tmp/.X11-unix).
        let browser = try Browser(in: namespace, extra: ["--headed", "--window", "\(width)x\(height)"], environment: ["DISPLAY": xvfb.display])
        defer { browser.quit() }
        _ = try #require(browser.nextReply(timeout: 60), "Chromium did not start on \(xvfb.display): \(browser.process.log.suffix(1500))")
        let opened = try browser.send(["cmd": "open"])
        #expect(opened["joined"] as? Bool == true, "the page did not join the room: \(opened)")
        let name = "Bo's screen"
        let shared = try browser.send(["cmd": "share", "name": name])
        #expect(shared["shown"] as? Bool == true, "\(shared)")

        let agent = try Self.agent(in: namespace, ["--scan", "--backend", "x11", "--option", "display=\(xvfb.display)", "--scan-timeout", "30",
                                                   "--plugins", registry])
        defer { agent.stop() }
        #expect(agent.waitFor("found a join code", timeout: 40), "the agent did not find the page's code: \(agent.log.suffix(800))")
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(800))")
        #expect(agent.log.contains("as \"\(name)\""), "\(agent.log.prefix(800))")

        let watched = try browser.send(["cmd": "watch", "name": name, "seconds": 2, "timeout": 30])
        let stats = watched["stats"] as? [String: Any] ?? [:]
        func number(_ key: String) -> Double { (stats[key] as? NSNumber)?.doubleValue ?? .nan }
        print(String(format: "conference room --scan: %@; tile \"%@\" playing after %.0f ms at %@; getStats: framesDecoded %.0f, freezeCount %.0f, "
                     + "totalFreezesDuration %.3f s, jitterBufferDelay %.3f s", agent.log.components(separatedBy: "\n").first { $0.contains("found a join code") } ?? "-",
                     name, watched["waited_ms"] as? Double ?? -1, "\(watched["sizes"] ?? "-")", number("framesDecoded"), number("freezeCount"),
                     number("totalFreezesDuration"), number("jitterBufferDelay")))
        #expect(watched["tile_seen"] as? Bool == true, "no playing tile labelled \(name): \(watched)")
        #expect((watched["labels"] as? [String] ?? []).contains(name), "tile labels: \(watched["labels"] ?? "-")")
        #expect(watched["sizes"] as? [String] == ["\(width)x\(height)"], "the tile is not the X screen: \(watched["sizes"] ?? "-")")
        #expect(number("framesDecoded") >= 2, "Chromium decoded \(number("framesDecoded")) frames of the screen")
        try Self.endMeeting(browser, agent: agent, run: "conference room --scan")
    }

    // MARK: - The token server and scripts/dev-room without a browser

    /// What the page's backend gives out: tokens only for acceptable names, shaped as
    /// docs/join-codes.md says, and no secret in anything the page can fetch.
    @Test func theTokenServerMintsTwilioShapedTokensForGoodNamesOnly() throws {
        guard try Self.prerequisites() else { return }
        guard let namespace = try RtcTestNamespace() else { return }
        let room = try Self.startRoom(in: namespace)
        defer { room.stop() }
        let client = #"""
        import base64, json, sys, urllib.request, urllib.error
        base = sys.argv[1]
        def call(path, body=None):
            data = None if body is None else json.dumps(body).encode()
            try:
                with urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())
        part = lambda p: json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
        out = {"room": call("/api/room")}
        status, minted = call("/api/screen-token", {"identity": "  Ada's screen  "})
        header, claims, signature = minted["token"].split(".")
        out["good"] = {"status": status, "header": part(header), "claims": part(claims), "signature_length": len(signature),
                       "expires": minted["expires"]}
        out["refused"] = [call("/api/screen-token", {"identity": name})
                          for name in ["", "   ", "A" * 65, "Ann\u202eevil", "line\nbreak", 42]]
        out["not_json"] = call("/api/screen-token", [1])
        print(json.dumps(out))
        """#
        let (program, argv) = namespace.command("/usr/bin/python3", ["-c", client, String(Self.pageURL.dropLast())])
        let result = try Harness.run(program, argv, timeout: 30)
        let out = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result.stderr)")
        let roomReply = out["room"] as? [Any] ?? []
        let config = roomReply.last as? [String: Any] ?? [:]
        #expect(Set(config.keys) == ["kind", "janus", "room", "iceServers"], "/api/room gives the page more than it needs: \(config)")
        #expect(config["janus"] as? String == "http://127.0.0.1:8088/janus" && config["room"] as? Int == 4242, "\(config)")
        let good = out["good"] as? [String: Any] ?? [:]
        #expect(good["status"] as? Int == 200, "\(good)")
        #expect(good["header"] as? [String: String] == ["typ": "JWT", "alg": "HS256", "cty": "twilio-fpa;v=1"], "\(good)")
        let claims = good["claims"] as? [String: Any] ?? [:]
        let grants = claims["grants"] as? [String: Any] ?? [:]
        #expect(grants["identity"] as? String == "Ada's screen", "identity (trimmed): \(grants)")
        #expect((grants["video"] as? [String: String]) == ["room": "4242"], "\(grants)")
        let iat: Int = claims["iat"] as? Int ?? 0, exp: Int = claims["exp"] as? Int ?? 0
        #expect(exp - iat == 3600 && claims["nbf"] as? Int == iat && good["expires"] as? Int == exp, "\(claims)")
        #expect(good["signature_length"] as? Int == 43, "an HS256 signature is 43 base64url characters: \(good)")
        let refused = out["refused"] as? [[Any]] ?? []
        #expect(refused.count == 6 && refused.allSatisfy { $0.first as? Int == 400 }, "\(refused)")
        #expect((out["not_json"] as? [Any])?.first as? Int == 400, "\(out["not_json"] ?? "-")")
        #expect(room.log.contains("minted a token for \"Ada's screen\"") && !room.log.contains(".eyJ"), "\(room.log.suffix(500))")
    }

    /// A port in use and a bad option are refused with words saying what to do, before anything starts.
    @Test func devRoomRefusesATakenPortAndBadOptions() throws {
        guard try Self.prerequisites() else { return }
        guard let namespace = try RtcTestNamespace() else { return }
        let holder = """
        import socket, sys
        s = socket.socket(); s.bind(("127.0.0.1", 8089)); s.listen(); print("held", flush=True); sys.stdin.read()
        """
        let (program, argv) = namespace.command("/usr/bin/python3", ["-c", holder])
        let held = try DtlsTestProcess(program, argv)
        defer { held.stop() }
        try #require(held.waitFor("held", timeout: 10), "\(held.log)")
        let taken = try Harness.run("/bin/bash", [Self.devRoom, "--netns", namespace.name], timeout: 60)
        #expect(taken.status == 4 && taken.stderr.contains("port 8089 on 127.0.0.1 is taken") && taken.stderr.contains("--port"),
                "exit \(taken.status): \(taken.stderr)")
        let bad = try Harness.run("/bin/bash", [Self.devRoom, "--port", "http"], timeout: 30)
        #expect(bad.status == 2 && bad.stderr.contains("--port needs a number"), "exit \(bad.status): \(bad.stderr)")
        let unknown = try Harness.run("/bin/bash", [Self.devRoom, "--bogus"], timeout: 30)
        #expect(unknown.status == 2 && unknown.stderr.contains("unknown option --bogus"), "exit \(unknown.status): \(unknown.stderr)")
    }
}
