// krakl-bench roomshare: sharing a 1920x1080 X11 screen into a Janus
// VideoRoom: krakl-agent, a GStreamer webrtcbin publisher and Chromium's own
// screen share (getDisplayMedia), with an aiortc subscriber in the room
// (issues 17 and 27).
//
//   swift build -c release && sudo .build/release/krakl-bench roomshare [--rounds 3] [--seconds 20]
//       [--scenes static,typing,scrolling] [--publishers krakl,gst,chromium] [--smaps PREFIX] [--keep-samples DIR]
//   (--keep-samples also keeps krakl's --frame-log as DIR/SCENE-krakl-ROUND.frames.csv)
//
// Xvfb 1920x1080 with bench/xroom.c drawing the scene and a frame stamp
// (docs/frame-stamp.md, stamped with the draw time), bench/xaside.c keeping
// any window off that screen and the pointer in its corner; Janus
// (scripts/janus-testbed) in a namespace of the bench's own. Per scene,
// rounds alternate the publishers (order rotating):
//   krakl     krakl-agent --join (X11 backend, release build)
//   gst       bench/gst_janus_publisher.py: ximagesrc use-damage=true !
//             videoconvert ! vp8enc deadline=1 ! rtpvp8pay ! webrtcbin
//   chromium  bench/chromium_publisher.py: Debian's Chromium on the same
//             screen, bench/chromium_share.html calling getDisplayMedia
//             (whole screen, no dialog), contentHint "detail", VP8 capped
//             at 2.5 Mbit/s, Janus's HTTP API
// each publishing under a name of its own while bench/room_watch.py waits in
// the room, subscribes the moment the name is listed and decodes.
// Reported per publisher (the median round, and the range over rounds):
//   CPU s/min   publisher (all its processes) + the X server's extra over the
//               scene alone (measured right before), from /proc schedstat,
//               over the window from 2 s after the first decoded frame to
//               2 s before the subscriber stops (the first keyframe left out)
//   memory      Pss and Rss summed over the publisher's processes
//               (/proc/PID/smaps_rollup) at the window's end; VmHWM (peak)
//               of single-process publishers
//   first frame publisher started (Chromium: its page asked to share, the
//               browser already open) → first frame decoded at the
//               subscriber (the subscriber was waiting; its own Janus
//               set-up is in it)
//   latency     draw → decoded, p50/p99 over distinct stamps drawn 2 s or
//               more after the first frame (aiortc decodes a frame when a
//               packet of the next one arrives, so a quiet screen waits)
//   bitrate     bytes received over the same steady part
//   quality     PSNR and SSIM (luma) of the frame on show every 0.5 s of
//               the steady part against the frame as drawn (receivedQuality)
// and, for krakl, where its resident memory is (/proc/PID/smaps).
import Foundation
import KraklBase
import KraklHost

struct RoomShareRun {
    var cpuPublisher = Double.nan, cpuServer = Double.nan
    var cpuTicks = Double.nan
    var pssMB = Double.nan, rssMB = Double.nan, peakMB = Double.nan
    var firstFrameMs = Double.nan
    var p50 = Double.nan, p99 = Double.nan
    var kbps = Double.nan
    /// Distinct frames (stamps) decoded per second, drawn 2 s or more after the first.
    var fps = Double.nan
    var quality = ReceivedQuality()
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

/// JSON objects printed one a line, in order.
func jsonLines(_ text: String) -> [[String: Any]] {
    text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
}

let roomSharePublishers = ["krakl", "gst", "chromium"]
let roomShareLabels = ["krakl": "krakl-agent (X11)", "gst": "gst webrtcbin (ximagesrc use-damage)", "chromium": "Chromium getDisplayMedia"]

func runRoomShareBench(seconds: Double, rounds: Int, scenes: [String], publishers: [String], smapsOut: String?, keepSamples: String?) throws {
    installRtcSignalCleanup()
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let venv = "/opt/krakl-venv/bin/python", systemPython = "/usr/bin/python3"
    let watchScript = repo + "/bench/room_watch.py", gstScript = repo + "/bench/gst_janus_publisher.py"
    let chromiumScript = repo + "/bench/chromium_publisher.py"
    let host = repo + "/Tests/Fixtures/janus_host.py", codeScript = repo + "/Tests/Fixtures/make_join_code.py"
    guard !publishers.isEmpty, publishers.allSatisfy(roomSharePublishers.contains) else {
        throw BenchError("--publishers takes some of \(roomSharePublishers.joined(separator: ",")), comma-separated")
    }
    guard FileManager.default.isExecutableFile(atPath: venv) else { throw BenchError("\(venv) missing: run scripts/setup") }
    if publishers.contains("gst") {
        guard measure(systemPython, ["-c", "import gi; gi.require_version('GstWebRTC', '1.0')"]).status == 0,
              measure(which("gst-inspect-1.0"), ["webrtcbin"]).status == 0 else {
            throw BenchError("GStreamer's webrtcbin or its Python bindings are missing: run scripts/setup")
        }
    }
    if publishers.contains("chromium") {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium") else { throw BenchError("/usr/bin/chromium missing: run scripts/setup") }
    }
    let xvfb = which("Xvfb"), xsetroot = which("xsetroot"), cc = which("cc")
    let painterBinary = work + "/xroom", asideBinary = work + "/xaside"
    for (source, binary) in [("xroom.c", painterBinary), ("xaside.c", asideBinary)] {
        let built = measure(cc, ["-O2", repo + "/bench/" + source, "-o", binary, "-lX11"])
        guard built.status == 0 else { throw BenchError("cannot build bench/\(source): \(built.stderr)") }
    }

    let namespace = try BenchNamespace("krakl-bench-share-\(getpid())")
    defer { namespace.delete() }
    let janus = try namespace.startJanus(repo: repo, folder: work + "/janus")
    defer { janus.stop() }
    let room = Int.random(in: 10_000...99_999), secret = "bench"
    let created = measure(BenchNamespace.ip, namespace.command(venv, [host, "create", "--room", "\(room)", "--secret", secret]))
    guard created.stdout.contains("\"created\"") else { throw BenchError("cannot create the room: \(created.stdout) \(created.stderr)") }

    let window = max(4, seconds - 4)
    print("krakl-bench roomshare: \(scenes.joined(separator: ", ")) on a 1920x1080 Xvfb screen, \(publishers.map { roomShareLabels[$0]! }.joined(separator: " vs ")) into a Janus VideoRoom, aiortc subscribing; \(Int(seconds)) s sessions, \(rounds) rounds")
    print("load average at the start: \(loadAverage())")
    var results: [(scene: String, publisher: String, runs: [RoomShareRun])] = []
    var session = 0
    for scene in scenes {
        let screen = BenchXvfb(xvfb, xsetroot: xsetroot)
        defer { screen.stop() }
        let display = screen.display, server = screen.pid
        // Before any window: nothing but the scene is on the screen, for every publisher alike.
        guard let aside = BenchChild(asideBinary, [display, "\(Double(rounds * publishers.count) * (seconds + 120))"],
                                     out: work + "/aside-\(scene).out", err: work + "/aside-\(scene).err"),
              aside.poll(timeout: 10, { $0.contains("ready") ? true : nil }) != nil else { throw BenchError("bench/xaside.c did not start") }
        defer { aside.stop() }
        let painter = launch(painterBinary, [display, scene])
        defer { stopAndReap(painter) }
        usleep(500_000)

        var runs: [String: [RoomShareRun]] = [:]
        for round in 0..<rounds {
            for k in 0..<publishers.count {
                let publisher = publishers[(k + round) % publishers.count]
                session += 1
                let name = "\(publisher)-\(session)"
                print("  \(scene) round \(round + 1)/\(rounds): \(publisher) (load \(loadAverage())) …")
                let run = try roomShareSession(publisher: publisher, name: name, scene: scene, session: session, seconds: seconds, window: window,
                                               display: display, server: server, room: room, secret: secret, namespace: namespace,
                                               venv: venv, scripts: (watchScript, gstScript, chromiumScript, codeScript, systemPython, repo + "/bench/smaps_parts.py"),
                                               xroom: painterBinary, smapsPath: smapsOut.map { $0 + "-\(scene)-\(round + 1).txt" },
                                               keepAs: keepSamples.map { $0 + "/\(scene)-\(publisher)-\(round + 1)" })
                if let failure = run.failure { print("    \(failure)") }
                print(String(format: "    first frame %.0f ms, CPU %.2f + %.2f s/min (ticks %.2f), PSS %.1f / RSS %.1f / peak %.1f MB, latency %.0f / %.0f ms, %.0f kbit/s, %.1f frames/s, PSNR %.2f (worst %.2f) dB, SSIM %.4f over %d samples (%d unreadable, %d matched the next frame)",
                             run.firstFrameMs, run.cpuPublisher, run.cpuServer, run.cpuTicks, run.pssMB, run.rssMB, run.peakMB, run.p50, run.p99, run.kbps,
                             run.fps, run.quality.psnr, run.quality.worstPsnr, run.quality.ssim, run.quality.samples, run.quality.unreadable,
                             run.quality.nextFrame))
                runs[publisher, default: []].append(run)
            }
        }
        for publisher in publishers { results.append((scene, publisher, runs[publisher] ?? [])) }
    }
    print("load average at the end: \(loadAverage())")
    printRoomShareTable(results, scenes: scenes, publishers: publishers)
}

/// One publisher's session in the room, measured.
func roomShareSession(publisher: String, name: String, scene: String, session: Int, seconds: Double, window: Double,
                      display: String, server: pid_t, room: Int, secret: String, namespace: BenchNamespace, venv: String,
                      scripts: (watch: String, gst: String, chromium: String, code: String, systemPython: String, partsScript: String),
                      xroom: String, smapsPath: String?, keepAs: String?) throws -> RoomShareRun {
    var run = RoomShareRun()
    // The X server's CPU for the scene alone, right before.
    let idleStart = processCpuSeconds(server)
    usleep(3_000_000)
    let idlePerSecond = (processCpuSeconds(server) - idleStart) / 3

    // Chromium is open and its page loaded before the share starts, as a person's browser is.
    let publisherCommand: [String]
    switch publisher {
    case "krakl":
        let made = measure("/usr/bin/python3", [scripts.code, "--kind", "janus", "--url", "http://127.0.0.1:8088/janus", "--room", "\(room)",
                                                "--identity", name, "--secret", secret])
        let codePath = work + "/code-\(name)"
        try made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).write(toFile: codePath, atomically: true, encoding: .utf8)
        publisherCommand = namespace.command(agent, ["--join", "@" + codePath, "--address", "127.0.0.2", "--plugins", work + "/plugins-x11.json",
                                                     "--option", "display=\(display)"]
                                             // --keep-samples: krakl's own row per encoded frame beside them (time, bytes, keyframe, refresh, quantizer).
                                             + (keepAs.map { ["--frame-log", $0 + ".frames.csv"] } ?? []))
    case "gst":
        publisherCommand = namespace.command(scripts.systemPython, [scripts.gst, "--room", "\(room)", "--display", name, "--x-display", display])
    default:
        publisherCommand = namespace.command(venv, [scripts.chromium, "--room", "\(room)", "--display", name, "--x-display", display])
    }
    var browser: BenchChild?, root: pid_t = 0
    defer { if let browser { kill(browser.pid, SIGTERM); browser.stop(grace: 12) } }   // the page leaves the room first
    if publisher == "chromium" {
        browser = BenchChild(BenchNamespace.ip, publisherCommand, out: work + "/pub-\(session).out", err: work + "/pub-\(session).err")
        guard let browser, browser.poll(timeout: 60, { jsonLines($0).contains { $0["page"] != nil } ? true : nil }) != nil,
              let pid = jsonLines(browser.stdout).compactMap({ $0["chromium_pid"] as? Int }).first else {
            run.failure = "Chromium's page did not load in 60 s: " + String(((browser?.stdout ?? "") + (browser?.stderr ?? "")).suffix(300))
            return run
        }
        root = pid_t(pid)
    }

    guard let watcher = BenchChild(BenchNamespace.ip, namespace.command(venv, [scripts.watch, "--room", "\(room)", "--display", name, "--seconds", "\(seconds)",
                                                                              "--samples", work + "/samples-\(session).y", "--sample-size", "1920x1080"]),
                                   out: work + "/watch-\(session).out", err: work + "/watch-\(session).err") else { throw BenchError("cannot start the subscriber") }
    defer { watcher.stop(grace: 5); try? FileManager.default.removeItem(atPath: work + "/samples-\(session).y") }
    _ = watcher.poll(timeout: 20) { $0.contains("waiting") ? true : nil }
    let t0 = MonotonicClock.milliseconds()
    let child: BenchChild
    if let browser {
        browser.type("share\n")
        child = browser
    } else {
        guard let started = BenchChild(BenchNamespace.ip, publisherCommand, out: work + "/pub-\(session).out", err: work + "/pub-\(session).err") else {
            throw BenchError("cannot start \(publisher)")
        }
        child = started
        root = started.pid
    }
    defer { if browser == nil { kill(child.pid, SIGTERM); child.stop(grace: 5) } }
    guard let first = watcher.poll(timeout: 40, { jsonLines($0).compactMap { $0["first_frame_ms"] as? Double }.first }) else {
        run.failure = "no frame in 40 s; publisher: " + String((child.stdout + child.stderr).suffix(300)) + " subscriber: " + String((watcher.stdout + watcher.stderr).suffix(200))
        return run
    }
    run.firstFrameMs = first - t0
    usleep(useconds_t(max(0, first + 2000 - MonotonicClock.milliseconds()) * 1000))
    let cpu0 = (processTreeCpu(root), processCpuSeconds(server), treeTickSeconds(root)), threads0 = treeThreadCpu(root)
    usleep(useconds_t(window * 1_000_000))
    let cpu1 = (processTreeCpu(root), processCpuSeconds(server), treeTickSeconds(root)), threads1 = treeThreadCpu(root)
    run.cpuPublisher = treeCpuDelta(from: cpu0.0, to: cpu1.0) / window * 60
    run.cpuTicks = treeCpuDelta(from: cpu0.2, to: cpu1.2) / window * 60
    run.cpuServer = max(0, cpu1.1 - cpu0.1 - idlePerSecond * window) / window * 60
    if Set(cpu0.0.keys).subtracting(cpu1.0.keys).count > 0 {
        print("    note: \(Set(cpu0.0.keys).subtracting(cpu1.0.keys).count) of the publisher's processes ended in the window (their CPU is not counted)")
    }
    let memory = treeMemoryMB(root)
    (run.pssMB, run.rssMB) = (memory.pss, memory.rss)
    if memory.processes == 1 { run.peakMB = statusMB(root, "VmHWM") }
    if memory.processes > 1 {
        print("    \(publisher)'s processes: \(treeKinds(root))")
    }
    // Where the publisher's CPU went, thread by thread (which of Chromium's processes, which of krakl's threads).
    print("    busiest threads (CPU s/min): \(busiestThreads(from: threads0, to: threads1, window: window))")
    if publisher == "krakl", let smapsPath {
        try? smapsReport(pid: root).write(toFile: smapsPath, atomically: true, encoding: .utf8)
        // The raw files too, for bench/smaps_parts.py (memory by part: libvpx, pictures, libraries).
        let raw = smapsPath.hasSuffix(".txt") ? String(smapsPath.dropLast(4)) : smapsPath
        for file in ["smaps", "status"] {
            _ = FileManager.default.createFile(atPath: raw + "." + file, contents: Data(readProcFile("/proc/\(root)/\(file)")))
        }
        // Run under bench/alloc_log.c (KRAKL_ALLOC_LOG=DIR LD_PRELOAD=…), the anonymous memory split
        // into libvpx's buffers and the pipeline's pictures, read while the agent lives.
        if let folder = ProcessInfo.processInfo.environment["KRAKL_ALLOC_LOG"] {
            let parts = measure("/usr/bin/python3", [scripts.partsScript, "\(root)", "--allocations", folder])
            try? (parts.stdout + parts.stderr).write(toFile: raw + ".parts.txt", atomically: true, encoding: .utf8)
        }
    }
    guard let report = watcher.poll(timeout: seconds + 20, { jsonLines($0).first { $0["frames"] != nil } }) else {
        run.failure = "no report from the subscriber"
        return run
    }
    let steady = (report["latency_ms"] as? [[Any]] ?? []).filter { ($0.first as? Double ?? 0) >= 2000 }
    let latencies = steady.compactMap { $0.count == 2 ? $0[1] as? Double : nil }.sorted()
    run.p50 = latencies.nearestRank(0.5) ?? .nan
    run.p99 = latencies.nearestRank(0.99) ?? .nan
    if let bytes = report["bytes_steady"] as? Double, let span = report["steady_seconds"] as? Double, span > 0 {
        run.kbps = bytes * 8 / span / 1000
        run.fps = Double(steady.count) / span
    }
    if let sizes = report["sizes"] as? [String: Any], sizes.keys.contains(where: { $0 != "1920x1080" }) {
        print("    note: decoded sizes \(sizes) (scaled to 1920x1080 for the quality)")
    }
    if let keepAs {   // --keep-samples: the planes and the subscriber's report, to look at
        try? FileManager.default.copyItem(atPath: work + "/samples-\(session).y", toPath: keepAs + ".y")
        try? watcher.stdout.write(toFile: keepAs + ".json", atomically: true, encoding: .utf8)
    }
    run.quality = receivedQuality(samplesFile: work + "/samples-\(session).y", samples: report["samples"] as? [[Any]] ?? [], scene: scene,
                                  xroom: xroom, width: 1920, height: 1080)
    if publisher == "chromium" {
        // The page's own account of its sender, once the share stops (encoder, size, what limited it).
        child.closeInput()
        if let stats = child.poll(timeout: 10, { jsonLines($0).first { $0["stats"] != nil }?["stats"] }),
           let data = try? JSONSerialization.data(withJSONObject: stats, options: [.sortedKeys]) {
            print("    Chromium's sender: " + String(decoding: data, as: UTF8.self))
        }
    }
    return run
}

func printRoomShareTable(_ results: [(scene: String, publisher: String, runs: [RoomShareRun])], scenes: [String], publishers: [String]) {
    func values(_ runs: [RoomShareRun], _ value: (RoomShareRun) -> Double) -> [Double] {
        runs.filter { $0.failure == nil }.map(value).filter { !$0.isNaN }.sorted()
    }
    func median(_ runs: [RoomShareRun], _ value: (RoomShareRun) -> Double) -> Double {
        let v = values(runs, value)
        return v.isEmpty ? .nan : v[v.count / 2]
    }
    func range(_ runs: [RoomShareRun], _ value: (RoomShareRun) -> Double, _ format: String) -> String {
        let v = values(runs, value)
        guard let low = v.first, let high = v.last else { return "n/a" }
        return String(format: format, median(runs, value)) + " (" + String(format: format, low) + "–" + String(format: format, high) + ")"
    }
    func cell(_ value: Double, _ format: String) -> String { value.isNaN ? "n/a" : String(format: format, value) }
    print("")
    print("| scene | publisher | CPU s/min: publisher + X server extra = total | PSS / RSS (MB) | peak RSS (MB) | start → first frame decoded (ms) | draw → decoded p50 / p99 (ms) | bitrate (kbit/s) | frames/s decoded | received PSNR Y (dB) | received SSIM Y | rounds ok |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (scene, publisher, runs) in results {
        print("| \(scene) | \(roomShareLabels[publisher]!) | \(cell(median(runs, \.cpuPublisher), "%.2f")) + \(cell(median(runs, \.cpuServer), "%.2f")) = \(range(runs, \.cpuTotal, "%.2f"))"
              + " | \(cell(median(runs, \.pssMB), "%.1f")) / \(cell(median(runs, \.rssMB), "%.1f")) | \(cell(median(runs, \.peakMB), "%.1f"))"
              + " | \(range(runs, \.firstFrameMs, "%.0f")) | \(cell(median(runs, \.p50), "%.0f")) / \(cell(median(runs, \.p99), "%.0f")) | \(cell(median(runs, \.kbps), "%.0f")) | \(cell(median(runs, \.fps), "%.1f"))"
              + " | \(range(runs, \.quality.psnr, "%.2f")) | \(range(runs, \.quality.ssim, "%.4f")) | \(runs.filter { $0.failure == nil }.count)/\(runs.count) |")
    }
    print("")
    guard publishers.contains("krakl"), publishers.count > 1 else { return }
    for scene in scenes {
        let pick = { (name: String) in results.first { $0.scene == scene && $0.publisher == name }?.runs ?? [] }
        let k = pick("krakl")
        var parts: [String] = []
        for peer in publishers where peer != "krakl" {
            let p = pick(peer)
            let ratio = median(p, \.cpuTotal) / median(k, \.cpuTotal)
            let versus = { (value: (RoomShareRun) -> Double, format: String) in cell(median(k, value), format) + " vs " + cell(median(p, value), format) }
            parts.append("\(peer): CPU \(versus(\.cpuTotal, "%.2f")) s/min ("
                         + (median(k, \.cpuTotal) < 0.01 ? "krakl rounds to 0" : String(format: "%.1fx less", ratio))
                         + "), PSNR \(versus(\.quality.psnr, "%.2f")) dB, SSIM \(versus(\.quality.ssim, "%.4f")), frames/s \(versus(\.fps, "%.1f")),"
                         + " first frame \(versus(\.firstFrameMs, "%.0f")) ms, latency p50 \(versus(\.p50, "%.0f")) ms")
        }
        print("\(scene), krakl against " + parts.joined(separator: "; "))
    }
}

// MARK: where the memory is

/// A procfs file whole, read with read(2) (empty when it cannot be opened).
func readProcFile(_ path: String) -> [UInt8] {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return [] }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    for _ in 0..<10_000 {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, 65536) }
        if n <= 0 { break }
        bytes += chunk[0..<n]
    }
    return bytes
}

/// /proc/PID/smaps summed by what holds the memory: the heap, each library
/// (all its mappings), shared memory, and anonymous mappings listed one by
/// one when large (their size tells what they are). Read whole with read(2):
/// Foundation's String(contentsOfFile:) stops at procfs's first 4 KB.
func smapsReport(pid: pid_t) -> String {
    let bytes = readProcFile("/proc/\(pid)/smaps")
    guard !bytes.isEmpty else { return "cannot read /proc/\(pid)/smaps\n" }
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
