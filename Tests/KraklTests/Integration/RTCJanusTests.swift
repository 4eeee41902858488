import Foundation
import Testing

/// The publisher against a real SFU: Janus 1.1.2's VideoRoom in the test's
/// own network namespace (scripts/janus-testbed). Tests/Fixtures/janus_room.py
/// does the room signalling a room driver will do (create, join as publisher
/// with a display name, publish our offer, listparticipants), then watches
/// the publication through Janus with an aiortc subscriber, and finally
/// destroys the room: Janus then ends our DTLS session with close_notify.
@Suite(.serialized, .tags(.integration, .netns)) struct RTCJanusTests {
    static var testbed: String { Harness.repoRoot + "/scripts/janus-testbed" }
    static var roomScript: String { Harness.repoRoot + "/Tests/Fixtures/janus_room.py" }

    @Test func janusAcceptsThePublicationAndASubscriberDecodesItUntilTheRoomEnds() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        guard Harness.which("janus") != nil else {
            skipTest("janus missing (scripts/setup installs it)")
            return
        }
        let folder = try Harness.temporaryDirectory()
        let started = try namespace.run("/bin/bash", [Self.testbed, "start", folder + "/janus"])
        try #require(started.status == 0, "Janus did not start: \(started.stderr)")
        defer { _ = try? namespace.run("/bin/bash", [Self.testbed, "stop", folder + "/janus"]) }

        let registry = try Harness.registryForThisBuild(in: folder)
        let display = "Ada's screen"
        let (rp, ra) = namespace.command(RtcPublisherSession.python, [Self.roomScript, "--display", display, "--seconds", "4", "--destroy"])
        let room = try DtlsTestProcess(rp, ra)
        defer { room.stop() }
        // The probe would publish for 60 s; the room's end must stop it long before.
        let (pp, pa) = namespace.command(RtcPublisherSession.probePath, ["--address", "127.0.0.2", "--seconds", "60", "--plugins", registry,
                                                                        "--option", "scene=typing", "--option", "width=640", "--option", "height=360"])
        let probe = try DtlsTestProcess(pp, pa)
        defer { probe.stop() }

        let offer = try #require(RtcPublisherSession.waitForSdp(probe, timeout: 30), "no offer from the probe: \(probe.log)")
        room.type(offer + "\n")
        let answer = try #require(RtcPublisherSession.waitForSdp(room, timeout: 30), "no answer from Janus: \(room.log)")
        #expect(answer.contains("a=setup:active") && answer.contains("VP8"), "Janus's answer: \(answer)")
        probe.type(answer + "\n")

        let report = try #require(RtcPublisherSession.jsonLine(room, marker: "{\"report\"", timeout: 60)?["report"] as? [String: Any],
                                  "no report from the room script: \(room.log)")
        let result = try #require(RtcPublisherSession.jsonLine(probe, marker: "\"result\"", timeout: 30), "the probe did not end with the room: \(probe.log)")
        let stats = result["stats"] as? [String: Any] ?? [:]
        let participants = report["participants"] as? [[String: Any]] ?? []
        let decoded = report["frames_decoded"] as? Int ?? 0
        print(String(format: "Janus: connected %@ ms after the answer; publisher listed %@; subscriber decoded %d frames in 4 s (%@ distinct stamps); probe: %@",
                     "\(stats["connect_ms"] ?? "-")", "\(report["publisher_listed"] ?? "?")", decoded, "\(report["distinct_stamps"] ?? 0)",
                     "\(result["result"] ?? "?")"))

        #expect(report["publisher_listed"] as? Bool == true, "listparticipants: \(participants)")
        #expect(participants.contains { $0["display"] as? String == display && $0["publisher"] as? Bool == true }, "\(participants)")
        // Frames flow (a small number, not a rate: krakl-bench room measures that).
        #expect(decoded >= 20, "the subscriber decoded \(decoded) frames in 4 s through Janus")
        #expect(report["decreasing"] as? Int == 0, "frame numbers went backwards through Janus")
        #expect((report["stamps_read"] as? Int ?? 0) >= decoded * 9 / 10, "frame stamps unreadable after Janus")
        #expect(report["sizes"] as? [String] == ["640x360"], "sizes \(report["sizes"] ?? "?")")
        #expect(report["destroyed"] as? String == "destroyed")
        // The room's end reaches the publisher as the peer closing DTLS, well before its own 60 s.
        #expect("\(result["result"] ?? "")".contains("close_notify"), "probe: \(result["result"] ?? "?")")
        #expect(probe.log.contains("\"event\":\"remote_closed\""), "no remote_closed event: \(probe.log.suffix(800))")
        #expect(stats["dtls_role"] as? String == "server", "Janus answers setup:active, so we are the DTLS server")
    }
}
