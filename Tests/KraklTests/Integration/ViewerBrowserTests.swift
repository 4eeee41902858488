import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// The built-in viewer end to end (issue 14 part 4, "Viewer"): the real agent (file backend, the
/// frame-stamped typing scene) and its page in headless Chromium (Tests/Fixtures/viewer_browser.py),
/// or a standard WHEP player that is not our page (aiortc, Tests/Fixtures/whep_player.py).
///
/// Chromium runs on plain loopback: without a media permission it signals no candidates and sends
/// its checks from a socket bound to 0.0.0.0, so they reach the agent's 127.0.0.1 candidate from
/// 127.0.0.1 and ICE connects on a peer-reflexive pair (docs/testing.md, "Chromium"); nothing leaves `lo`. aiortc
/// drops 127.0.0.1 from its candidates, so the WHEP player test runs in a namespace of its own.
@Suite(.serialized, .tags(.integration, .browser, .netns)) struct ViewerBrowserTests {
    static let python = "/opt/krakl-venv/bin/python"
    static var browserScript: String { Harness.repoRoot + "/Tests/Fixtures/viewer_browser.py" }
    static var playerScript: String { Harness.repoRoot + "/Tests/Fixtures/whep_player.py" }

    /// Chromium, chromium-driver and selenium, or false after SKIP naming the missing one.
    static func browserPrerequisites() throws -> Bool {
        for (path, package) in [("/usr/bin/chromium", "chromium"), ("/usr/bin/chromedriver", "chromium-driver")]
        where !FileManager.default.isExecutableFile(atPath: path) {
            skipTest("\(path) is missing (Debian \(package); scripts/setup installs it)")
            return false
        }
        guard FileManager.default.isExecutableFile(atPath: python), try Harness.run(python, ["-c", "import selenium"]).status == 0 else {
            skipTest("selenium missing in \(python) (scripts/setup installs it)")
            return false
        }
        return true
    }

    /// The agent sharing the typing scene to its viewer on 127.0.0.1 (a free port); its URL once it serves.
    static func startAgent(_ extra: [String] = [], width: Int = 640, height: Int = 360) throws -> (RunningAgent, String) {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--backend", "file", "-o", "scene=typing", "-o", "width=\(width)",
                                      "-o", "height=\(height)", "--listen", "127.0.0.1:0"] + extra)
        try #require(agent.read(until: "| viewers 0/"), "the agent did not start its viewer: \(agent.output)")
        let url = try #require(ViewerAgentTests.printedURL(agent.output), "no URL: \(agent.output)")
        return (agent, url)
    }

    /// One Chromium watching the page: one JSON command in, one JSON line out.
    final class Viewer {
        let process: DtlsTestProcess
        private var answered = 0

        init() throws {
            process = try DtlsTestProcess(ViewerBrowserTests.python, [ViewerBrowserTests.browserScript])
            _ = try #require(nextReply(timeout: 60), "Chromium did not start: \(process.log.suffix(1500))")
        }

        func nextReply(timeout: Double) -> [String: Any]? {
            let deadline = MonotonicClock.milliseconds() + timeout * 1000
            while MonotonicClock.milliseconds() < deadline {
                let replies = process.log.split(whereSeparator: \.isNewline).compactMap { line -> [String: Any]? in
                    guard line.hasPrefix("{\"ok\"") else { return nil }
                    return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
                }
                if replies.count > answered {
                    answered += 1
                    return replies[answered - 1]
                }
                if !process.isRunning { break }
                usleep(20_000)
            }
            return nil
        }

        /// Sends a command and waits (bounded) for its reply; a failed or missing reply fails the test.
        func send(_ command: [String: Any], timeout: Double = 60) throws -> [String: Any] {
            let data = try JSONSerialization.data(withJSONObject: command)
            process.type(String(decoding: data, as: UTF8.self) + "\n")
            let reply = try #require(nextReply(timeout: timeout), "no reply to \(command) in \(timeout) s: \(process.log.suffix(1500))")
            try #require(reply["ok"] as? Bool == true, "browser: \(reply)")
            return reply
        }

        /// Opens the page and checks it plays stamped video.
        func open(_ url: String, run: String) throws -> [String: Any] {
            let opened = try send(["cmd": "open", "url": url, "timeout": 30], timeout: 90)
            print(String(format: "%@: page opened → first frame presented %.0f ms (on the page's clock), ready after %.0f ms; %@",
                         run, opened["first_frame_ms"] as? Double ?? -1, opened["waited_ms"] as? Double ?? -1, "\(opened["state"] ?? "-")"))
            #expect(opened["playing"] as? Bool == true, "\(run): no stamped video in the page: \(opened)")
            return opened
        }

        /// Ends the browser (once; the fixture ends by itself after "vanish").
        func quit() {
            guard !quitted else { return }
            quitted = true
            if process.isRunning { process.type("{\"cmd\": \"quit\"}\n") }
            _ = process.waitForExit(seconds: 10)
            process.stop()
        }
        private var quitted = false
    }

    /// Checks a `watch` reply (stamps advancing in the page) and prints Chromium's getStats numbers.
    @discardableResult
    static func checkWatched(_ watched: [String: Any], run: String, seconds: Double) -> [Int] {
        let stats = watched["stats"] as? [String: Any] ?? [:], before = watched["stats_before"] as? [String: Any] ?? [:]
        func number(_ key: String, _ from: [String: Any] = stats) -> Double { (from[key] as? NSNumber)?.doubleValue ?? .nan }
        let latencies = watched["latency_ms"] as? [Double] ?? []
        let decoded = number("framesDecoded") - number("framesDecoded", before)
        let jitterMs = number("jitterBufferDelay") / max(1, number("jitterBufferEmittedCount")) * 1000
        print(String(format: "%@: %d frames presented in %.0f s, %d with a stamp, frames %@ → %@ (%d distinct), sizes %@; "
                     + "capture → presented p50 %.1f ms, max %.1f ms; selected pair %@; "
                     + "getStats: framesDecoded %.0f (+%.0f), freezeCount %.0f, totalFreezesDuration %.3f s, "
                     + "jitterBufferDelay %.3f s (%.1f ms a frame), packetsLost %.0f, nackCount %.0f, pliCount %.0f",
                     run, watched["presented"] as? Int ?? 0, seconds, watched["stamps_read"] as? Int ?? 0,
                     "\(watched["first_frame"] ?? "-")", "\(watched["last_frame"] ?? "-")", watched["distinct_frames"] as? Int ?? 0,
                     "\(watched["sizes"] ?? "-")", latencies.nearestRank(0.5) ?? .nan, latencies.last ?? .nan,
                     "\((stats["pair"] as? [String: Any]).map { "\($0["local"] ?? "?") ⇄ \($0["remote"] ?? "?")" } ?? "-")",
                     number("framesDecoded"), decoded, number("freezeCount"), number("totalFreezesDuration"), number("jitterBufferDelay"),
                     jitterMs, number("packetsLost"), number("nackCount"), number("pliCount")))
        let presented = watched["presented"] as? Int ?? 0, read = watched["stamps_read"] as? Int ?? 0
        let first = watched["first_frame"] as? Int ?? 0, last = watched["last_frame"] as? Int ?? 0
        #expect(presented >= 10 && read >= presented * 9 / 10, "\(run): stamps unreadable in the page: \(read) of \(presented)")
        #expect(last > first && (watched["distinct_frames"] as? Int ?? 0) >= 10, "\(run): the stamp did not advance: \(first) → \(last)")
        #expect(watched["decreasing"] as? Int == 0, "\(run): frame stamps went backwards in the page")
        // Frames flow (a small number, not a rate: krakl-bench viewer measures that).
        #expect(decoded >= 10, "\(run): Chromium decoded \(decoded) frames while watching")
        #expect((watched["state"] as? [String: Any])?["text"] as? String == "Watching the shared screen.", "\(run): \(watched["state"] ?? "-")")
        return [first, last]
    }

    /// The agent's own named threads (krakl-…: its network loop, control…), sorted. Threads still called
    /// by the process's name and libdispatch's workers (com.apple.root.…-qos) are left out: they come and go.
    static func namedThreads(_ pid: pid_t) -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.map { procText("/proc/\(pid)/task/\($0)/comm").trimmingCharacters(in: .whitespacesAndNewlines) }
            .filter { $0.hasPrefix("krakl-") && $0 != "krakl-agent" }.sorted()
    }

    @Test func thePagePlaysLiveVideoWithAdvancingStamps() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let viewer = try Viewer()
        defer { viewer.quit() }
        let opened = try viewer.open(url, run: "viewer page")
        #expect(opened["size"] as? String == "640x360", "\(opened)")
        #expect(agent.read(until: "1 watching"), "\(agent.output.suffix(600))")
        Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 3]), run: "viewer page", seconds: 3)
        // Leaving the page (as closing the tab does): its pagehide DELETE frees the place at once.
        _ = try viewer.send(["cmd": "leave"])
        #expect(agent.read(until: "left; 0 watching", timeout: 10), "the page's DELETE did not arrive: \(agent.output.suffix(600))")
        viewer.quit()
        #expect(agent.stop() == 0)
    }

    /// The run's end is on the page at once: the agent closes DTLS (close_notify) and the page says
    /// so from the transport's state, instead of "Watching the shared screen." over the frozen last
    /// picture until the connection's state caught up (~2 s).
    @Test func theEndOfTheRunIsOnThePageAtOnce() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let viewer = try Viewer()
        defer { viewer.quit() }
        _ = try viewer.open(url, run: "end of run")
        #expect(agent.read(until: "1 watching"), "\(agent.output.suffix(600))")
        agent.signal(SIGINT)
        let ended = try viewer.send(["cmd": "await_text", "text": "Sharing ended: the agent closed the connection.", "timeout": 10], timeout: 30)
        print("the page after the run ended: \(ended["texts"] ?? "-")")
        #expect(ended["found"] as? Bool == true, "the page did not say the run ended: \(ended)")
        #expect((ended["texts"] as? [String])?.contains { $0.hasPrefix("The connection") } == false, "\(ended)")
    }

    /// Two browsers at once: both play, both see the one stream (the same frame numbers), and the
    /// second viewer adds no named thread to the agent (one encoder, one network loop, fanned out).
    @Test func twoViewersAtOnceShareOneEncoder() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let first = try Viewer(), second = try Viewer()
        defer { first.quit(); second.quit() }
        _ = try first.open(url, run: "viewer 1 of 2")
        #expect(agent.read(until: "1 watching"))
        let threadsWithOne = Self.namedThreads(agent.process.processIdentifier)
        _ = try second.open(url, run: "viewer 2 of 2")
        #expect(agent.read(until: "2 watching"), "\(agent.output.suffix(600))")
        #expect(agent.read(until: "viewers 2/4"))
        let threadsWithTwo = Self.namedThreads(agent.process.processIdentifier)
        print("two viewers: the agent's named threads with 1 viewer \(threadsWithOne), with 2 viewers \(threadsWithTwo)")
        #expect(!threadsWithOne.isEmpty && threadsWithTwo == threadsWithOne, "a second viewer added threads to the agent: \(threadsWithOne) → \(threadsWithTwo)")
        // Both watch at once (each command returns after its seconds; the two overlap).
        first.process.type("{\"cmd\": \"watch\", \"seconds\": 3}\n")
        second.process.type("{\"cmd\": \"watch\", \"seconds\": 3}\n")
        let one = try #require(first.nextReply(timeout: 60), "\(first.process.log.suffix(800))")
        let two = try #require(second.nextReply(timeout: 60), "\(second.process.log.suffix(800))")
        let rangeOne = Self.checkWatched(one, run: "viewer 1 of 2", seconds: 3)
        let rangeTwo = Self.checkWatched(two, run: "viewer 2 of 2", seconds: 3)
        // The same stream: their frame ranges overlap.
        #expect(rangeOne[0] <= rangeTwo[1] && rangeTwo[0] <= rangeOne[1], "the viewers' frames do not overlap: \(rangeOne) \(rangeTwo)")
        first.quit(); second.quit()
        #expect(agent.stop() == 0)
        let encodedLines = agent.output.split(separator: "\n").filter { $0.hasPrefix("encoded: ") }
        #expect(encodedLines.count == 1, "one encoder's summary: \(encodedLines)")
        print("two viewers: \(encodedLines.first ?? "no encoder summary")")
    }

    /// A viewer whose browser vanishes (killed: no pagehide, no DELETE, no DTLS close) is dropped by
    /// ICE consent (RFC 7675: 30 s after the browser's last check), and the other viewer plays on.
    @Test func aViewerThatVanishesIsDroppedWithin30Seconds() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let staying = try Viewer(), leaving = try Viewer()
        defer { staying.quit(); leaving.quit() }
        _ = try staying.open(url, run: "staying viewer")
        _ = try leaving.open(url, run: "vanishing viewer")
        #expect(agent.read(until: "2 watching"), "\(agent.output.suffix(600))")
        let killed = try leaving.send(["cmd": "vanish"])
        let vanishedAt = MonotonicClock.milliseconds()
        #expect(killed["killed"] as? Int ?? 0 >= 1, "\(killed)")
        // Bounded: consent's 30 s counts from the last check, which came before the kill; 2 s more for a busy machine.
        let dropped = agent.read(until: "1 watching", count: 2, timeout: 32) // the first was when the first viewer joined
        let ms = MonotonicClock.milliseconds() - vanishedAt
        let line = agent.output.split(separator: "\n").first { $0.contains("dropped") } ?? "none"
        print(String(format: "vanished viewer: dropped %.1f s after its browser was killed (%@)", ms / 1000, String(line)))
        #expect(dropped, "the vanished viewer was not dropped: \(agent.output.suffix(600))")
        #expect(line.contains("ICE consent expired"), "dropped by consent: \(line)")
        Self.checkWatched(try staying.send(["cmd": "watch", "seconds": 2]), run: "staying viewer after the other vanished", seconds: 2)
        staying.quit()
        #expect(agent.stop() == 0)
    }

    /// WHEP ICE restart with a real peer (RFC 9725 §4.3.2): the page's `pc.restartIce()` (what it does by
    /// itself when ICE fails), its PATCH and the agent's answer fragment; Chromium's selected pair moves
    /// to the new generation's credentials on both sides, the stamps keep advancing, DTLS stays as it
    /// was (same certificates, still connected, and the agent counts one handshake for the session).
    @Test func thePageRestartsIceAndTheVideoGoesOn() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let viewer = try Viewer()
        defer { viewer.quit() }
        _ = try viewer.open(url, run: "restart: before")
        #expect(agent.read(until: "1 watching"), "\(agent.output.suffix(600))")
        Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 2]), run: "restart: before", seconds: 2)
        for round in 1...2 {
            let restarted = try viewer.send(["cmd": "restart", "timeout": 20], timeout: 60)
            let before = restarted["before"] as? [String: Any] ?? [:], after = restarted["after"] as? [String: Any] ?? [:]
            let pairBefore = before["pair"] as? [String: Any] ?? [:], pairAfter = after["pair"] as? [String: Any] ?? [:]
            func ms(_ key: String) -> Double { (restarted[key] as? NSNumber)?.doubleValue ?? .nan }
            print(String(format: "restart %d: PATCH answered in %.1f ms; PATCH → selected pair on the new credentials ≤ %.0f ms "
                         + "(polled every ~100 ms); PATCH → next newer frame presented %.1f ms; %d newer frames; "
                         + "pair %@ (%@/%@) → %@ (%@/%@); selectedCandidatePairChanges %@ → %@; dtlsState %@ → %@; %@",
                         round, ms("patch_answered_ms"), ms("patch_to_pair_switch_ms"), ms("patch_to_next_frame_ms"),
                         restarted["frames_after_patch"] as? Int ?? 0,
                         "\(pairBefore["local"] ?? "-")", "\(pairBefore["localUfrag"] ?? "-")", "\(pairBefore["remoteUfrag"] ?? "-")",
                         "\(pairAfter["local"] ?? "-")", "\(pairAfter["localUfrag"] ?? "-")", "\(pairAfter["remoteUfrag"] ?? "-")",
                         "\(before["selectedCandidatePairChanges"] ?? "-")", "\(after["selectedCandidatePairChanges"] ?? "-")",
                         "\(before["dtlsState"] ?? "-")", "\(after["dtlsState"] ?? "-")", "\(restarted["result"] ?? "-")"))
            #expect(restarted["restarted"] as? Bool == true, "round \(round): \(restarted["result"] ?? "-")")
            // The selected pair is the new generation's, on both sides' credentials.
            #expect(pairAfter["localUfrag"] as? String != nil && pairAfter["localUfrag"] as? String != pairBefore["localUfrag"] as? String,
                    "round \(round): local ufrag \(pairBefore["localUfrag"] ?? "-") → \(pairAfter["localUfrag"] ?? "-")")
            #expect(pairAfter["remoteUfrag"] as? String != nil && pairAfter["remoteUfrag"] as? String != pairBefore["remoteUfrag"] as? String,
                    "round \(round): remote ufrag \(pairBefore["remoteUfrag"] ?? "-") → \(pairAfter["remoteUfrag"] ?? "-")")
            #expect(after["iceLocalUsernameFragment"] == nil || after["iceLocalUsernameFragment"] as? String == pairAfter["localUfrag"] as? String)
            // DTLS kept: still connected with the same certificates on both sides.
            #expect(after["dtlsState"] as? String == "connected")
            #expect(after["localFingerprint"] as? String != nil && after["localFingerprint"] as? String == before["localFingerprint"] as? String)
            #expect(after["remoteFingerprint"] as? String != nil && after["remoteFingerprint"] as? String == before["remoteFingerprint"] as? String)
            // Video went on: newer stamps after the PATCH, never backwards.
            #expect(restarted["frames_after_patch"] as? Int ?? 0 >= 5, "round \(round): \(restarted["frames_after_patch"] ?? "-") newer frames")
            #expect(restarted["decreasing"] as? Int == 0)
            #expect(agent.read(until: "restarted ICE; 1 watching", count: round), "\(agent.output.suffix(600))")
            Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 2]), run: "restart \(round): after", seconds: 2)
        }
        let state = try viewer.send(["cmd": "state"])
        #expect((state["state"] as? [String: Any])?["restarts"] as? Int == 2, "\(state)")
        // The agent's own count: two restarts, one DTLS handshake for the whole session.
        _ = try viewer.send(["cmd": "leave"])
        #expect(agent.read(until: "(2 ICE restarts, 1 DTLS handshake) left; 0 watching", timeout: 10), "\(agent.output.suffix(600))")
        viewer.quit()
        #expect(agent.stop() == 0)
    }

    /// The page restarts ICE by itself: the agent stalls (SIGSTOP: nothing reaches Chromium, as when the
    /// path breaks), Chromium's ICE goes disconnected, the page says "Reconnecting…" and PATCHes a
    /// restart after its 3 s grace; the agent resumes (SIGCONT), answers, and the video goes on in the
    /// same session (the same DTLS: one handshake).
    @Test func thePageRestartsIceByItselfWhenTheConnectionStalls() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent()
        let viewer = try Viewer()
        defer {
            kill(agent.process.processIdentifier, SIGCONT)
            viewer.quit()
        }
        _ = try viewer.open(url, run: "stall: before")
        #expect(agent.read(until: "1 watching"), "\(agent.output.suffix(600))")
        Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 1]), run: "stall: before", seconds: 1)
        let pid = agent.process.processIdentifier
        try #require(kill(pid, SIGSTOP) == 0)
        let stoppedAt = MonotonicClock.milliseconds()
        let waiting = try viewer.send(["cmd": "await_text", "text": "Reconnecting…", "timeout": 20], timeout: 40)
        let reconnectingAfter = MonotonicClock.milliseconds() - stoppedAt
        kill(pid, SIGCONT)
        let resumedAt = MonotonicClock.milliseconds()
        #expect(waiting["found"] as? Bool == true, "the page never said Reconnecting…: \(waiting)")
        let restarted = try viewer.send(["cmd": "await_restart", "count": 1, "timeout": 30], timeout: 60)
        let backAfter = MonotonicClock.milliseconds() - resumedAt
        let times = restarted["times"] as? [String: Any] ?? [:]
        func ms(_ key: String) -> Double { (restarted[key] as? NSNumber)?.doubleValue ?? .nan }
        let ice = restarted["ice"] as? [String: Any] ?? [:]
        print(String(format: "stall: agent stopped → page says Reconnecting… after %.1f s; resumed → restarted and %d newer frames within %.1f s; "
                     + "PATCH → next newer frame %.0f ms (includes the stall left after the PATCH left); restart asked → next newer frame %.0f ms; "
                     + "texts %@; ICE %@, DTLS %@, pair changes %@",
                     reconnectingAfter / 1000, restarted["frames_after_patch"] as? Int ?? 0, backAfter / 1000, ms("patch_to_next_frame_ms"),
                     ms("asked_to_next_frame_ms"), "\(restarted["texts"] ?? "-")", "\(ice["iceConnectionState"] ?? "-")",
                     "\(ice["dtlsState"] ?? "-")", "\(ice["selectedCandidatePairChanges"] ?? "-")"))
        #expect(restarted["restarts"] as? Int ?? 0 >= 1 && times["applied"] != nil, "\(restarted)")
        #expect(restarted["frames_after_patch"] as? Int ?? 0 >= 5, "the video did not go on after the restart: \(restarted)")
        #expect((restarted["texts"] as? [String] ?? []).contains("Watching the shared screen."), "\(restarted["texts"] ?? "-")")
        #expect(ice["dtlsState"] as? String == "connected")
        #expect(agent.read(until: "restarted ICE; 1 watching"), "\(agent.output.suffix(600))")
        Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 2]), run: "stall: after the restart", seconds: 2)
        _ = try viewer.send(["cmd": "leave"])
        #expect(agent.read(until: "1 DTLS handshake) left; 0 watching", timeout: 10), "\(agent.output.suffix(600))")
        viewer.quit()
        #expect(agent.stop() == 0)
    }

    /// `--viewer-token` on loopback (the same rule as any non-loopback listen): the page without
    /// the token is refused (401) and says what to do; the whole printed URL plays.
    @Test func aListenThatNeedsTheTokenRefusesThePageWithoutIt() throws {
        guard try Self.browserPrerequisites() else { return }
        let (agent, url) = try Self.startAgent(["--viewer-token"])
        let token = try #require(url.components(separatedBy: "#token=").last, "\(url)")
        #expect(url.contains("#token=") && token.count >= 22, "\(url)")
        let bare = String(url.prefix { $0 != "#" })
        let port = try #require(ViewerAgentTests.port(of: bare))
        let refused = try RawHTTP.request(port: port, "POST", "/whep", headers: [("Content-Type", "application/sdp")], body: ViewerServerTests.offer)
        #expect(refused.status == 401, "POST /whep without the token: \(refused.status)")
        let viewer = try Viewer()
        defer { viewer.quit() }
        let without = try viewer.send(["cmd": "open", "url": bare, "timeout": 15], timeout: 60)
        let state = without["state"] as? [String: Any] ?? [:]
        print("token: the page without it says \"\(state["text"] ?? "-")\"")
        #expect(without["playing"] as? Bool == false && state["ended"] as? Bool == true, "\(without)")
        #expect((state["text"] as? String ?? "").contains("needs its access token"), "\(state)")
        #expect(agent.output.contains("| viewers 0/4"))
        _ = try viewer.open(url, run: "viewer with the token")
        #expect(agent.read(until: "1 watching"))
        Self.checkWatched(try viewer.send(["cmd": "watch", "seconds": 2]), run: "viewer with the token", seconds: 2)
        viewer.quit()
        #expect(agent.stop() == 0)
        #expect(agent.output.components(separatedBy: token).count == 2, "the token is printed once")
    }

    /// A standard WHEP player that is not our page (aiortc over plain HTTP: POST application/sdp,
    /// 201 + Location, DELETE at the end) decodes advancing stamps, and its DELETE frees its place.
    @Test func aStandardWhepPlayerPlaysAndLeaves() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python), try Harness.run(Self.python, ["-c", "import aiortc"]).status == 0 else {
            skipTest("aiortc missing in \(Self.python) (scripts/setup installs it)")
            return
        }
        try Harness.requireBuild()
        guard let namespace = try RtcTestNamespace() else { return }
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let (program, argv) = namespace.command(Harness.agent, ["--plugins", registry, "--backend", "file", "-o", "scene=typing",
                                                                 "-o", "width=640", "-o", "height=360", "--listen", "127.0.0.2:0"])
        let agent = try DtlsTestProcess(program, argv)
        defer { agent.stop() }
        try #require(agent.waitFor("| viewers 0/4", timeout: 30), "\(agent.log)")
        let url = try #require(ViewerAgentTests.printedURL(agent.log), "\(agent.log)")
        let (pp, pa) = namespace.command(Self.python, [Self.playerScript, url + "whep", "--seconds", "3"])
        let player = try Harness.run(pp, pa, timeout: 60)
        let line = player.stdout.split(separator: "\n").last { $0.hasPrefix("{\"report\"") }.map(String.init) ?? ""
        let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        let report = try #require(object?["report"] as? [String: Any], "exit \(player.status): \(player.stdout) \(player.stderr.suffix(1500))")
        print("WHEP player (aiortc): \(report.filter { $0.key != "states" })")
        #expect(player.status == 0)
        #expect(report["post_status"] as? Int == 201 && (report["content_type"] as? String ?? "").hasPrefix("application/sdp"), "\(report)")
        #expect((report["location"] as? String ?? "").hasPrefix("/whep/resource/") && report["etag"] as? String != nil, "\(report)")
        let decoded = report["frames_decoded"] as? Int ?? 0, read = report["stamps_read"] as? Int ?? 0
        // Frames flow (a small number over the player's 3 s, not a rate: krakl-bench viewer measures that).
        #expect(decoded >= 10 && read >= decoded * 9 / 10, "decoded \(decoded), stamps \(read)")
        #expect((report["last_stamp"] as? Int ?? 0) > (report["first_stamp"] as? Int ?? 0) && report["decreasing"] as? Int == 0, "\(report)")
        #expect(report["sizes"] as? [String] == ["640x360"], "\(report)")
        #expect(report["delete_status"] as? Int == 200, "\(report)")
        #expect(agent.waitFor("left; 0 watching", timeout: 10), "the DELETE did not free the place: \(agent.log.suffix(500))")
        agent.signal(SIGINT)
        #expect(agent.waitForExit(seconds: 15))
        #expect(agent.exitStatus == 0, "\(agent.log.suffix(500))")
    }
}
