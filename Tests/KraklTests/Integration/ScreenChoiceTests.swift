import Foundation
import Glibc
import KraklBase
import KraklCore
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
        let seen = try room.waitForParticipant(Self.identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 5 }
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
        let stop = try daemon.client(["stop"])
        #expect(stop.status == 0, "\(stop)")
    }
}
