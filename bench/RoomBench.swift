// krakl-bench room: a join code to a picture in a real room, and back.
//
//   swift build -c release && sudo .build/release/krakl-bench room [--joins 10]
//
// Janus VideoRoom (scripts/janus-testbed) in a namespace of the bench's own;
// for each join a fresh `krakl-agent --join @code --once` shares the file
// backend's typing scene at 1920x1080 while an aiortc subscriber
// (Tests/Fixtures/janus_host.py watch) waits in the room, subscribes the
// moment the agent is listed and decodes. Reported per join: join code →
// first frame decoded by the subscriber, and where the time went (the
// agent's own marks: source, room server HTTP, ICE+DTLS; the rest is the
// subscriber's own set-up through Janus plus the first keyframe); stop
// (SIGTERM) → gone from listparticipants; then the room destroyed → the
// agent's exit; and an idle agent between sessions: threads and CPU.
import Foundation
import KraklBase
import KraklHost

struct RoomJoin {
    var firstFrameMs = Double.nan
    var sourceMs = Double.nan, roomServerMs = Double.nan, iceDtlsMs = Double.nan
    var stopToGoneMs = Double.nan
    var failure: String?
}

/// The agent's "sharing … (source 3 ms, room server 25 ms, ICE+DTLS 41 ms)" line, as numbers.
func sharingMarks(_ text: String) -> (source: Double, room: Double, ice: Double)? {
    guard let line = text.split(separator: "\n").first(where: { $0.contains("sharing the screen") }) else { return nil }
    func value(_ name: String) -> Double {
        guard let range = line.range(of: name + " ") else { return .nan }
        return Double(line[range.upperBound...].prefix { $0.isNumber || $0 == "." }) ?? .nan
    }
    return (value("source"), value("room server"), value("ICE+DTLS"))
}

func runRoomBench(joins: Int) throws {
    installRtcSignalCleanup()
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let python = "/opt/krakl-venv/bin/python", host = repo + "/Tests/Fixtures/janus_host.py"
    let codeScript = repo + "/Tests/Fixtures/make_join_code.py"
    guard FileManager.default.isExecutableFile(atPath: python) else { throw BenchError("\(python) missing: run scripts/setup") }
    let namespace = try BenchNamespace("krakl-bench-room-\(getpid())")
    defer { namespace.delete() }
    let janus = try namespace.startJanus(repo: repo, folder: work + "/janus")
    defer { janus.stop() }
    let room = Int.random(in: 10_000...99_999), secret = "bench"
    func hostCommand(_ arguments: [String]) -> [String: Any] {
        let result = measure(BenchNamespace.ip, namespace.command(python, [host] + arguments + ["--room", "\(room)", "--secret", secret]))
        let line = result.stdout.split(separator: "\n").last.map(String.init) ?? ""
        return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
    }
    guard hostCommand(["create"])["created"] as? String == "created" else { throw BenchError("cannot create the room") }
    func code(_ identity: String) throws -> String {
        let made = measure("/usr/bin/python3", [codeScript, "--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", "\(room)",
                                                "--identity", identity, "--secret", "bench"])
        let path = work + "/code-\(identity)"
        try made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
    func startAgent(_ codePath: String, once: Bool, tag: String) -> BenchChild? {
        BenchChild(BenchNamespace.ip, namespace.command(agent, ["--join", "@" + codePath] + (once ? ["--once"] : []) + [
            "--address", "127.0.0.2", "--plugins", work + "/plugins.json",
            "--option", "scene=typing", "--option", "width=1920", "--option", "height=1080"]),
                   out: work + "/agent-\(tag).out", err: work + "/agent-\(tag).err")
    }

    print("krakl-bench room: Janus VideoRoom in a namespace, krakl-agent --join (1080p typing, release build), an aiortc subscriber waiting in the room; \(joins) joins")
    print("join | code → first frame | source | room server | ICE+DTLS | rest (subscriber + first keyframe) | stop → gone from the room")
    var results: [RoomJoin] = []
    for n in 1...joins {
        var join = RoomJoin()
        let identity = "bench-\(n)"
        let codePath = try code(identity)
        let watcher = BenchChild(BenchNamespace.ip, namespace.command(python, [host, "watch", "--room", "\(room)", "--display", identity,
                                                                               "--seconds", "1", "--secret", secret]),
                                 out: work + "/watch-\(n).out", err: work + "/watch-\(n).err")
        let t0 = MonotonicClock.milliseconds()
        guard let child = startAgent(codePath, once: true, tag: "\(n)") else { throw BenchError("cannot start krakl-agent") }
        let report = watcher?.poll(timeout: 40) { text -> [String: Any]? in
            guard let line = text.split(separator: "\n").last, line.hasPrefix("{") else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
        if let first = report?["first_frame_ms"] as? Double { join.firstFrameMs = first - t0 } else { join.failure = "no frame: \(report ?? [:])" }
        if let marks = sharingMarks(child.stdout) { (join.sourceMs, join.roomServerMs, join.iceDtlsMs) = marks }
        // A poller already polling the room, then the signal: the leave's time without Python's start-up in it.
        let poller = BenchChild(BenchNamespace.ip, namespace.command(python, [host, "gone", "--room", "\(room)", "--display", identity,
                                                                              "--seconds", "10"]),
                                out: work + "/gone-\(n).out", err: work + "/gone-\(n).err")
        _ = poller?.poll(timeout: 20) { $0.contains("polling") ? true : nil }
        let signalled = MonotonicClock.milliseconds()
        kill(child.pid, SIGTERM)
        let gone = poller?.poll(timeout: 15) { text -> [String: Any]? in
            guard let line = text.split(separator: "\n").last, line.contains("gone_ms") else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
        if gone?["gone"] as? Bool == true, let at = gone?["gone_ms"] as? Double { join.stopToGoneMs = at - signalled }
        poller?.stop(grace: 1)
        child.stop(grace: 5)
        watcher?.stop(grace: 2)
        let rest = join.firstFrameMs - join.sourceMs - join.roomServerMs - join.iceDtlsMs
        print(String(format: "%4d | %8.0f ms | %5.0f ms | %8.0f ms | %6.0f ms | %8.0f ms | %6.0f ms%@", n, join.firstFrameMs, join.sourceMs,
                     join.roomServerMs, join.iceDtlsMs, rest, join.stopToGoneMs, join.failure.map { " (\($0))" } ?? ""))
        results.append(join)
    }
    func stats(_ values: [Double]) -> String {
        let v = values.filter { !$0.isNaN }.sorted()
        return String(format: "p50 %.0f ms, p99 %.0f ms (n=%d)", v.nearestRank(0.5) ?? .nan, v.nearestRank(0.99) ?? .nan, v.count)
    }
    print("code → first frame decoded: \(stats(results.map(\.firstFrameMs)))")
    print("  source: \(stats(results.map(\.sourceMs))); room server (HTTP): \(stats(results.map(\.roomServerMs))); ICE+DTLS: \(stats(results.map(\.iceDtlsMs)))")
    print("stop (SIGTERM) → gone from listparticipants (polled every 50 ms, an upper bound on 'leave sent'): \(stats(results.map(\.stopToGoneMs)))")

    // The room destroyed under a sharing agent that stays up: time to idle, then the idle agent's cost.
    guard let idle = startAgent(try code("idle"), once: false, tag: "idle") else { throw BenchError("cannot start krakl-agent") }
    defer { idle.stop() }
    _ = idle.poll(timeout: 30) { $0.contains("sharing the screen") ? true : nil }
    let ended = hostCommand(["end", "--how", "destroy"])
    let destroyedAt = ended["t_ms"] as? Double ?? .nan
    _ = idle.poll(timeout: 10) { $0.contains("idle. Paste") ? true : nil }
    let idleAt = MonotonicClock.milliseconds()
    print(String(format: "room destroyed → agent idle (its 'idle' line seen, polled every 20 ms): %.0f ms", idleAt - destroyedAt))
    usleep(6_000_000)   // libdispatch retires idle workers after 5 s
    let cpu0 = processCpuSeconds(idle.pid), threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(idle.pid)/task").count) ?? -1
    let names = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(idle.pid)/task")) ?? []).compactMap {
        (try? String(contentsOfFile: "/proc/\(idle.pid)/task/\($0)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }
    usleep(10_000_000)
    let cpu = (processCpuSeconds(idle.pid) - cpu0) / 10 * 100
    print(String(format: "idle agent between sessions: %d threads (%@), CPU %.3f %% over 10 s", threads, names.joined(separator: ", "), cpu))
}

extension BenchNamespace {
    /// Janus with the project's test configuration (scripts/janus-testbed) inside this namespace.
    func startJanus(repo: String, folder: String) throws -> BenchJanus {
        let started = measure(BenchNamespace.ip, command("/bin/bash", [repo + "/scripts/janus-testbed", "start", folder]))
        guard started.status == 0 else { throw BenchError("Janus did not start: \(started.stderr)") }
        return BenchJanus(namespace: self, repo: repo, folder: folder)
    }
}

struct BenchJanus {
    let namespace: BenchNamespace
    let repo: String
    let folder: String

    func stop() { _ = measure(BenchNamespace.ip, namespace.command("/bin/bash", [repo + "/scripts/janus-testbed", "stop", folder])) }
}
