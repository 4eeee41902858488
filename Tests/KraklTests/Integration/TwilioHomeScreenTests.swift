import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The brief's workflow through the Twilio room emulator, in the interactive home screen (tmux, an
/// 80×24 pane in the room's namespace): the screen shows a QR code holding just a Twilio access
/// token, `s` scans it, the agent shares as the token's identity, the room's owner completes the
/// room over REST, and the home screen is back at "connect" with the reason; `s` while sharing
/// stops and says goodbye.
@Suite(.serialized, .tags(.integration, .netns)) struct TwilioHomeScreenTests {
    @Test func scanABareTokenShareAndComeHomeWhenTheRoomIsCompleted() throws {
        guard try ScreenScanTests.prerequisites(), let room = try TwilioTestRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let identity = "Mubashir's screen"
        let token = try room.token(identity: identity)
        let clip = try ScreenScanTests.clip(try ScreenScanTests.qrPNG(token, pixels: 3, in: folder), size: "800x600", seconds: 12, fps: 5,
                                            appearsAt: 3, x: 100, y: 50, in: folder)
        let script = HomeScreenTests.paneScript(registry: room.registry, arguments: ["home", "--twilio-url", room.signalingURL],
                                                environment: ["KRAKL_NO_NOTIFY": "1"], folder: folder,
                                                source: ["--backend", "file", "--option", "path=" + clip, "--option", "loop=true"])
        let pane = try HomeScreenTests.Pane(script: script, folder: folder, namespace: room.namespace)
        try #require(pane.waitFor("[s] scan the screen", timeout: 20).ok, "no home screen: \(pane.screen())")
        pane.keys("s")
        let sharing = pane.waitFor(timeout: 60) { $0.contains("State:     sharing") && $0.contains("Identity:  \(identity)") }
        print("home screen sharing into the Twilio room:\n\(sharing.screen)")
        try #require(sharing.ok, "the scanned token did not share: \(sharing.screen) \(procText(folder + "/agent.stderr").suffix(800))")
        #expect(sharing.screen.contains("(Twilio Video)"), "\(sharing.screen)")
        let seen = try room.waitForParticipant(identity, timeout: 30) { (TwilioTestRoom.frames($0)["decoded"] as? Int ?? 0) >= 10 }
        #expect((TwilioTestRoom.frames(seen)["decoded"] as? Int ?? 0) >= 10, "the room decoded nothing: \(TwilioTestRoom.frames(seen))")

        _ = try room.complete()
        let home = pane.waitFor(timeout: 20) { $0.contains("State:     idle") && $0.contains("Twilio 53118") }
        print("home screen after the room was completed:\n\(home.screen)")
        #expect(home.ok, "not home after completion: \(home.screen) \(procText(folder + "/agent.stderr").suffix(600))")
        #expect(home.screen.contains("[c] connect with a join code"), "\(home.screen)")
        let record = try room.waitForParticipant(identity, timeout: 5) { $0["disconnect_received"] as? Bool == true }
        #expect(record?["disconnect_received"] as? Bool == true, "\(record ?? [:])")
        #expect(pane.nothingWraps(width: 80).ok)
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not quit: \(pane.screen())")
    }

    @Test func theStopKeySaysDisconnectAndBye() throws {
        guard let room = try TwilioTestRoom() else { return }
        let folder = try Harness.temporaryDirectory()
        let identity = "Ada's screen"
        let code = try room.code(identity: identity)
        let pane = try HomeScreenTests.Pane(script: HomeScreenTests.paneScript(registry: room.registry, arguments: ["--join", "@" + code],
                                                                               environment: ["KRAKL_NO_NOTIFY": "1"], folder: folder),
                                            folder: folder, namespace: room.namespace)
        let sharing = pane.waitFor(timeout: 40) { $0.contains("State:     sharing") && $0.contains("Identity:  \(identity)") }
        try #require(sharing.ok, "never shared: \(sharing.screen) \(procText(folder + "/agent.stderr").suffix(800))")
        pane.keys("s")
        let stopped = pane.waitFor(timeout: 20) { $0.contains("You stopped sharing.") && $0.contains("State:     idle") }
        #expect(stopped.ok, "\(stopped.screen)")
        let record = try room.waitForParticipant(identity, timeout: 5) { $0["ws_close_code"] as? Int == 1000 }
        #expect(record?["disconnect_received"] as? Bool == true && record?["bye_received"] as? Bool == true, "\(record ?? [:])")
        pane.keys("x")
        #expect(pane.waitFor("EXIT=0", timeout: 20).ok, "x did not quit: \(pane.screen())")
    }
}
