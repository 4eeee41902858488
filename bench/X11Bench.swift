// krakl-bench x11: the X11 backend vs GStreamer's ximagesrc (use-damage=true)
// and ffmpeg's x11grab, each capturing a 1920x1080 Xvfb at 30 fps into a
// null sink, for a static screen, a terminal being typed into, and a
// full-screen change every frame (bench/xactivity.c draws them).
//
// Reported, in steady state (a 2 s warm-up is left out, so start-up does not
// count): the capturer's CPU seconds per minute and the X server's extra CPU
// seconds per minute while it runs (the server copies the pixels a capturer
// asks for; over a baseline of the same scene with no capturer), both from
// /proc; and the capturer's peak RSS (wait4).
//
// The machine is shared and the server's share swings, so each scene runs
// `rounds` rounds; a round measures a fresh no-capturer baseline right before
// each capturer, and the capturers' order rotates from round to round. The
// table gives each capturer's median round, with the range of totals.
import Foundation

struct X11Row {
    var scene = "", capturer = ""
    var capturerCpu = 0.0, serverCpu = 0.0, rssMB = 0.0
    var note = ""
    /// Totals of every round, lowest first (the row itself is the median round).
    var totals: [Double] = []
    var total: Double { capturerCpu + serverCpu }
}

/// CPU seconds a process's threads have used so far, from each thread's
/// /proc/PID/task/TID/schedstat (nanoseconds; utime/stime tick only every
/// 10 ms, too coarse for an idle capturer).
func processCpuSeconds(_ pid: pid_t) -> Double {
    guard let threads = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return 0 }
    return threads.reduce(0) { $0 + (threadCpuSeconds(pid, $1) ?? 0) }
}

/// One thread's CPU seconds so far (the first field of /proc/PID/task/TID/schedstat, ns); nil once it ended.
func threadCpuSeconds(_ pid: pid_t, _ tid: String) -> Double? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/schedstat", encoding: .utf8),
          let ns = text.split(separator: " ").first.flatMap({ Double($0) }) else { return nil }
    return ns / 1e9
}

func stopAndReap(_ pid: pid_t) {
    kill(pid, SIGKILL)
    var status: Int32 = 0
    waitpid(pid, &status, 0)
}

/// Runs a capturer: 2 s of warm-up, then `seconds` measured (its CPU and the
/// X server's, from /proc), then SIGINT (SIGKILL 5 s later if needed).
/// `cpuSeconds` is the measured window only.
func measureFor(_ seconds: Double, _ program: String, _ arguments: [String], server: pid_t) -> (Measured, serverCpu: Double) {
    let outPath = work + "/x11-stdout", errPath = work + "/x11-stderr"
    let pid = launch(program, arguments, stdout: outPath, stderr: errPath)
    guard pid > 0 else { return (Measured(status: -1), 0) }
    usleep(2_000_000)
    let start = (processCpuSeconds(pid), processCpuSeconds(server))
    usleep(useconds_t(seconds * 1_000_000))
    let end = (processCpuSeconds(pid), processCpuSeconds(server))
    kill(pid, SIGINT)
    var status: Int32 = 0
    var usage = rusage()
    let deadline = Date().addingTimeInterval(5)
    while wait4(pid, &status, WNOHANG, &usage) == 0 {
        if Date() > deadline { kill(pid, SIGKILL) }
        usleep(10_000)
    }
    var m = Measured(status: status, usage: usage, out: outPath, err: errPath)
    m.cpuSeconds = end.0 - start.0 // the measured window, not the whole life
    return (m, end.1 - start.1)
}

func runX11Bench(seconds: Double, rounds: Int) throws {
    let xvfb = which("Xvfb"), xsetroot = which("xsetroot"), cc = which("cc")
    let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("xactivity.c").path
    let activity = work + "/xactivity"
    let built = measure(cc, ["-O2", source, "-o", activity, "-lX11"])
    guard built.status == 0 else { print("krakl-bench: cannot build xactivity: \(built.stderr)"); exit(1) }
    let minutes = seconds / 60
    var rows: [X11Row] = []
    print("krakl-bench x11: static, typing, full at 1920x1080, 30 fps, \(Int(seconds)) s windows, \(rounds) rounds, on an Xvfb screen of its own")
    for scene in ["static", "typing", "full"] {
        let screen = BenchXvfb(xvfb, xsetroot: xsetroot)
        defer { screen.stop() }
        let display = screen.display, server = screen.pid
        let painter = launch(activity, [display, scene])
        defer { stopAndReap(painter) }
        usleep(500_000) // let the painter reach its steady rhythm before measuring

        let capturers: [(String, String, [String])] = [
            ("krakl x11 backend", agent, ["--plugins", work + "/plugins-x11.json", "--backend", "x11", "--option", "display=\(display)",
                                          "--no-record", "-q", "--seconds", "\(seconds + 3)", "--stats-json", work + "/x11-stats.json"]),
            ("gst ximagesrc use-damage=true", gst, ["-q", "-e", "ximagesrc", "display-name=\(display)", "use-damage=true", "!",
                                                   "video/x-raw,framerate=30/1", "!", "fakesink"]),
            ("ffmpeg -f x11grab", ffmpeg, ["-loglevel", "info", "-f", "x11grab", "-framerate", "30", "-video_size", "1920x1080",
                                          "-i", display, "-t", "\(seconds + 3)", "-f", "null", "-"]),
        ]
        var measured: [String: [X11Row]] = [:]
        for round in 0..<rounds {
            for k in 0..<capturers.count {
                let (name, program, arguments) = capturers[(k + round) % capturers.count]
                print("  \(scene) round \(round + 1)/\(rounds): \(name) …")
                let idleStart = processCpuSeconds(server)
                usleep(useconds_t(seconds / 2 * 1_000_000))
                let idle = (processCpuSeconds(server) - idleStart) / (seconds / 2) // server CPU/s for the scene alone
                let (m, serverCpu) = measureFor(seconds, program, arguments, server: server)
                var row = X11Row(scene: scene, capturer: name)
                row.capturerCpu = m.cpuSeconds / minutes
                row.serverCpu = max(0, serverCpu - idle * seconds) / minutes
                row.rssMB = m.peakRSSMB
                if name.hasPrefix("krakl") {
                    let json = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: work + "/x11-stats.json")))) as? [String: Any] ?? [:]
                    row.note = String(format: "%d frames delivered, damage %.1f%% of the frame", json["captured_frames"] as? Int ?? 0,
                                      (json["damage_share"] as? Double ?? 0) * 100)
                } else if name.hasPrefix("ffmpeg"), let line = m.stderr.split(separator: "\r").last(where: { $0.contains("frame=") }) {
                    row.note = String(line.split(separator: "fps=").first ?? "").trimmingCharacters(in: .whitespaces) + " grabbed"
                }
                measured[name, default: []].append(row)
            }
        }
        for (name, _, _) in capturers {
            let all = (measured[name] ?? []).sorted { $0.total < $1.total }
            guard var median = all.isEmpty ? nil : all[all.count / 2] else { continue }
            median.totals = all.map(\.total)
            rows.append(median)
        }
    }
    print("")
    print("| scene | capturer | capturer CPU s / min | X server extra CPU s / min | total CPU s / min | total, all rounds | peak RSS (MB) | note |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for r in rows {
        print(String(format: "| %@ | %@ | %.2f | %.2f | %.2f | %@ | %.1f | %@ |", r.scene, r.capturer, r.capturerCpu, r.serverCpu,
                     r.total, r.totals.map { String(format: "%.2f", $0) }.joined(separator: ", "), r.rssMB, r.note))
    }
    print("")
    for scene in ["static", "typing", "full"] {
        let pick = { (prefix: String) in rows.first { $0.scene == scene && $0.capturer.hasPrefix(prefix) } }
        guard let krakl = pick("krakl"), let ffmpeg = pick("ffmpeg"), let gst = pick("gst") else { continue }
        print(String(format: "%@: krakl total CPU (median) is %.1fx lower than ffmpeg x11grab and %.1fx lower than GStreamer ximagesrc",
                     scene, ffmpeg.total / krakl.total, gst.total / krakl.total))
    }
}

/// An Xvfb screen of the bench's own on a free display number, up once `xsetroot` can paint its
/// background (bounded at 10 s); `stop()` kills it and removes the socket and lock file a killed
/// server leaves behind.
struct BenchXvfb {
    let display: String
    let pid: pid_t

    init(_ xvfb: String, xsetroot: String, size: String = "1920x1080", background: String = "#1e1e1e") {
        display = ":\((150..<250).first { !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\($0)") } ?? 150)"
        pid = launch(xvfb, [display, "-screen", "0", "\(size)x24", "-nolisten", "tcp", "-noreset"])
        let ready = Date().addingTimeInterval(10)
        while measure(xsetroot, ["-display", display, "-solid", background]).status != 0 && Date() < ready { usleep(20_000) }
    }

    func stop() {
        stopAndReap(pid)
        try? FileManager.default.removeItem(atPath: "/tmp/.X11-unix/X\(display.dropFirst())")
        try? FileManager.default.removeItem(atPath: "/tmp/.X\(display.dropFirst())-lock")
    }
}
