// krakl-bench isolate: what isolated mode costs (the backend in krakl-backend-host, frames
// through the shared ring) against the same backend loaded into the agent, at 1920x1080, 30 fps:
// the file backend (typing and video scenes) and the X11 backend on Xvfb (typing and full-screen
// change, bench/xactivity.c), each capture only (--no-record) and recording VP8.
//
// Reported per row, median of `rounds` rounds (in-process and isolated alternate, order rotating):
// CPU seconds per minute of the agent and its child together (every thread's schedstat, over
// `seconds` after a 2 s warm-up) and the capture→host latency p50/p99 (capture timestamp to the
// agent's sink, from --stats-json: in isolated mode this includes the copy into the ring and the
// hop over the socket).
import Foundation

struct IsolateRow {
    var backend = "", scene = "", pipeline = "", mode = ""
    var cpu = 0.0, p50 = 0.0, p99 = 0.0, frames = 0
}

/// CPU seconds of `pid` and of its children (krakl-backend-host), from /proc.
func treeCpuSeconds(_ pid: pid_t) -> Double {
    var total = processCpuSeconds(pid)
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let child = pid_t(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { continue }
        // Fields after the command's closing parenthesis: state, ppid, …
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        if fields.count > 1, pid_t(fields[1]) == pid { total += processCpuSeconds(child) }
    }
    return total
}

/// One agent run: 2 s warm-up, `seconds` measured, then SIGINT; CPU of the window, latency of the run.
func isolateRun(_ arguments: [String], seconds: Double) -> (cpu: Double, p50: Double, p99: Double, frames: Int) {
    let stats = work + "/isolate-stats.json"
    try? FileManager.default.removeItem(atPath: stats)
    let pid = launch(agent, arguments + ["--stats-json", stats, "-q"], stdout: work + "/isolate-stdout", stderr: work + "/isolate-stderr")
    guard pid > 0 else { return (.nan, .nan, .nan, 0) }
    usleep(2_000_000)
    let start = treeCpuSeconds(pid)
    usleep(useconds_t(seconds * 1_000_000))
    let end = treeCpuSeconds(pid)
    kill(pid, SIGINT)
    var status: Int32 = 0
    let deadline = Date().addingTimeInterval(10)
    while waitpid(pid, &status, WNOHANG) == 0 {
        if Date() > deadline { kill(pid, SIGKILL) }
        usleep(10_000)
    }
    let json = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: stats)))) as? [String: Any] ?? [:]
    return ((end - start) / (seconds / 60), json["delivery_latency_ms_p50"] as? Double ?? .nan,
            json["delivery_latency_ms_p99"] as? Double ?? .nan, json["captured_frames"] as? Int ?? 0)
}

func runIsolateBench(seconds: Double, rounds: Int) throws {
    let xvfb = which("Xvfb"), xsetroot = which("xsetroot"), cc = which("cc")
    let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("xactivity.c").path
    let activity = work + "/xactivity"
    guard measure(cc, ["-O2", source, "-o", activity, "-lX11"]).status == 0 else { print("krakl-bench: cannot build xactivity"); exit(1) }
    print("krakl-bench isolate: in-process vs isolated, 1920x1080 at 30 fps, \(Int(seconds)) s windows, \(rounds) rounds")
    var rows: [IsolateRow] = []
    func measureCase(backend: String, scene: String, base: [String]) {
        for pipeline in ["capture only", "VP8 recording"] {
            let output = pipeline == "capture only" ? ["--no-record"] : ["--record", work + "/isolate.webm"]
            var runs: [String: [IsolateRow]] = [:]
            for round in 0..<rounds {
                let modes = round % 2 == 0 ? ["in-process", "isolated"] : ["isolated", "in-process"]
                for mode in modes {
                    print("  \(backend) \(scene), \(pipeline), round \(round + 1)/\(rounds): \(mode) …")
                    let flag = mode == "isolated" ? "--isolate" : "--no-isolate"
                    let r = isolateRun(base + output + [flag, "--seconds", "\(seconds + 4)"], seconds: seconds)
                    runs[mode, default: []].append(IsolateRow(backend: backend, scene: scene, pipeline: pipeline, mode: mode,
                                                              cpu: r.cpu, p50: r.p50, p99: r.p99, frames: r.frames))
                }
            }
            for mode in ["in-process", "isolated"] {
                let all = (runs[mode] ?? []).sorted { $0.cpu < $1.cpu }
                guard !all.isEmpty else { continue }
                var row = all[all.count / 2]
                let p50s = all.map(\.p50).sorted(), p99s = all.map(\.p99).sorted()
                row.p50 = p50s[p50s.count / 2]
                row.p99 = p99s[p99s.count / 2]
                rows.append(row)
            }
        }
    }

    measureCase(backend: "file", scene: "typing", base: ["--plugins", work + "/plugins.json", "--backend", "file", "-o", "scene=typing",
                                                          "-o", "width=1920", "-o", "height=1080", "-o", "fps=30"])
    measureCase(backend: "file", scene: "video", base: ["--plugins", work + "/plugins.json", "--backend", "file", "-o", "scene=video",
                                                         "-o", "width=1920", "-o", "height=1080", "-o", "fps=30"])
    let screen = BenchXvfb(xvfb, xsetroot: xsetroot)
    defer { screen.stop() }
    let display = screen.display
    for scene in ["typing", "full"] {
        let painter = launch(activity, [display, scene])
        usleep(500_000)
        measureCase(backend: "x11", scene: scene, base: ["--plugins", work + "/plugins-x11.json", "--backend", "x11",
                                                         "-o", "display=\(display)", "-o", "fps=30"])
        stopAndReap(painter)
    }

    print("")
    print("| backend | scene | pipeline | mode | CPU s / min (agent + child) | capture→host p50 ms | p99 ms | frames |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for r in rows {
        print(String(format: "| %@ | %@ | %@ | %@ | %.2f | %.3f | %.3f | %d |", r.backend, r.scene, r.pipeline, r.mode, r.cpu, r.p50, r.p99, r.frames))
    }
    print("")
    for pair in stride(from: 0, to: rows.count - 1, by: 2) {
        let a = rows[pair], b = rows[pair + 1]
        print(String(format: "%@ %@, %@: isolation adds %+.2f CPU s/min (%+.1f%% of a core), p50 %+.3f ms, p99 %+.3f ms",
                     a.backend, a.scene, a.pipeline, b.cpu - a.cpu, (b.cpu - a.cpu) / 60 * 100, b.p50 - a.p50, b.p99 - a.p99))
    }
}
