// krakl-bench rtc: the WebRTC publisher (krakl-rtc-probe, release build)
// against an aiortc receiver (Tests/Fixtures/aiortc_receiver.py), for the
// targets of issue 6.
//
//   swift build -c release && sudo .build/release/krakl-bench rtc [--seconds 10] [--rounds 3]
//
// Each session gets a network namespace of its own (ip netns add, lo up, a
// veth carrying 127.0.0.2: aiortc drops 127.0.0.1 from its candidates), runs
// the probe and the receiver inside it, and passes the offer and the answer
// between them. Loss scenarios add an nftables input chain in the namespace
// that drops that share of UDP once the session is connected (both
// directions cross input once). The file backend's scenes carry a frame
// stamp with the capture time (CLOCK_MONOTONIC ms); the receiver reads it
// from each decoded frame, so capture-to-decoded latency is measured on one
// clock without any side channel.
//
// Reported per scenario (median round, and the range over rounds): connect
// time after the answer (ICE + DTLS, the probe's connect_ms), frames sent /
// decoded, latency p50/p99 over the decoded frames whose stamp reads,
// longest freeze (longest gap between decoded frames from 0.5 s after
// connecting to 0.2 s before the probe stops sending, as the loss tests),
// bitrate on the wire (bytes_sent incl. headers and retransmissions), and
// the CPU of the receiver (all its threads, and its busiest thread) and of
// the probe over the sending window, from /proc schedstat. Rounds run the
// scenarios in rotating order, as the other benches do.
import KraklBase
import KraklHost
import Foundation
import Synchronization

// MARK: scenarios

struct RtcScenario {
    let scene: String
    let width: Int, height: Int
    let lossPercent: Int
    var label: String { "\(width)×\(height) \(scene), " + (lossPercent == 0 ? "clean" : "\(lossPercent) % loss") }
    var is1080p: Bool { height == 1080 }
}

struct RtcRun {
    var failure: String?
    var connectMs = Double.nan
    var sent = 0, decoded = 0, stamped = 0
    /// Capture → decoded at aiortc, over every stamped frame.
    var p50 = Double.nan, p99 = Double.nan
    /// The same over frames captured 2 s or more after connecting (the first keyframe and what queued behind it left out).
    var steadyP50 = Double.nan, steadyP99 = Double.nan
    /// Capture → the frame's last packet in at aiortc (RTX included): aiortc decodes a frame only when a packet of
    /// the next one arrives, so this is the sender's and network's share without that wait.
    var completeP50 = Double.nan, completeP99 = Double.nan
    var freezeMs = Double.nan
    var firstFrameMs = Double.nan
    /// The first decoded frame's capture and the arrival of its last packet, ms after connecting (where its time went).
    var firstCaptureMs = Double.nan, firstLastPacketMs = Double.nan
    var kbps = Double.nan
    var receiverCpu = Double.nan, receiverBusiestThread = Double.nan, probeCpu = Double.nan
    /// The probe's CPU from 5 s after connecting to the window's end: what an unchanged screen costs once the
    /// first picture is out (a static scene's one keyframe would otherwise dominate a short window).
    var probeSteadyCpu = Double.nan
    var retransmitted = 0, plis = 0, keyframes = 0, redundant = 0
    /// Where the sender's share goes: libvpx's encode time, capture → encoded frame (conversion, waiting, encode),
    /// and the mean wait of a media packet in the pacer.
    var encodeP50 = Double.nan, encodedP50 = Double.nan, pacerWaitMean = Double.nan
    /// The publisher's target at the end, and the receiver's last REMB, kbit/s.
    var targetKbps = Double.nan, rembKbps = Double.nan
    /// The first keyframe's start-up probe (bytes sent under it, fastest pacing rate in Mbit/s).
    var probedBytes = 0, probePeakMbps = 0.0
    /// The first keyframe into the pacer (encoded) and its last packet out, ms after connecting (the sender's share).
    var keyframeQueuedMs = Double.nan, keyframeSentMs = Double.nan
    var decodedPercent: Double { sent > 0 ? Double(decoded) / Double(sent) * 100 : .nan }
}

// MARK: cleanup on every path (also Ctrl-C)

/// Children and namespaces alive right now, for the SIGINT/SIGTERM handler.
final class RtcLive: Sendable {
    static let shared = RtcLive()
    private let live = Mutex<(pids: Set<pid_t>, namespaces: Set<String>)>(([], []))
    func add(pid: pid_t) { live.withLock { _ = $0.pids.insert(pid) } }
    func remove(pid: pid_t) { live.withLock { _ = $0.pids.remove(pid) } }
    func add(namespace: String) { live.withLock { _ = $0.namespaces.insert(namespace) } }
    func remove(namespace: String) { live.withLock { _ = $0.namespaces.remove(namespace) } }
    func tearDown() {
        let (p, n) = live.withLock { ($0.pids, $0.namespaces) }
        for pid in p { kill(pid, SIGKILL); var s: Int32 = 0; waitpid(pid, &s, 0) }
        for name in n {
            let pid = launch(BenchNamespace.ip, ["netns", "del", name])
            var s: Int32 = 0
            if pid > 0 { waitpid(pid, &s, 0) }
        }
    }
}

/// The installed handlers' sources, kept alive for the whole run.
let rtcSignalSources = Mutex<[DispatchSourceSignal]>([])

func installRtcSignalCleanup() {
    for sig in [SIGINT, SIGTERM] {
        signal(sig, SIG_IGN)
        // Made inside the lock: a DispatchSourceSignal is not Sendable, so it goes into the list it is made for.
        rtcSignalSources.withLock { sources in
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler {
                print("krakl-bench rtc: interrupted; killing the sessions and deleting their namespaces")
                RtcLive.shared.tearDown()
                try? FileManager.default.removeItem(atPath: work)
                exit(130)
            }
            source.resume()
            sources.append(source)
        }
    }
    signal(SIGPIPE, SIG_IGN) // a child that died must not take the bench with it when we write its stdin
}

// MARK: processes with a stdin we hold

/// A child with stdin on a pipe the bench holds (closed on demand: the
/// receiver stops at its end) and stdout/stderr in files.
final class BenchChild {
    let pid: pid_t
    let outPath: String, errPath: String
    private var input: Int32
    private var status: Int32?

    init?(_ program: String, _ arguments: [String], out: String, err: String) {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return nil }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) } // no other child inherits the write end
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[0], 0) // dup2 clears close-on-exec on 0; the write end stays ours
        posix_spawn_file_actions_addopen(&actions, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        let argv = ([program] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, program, &actions, nil, argv, environ)
        close(fds[0])
        guard spawned == 0 else { close(fds[1]); return nil }
        self.pid = pid
        input = fds[1]
        outPath = out
        errPath = err
        RtcLive.shared.add(pid: pid)
    }

    deinit { stop() }

    var stdout: String { (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "" }

    var isRunning: Bool {
        if status != nil { return false }
        var s: Int32 = 0
        if waitpid(pid, &s, WNOHANG) == pid { status = s; RtcLive.shared.remove(pid: pid) }
        return status == nil
    }

    @discardableResult
    func type(_ text: String) -> Bool {
        guard input >= 0 else { return false }
        let bytes = Array(text.utf8)
        var offset = 0
        for _ in 0..<10_000 where offset < bytes.count {
            let n = bytes[offset...].withUnsafeBufferPointer { Glibc.write(input, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            offset += n
        }
        return offset == bytes.count
    }

    func closeInput() {
        if input >= 0 { close(input); input = -1 }
    }

    /// Closes stdin, gives the child `grace` seconds to end, then SIGKILL; always reaped.
    func stop(grace: Double = 0) {
        closeInput()
        let deadline = Date().addingTimeInterval(grace)
        while isRunning && Date() < deadline { usleep(20_000) }
        if isRunning {
            kill(pid, SIGKILL)
            var s: Int32 = 0
            waitpid(pid, &s, 0)
            status = s
            RtcLive.shared.remove(pid: pid)
        }
    }

    /// Waits (bounded) until `done(stdout)` gives a value or the child ends; the value, or nil.
    func poll<T>(timeout: Double, in stream: KeyPath<BenchChild, String> = \.stdout, _ done: (String) -> T?) -> T? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let running = isRunning
            if let value = done(self[keyPath: stream]) { return value }
            if !running { return nil }
            usleep(20_000)
        }
        return nil
    }
}

/// The SDP a process printed: from "v=0" to the first empty line; nil until complete.
func rtcSdpBlock(_ text: String) -> String? {
    guard let start = text.range(of: "v=0") else { return nil }
    var lines: [String] = []
    for line in text[start.lowerBound...].split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
        let trimmed = line.trimmingCharacters(in: .whitespaces)
        if trimmed.isEmpty { return lines.joined(separator: "\r\n") + "\r\n" }
        lines.append(trimmed)
    }
    return nil
}

/// The first output line containing `marker` that is a JSON object.
func rtcJsonLine(_ text: String, marker: String) -> [String: Any]? {
    for line in text.split(whereSeparator: \.isNewline) where line.contains(marker) {
        if let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] { return object }
    }
    return nil
}

/// aiortc_receiver.py's report: it ends on its own when our close_notify ends the track, and its
/// stdin's end stops it otherwise. Nil when neither brings one within 20 s each.
func aiortcReport(_ aiortc: BenchChild) -> [String: Any]? {
    var reportLine = aiortc.poll(timeout: 20) { rtcJsonLine($0, marker: "{\"report\"") }
    if reportLine == nil {
        aiortc.closeInput()
        reportLine = aiortc.poll(timeout: 20) { rtcJsonLine($0, marker: "{\"report\"") }
    }
    return reportLine?["report"] as? [String: Any]
}

/// CPU seconds per thread of a process so far (schedstat, ns), by thread id.
func threadCpuSeconds(_ pid: pid_t) -> [String: Double] {
    guard let threads = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [:] }
    var result: [String: Double] = [:]
    for tid in threads {
        if let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/schedstat", encoding: .utf8),
           let ns = text.split(separator: " ").first.flatMap({ Double($0) }) {
            result[tid] = ns / 1e9
        }
    }
    return result
}

// MARK: the namespace

/// A network namespace of the bench's own: lo up, a veth pair with
/// 127.0.0.2, IPv6 off on it; optionally an nftables input chain for loss.
final class BenchNamespace {
    static let ip = "/usr/sbin/ip", nft = "/usr/sbin/nft"
    /// The namespace recipe the tests use too.
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/scripts/rtc-netns"
    let name: String
    private var deleted = false

    init(_ name: String) throws {
        self.name = name
        RtcLive.shared.add(namespace: name)
        let made = measure("/bin/bash", [Self.script, "add", name])
        guard made.status == 0 else { throw BenchError("scripts/rtc-netns add \(name): \(made.stderr)") }
    }

    deinit { delete() }

    func delete() {
        guard !deleted else { return }
        deleted = true
        _ = measure("/bin/bash", [Self.script, "del", name])
        RtcLive.shared.remove(namespace: name)
    }

    func command(_ program: String, _ arguments: [String]) -> [String] { ["netns", "exec", name, program] + arguments }

    /// Drops `percent` % of the UDP arriving in the namespace from now on.
    func dropUdp(percent: Int) throws {
        let steps: [[String]] = [
            ["add", "table", "inet", "krakl"],
            ["add", "chain", "inet", "krakl", "input", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"],
            ["add", "rule", "inet", "krakl", "input", "meta", "l4proto", "udp", "numgen", "random", "mod", "100", "<", "\(percent)", "drop"],
        ]
        for step in steps {
            let result = measure(Self.ip, command(Self.nft, step))
            guard result.status == 0 else { throw BenchError("nft \(step.joined(separator: " ")): \(result.stderr)") }
        }
    }

    func heal() { _ = measure(Self.ip, command(Self.nft, ["flush", "chain", "inet", "krakl", "input"])) }
}

// MARK: one session

func runRtcSession(_ scenario: RtcScenario, seconds: Double, index: Int, probe: String, receiver: String, python: String,
                   plugins: String, probeArguments: [String] = []) -> RtcRun {
    var run = RtcRun()
    let namespace: BenchNamespace
    do { namespace = try BenchNamespace("krakl-bench-\(getpid())-\(index)") } catch {
        run.failure = "namespace: \(error)"
        return run
    }
    defer { namespace.delete() }
    let folder = work + "/rtc-\(index)"
    try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    guard let aiortc = BenchChild(BenchNamespace.ip, namespace.command(python, [receiver, "--seconds", "\(seconds + 60)"]),
                                  out: folder + "/receiver.out", err: folder + "/receiver.err") else {
        run.failure = "cannot start the aiortc receiver"
        return run
    }
    defer { aiortc.stop() }
    // Another backend (--probe-arg --backend --probe-arg x11, DISPLAY from the environment) captures what it
    // sees: the file backend's scene options do not apply to it.
    let sceneOptions = probeArguments.contains("--backend") ? [] : [
        "--option", "scene=\(scenario.scene)", "--option", "width=\(scenario.width)", "--option", "height=\(scenario.height)"]
    guard let publisher = BenchChild(BenchNamespace.ip, namespace.command(probe, [
        "--address", "127.0.0.2", "--seconds", "\(seconds)", "--plugins", plugins,
    ] + sceneOptions + probeArguments), out: folder + "/probe.out", err: folder + "/probe.err") else {
        run.failure = "cannot start krakl-rtc-probe"
        return run
    }
    defer { publisher.stop() }

    // Offer → receiver, answer → probe.
    guard let offer = publisher.poll(timeout: 30, rtcSdpBlock) else {
        run.failure = "no offer from the probe: \(publisher.stderr.suffix(500))"
        return run
    }
    aiortc.type(offer + "\n")
    guard let answer = aiortc.poll(timeout: 30, rtcSdpBlock) else {
        run.failure = "no answer from aiortc: \(aiortc.stderr.suffix(500))"
        return run
    }
    publisher.type(answer + "\n")

    // Connected (the probe's event, CLOCK_MONOTONIC ms).
    guard let connected = publisher.poll(timeout: 20, in: \.stderr, { text -> Double? in
        rtcJsonLine(text, marker: "\"event\":\"connected\"")?["t_ms"] as? Double
    }) else {
        run.failure = "never connected: \(publisher.stderr.suffix(500))"
        return run
    }
    if scenario.lossPercent > 0 {
        do { try namespace.dropUdp(percent: scenario.lossPercent) } catch {
            run.failure = "\(error)"
            return run
        }
    }
    // CPU over the sending window: sampled at the start and, while polling for the result, up to its end.
    let windowEnd = connected + seconds * 1000
    let receiverStart = threadCpuSeconds(aiortc.pid), probeStart = processCpuSeconds(publisher.pid)
    var receiverEnd = receiverStart, probeEnd = probeStart
    var sampledUntil = MonotonicClock.milliseconds()
    let steadyFrom = connected + 5000
    var probeSteadyStart: (ms: Double, cpu: Double)?
    let result = publisher.poll(timeout: seconds + 60) { text -> [String: Any]? in
        let now = MonotonicClock.milliseconds()
        if now <= windowEnd {
            let r = threadCpuSeconds(aiortc.pid), p = processCpuSeconds(publisher.pid)
            if !r.isEmpty { receiverEnd = r }
            if p > 0 { probeEnd = p }
            if probeSteadyStart == nil && now >= steadyFrom && p > 0 { probeSteadyStart = (now, p) }
            sampledUntil = now
        }
        return rtcJsonLine(text, marker: "\"result\"")
    }
    namespace.heal()
    let window = (sampledUntil - connected) / 1000
    if window > 1 {
        let perThread = receiverEnd.map { tid, end in end - (receiverStart[tid] ?? 0) }
        run.receiverCpu = perThread.reduce(0, +) / window * 100
        run.receiverBusiestThread = (perThread.max() ?? 0) / window * 100
        run.probeCpu = (probeEnd - probeStart) / window * 100
        if let steady = probeSteadyStart, sampledUntil - steady.ms > 1000 {
            run.probeSteadyCpu = (probeEnd - steady.cpu) / ((sampledUntil - steady.ms) / 1000) * 100
        }
    }
    guard let result, let stats = result["stats"] as? [String: Any] else {
        run.failure = "the probe gave no result: \(publisher.stderr.suffix(500))"
        return run
    }
    guard let report = aiortcReport(aiortc) else {
        run.failure = "aiortc gave no report: \(aiortc.stderr.suffix(500))"
        return run
    }

    run.connectMs = stats["connect_ms"] as? Double ?? .nan
    run.sent = stats["frames_sent"] as? Int ?? 0
    run.decoded = report["frames_decoded"] as? Int ?? 0
    run.kbps = Double(stats["bytes_sent"] as? Int ?? 0) * 8 / seconds / 1000
    run.retransmitted = stats["retransmitted_packets"] as? Int ?? 0
    run.redundant = stats["redundant_packets"] as? Int ?? 0
    run.plis = stats["plis_received"] as? Int ?? 0
    run.keyframes = stats["keyframes_sent"] as? Int ?? 0
    run.targetKbps = (stats["target_bitrate"] as? Double ?? .nan) / 1000
    run.rembKbps = (stats["remb_bitrate"] as? Double ?? .nan) / 1000
    run.probedBytes = stats["startup_probe_bytes"] as? Int ?? 0
    run.probePeakMbps = (stats["startup_probe_peak_rate"] as? Double ?? 0) / 1e6
    run.keyframeQueuedMs = (stats["first_keyframe_queued_ms"] as? Double).map { $0 - connected } ?? .nan
    run.keyframeSentMs = (stats["first_keyframe_sent_ms"] as? Double).map { $0 - connected } ?? .nan
    let mediaPackets = (stats["packets_sent"] as? Int ?? 0) - run.retransmitted - run.redundant
    if mediaPackets > 0, let waited = stats["total_packet_send_delay"] as? Double { run.pacerWaitMean = waited / Double(mediaPackets) * 1000 }
    if let encoder = result["encoder"] as? [String: Any] {
        run.encodeP50 = encoder["encode_ms_p50"] as? Double ?? .nan
        run.encodedP50 = encoder["capture_to_encoded_ms_p50"] as? Double ?? .nan
    }
    let rows = report["arrivals"] as? [[Any]] ?? []
    let times = rows.compactMap { $0.first as? Double }
    // Per-frame latency as the receiver computes it: decoded ms (truncated) minus the stamp's capture ms, mod 2^32.
    func since(_ capture: Int, _ t: Double) -> Double? {
        let latency = (Int64(t) - Int64(capture)) & 0xFFFF_FFFF
        return latency < 10_000 ? Double(latency) : nil
    }
    var latencies: [Double] = [], steady: [Double] = [], complete: [Double] = []
    for row in rows where row.count > 2 {
        guard let decodedAt = row[0] as? Double, let capture = row[2] as? Int, let latency = since(capture, decodedAt) else { continue }
        latencies.append(latency)
        if decodedAt - latency >= connected + 2000 { steady.append(latency) }
        if row.count > 3, let lastPacket = row[3] as? Double, let c = since(capture, lastPacket) { complete.append(c) }
    }
    run.stamped = latencies.count
    run.p50 = percentile(latencies, 0.5)
    run.p99 = percentile(latencies, 0.99)
    run.steadyP50 = percentile(steady, 0.5)
    run.steadyP99 = percentile(steady, 0.99)
    run.completeP50 = percentile(complete, 0.5)
    run.completeP99 = percentile(complete, 0.99)
    let start = connected + 500, end = windowEnd - 200
    let inside = [start] + times.filter { $0 > start && $0 < end } + [end]
    run.freezeMs = zip(inside, inside.dropFirst()).map { $1 - $0 }.max() ?? (end - start)
    if let first = times.first { run.firstFrameMs = first - connected }
    if let row = rows.first, row.count > 2, let decodedAt = row[0] as? Double, let capture = row[2] as? Int,
       let latency = since(capture, decodedAt) {
        run.firstCaptureMs = decodedAt - latency - connected
        if row.count > 3, let lastPacket = row[3] as? Double, let c = since(capture, lastPacket) { run.firstLastPacketMs = decodedAt - latency + c - connected }
    }
    if result["status"] as? Int != 0 { run.failure = "probe: \(result["result"] ?? "?")" }
    return run
}

// MARK: the bench

/// `only`: keep the scenarios whose label contains one of these texts (all when empty),
/// e.g. `--only "1920×1080 scrolling"` while working on one of them.
func runRtcBench(seconds: Double, rounds: Int, only: [String] = [], probeArguments: [String] = []) throws {
    guard geteuid() == 0 else { throw BenchError("krakl-bench rtc needs root (ip netns add, nft)") }
    let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let receiver = repoRoot + "/Tests/Fixtures/aiortc_receiver.py"
    let python = "/opt/krakl-venv/bin/python"
    let probe = buildDir + "/krakl-rtc-probe"
    for (path, why) in [(probe, "swift build -c release builds it"), (python, "scripts/setup makes the venv with aiortc"),
                        (BenchNamespace.ip, "iproute2"), (BenchNamespace.nft, "Debian package nftables")]
    where !FileManager.default.isExecutableFile(atPath: path) {
        throw BenchError("\(path) missing (\(why))")
    }
    installRtcSignalCleanup()
    defer {
        RtcLive.shared.tearDown()
        try? FileManager.default.removeItem(atPath: work) // the sessions' logs; main's own defer does not run past exit()
    }

    let allScenarios = [
        RtcScenario(scene: "typing", width: 640, height: 360, lossPercent: 0),
        RtcScenario(scene: "typing", width: 1920, height: 1080, lossPercent: 0),
        RtcScenario(scene: "scrolling", width: 1920, height: 1080, lossPercent: 0),
        RtcScenario(scene: "typing", width: 640, height: 360, lossPercent: 5),
        RtcScenario(scene: "scrolling", width: 640, height: 360, lossPercent: 5),
        RtcScenario(scene: "typing", width: 1920, height: 1080, lossPercent: 5),
        RtcScenario(scene: "scrolling", width: 1920, height: 1080, lossPercent: 5),
        RtcScenario(scene: "static", width: 1920, height: 1080, lossPercent: 0),
    ]
    let plain = { (text: String) in text.replacingOccurrences(of: "×", with: "x") } // so "1920x1080" matches too
    let scenarios = only.isEmpty ? allScenarios : allScenarios.filter { s in only.contains { plain(s.label).contains(plain($0)) } }
    guard !scenarios.isEmpty else { throw BenchError("--only \(only.joined(separator: "|")) matches none of: \(allScenarios.map(\.label).joined(separator: " | "))") }
    print("krakl-bench rtc: krakl-rtc-probe → aiortc in a namespace each, \(Int(seconds)) s of video a session, 30 fps, 2500 kbit/s start, \(rounds) rounds")
    var runs = [[RtcRun]](repeating: [], count: scenarios.count)
    var index = 0
    for round in 0..<rounds {
        for k in 0..<scenarios.count {
            let s = (k + round) % scenarios.count
            index += 1
            print("  round \(round + 1)/\(rounds): \(scenarios[s].label) …")
            let run = runRtcSession(scenarios[s], seconds: seconds, index: index, probe: probe, receiver: receiver, python: python,
                                    plugins: work + "/plugins.json", probeArguments: probeArguments)
            print(String(format: "    connect %.1f ms, %d/%d decoded (%.1f %%), latency p50 %.0f p99 %.0f ms (from 2 s: %.0f/%.0f; last packet in: %.0f/%.0f), freeze %.0f ms, first frame %.0f ms (captured %.0f, encoded %.0f, last packet out %.0f, in %.0f), %.0f kbit/s, receiver CPU %.0f %% (busiest thread %.0f %%), probe %.0f %% (from 5 s after connect: %.3f %%), rtx %d, copies %d, PLIs %d, keyframes %d; sender: encode p50 %.1f ms, capture → encoded p50 %.1f ms, pacer wait mean %.1f ms; target at the end %.0f kbit/s (REMB %.0f); start-up probe %d bytes at up to %.1f Mbit/s%@",
                         run.connectMs, run.decoded, run.sent, run.decodedPercent, run.p50, run.p99, run.steadyP50, run.steadyP99, run.completeP50, run.completeP99,
                         run.freezeMs, run.firstFrameMs, run.firstCaptureMs, run.keyframeQueuedMs, run.keyframeSentMs, run.firstLastPacketMs, run.kbps, run.receiverCpu, run.receiverBusiestThread, run.probeCpu, run.probeSteadyCpu,
                         run.retransmitted, run.redundant, run.plis, run.keyframes, run.encodeP50, run.encodedP50, run.pacerWaitMean, run.targetKbps, run.rembKbps, run.probedBytes, run.probePeakMbps, run.failure.map { "; FAILED: \($0)" } ?? ""))
            runs[s].append(run)
        }
    }

    func median(_ values: [Double]) -> Double {
        let v = values.filter { !$0.isNaN }.sorted()
        return v.isEmpty ? .nan : (v.count % 2 == 1 ? v[v.count / 2] : (v[v.count / 2 - 1] + v[v.count / 2]) / 2)
    }
    func cell(_ values: [Double], _ format: String) -> String {
        let v = values.filter { !$0.isNaN }
        guard let lo = v.min(), let hi = v.max() else { return "n/a" }
        let m = String(format: format, median(v))
        return v.count > 1 ? "\(m) (\(String(format: format, lo))–\(String(format: format, hi)))" : m
    }
    print("")
    print("Median of \(rounds) rounds (range):")
    print("")
    print("| scenario | connect (ms) | frames sent | frames decoded | decoded % | latency p50 (ms) | latency p99 (ms) | p50 / p99 captured ≥ 2 s after connect (ms) | p50 / p99 to last packet in (ms) | longest freeze (ms) | first frame after connect (ms) | bitrate (kbit/s) | receiver CPU % (busiest thread) | probe CPU % | failed rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for (s, scenario) in scenarios.enumerated() {
        let r = runs[s].filter { $0.sent > 0 }
        let failed = runs[s].filter { $0.failure != nil }.count
        func m(_ k: KeyPath<RtcRun, Double>) -> [Double] { r.map { $0[keyPath: k] } }
        print("| \(scenario.label) | \(cell(m(\.connectMs), "%.0f")) | \(cell(r.map { Double($0.sent) }, "%.0f")) | \(cell(r.map { Double($0.decoded) }, "%.0f")) | \(cell(m(\.decodedPercent), "%.1f")) | \(cell(m(\.p50), "%.0f")) | \(cell(m(\.p99), "%.0f")) | \(String(format: "%.0f / %.0f", median(m(\.steadyP50)), median(m(\.steadyP99)))) | \(String(format: "%.0f / %.0f", median(m(\.completeP50)), median(m(\.completeP99)))) | \(cell(m(\.freezeMs), "%.0f")) | \(cell(m(\.firstFrameMs), "%.0f")) | \(cell(m(\.kbps), "%.0f")) | \(String(format: "%.0f (%.0f)", median(m(\.receiverCpu)), median(m(\.receiverBusiestThread)))) | \(cell(m(\.probeCpu), "%.0f")) | \(failed) |")
    }

    // Targets: every round must meet them; the median and the worst round are given.
    print("")
    print("| target | median | worst round | met (all rounds) |")
    print("|---|---:|---:|---|")
    let all = runs.flatMap { $0 }.filter { !$0.connectMs.isNaN }
    let connects = all.map(\.connectMs)
    print(String(format: "| ICE + DTLS connected ≤ 300 ms after the answer (all %d sessions) | %.0f ms | %.0f ms | %@ |", connects.count,
                 median(connects), connects.max() ?? .nan, (connects.max() ?? .infinity) <= 300 ? "yes" : "no"))
    for (s, scenario) in scenarios.enumerated() where scenario.is1080p && scenario.lossPercent == 0 {
        let r = runs[s].filter { $0.sent > 0 }
        let p50 = r.map(\.p50), p99 = r.map(\.p99)
        let s50 = r.map(\.steadyP50), s99 = r.map(\.steadyP99)
        print(String(format: "| %@: latency p50 ≤ 60 ms | %.0f ms | %.0f ms | %@ (from 2 s after connecting: median %.0f, worst %.0f ms) |",
                     scenario.label, median(p50), p50.max() ?? .nan, !r.isEmpty && r.allSatisfy { $0.p50 <= 60 } ? "yes" : "no",
                     median(s50), s50.max() ?? .nan))
        print(String(format: "| %@: latency p99 ≤ 150 ms | %.0f ms | %.0f ms | %@ (from 2 s after connecting: median %.0f, worst %.0f ms) |",
                     scenario.label, median(p99), p99.max() ?? .nan, !r.isEmpty && r.allSatisfy { $0.p99 <= 150 } ? "yes" : "no",
                     median(s99), s99.max() ?? .nan))
    }
    for (s, scenario) in scenarios.enumerated() where scenario.lossPercent > 0 {
        let r = runs[s].filter { $0.sent > 0 }
        let ratio = r.map(\.decodedPercent), freeze = r.map(\.freezeMs)
        print(String(format: "| %@: ≥ 95 %% decoded | %.1f %% | %.1f %% | %@ |", scenario.label, median(ratio), ratio.min() ?? .nan,
                     !r.isEmpty && r.allSatisfy { $0.decodedPercent >= 95 } ? "yes" : "no"))
        print(String(format: "| %@: no freeze > 500 ms | %.0f ms | %.0f ms | %@ |", scenario.label, median(freeze), freeze.max() ?? .nan,
                     !r.isEmpty && r.allSatisfy { $0.freezeMs <= 500 } ? "yes" : "no"))
    }
}
