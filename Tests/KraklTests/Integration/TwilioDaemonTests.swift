import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The daemon in Twilio rooms (the emulator, Tests/Fixtures/twilio_room.py): `connect` shares, the
/// room's completion brings it back to idle, `stop` says goodbye, and many join/complete cycles
/// leave its descriptors and threads where they were.
@Suite(.serialized, .tags(.integration, .netns)) struct TwilioDaemonTests {
    static func daemon(_ room: TwilioTestRoom) throws -> DaemonTests.Daemon {
        try DaemonTests.Daemon(namespace: room.namespace, extra: ["--address", "127.0.0.2", "--plugins", room.registry, "--option", "scene=typing",
                                                                  "--option", "width=640", "--option", "height=360"])
    }

    /// Polls `status` until the daemon is idle again (bounded); its status then.
    static func idle(_ daemon: DaemonTests.Daemon, timeout: Double = 20) throws -> [String: Any] {
        let deadline = Date().addingTimeInterval(timeout)
        var status = try daemon.status()
        while status["state"] as? String != "idle" && Date() < deadline {
            usleep(50_000)
            status = try daemon.status()
        }
        return status
    }

    @Test func connectThenTheRoomIsCompletedThenStopSaysGoodbye() throws {
        guard let room = try TwilioTestRoom() else { return }
        let daemon = try Self.daemon(room)
        let identity = "Ada's screen"
        let connect = try daemon.client(["connect", "@" + (try room.code(identity: identity))])
        try #require(connect.status == 0, "connect: \(connect)")
        let sharing = try daemon.status()
        #expect(sharing["service"] as? String == "Twilio Video")
        #expect((sharing["roomDetails"] as? String)?.contains("RM") == true, "status has no room SID: \(sharing)")
        let asked = try room.complete()
        let idle = try Self.idle(daemon)
        let ms = MonotonicClock.milliseconds() - asked
        print(String(format: "daemon, twilio: room completed → idle seen by status polling %.0f ms later", ms))
        #expect(idle["state"] as? String == "idle", "\(idle)")
        let end = idle["lastEnd"] as? [String: Any] ?? [:]
        #expect((end["message"] as? String)?.contains("Twilio 53118") == true, "last end: \(end)")
        let record = try room.waitForParticipant(identity, timeout: 5) { $0["disconnect_received"] as? Bool == true }
        #expect(record?["disconnect_received"] as? Bool == true && record?["bye_received"] as? Bool == true, "\(record ?? [:])")

        // Again, now ended by the person: the daemon's `stop`.
        let again = try daemon.client(["connect", "@" + (try room.code(identity: identity))])
        try #require(again.status == 0, "second connect: \(again)")
        let stop = try daemon.client(["stop"])
        #expect(stop.status == 0 && stop.stdout.contains("You stopped sharing."), "\(stop)")
        let second = try room.waitForParticipant(identity, timeout: 5) { $0["ws_close_code"] as? Int == 1000 }
        #expect(second?["disconnect_received"] as? Bool == true && second?["bye_received"] as? Bool == true && second?["ws_close_code"] as? Int == 1000,
                "after stop: \(second ?? [:])")
    }

    /// `watch` after a stopped session, then one the room ends: no line in between repeats the
    /// first session's end as if it were the second's (issue 23, item 4.4).
    @Test func watchTellsEachSessionsOwnEnd() throws {
        guard let room = try TwilioTestRoom() else { return }
        let daemon = try Self.daemon(room)
        let watch = try DtlsTestProcess("/usr/bin/env", ["XDG_RUNTIME_DIR=\(daemon.runtime)", Harness.agent, "watch"])
        defer { watch.stop() }
        let code = try room.code(identity: "Wes")
        try #require(try daemon.client(["connect", "@" + code]).status == 0)
        try #require(try daemon.client(["stop"]).status == 0)
        #expect(watch.waitFor("You stopped sharing.", timeout: 10), "\(watch.log)")
        let before = watch.log.count
        try #require(try daemon.client(["connect", "@" + code]).status == 0)
        _ = try room.complete()
        #expect(watch.waitFor("Twilio 53118", timeout: 20), "\(watch.log)")
        _ = watch.waitFor("\u{1}never", timeout: 0.5)
        let second = String(watch.log.dropFirst(before))
        #expect(!second.contains("You stopped sharing."), "the first session's end was told again:\n\(second)")
    }

    @Test func joinCompleteCyclesKeepTheDaemonFlat() throws {
        guard let room = try TwilioTestRoom(["--seconds", "900"]) else { return }
        let daemon = try Self.daemon(room)
        let code = try room.code(identity: "Cy")
        let cycles = Int(ProcessInfo.processInfo.environment["KRAKL_TWILIO_CYCLES"] ?? "") ?? 50
        let pid = daemon.pid
        func cycle(_ index: Int) throws {
            let connect = try daemon.client(["connect", "@" + code])
            try #require(connect.status == 0, "cycle \(index) connect: \(connect)")
            _ = try room.complete()
            let idle = try Self.idle(daemon)
            try #require(idle["state"] as? String == "idle", "cycle \(index): not idle after the room was completed: \(idle)")
        }
        // Warm-up as for the WHIP cycles: glibc arenas grow to their working size in the first ~20 sessions.
        let warm = min(20, cycles / 2)
        for index in 0..<max(1, warm) { try cycle(index) }
        let start = DaemonTests.settled(pid)
        let startMappings = DaemonTests.residentByMapping(pid)
        let began = MonotonicClock.milliseconds()
        for index in 1...(cycles - warm) { try cycle(warm + index) }
        let seconds = (MonotonicClock.milliseconds() - began) / 1000
        let end = DaemonTests.settled(pid, like: start)
        let perCycle = Double(end.rssKB - start.rssKB) / Double(cycles - warm)
        let grown = DaemonTests.growth(from: startMappings, to: DaemonTests.residentByMapping(pid))
        print(String(format: "%d Twilio join/complete cycles through the daemon: after cycle %d fds %d, threads %d, RSS %d KB; after cycle %d "
                     + "(%.1f s later) fds %d, threads %d, RSS %d KB (%+.1f KB a cycle); by mapping: %@",
                     cycles, warm, start.fds, start.threads, start.rssKB, cycles, seconds, end.fds, end.threads, end.rssKB, perCycle, grown))
        #expect(end.fds == start.fds, "descriptors \(start.fds) → \(end.fds)")
        #expect(end.threads == start.threads, "threads \(start.threads) → \(end.threads)")
        // RSS is reported; glibc's per-thread arenas make 30 cycles beside a loaded suite move by up to
        // ~160 KB a cycle (a quiet 100-cycle run: +1.2 KB a cycle), so only what a leaked session would
        // cost is judged: its encoder and send stream are megabytes (640x360) a cycle.
        #expect(perCycle < 1000, "RSS \(start.rssKB) → \(end.rssKB) KB over \(cycles - warm) cycles")
        let completions = room.events("room-completed").count
        #expect(completions == cycles, "the emulator completed \(completions) rooms for \(cycles) cycles")
    }
}
