// krakl-bench roomshare: sharing a 1920x1080 X11 screen into a Janus
// VideoRoom, krakl-agent against a GStreamer webrtcbin publisher, with an
// aiortc subscriber in the room (issue 17).
//
//   swift build -c release && sudo .build/release/krakl-bench roomshare [--rounds 3] [--seconds 20] [--scenes static,typing,scrolling]
//
// Xvfb 1920x1080 with bench/xroom.c drawing the scene and a frame stamp
// (docs/frame-stamp.md, stamped with the draw time); Janus (scripts/janus-testbed)
// in a namespace of the bench's own. Per scene, rounds alternate the two
// publishers (order rotating):
//   krakl   krakl-agent --join (X11 backend, release build)
//   gst     bench/gst_janus_publisher.py: ximagesrc use-damage=true !
//           videoconvert ! vp8enc deadline=1 ! rtpvp8pay ! webrtcbin
// each publishing under a name of its own while bench/room_watch.py waits in
// the room, subscribes the moment the name is listed and decodes.
// Reported per publisher (the median round, and the range over rounds):
//   CPU s/min   publisher + the X server's extra over the scene alone
//               (measured right before), from /proc schedstat, over the
//               window from 2 s after the first decoded frame to 2 s before
//               the subscriber stops (the first keyframe left out)
//   RSS         VmHWM (peak) and VmRSS (steady) at the window's end
//   first frame publisher started → first frame decoded at the subscriber
//               (the subscriber was waiting; its own Janus set-up is in it)
//   latency     draw → decoded, p50/p99 over distinct stamps drawn 2 s or
//               more after the first frame (aiortc decodes a frame when a
//               packet of the next one arrives, so a quiet screen waits)
//   bitrate     RTP bytes received over the same steady part
// and, for krakl, where its resident memory is (/proc/PID/smaps).
import Foundation
import KraklBase
import KraklCore

struct RoomShareRun {
    var cpuPublisher = Double.nan, cpuServer = Double.nan
    var peakMB = Double.nan, steadyMB = Double.nan
    var firstFrameMs = Double.nan
    var p50 = Double.nan, p99 = Double.nan
    var kbps = Double.nan
    var failure: String?
    var cpuTotal: Double { cpuPublisher + cpuServer }
}

/// A /proc/PID/status field in MB (VmRSS, VmHWM).
func statusMB(_ pid: pid_t, _ field: String) -> Double {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = text.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
          let kb = line.split(separator: " ").dropFirst().first.flatMap({ Double($0) }) else { return .nan }
    return kb / 1024
}

func runRoomShareBench(seconds: Double, rounds: Int, scenes: [String], smapsOut: String?) throws {
    installRtcSignalCleanup()
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let venv = "/opt/krakl-venv/bin/python", systemPython = "/usr/bin/python3"
    let watchScript = repo + "/bench/room_watch.py", gstScript = repo + "/bench/gst_janus_publisher.py"
    let host = repo + "/Tests/Fixtures/janus_host.py", codeScript = repo + "/Tests/Fixtures/make_join_code.py"
    guard FileManager.default.isExecutableFile(atPath: venv) else { throw BenchError("\(venv) missing: run scripts/setup") }
    guard measure(systemPython, ["-c", "import gi; gi.require_version('GstWebRTC', '1.0')"]).status == 0,
          measure(which("gst-inspect-1.0"), ["webrtcbin"]).status == 0 else {
        throw BenchError("GStreamer's webrtcbin or its Python bindings are missing: run scripts/setup")
    }
    let xvfb = which("Xvfb"), xsetroot = which("xsetroot"), cc = which("cc")
    let painterBinary = work + "/xroom"
    let built = measure(cc, ["-O2", repo + "/bench/xroom.c", "-o", painterBinary, "-lX11"])
    guard built.status == 0 else { throw BenchError("cannot build bench/xroom.c: \(built.stderr)") }

    let namespace = try BenchNamespace("krakl-bench-share-\(getpid())")
    defer { namespace.delete() }
    let janus = try namespace.startJanus(repo: repo, folder: work + "/janus")
    defer { janus.stop() }
    let room = Int.random(in: 10_000...99_999), secret = "bench"
    let created = measure(BenchNamespace.ip, namespace.command(venv, [host, "create", "--room", "\(room)", "--secret", secret]))
    guard created.stdout.contains("\"created\"") else { throw BenchError("cannot create the room: \(created.stdout) \(created.stderr)") }

    let window = max(4, seconds - 4)
    print("krakl-bench roomshare: \(scenes.joined(separator: ", ")) on a 1920x1080 Xvfb screen, krakl-agent (X11 backend) vs GStreamer webrtcbin into a Janus VideoRoom, aiortc subscribing; \(Int(seconds)) s sessions, \(rounds) rounds")
    var results: [(scene: String, publisher: String, runs: [RoomShareRun])] = []
    var session = 0
    for scene in scenes {
        let screen = BenchXvfb(xvfb, xsetroot: xsetroot)
        defer { screen.stop() }
        let display = screen.display, server = screen.pid
        let painter = launch(painterBinary, [display, scene])
        defer { stopAndReap(painter) }
        usleep(500_000)

        var runs: [String: [RoomShareRun]] = [:]
        let publishers = ["krakl", "gst"]
        for round in 0..<rounds {
            for k in 0..<publishers.count {
                let publisher = publishers[(k + round) % publishers.count]
                session += 1
                let name = "\(publisher)-\(session)"
                print("  \(scene) round \(round + 1)/\(rounds): \(publisher) …")
                // The X server's CPU for the scene alone, right before.
                let idleStart = processCpuSeconds(server)
                usleep(3_000_000)
                let idlePerSecond = (processCpuSeconds(server) - idleStart) / 3
                var run = RoomShareRun()
                guard let watcher = BenchChild(BenchNamespace.ip, namespace.command(venv, [watchScript, "--room", "\(room)", "--display", name,
                                                                                          "--seconds", "\(seconds)"]),
                                               out: work + "/watch-\(session).out", err: work + "/watch-\(session).err") else { throw BenchError("cannot start the subscriber") }
                defer { watcher.stop(grace: 5) }
                _ = watcher.poll(timeout: 20) { $0.contains("waiting") ? true : nil }
                let t0 = MonotonicClock.milliseconds()
                let arguments: [String]
                if publisher == "krakl" {
                    let made = measure("/usr/bin/python3", [codeScript, "--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", "\(room)",
                                                            "--identity", name, "--secret", secret])
                    let codePath = work + "/code-\(name)"
                    try made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).write(toFile: codePath, atomically: true, encoding: .utf8)
                    arguments = namespace.command(agent, ["--join", "@" + codePath, "--address", "127.0.0.2", "--plugins", work + "/plugins-x11.json",
                                                          "--option", "display=\(display)"])
                } else {
                    arguments = namespace.command(systemPython, [gstScript, "--room", "\(room)", "--display", name, "--x-display", display])
                }
                guard let child = BenchChild(BenchNamespace.ip, arguments, out: work + "/pub-\(session).out", err: work + "/pub-\(session).err") else {
                    throw BenchError("cannot start \(publisher)")
                }
                defer { kill(child.pid, SIGTERM); child.stop(grace: 5) }
                guard let first = watcher.poll(timeout: 40, { text -> Double? in
                    text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
                        .compactMap { $0["first_frame_ms"] as? Double }.first
                }) else {
                    run.failure = "no frame in 40 s; publisher: " + String((child.stdout + child.stderr).suffix(300)) + " subscriber: " + String((watcher.stdout + watcher.stderr).suffix(200))
                    print("    \(run.failure!)")
                    runs[publisher, default: []].append(run)
                    continue
                }
                run.firstFrameMs = first - t0
                usleep(useconds_t(max(0, first + 2000 - MonotonicClock.milliseconds()) * 1000))
                let cpu0 = (processCpuSeconds(child.pid), processCpuSeconds(server))
                usleep(useconds_t(window * 1_000_000))
                let cpu1 = (processCpuSeconds(child.pid), processCpuSeconds(server))
                run.cpuPublisher = (cpu1.0 - cpu0.0) / window * 60
                run.cpuServer = max(0, cpu1.1 - cpu0.1 - idlePerSecond * window) / window * 60
                run.peakMB = statusMB(child.pid, "VmHWM")
                run.steadyMB = statusMB(child.pid, "VmRSS")
                if publisher == "krakl", let smapsOut {
                    let path = smapsOut + "-\(scene)-\(round + 1).txt"
                    try? smapsReport(pid: child.pid).write(toFile: path, atomically: true, encoding: .utf8)
                }
                let report = watcher.poll(timeout: seconds + 20) { text -> [String: Any]? in
                    text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
                        .first { $0["frames"] != nil }
                }
                if let report {
                    let latencies = (report["latency_ms"] as? [[Any]] ?? []).compactMap { pair -> Double? in
                        guard pair.count == 2, let at = pair[0] as? Double, at >= 2000 else { return nil }
                        return pair[1] as? Double
                    }.sorted()
                    run.p50 = latencies.nearestRank(0.5) ?? .nan
                    run.p99 = latencies.nearestRank(0.99) ?? .nan
                    if let bytes = report["bytes_steady"] as? Double, let span = report["steady_seconds"] as? Double, span > 0 {
                        run.kbps = bytes * 8 / span / 1000
                    }
                } else {
                    run.failure = "no report from the subscriber"
                }
                print(String(format: "    first frame %.0f ms, CPU %.2f + %.2f s/min, RSS %.1f / %.1f MB, latency %.0f / %.0f ms, %.0f kbit/s",
                             run.firstFrameMs, run.cpuPublisher, run.cpuServer, run.peakMB, run.steadyMB, run.p50, run.p99, run.kbps))
                runs[publisher, default: []].append(run)
            }
        }
        for publisher in publishers { results.append((scene, publisher, runs[publisher] ?? [])) }
    }

    func median(_ runs: [RoomShareRun], _ value: (RoomShareRun) -> Double) -> Double {
        let v = runs.filter { $0.failure == nil }.map(value).filter { !$0.isNaN }.sorted()
        return v.isEmpty ? .nan : v[v.count / 2]
    }
    func range(_ runs: [RoomShareRun], _ value: (RoomShareRun) -> Double, _ format: String) -> String {
        let v = runs.filter { $0.failure == nil }.map(value).filter { !$0.isNaN }.sorted()
        guard let low = v.first, let high = v.last else { return "n/a" }
        return String(format: format, median(runs, value)) + " (" + String(format: format, low) + "–" + String(format: format, high) + ")"
    }
    print("")
    print("| scene | publisher | CPU s/min: publisher + X server extra = total | peak / steady RSS (MB) | start → first frame decoded (ms) | draw → decoded p50 / p99 (ms) | bitrate (kbit/s) | rounds ok |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (scene, publisher, runs) in results {
        let label = publisher == "krakl" ? "krakl-agent (X11)" : "gst webrtcbin (ximagesrc use-damage)"
        print(String(format: "| %@ | %@ | %.2f + %.2f = %@ | %.1f / %.1f | %@ | %.0f / %.0f | %.0f | %d/%d |", scene, label,
                     median(runs, \.cpuPublisher), median(runs, \.cpuServer), range(runs, \.cpuTotal, "%.2f"),
                     median(runs, \.peakMB), median(runs, \.steadyMB), range(runs, \.firstFrameMs, "%.0f"),
                     median(runs, \.p50), median(runs, \.p99), median(runs, \.kbps), runs.filter { $0.failure == nil }.count, runs.count))
    }
    print("")
    for scene in scenes {
        let pick = { (name: String) in results.first { $0.scene == scene && $0.publisher == name }?.runs ?? [] }
        let k = median(pick("krakl"), \.cpuTotal), g = median(pick("gst"), \.cpuTotal)
        if k < 0.01 {
            print(String(format: "%@: krakl's total CPU (median) rounds to 0.00 s/min against GStreamer's %.2f", scene, g))
        } else {
            print(String(format: "%@: krakl's total CPU (median) is %.1fx lower than GStreamer's", scene, g / k))
        }
    }
}

// MARK: where the memory is

/// /proc/PID/smaps summed by what holds the memory: the heap, each library
/// (all its mappings), shared memory, and anonymous mappings listed one by
/// one when large (their size tells what they are). Read whole with read(2):
/// Foundation's String(contentsOfFile:) stops at procfs's first 4 KB.
func smapsReport(pid: pid_t) -> String {
    let fd = open("/proc/\(pid)/smaps", O_RDONLY)
    guard fd >= 0 else { return "cannot open /proc/\(pid)/smaps\n" }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    for _ in 0..<10_000 {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, 65536) }
        if n <= 0 { break }
        bytes += chunk[0..<n]
    }
    struct Group { var rss = 0, privateDirty = 0, size = 0, count = 0 }
    var groups: [String: Group] = [:]
    var anonymous: [(range: String, size: Int, rss: Int)] = []
    var current = "", currentRange = "", currentSize = 0, currentRss = 0
    func flushAnonymous() {
        if current == "anonymous" && currentRss >= 256 { anonymous.append((currentRange, currentSize, currentRss)) }
    }
    for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        guard let head = fields.first else { continue }
        if head.contains("-") && !head.hasSuffix(":") {
            flushAnonymous()
            currentRange = String(head)
            let path = fields.count >= 6 ? fields[5...].joined(separator: " ") : ""
            if path.isEmpty { current = "anonymous" }
            else if path.hasPrefix("/SYSV") { current = "System V shared memory (X shm image)" }
            else if path.hasPrefix("[") { current = path }
            else { current = (path as NSString).lastPathComponent }
            currentSize = 0
            currentRss = 0
            continue
        }
        guard fields.count >= 2, let kb = Int(fields[1]) else { continue }
        switch head {
        case "Size:": groups[current, default: Group()].size += kb; groups[current, default: Group()].count += 1; currentSize = kb
        case "Rss:": groups[current, default: Group()].rss += kb; currentRss = kb
        case "Private_Dirty:": groups[current, default: Group()].privateDirty += kb
        default: break
        }
    }
    flushAnonymous()
    var out = "| mapping | mappings | size (KB) | Rss (KB) | private dirty (KB) |\n|---|---:|---:|---:|---:|\n"
    for (name, g) in groups.sorted(by: { $0.value.rss > $1.value.rss }) where g.rss > 0 {
        out += "| \(name) | \(g.count) | \(g.size) | \(g.rss) | \(g.privateDirty) |\n"
    }
    out += "| total | | \(groups.values.map(\.size).reduce(0, +)) | \(groups.values.map(\.rss).reduce(0, +)) | \(groups.values.map(\.privateDirty).reduce(0, +)) |\n"
    out += "\nanonymous mappings with Rss ≥ 256 KB:\n| range | size (KB) | Rss (KB) |\n|---|---:|---:|\n"
    for a in anonymous.sorted(by: { $0.rss > $1.rss }) { out += "| \(a.range) | \(a.size) | \(a.rss) |\n" }
    return out
}
