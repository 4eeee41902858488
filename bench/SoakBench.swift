// krakl-bench soak: does the agent stay the same size over a long run?
//
//   swift build -c release && .build/release/krakl-bench soak [--minutes 60] [--isolate]
//
// One `krakl-agent` records the file backend's typing scene (1920x1080,
// 30 fps, the encoder at its defaults) for the given time. Every minute the
// bench reads the agent's VmRSS, open file descriptors and threads from
// /proc (and the isolated backend's process too, with --isolate) and prints
// a row; at the end it compares the first and the last ten minutes (or
// halves, for shorter runs). Per-frame state that grows with the run's
// length shows here as a steady climb: ~10 MB an hour before the statistics
// became fixed-size.
import Foundation

func runSoakBench(minutes: Int, isolate: Bool) throws {
    let recording = work + "/soak.webm"
    var arguments = ["--plugins", work + "/plugins.json", "--option", "scene=typing", "--option", "width=1920", "--option", "height=1080",
                     "--option", "fps=30", "--record", recording, "--seconds", String(minutes * 60 + 5), "--quiet"]
    if isolate { arguments.append("--isolate") }
    guard let child = BenchChild(agent, arguments, out: work + "/soak.out", err: work + "/soak.err") else { throw BenchError("cannot start \(agent)") }
    print("krakl-bench soak: krakl-agent \(arguments.joined(separator: " "))")
    print("| minute | agent RSS MB | agent fds | agent threads | backend process RSS MB | agent CPU s (total) | recording MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    var rows: [(rss: Double, fds: Int, threads: Int)] = []
    let start = Date()
    for minute in 0...minutes {
        // Sample on the minute; the loop is bounded by `minutes` and each wait by the agent's exit.
        let due = start.addingTimeInterval(Double(minute) * 60 + 2)
        while Date() < due && child.isRunning { usleep(200_000) }
        guard child.isRunning else {
            print("the agent ended early: \(child.stderr.suffix(400))")
            break
        }
        let status = (try? String(contentsOfFile: "/proc/\(child.pid)/status", encoding: .utf8)) ?? ""
        func field(_ name: String, _ text: String) -> Int {
            guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }) else { return 0 }
            return Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? 0
        }
        let rss = Double(field("VmRSS", status)) / 1024
        let threads = field("Threads", status)
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(child.pid)/fd").count) ?? 0
        let stat = (try? String(contentsOfFile: "/proc/\(child.pid)/stat", encoding: .utf8)) ?? ""
        let afterName = stat.split(separator: ")").last.map { $0.split(separator: " ") } ?? []
        let ticks = afterName.count > 13 ? (Double(afterName[11]) ?? 0) + (Double(afterName[12]) ?? 0) : 0
        var backendRSS = "-"
        if isolate, let children = try? String(contentsOfFile: "/proc/\(child.pid)/task/\(child.pid)/children", encoding: .utf8),
           let first = children.split(separator: " ").first {
            let childStatus = (try? String(contentsOfFile: "/proc/\(first)/status", encoding: .utf8)) ?? ""
            backendRSS = String(format: "%.1f", Double(field("VmRSS", childStatus)) / 1024)
        }
        let size = Double((try? FileManager.default.attributesOfItem(atPath: recording)[.size] as? Int) ?? 0) / 1e6
        print(String(format: "| %d | %.1f | %d | %d | %@ | %.1f | %.1f |", minute, rss, fds, threads, backendRSS, ticks / 100, size))
        rows.append((rss, fds, threads))
    }
    kill(child.pid, SIGTERM)
    child.stop(grace: 20)
    guard rows.count >= 4 else { throw BenchError("too few samples to compare") }
    let span = min(10, rows.count / 2)
    let early = rows.dropFirst().prefix(span), late = rows.suffix(span)
    print(String(format: "RSS: max %.1f MB over minutes 1-%d, max %.1f MB over the last %d; fds: %d -> %d; threads: %d -> %d",
                 early.map(\.rss).max()!, span, late.map(\.rss).max()!, span,
                 early.map(\.fds).max()!, late.map(\.fds).max()!, early.map(\.threads).max()!, late.map(\.threads).max()!))
}
