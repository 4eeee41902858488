import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// One backend choice for every entry point (issue 23, item 1): with an X display and no
/// `--backend`, a room gets the X screen, the scan looks at it and the daemon says so; without a
/// screen, the test pattern, and a line that says so. The room is the Twilio emulator, whose aiortc
/// decodes what arrives: the size of the decoded pictures tells the X screen from the pattern.
@Suite(.serialized, .tags(.integration, .netns)) struct ScreenChoiceTests {
    static let identity = "Ada's screen"

    @Test func aJoinWithAnXDisplaySharesTheXScreen() throws {
        guard let xvfb = try XvfbServer(width: 800, height: 600) else { return }
        defer { xvfb.kill() }
        guard let room = try TwilioTestRoom() else { return }
        let agent = try room.agent(try room.code(identity: Self.identity), environment: ["DISPLAY": xvfb.display, "WAYLAND_DISPLAY": ""], source: nil)
        defer { agent.stop() }
        #expect(agent.waitFor("backend x11: an X display (DISPLAY=\(xvfb.display))", timeout: 30), "\(agent.log.suffix(800))")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 1 }
        let frames = TwilioTestRoom.frames(seen)
        #expect(frames["width"] as? Int == 800 && frames["height"] as? Int == 600, "the room did not get the 800x600 X screen: \(frames)")
        _ = try room.complete()
        #expect(TwilioTestRoom.waitExit(agent, seconds: 20) == 30, "\(agent.log.suffix(600))")
    }

    @Test func aJoinWithoutAScreenSaysItSharesATestPattern() throws {
        guard let room = try TwilioTestRoom() else { return }
        let agent = try room.agent(try room.code(identity: Self.identity), environment: ["DISPLAY": "", "WAYLAND_DISPLAY": ""], source: nil)
        defer { agent.stop() }
        #expect(agent.waitFor("no screen found", timeout: 30) && agent.log.contains("sharing a test pattern (file backend)"), "\(agent.log.suffix(800))")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 5 }
        #expect((TwilioTestRoom.frames(seen)["decoded"] as? Int ?? 0) >= 5, "\(TwilioTestRoom.frames(seen))")
    }

    @Test func theScanLooksAtTheXScreenAndTheDaemonNamesIt() throws {
        try Harness.requireBuild()
        guard let xvfb = try XvfbServer(width: 640, height: 480) else { return }
        defer { xvfb.kill() }
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let scan = try Harness.agent(["--scan", "--once", "--plugins", registry, "--scan-timeout", "2"], timeout: 60,
                                     environment: ["DISPLAY": xvfb.display, "WAYLAND_DISPLAY": ""])
        #expect(scan.status == 50, "a blank X screen has no code: \(scan.status) \(scan.stderr)")
        #expect((scan.stdout + scan.stderr).contains("scanning the x11 (display \(xvfb.display)) screen"), "\(scan.stdout) \(scan.stderr)")

        guard let room = try TwilioTestRoom() else { return }
        let daemon = try DaemonTests.Daemon(namespace: room.namespace, extra: ["--address", "127.0.0.2", "--plugins", room.registry],
                                            environment: ["DISPLAY": xvfb.display, "WAYLAND_DISPLAY": ""])
        let connect = try daemon.client(["connect", "@" + (try room.code(identity: Self.identity))])
        try #require(connect.status == 0, "connect: \(connect)")
        let status = try daemon.status()
        #expect(status["backend"] as? String == "x11 (display \(xvfb.display))", "\(status)")
        // What the room decodes is the X screen's 640x480, not the pattern's 1280x720.
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 1 }
        let frames = TwilioTestRoom.frames(seen)
        #expect(frames["width"] as? Int == 640 && frames["height"] as? Int == 480, "the room did not get the 640x480 X screen: \(frames)")
        let stop = try daemon.client(["stop"])
        #expect(stop.status == 0, "\(stop)")
    }

    /// Through Janus, as the issue saw it: the subscriber decodes the X screen's size, not the
    /// test pattern's 1280x720.
    @Test func aJanusJoinWithAnXDisplaySharesTheXScreen() throws {
        guard let xvfb = try XvfbServer(width: 800, height: 600) else { return }
        defer { xvfb.kill() }
        guard let room = try RoomSessionTests.JanusRoom() else { return }
        let (code, _) = try room.codeFile(identity: Self.identity)
        let (program, argv) = room.namespace.command("/usr/bin/env", ["DISPLAY=" + xvfb.display, "WAYLAND_DISPLAY=", Harness.agent,
                                                                      "--join", "@" + code, "--once", "--address", "127.0.0.2",
                                                                      "--plugins", room.registry])
        let agent = try DtlsTestProcess(program, argv)
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "\(agent.log.suffix(800))")
        #expect(agent.log.contains("backend x11: an X display (DISPLAY=\(xvfb.display))"), "\(agent.log.suffix(800))")
        let watched = try room.host(["watch", "--display", Self.identity, "--seconds", "2"])
        // An unchanging X screen sends few frames (damage-tracked): the size is what is judged.
        #expect((watched["frames_decoded"] as? Int ?? 0) >= 1, "\(watched)")
        #expect(watched["sizes"] as? [String] == ["800x600"], "the subscriber through Janus did not see the 800x600 X screen: \(watched)")
        _ = try room.host(["end", "--how", "destroy", "--display", Self.identity])
        #expect(RoomSessionTests.waitExit(agent, seconds: 20).status == 30, "\(agent.log.suffix(600))")
    }

    /// The home screen's join shares the X screen and says so on its Backend line.
    @Test func theHomeScreenSharesTheXScreenAndNamesIt() throws {
        guard let xvfb = try XvfbServer(width: 800, height: 600) else { return }
        defer { xvfb.kill() }
        guard let room = try TwilioTestRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try String(contentsOfFile: try room.code(identity: Self.identity), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let script = HomeScreenTests.paneScript(registry: room.registry, arguments: ["home"],
                                                environment: ["KRAKL_NO_NOTIFY": "1", "DISPLAY": xvfb.display, "WAYLAND_DISPLAY": ""],
                                                folder: folder, source: [])
        let pane = try HomeScreenTests.Pane(script: script, folder: folder, namespace: room.namespace)
        try #require(pane.waitFor("[c] connect with a join code", timeout: 20).ok, "no home screen: \(pane.screen())")
        pane.keys("c")
        #expect(pane.waitFor("Paste or type the join code", timeout: 10).ok)
        pane.type(code)
        pane.keys("Enter")
        let sharing = pane.waitFor(timeout: 40) { $0.contains("State:     sharing") && $0.contains("Picture:   800x600") }
        #expect(sharing.ok && sharing.screen.contains("Backend:   x11 (display \(xvfb.display))"), "\(sharing.screen)")
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 1 }
        let frames = TwilioTestRoom.frames(seen)
        #expect(frames["width"] as? Int == 800 && frames["height"] as? Int == 600, "the room did not get the 800x600 X screen: \(frames)")
        _ = try room.complete()
        #expect(pane.waitFor("State:     idle", timeout: 20).ok, "\(pane.screen())")
        pane.keys("x")
    }

    /// What the person names wins over the screen that is there: `--backend`, then a plugins.json
    /// `default`; a Wayland session picks the portal over an X display.
    @Test func namedBackendsWinOverTheScreenAndWaylandPicksThePortal() throws {
        try Harness.requireBuild()
        guard let xvfb = try XvfbServer(width: 640, height: 480) else { return }
        defer { xvfb.kill() }
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        var object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: registry))) as? [String: Any])
        object["default"] = "file"
        let withDefault = folder + "/plugins-default.json"
        try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: withDefault))

        func scanned(_ arguments: [String], _ environment: [String: String]) throws -> String {
            let scan = try Harness.agent(["--scan", "--once", "--scan-timeout", "1"] + arguments, timeout: 60, environment: environment)
            return scan.stdout + scan.stderr
        }
        let x = ["DISPLAY": xvfb.display, "WAYLAND_DISPLAY": ""]
        let asked = try scanned(["--plugins", registry, "--backend", "file"], x)
        #expect(asked.contains("scanning the file (test pattern) screen"), "\(asked)")
        let byDefault = try scanned(["--plugins", withDefault], x)
        #expect(byDefault.contains("scanning the file (test pattern) screen"), "\(byDefault)")
        // `backends` names the choice without starting the portal (there is none here).
        let listed = try Harness.agent(["backends", "--plugins", registry], timeout: 60, environment: x)
        #expect(listed.stdout.contains("the screen's: x11 here"), "\(listed.stdout)")
        let wayland = try Harness.agent(["backends", "--plugins", registry], timeout: 60,
                                        environment: ["DISPLAY": xvfb.display, "WAYLAND_DISPLAY": "wayland-krakl-test"])
        #expect(wayland.stdout.contains("the screen's: pipewire here, a Wayland session"), "\(wayland.stdout)")
    }
}
