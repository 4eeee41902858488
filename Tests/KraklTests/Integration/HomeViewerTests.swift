import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The home screen's local preview viewer (`v`, docs/home-screen.md), driven through tmux as a
/// person would (HomeScreenTests.Pane): opened with $BROWSER (a script of the test that records
/// its argument), or its URL shown; served until `x`; while sharing into the test WHIP room, a
/// standard WHEP player (aiortc, Tests/Fixtures/whep_player.py) receives the shared frames.
@Suite(.serialized, .tags(.integration, .browser, .netns)) struct HomeViewerTests {
    typealias Pane = HomeScreenTests.Pane

    /// The `Viewer:` line's URL (http://HOST:PORT/, no token on loopback).
    static func viewerURL(_ screen: String, host: String) -> String? {
        let pattern = "Viewer:    (http://" + host.replacingOccurrences(of: ".", with: "\\.") + ":[0-9]+/)"
        guard let regex = try? NSRegularExpression(pattern: pattern),
              let match = regex.firstMatch(in: screen, range: NSRange(screen.startIndex..., in: screen)),
              let range = Range(match.range(at: 1), in: screen) else { return nil }
        return String(screen[range])
    }

    static func port(_ url: String) -> UInt16? {
        url.split(separator: ":").last.flatMap { UInt16($0.trimmingCharacters(in: CharacterSet(charactersIn: "/"))) }
    }

    /// Lines of a file, polled (bounded) until there are `count`.
    static func lines(_ path: String, count: Int, timeout: Double) -> [String] {
        var lines: [String] = []
        for _ in 0..<Int(timeout * 10 + 1) {
            lines = procText(path).split(separator: "\n").map(String.init)
            if lines.count >= count { break }
            usleep(100_000)
        }
        return lines
    }

    /// The home screen in a pane of its own (no room), `v` pressed once it shows: viewer on `listen`,
    /// `environment` added, and the variables that would open a browser unset unless given.
    static func homeWithViewerAsked(listen: String = "127.0.0.1:0", environment: [String: String] = [:], folder: String) throws -> Pane {
        let registry = try Harness.registryForThisBuild(in: folder)
        let script = HomeScreenTests.paneScript(registry: registry, arguments: ["home", "--listen", listen],
                                                environment: ["KRAKL_NO_NOTIFY": "1"].merging(environment) { $1 }, folder: folder,
                                                unsetting: ["BROWSER", "DISPLAY", "WAYLAND_DISPLAY"].filter { environment[$0] == nil })
        let pane = try Pane(script: script, folder: folder, namespace: nil)
        let home = pane.waitFor("[v] viewer", timeout: 20)
        try #require(home.ok, "no home screen: \(home.screen) \(procText(folder + "/agent.stderr"))")
        pane.keys("v")
        return pane
    }

    @Test func vOpensTheViewerWithBrowserAndQuitStopsIt() throws {
        try Harness.requireBuild()
        let folder = try Harness.temporaryDirectory()
        let recorded = folder + "/opened.txt"
        let browser = folder + "/browser.sh"
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '\(recorded)'\n".write(toFile: browser, atomically: true, encoding: .utf8)
        chmod(browser, 0o755)
        let pane = try Self.homeWithViewerAsked(environment: ["BROWSER": browser], folder: folder)
        let opened = pane.waitFor("opened in your browser", timeout: 15)
        #expect(opened.ok, "after v: \(opened.screen)")
        let first = Self.lines(recorded, count: 1, timeout: 10)
        let url = try #require(first.first, "the BROWSER script was not run: \(opened.screen) \(procText(folder + "/agent.stderr"))")
        #expect(Self.viewerURL(opened.screen, host: "127.0.0.1") == url, "BROWSER got \(url); the screen: \(opened.screen)")
        let port = try #require(Self.port(url), "no port in \(url)")
        #expect(port != 8990 && port != 0, "--listen 127.0.0.1:0 picks a free port: \(url)")

        let page = try RawHTTP.request(port: port, "GET", "/")
        #expect(page.status == 200 && page.body.contains("<video") && page.header("Content-Type")?.hasPrefix("text/html") == true, "GET \(url): \(page.status) \(page.body.prefix(200))")
        // Nothing is shared at home: the status the page reads says so.
        let status = try RawHTTP.request(port: port, "GET", "/status")
        let object = (try? JSONSerialization.jsonObject(with: Data(status.body.utf8))) as? [String: Any]
        #expect((object?["idle"] as? String ?? "").contains("Nothing is shared right now") && object?["sharing"] as? Bool == false, "\(status.body)")

        // v again: the same server, opened again.
        pane.keys("v")
        let twice = Self.lines(recorded, count: 2, timeout: 10)
        #expect(twice == [url, url], "the second v: \(twice)")

        // x quits and the viewer's port is closed.
        pane.keys("x")
        let quit = pane.waitFor("EXIT=", timeout: 20)
        #expect(quit.screen.contains("EXIT=0"), "after x: \(quit.screen) \(procText(folder + "/agent.stderr"))")
        #expect((try? RawHTTP.request(port: port, "GET", "/")) == nil, "the viewer still answers after quitting")
    }

    @Test func withoutBrowserOrDisplayTheURLIsShown() throws {
        try Harness.requireBuild()
        let folder = try Harness.temporaryDirectory()
        let pane = try Self.homeWithViewerAsked(folder: folder)
        let shown = pane.waitFor("open this URL: http://127.0.0.1:", timeout: 15)
        #expect(shown.ok, "after v: \(shown.screen)")
        let url = try #require(Self.viewerURL(shown.screen, host: "127.0.0.1"), "no Viewer: line: \(shown.screen)")
        #expect(shown.screen.contains("open this URL: \(url)") && !shown.screen.contains("opened in your browser"), "\(shown.screen)")
        let page = try RawHTTP.request(port: try #require(Self.port(url)), "GET", "/")
        #expect(page.status == 200 && page.body.contains("<video"), "GET \(url): \(page.status)")
        let wraps = pane.nothingWraps(width: 80)
        #expect(wraps.ok, "\(wraps.detail)")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "after x: \(pane.screen())")
    }

    /// The page in headless Chromium (Tests/Fixtures/viewer_browser.py) with nothing shared: it
    /// connects and says so, in place of "Watching the shared screen.".
    @Test func thePageSaysNothingIsSharedAtHome() throws {
        try Harness.requireBuild()
        guard try ViewerBrowserTests.browserPrerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let pane = try Self.homeWithViewerAsked(folder: folder)
        let shown = pane.waitFor("open this URL", timeout: 15)
        let url = try #require(Self.viewerURL(shown.screen, host: "127.0.0.1"), "no Viewer: line: \(shown.screen)")
        let viewer = try ViewerBrowserTests.Viewer()
        defer { viewer.quit() }
        // No frames come: the open gives up waiting for video after a few seconds.
        _ = try viewer.send(["cmd": "open", "url": url, "timeout": 3], timeout: 60)
        let idle = try viewer.send(["cmd": "await_text", "text": Self.nothingShared, "timeout": 15], timeout: 40)
        #expect(idle["found"] as? Bool == true, "the page's texts: \(idle["texts"] ?? "-")")
        #expect(pane.waitFor("· 1 viewer", timeout: 10).ok, "the Viewer: line does not count the page: \(pane.screen())")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "after x: \(pane.screen())")
    }

    /// HomeViewer.nothingShared, as the page shows it.
    static let nothingShared = "Nothing is shared right now: the picture comes back when the agent shares into a room again."

    /// --listen and friends are accepted where the home screen may show; the daemon still refuses them.
    @Test func viewerOptionsAreForTheViewerAndTheHomeScreen() throws {
        try Harness.requireBuild()
        let home = try Harness.run(Harness.agent, ["home", "--listen", "127.0.0.1:0", "--viewer-token"], timeout: 20)
        #expect(home.status == 2 && home.stderr.contains("needs a terminal") && !home.stderr.contains("--listen"), "\(home)")
        let daemon = try Harness.run(Harness.agent, ["daemon", "--viewer-port", "0"], timeout: 20)
        #expect(daemon.status == 2 && daemon.stderr.contains("are for the viewer"), "\(daemon)")
    }

    /// A taken port: said on the screen, and the home screen goes on.
    @Test func aTakenPortIsANoticeNotAnExit() throws {
        try Harness.requireBuild()
        let folder = try Harness.temporaryDirectory()
        // A listening socket of the test holds a port (the proxy tests' listener that never accepts).
        let holder = try SilentListener()
        let taken = holder.port
        let pane = try Self.homeWithViewerAsked(listen: "127.0.0.1:\(taken)", folder: folder)
        let refused = pane.waitFor("Cannot start the viewer", timeout: 15)
        #expect(refused.ok && refused.screen.contains("State:     idle") && !refused.screen.contains("Viewer:    "), "after v: \(refused.screen)")
        #expect(!pane.screen().contains("EXIT="), "the agent ended: \(pane.screen())")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "after x: \(pane.screen())")
    }

    /// While sharing into the WHIP room, the viewer shows the same frames: a WHEP player decodes
    /// them with advancing stamps; after the session ends, `/status` says nothing is shared.
    @Test func whileSharingAWhepPlayerReceivesTheSharedFrames() throws {
        guard let room = try RoomSessionTests.WhipRoom() else { return }
        let python = ViewerBrowserTests.python
        guard FileManager.default.isExecutableFile(atPath: python) else {
            skipTest("\(python) is missing (scripts/setup makes it)")
            return
        }
        let folder = try Harness.temporaryDirectory()
        let (code, _) = try room.codeFile(identity: "Viv's screen")
        // aiortc drops 127.0.0.1 from its candidates: the viewer listens on the namespace's 127.0.0.2.
        let script = HomeScreenTests.paneScript(room, arguments: ["home", "--join", "@" + code, "--listen", "127.0.0.2:0"],
                                                environment: ["KRAKL_NO_NOTIFY": "1"], folder: folder,
                                                unsetting: ["BROWSER", "DISPLAY", "WAYLAND_DISPLAY"])
        let pane = try Pane(script: script, folder: folder, namespace: room.namespace)
        let sharing = pane.waitFor(timeout: 40, HomeScreenTests.hasLiveNumbers)
        try #require(sharing.ok, "not sharing: \(sharing.screen) \(procText(folder + "/agent.stderr"))")
        pane.keys("v")
        let shown = pane.waitFor("open this URL: http://127.0.0.2:", timeout: 15)
        let url = try #require(Self.viewerURL(shown.screen, host: "127.0.0.2"), "no Viewer: line: \(shown.screen)")

        let (program, argv) = room.namespace.command(python, [ViewerBrowserTests.playerScript, url + "whep", "--seconds", "3"])
        let player = try Harness.run(program, argv, timeout: 60)
        let line = player.stdout.split(separator: "\n").last { $0.hasPrefix("{\"report\"") }.map(String.init) ?? ""
        let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        let report = try #require(object?["report"] as? [String: Any], "exit \(player.status): \(player.stdout) \(player.stderr.suffix(1500))")
        print("WHEP player on the home screen's viewer while sharing: \(report.filter { $0.key != "states" })")
        #expect(player.status == 0 && report["post_status"] as? Int == 201, "\(report)")
        let decoded = report["frames_decoded"] as? Int ?? 0, read = report["stamps_read"] as? Int ?? 0
        // Frames flow (a small number over the player's 3 s, not a rate: krakl-bench viewer measures that).
        #expect(decoded >= 10 && read >= decoded * 9 / 10, "decoded \(decoded), stamps \(read)")
        #expect((report["last_stamp"] as? Int ?? 0) > (report["first_stamp"] as? Int ?? 0) && report["decreasing"] as? Int == 0, "\(report)")
        #expect(report["sizes"] as? [String] == ["640x360"], "\(report)")
        // The room share went on meanwhile.
        #expect(pane.screen().contains("State:     sharing"), "\(pane.screen())")

        // s ends the session; the server stays and says nothing is shared.
        pane.keys("s")
        #expect(pane.waitFor(timeout: 20) { $0.contains("You stopped sharing.") && $0.contains("State:     idle") }.ok, "\(pane.screen())")
        let statusScript = "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
        let (sp, sa) = room.namespace.command(python, ["-c", statusScript, url + "status"])
        let status = try Harness.run(sp, sa, timeout: 30)
        let parsed = (try? JSONSerialization.jsonObject(with: Data(status.stdout.utf8))) as? [String: Any]
        #expect((parsed?["idle"] as? String ?? "").contains("Nothing is shared right now") && parsed?["ended"] is NSNull, "\(status)")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "after x: \(pane.screen())")
    }
}
