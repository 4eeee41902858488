// krakl-bench viewer: the built-in viewer (docs/viewer.md) in headless Chromium.
//
//   swift build -c release && sudo .build/release/krakl-bench viewer [--rounds 5] [--seconds 10] [--no-loss]
//
// In a network namespace of the bench's own (scripts/rtc-netns; every packet stays in it, and
// nftables can drop some): `krakl-agent` sharing the file backend's typing scene at 1920x1080 to
// its viewer on 127.0.0.1, and Chromium (selenium, Tests/Fixtures/viewer_browser.py) on its page.
//  1. page opened → first frame presented (requestVideoFrameCallback's presentationTime on the
//     page's clock, whose origin is the navigation's start), one fresh browser per round;
//  2. capture → presented latency: each presented frame's stamp (CLOCK_MONOTONIC ms of its capture)
//     against its presentationTime mapped to CLOCK_MONOTONIC (selenium round trips, the shortest);
//  3. the agent's CPU with 1 viewer and with 4 (schedstat of its threads over the same seconds);
//  4. two viewers left, 5 % of the UDP to one dropped (nftables on its port): its decoded share
//     against the clean viewer's over the same seconds, its longest still picture, and the other's.
import Foundation
import KraklBase
import KraklHost

/// One Chromium on the viewer page, driven by Tests/Fixtures/viewer_browser.py.
final class ViewerBenchBrowser {
    let child: BenchChild
    private var answered = 0

    init?(_ namespace: BenchNamespace, python: String, script: String, tag: String) {
        guard let child = BenchChild(BenchNamespace.ip, namespace.command(python, [script]),
                                     out: work + "/browser-\(tag).out", err: work + "/browser-\(tag).err") else { return nil }
        self.child = child
        guard nextReply(timeout: 60) != nil else { return nil }
    }

    func post(_ command: [String: Any]) {
        let data = (try? JSONSerialization.data(withJSONObject: command)) ?? Data()
        child.type(String(decoding: data, as: UTF8.self) + "\n")
    }

    func nextReply(timeout: Double) -> [String: Any]? {
        let index = answered
        let reply = child.poll(timeout: timeout) { text -> [String: Any]? in
            let lines = text.split(separator: "\n").filter { $0.hasPrefix("{\"ok\"") }
            guard lines.count > index else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(lines[index].utf8))) as? [String: Any] ?? [:]
        }
        if reply != nil { answered += 1 }
        return reply
    }

    func send(_ command: [String: Any], timeout: Double = 90) -> [String: Any]? {
        post(command)
        return nextReply(timeout: timeout)
    }

    func quit() {
        post(["cmd": "quit"])
        child.stop(grace: 10)
    }
}

/// A number from a getStats dictionary.
func statNumber(_ stats: Any?, _ key: String) -> Double {
    ((stats as? [String: Any])?[key] as? NSNumber)?.doubleValue ?? .nan
}

/// Δ of a getStats counter over a `watch`.
func statDelta(_ watched: [String: Any], _ key: String) -> Double {
    statNumber(watched["stats"], key) - statNumber(watched["stats_before"], key)
}

func runViewerBench(seconds: Double, rounds: Int, loss: Bool) throws {
    installRtcSignalCleanup()
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let python = "/opt/krakl-venv/bin/python", script = repo + "/Tests/Fixtures/viewer_browser.py"
    for path in [python, "/usr/bin/chromium", "/usr/bin/chromedriver"] where !FileManager.default.isExecutableFile(atPath: path) {
        throw BenchError("\(path) missing: run scripts/setup")
    }
    let namespace = try BenchNamespace("krakl-bench-viewer-\(getpid())")
    defer { namespace.delete() }
    guard let agentChild = BenchChild(BenchNamespace.ip, namespace.command(agent, [
        "--plugins", work + "/plugins.json", "--backend", "file", "-o", "scene=typing", "-o", "width=1920", "-o", "height=1080",
        "--listen", "127.0.0.1:0", "--max-viewers", "16"]), out: work + "/agent.out", err: work + "/agent.err") else {
        throw BenchError("cannot start krakl-agent")
    }
    defer { kill(agentChild.pid, SIGINT); agentChild.stop(grace: 10) }
    guard let url = agentChild.poll(timeout: 30, { text -> String? in
        guard let range = text.range(of: "open http://") else { return nil }
        return String(text[text.index(range.lowerBound, offsetBy: 5)...].prefix { !$0.isWhitespace })
    }) else { throw BenchError("the agent printed no URL: \(agentChild.stdout) \(agentChild.stderr)") }
    func watching() -> Int? {
        guard let line = agentChild.stdout.split(separator: "\n").last(where: { $0.hasSuffix(" watching") }) else { return nil }
        return Int(line.split(separator: " ").dropLast().last ?? "")
    }
    func newBrowser(_ tag: String) throws -> ViewerBenchBrowser {
        guard let browser = ViewerBenchBrowser(namespace, python: python, script: script, tag: tag) else {
            throw BenchError("Chromium did not start: \((try? String(contentsOfFile: work + "/browser-\(tag).err", encoding: .utf8))?.suffix(800) ?? "")")
        }
        return browser
    }
    func ms(_ value: Double) -> String { value.isNaN ? "–" : String(format: "%.0f ms", value) }
    print("krakl-bench viewer: krakl-agent (release) sharing the typing scene at 1920×1080 to its viewer, headless Chromium 156 on the page, "
          + "all in namespace \(namespace.name); \(rounds) first-frame rounds, \(Int(seconds)) s per measurement")

    // 1. Page opened → first frame, a fresh browser each round (Chromium's start is before the navigation).
    print("\nround | page opened → first frame presented | its capture → presented | page ready (bench's view) | on the way: peer made, ICE gathered, offer POSTed, answer in, connected, track")
    var firstFrames: [Double] = []
    for round in 1...rounds {
        let browser = try newBrowser("first-\(round)")
        let opened = browser.send(["cmd": "open", "url": url, "timeout": 30]) ?? [:]
        let first = opened["first_frame_ms"] as? Double ?? .nan
        if !first.isNaN { firstFrames.append(first) }
        let marks = opened["marks"] as? [String: Any] ?? [:]
        let way = ["created", "gathered", "posted", "answered", "connected", "track"].map { ms(statNumber(marks, $0)) }.joined(separator: ", ")
        print(String(format: "%5d | %@ | %@ | %@ | %@%@", round, ms(first),
                     ms(opened["first_latency_ms"] as? Double ?? .nan), ms(opened["waited_ms"] as? Double ?? .nan), way,
                     opened["playing"] as? Bool == true ? "" : " (no video: \(opened["state"] ?? opened["error"] ?? "-"))"))
        browser.quit()
        // Its DELETE (pagehide) frees the place before the next round.
        _ = agentChild.poll(timeout: 35) { _ in watching() == 0 ? true : nil }
    }
    let sortedFirst = firstFrames.sorted()
    print(String(format: "page opened → first frame: median %@, max %@ (n=%d; target ≤ 500 ms)", ms(sortedFirst.nearestRank(0.5) ?? .nan),
                 ms(sortedFirst.last ?? .nan), sortedFirst.count))

    // 2 + 3. One viewer, then four: latency and the agent's CPU over the same seconds.
    let browsers = try (1...4).map { try newBrowser("watch-\($0)") }
    defer { browsers.forEach { $0.quit() } }
    /// The agent's once-a-second status lines while `body` ran: mean fps and encoded kbit/s (its work, to
    /// compare CPU figures fairly: a starved browser lowers the bitrate the weakest viewer allows).
    func agentWork(_ body: () -> Void) -> String {
        let before = agentChild.stdout.count
        body()
        let lines = agentChild.stdout.dropFirst(before).split(separator: "\n").filter { $0.contains(" fps |") && $0.contains("| enc ") }
        func mean(_ after: String) -> Double {
            let values = lines.compactMap { line -> Double? in
                guard let range = line.range(of: after) else { return nil }
                return Double(line[..<range.lowerBound].split(separator: " ").last ?? "")
            }
            return values.isEmpty ? .nan : values.reduce(0, +) / Double(values.count)
        }
        return String(format: "agent: %.1f fps encoded at %.0f kbit/s", mean(" fps |"), mean(" kbit/s"))
    }
    func watchAll(_ viewers: [ViewerBenchBrowser]) -> (replies: [[String: Any]], cpuPercent: Double, work: String) {
        var replies: [[String: Any]] = []
        var cpu = Double.nan
        let work = agentWork {
            let cpu0 = processCpuSeconds(agentChild.pid), t0 = MonotonicClock.milliseconds()
            viewers.forEach { $0.post(["cmd": "watch", "seconds": seconds]) }
            replies = viewers.map { $0.nextReply(timeout: seconds + 60) ?? [:] }
            cpu = (processCpuSeconds(agentChild.pid) - cpu0) / ((MonotonicClock.milliseconds() - t0) / 1000) * 100
        }
        return (replies, cpu, work)
    }
    func latencyText(_ watched: [String: Any]) -> String {
        let values = (watched["latency_ms"] as? [Double] ?? []).sorted()
        return String(format: "p50 %@ p99 %@ (n=%d)", ms(values.nearestRank(0.5) ?? .nan), ms(values.nearestRank(0.99) ?? .nan), values.count)
    }
    func viewerLine(_ label: String, _ watched: [String: Any]) -> String {
        let decoded = statDelta(watched, "framesDecoded")
        return String(format: "%@ | %@ | decoded %.0f, freezes %.0f (%.3f s), longest still %@, jitter buffer %.1f ms a frame, lost %.0f, NACK %.0f, PLI %.0f",
                      label, latencyText(watched), decoded, statDelta(watched, "freezeCount"), statDelta(watched, "totalFreezesDuration"),
                      ms(watched["max_gap_ms"] as? Double ?? .nan),
                      statDelta(watched, "jitterBufferDelay") / max(1, statDelta(watched, "jitterBufferEmittedCount")) * 1000,
                      statDelta(watched, "packetsLost"), statDelta(watched, "nackCount"), statDelta(watched, "pliCount"))
    }
    guard browsers[0].send(["cmd": "open", "url": url, "timeout": 30])?["playing"] as? Bool == true else { throw BenchError("viewer 1 did not play") }
    usleep(3_000_000) // past the first keyframe and the bitrate's ramp
    print("\nviewers | capture → presented (rVFC) | Chromium's getStats over \(Int(seconds)) s")
    let one = watchAll([browsers[0]])
    print(viewerLine("1 of 1", one.replies[0]))
    for (n, browser) in browsers.enumerated().dropFirst() {
        guard browser.send(["cmd": "open", "url": url, "timeout": 30])?["playing"] as? Bool == true else { throw BenchError("viewer \(n + 1) did not play") }
    }
    usleep(3_000_000)
    let four = watchAll(browsers)
    for (n, watched) in four.replies.enumerated() { print(viewerLine("\(n + 1) of 4", watched)) }
    print(String(format: "agent CPU: 1 viewer %.1f %% of a core (%@), 4 viewers %.1f %% (%@): ratio %.2f× (target ≤ 1.3×; one encoder)",
                 one.cpuPercent, one.work, four.cpuPercent, four.work, four.cpuPercent / one.cpuPercent))
    print(String(format: "machine load over the 4-viewer seconds: %@", loadAverage()))

    // 4. Loss to one viewer: its port is the selected pair's local (peer-reflexive) one.
    guard loss else { return }
    let pairs = four.replies.map { ((($0["stats"] as? [String: Any])?["pair"] as? [String: Any])?["local"] as? String) ?? "" }
    guard let port = pairs.last?.split(separator: " ").first?.split(separator: ":").last.flatMap({ Int($0) }) else {
        throw BenchError("no candidate pair for viewer 4: \(pairs)")
    }
    // Two viewers only (one clean, one lossy): four Chromiums decoding 1080p starve a 2-core machine,
    // and their still pictures would hide what the loss does.
    browsers[1].quit()
    browsers[2].quit()
    _ = agentChild.poll(timeout: 35) { _ in watching() == 2 ? true : nil }
    try namespace.dropUdp(percent: 5, toPort: port)
    usleep(1_000_000)
    let lossy = watchAll([browsers[0], browsers[3]])
    let reference = statDelta(lossy.replies[0], "framesDecoded")
    print("\n5 % of the UDP to one of two viewers dropped (nftables, its port \(port)):")
    print(viewerLine("clean", lossy.replies[0]))
    print(viewerLine("lossy", lossy.replies[1]))
    let lossyWatch = lossy.replies[1]
    print(String(format: "lossy viewer: decoded %.1f %% of what the clean viewer decoded (%.0f frames; target ≥ 98 %%), "
                 + "freezes %.0f (%.3f s), longest still picture %@ (target: no freeze > 300 ms); agent CPU %.1f %% (%@)",
                 statDelta(lossyWatch, "framesDecoded") / reference * 100, reference, statDelta(lossyWatch, "freezeCount"),
                 statDelta(lossyWatch, "totalFreezesDuration"), ms(lossyWatch["max_gap_ms"] as? Double ?? .nan), lossy.cpuPercent, lossy.work))
}

extension BenchNamespace {
    /// Drops `percent` % of the UDP arriving in the namespace for one port (one viewer's socket).
    func dropUdp(percent: Int, toPort port: Int) throws {
        let steps: [[String]] = [
            ["add", "table", "inet", "kraklviewer"],
            ["add", "chain", "inet", "kraklviewer", "input", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"],
            ["add", "rule", "inet", "kraklviewer", "input", "udp", "dport", "\(port)", "numgen", "random", "mod", "100", "<", "\(percent)", "drop"],
        ]
        for step in steps {
            let done = measure(Self.ip, command(Self.nft, step))
            guard done.status == 0 else { throw BenchError("nft \(step.joined(separator: " ")): \(done.stderr)") }
        }
    }
}

/// /proc/loadavg's first three numbers (how busy the shared machine was).
func loadAverage() -> String {
    ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "").split(separator: " ").prefix(3).joined(separator: " ")
}
