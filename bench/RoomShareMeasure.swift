// What `krakl-bench roomshare` measures of a publisher that may be many
// processes (Chromium: browser, zygotes, GPU, network and storage services,
// renderers), and the received picture's quality (issue 27).
import Foundation

// MARK: a process and everything under it

/// `root` and every process below it (by the parent pid in /proc/PID/stat), at this moment.
func processTree(_ root: pid_t) -> [pid_t] {
    var children: [pid_t: [pid_t]] = [:]
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let pid = pid_t(entry),
              let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { continue }
        // After the command name (which may hold spaces and parentheses): state, then the parent pid.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        if fields.count > 1, let parent = pid_t(fields[1]) { children[parent, default: []].append(pid) }
    }
    var tree: [pid_t] = [], queue = [root]
    while let pid = queue.popLast(), tree.count < 10_000 {
        tree.append(pid)
        queue += children[pid] ?? []
    }
    return tree
}

/// CPU seconds so far of each process of the tree (schedstat of its live threads, as processCpuSeconds).
func processTreeCpu(_ root: pid_t) -> [pid_t: Double] {
    Dictionary(processTree(root).map { ($0, processCpuSeconds($0)) }, uniquingKeysWith: { a, _ in a })
}

/// The tree's CPU between two snapshots: what each process at the end used since the start (all of it
/// when it started in between). A process that ended in between is left out, and said so by the caller.
func treeCpuDelta(from start: [pid_t: Double], to end: [pid_t: Double]) -> Double {
    end.reduce(0) { $0 + $1.value - (start[$1.key] ?? 0) }
}

/// The same window counted in clock ticks (utime + stime of /proc/PID/stat, which keep the time of
/// threads that ended, at 10 ms resolution): a check on the schedstat sum for processes whose threads come and go.
func treeTickSeconds(_ root: pid_t) -> [pid_t: Double] {
    let hz = Double(sysconf(Int32(_SC_CLK_TCK)))
    var result: [pid_t: Double] = [:]
    for pid in processTree(root) {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { continue }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // fields[0] is the state (field 3 of proc(5)); utime and stime are fields 14 and 15.
        if fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) { result[pid] = (user + system) / hz }
    }
    return result
}

/// Summed Pss and Rss (MB) of the tree's processes, from /proc/PID/smaps_rollup. Pss shares each
/// shared page among the processes mapping it, so the sum counts Chromium's shared libraries and
/// shared memory once; for a single process Pss is close to Rss.
func treeMemoryMB(_ root: pid_t) -> (pss: Double, rss: Double, processes: Int) {
    var pss = 0.0, rss = 0.0, count = 0
    for pid in processTree(root) {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/smaps_rollup", encoding: .utf8) else { continue }
        count += 1
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, let kb = Double(fields[1]) else { continue }
            if fields[0] == "Pss:" { pss += kb / 1024 } else if fields[0] == "Rss:" { rss += kb / 1024 }
        }
    }
    return (pss, rss, count)
}

/// A process's kind in a Chromium tree (its --type, and a utility process's sub-type), "browser" for
/// the root, "other" for a process without one.
func processKind(_ pid: pid_t, root: pid_t) -> String {
    // The first 4 KB (all String(contentsOfFile:) reads of procfs) hold the --type argument. Chromium
    // rewrites its process title, so its arguments are separated by spaces there, not NULs.
    let arguments = ((try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8)) ?? "")
        .split(whereSeparator: { $0 == "\0" || $0 == " " }).map(String.init)
    var kind = arguments.first { $0.hasPrefix("--type=") }.map { String($0.dropFirst(7)) } ?? (pid == root ? "browser" : "other")
    if let sub = arguments.first(where: { $0.hasPrefix("--utility-sub-type=") }) { kind += " (" + sub.dropFirst(19).split(separator: ".").first! + ")" }
    return kind
}

/// "browser, zygote ×2, gpu-process, renderer ×3, …": what the tree holds, from each process's --type.
func treeKinds(_ root: pid_t) -> String {
    var kinds: [String: Int] = [:], order: [String] = []
    for pid in processTree(root) {
        let kind = processKind(pid, root: root)
        if kinds[kind] == nil { order.append(kind) }
        kinds[kind, default: 0] += 1
    }
    return order.map { kinds[$0]! > 1 ? "\($0) ×\(kinds[$0]!)" : $0 }.joined(separator: ", ")
}

/// CPU seconds so far of every live thread of the tree, keyed "pid/tid", with a label: the thread's
/// name (/proc/PID/task/TID/comm), after its process's kind when the tree has more than one process.
func treeThreadCpu(_ root: pid_t) -> [String: (label: String, seconds: Double)] {
    let pids = processTree(root)
    var result: [String: (label: String, seconds: Double)] = [:]
    for pid in pids {
        let kind = pids.count > 1 ? processKind(pid, root: root) + ": " : ""
        for tid in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? [] {
            guard let seconds = threadCpuSeconds(pid, tid) else { continue }
            let name = ((try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/comm", encoding: .utf8)) ?? "?")
                .trimmingCharacters(in: .whitespacesAndNewlines)
            result["\(pid)/\(tid)"] = (kind + name, seconds)
        }
    }
    return result
}

/// The busiest threads between two snapshots, summed by label, in CPU s/min: "krakl-encoder 8.10,
/// krakl-ctl 1.20, …" (at most `count`, those under 0.05 s/min left out).
func busiestThreads(from start: [String: (label: String, seconds: Double)], to end: [String: (label: String, seconds: Double)],
                   window: Double, count: Int = 10) -> String {
    var byLabel: [String: Double] = [:]
    for (key, thread) in end { byLabel[thread.label, default: 0] += thread.seconds - (start[key]?.seconds ?? 0) }
    return byLabel.map { ($0.key, $0.value / window * 60) }.filter { $0.1 >= 0.05 }.sorted { $0.1 > $1.1 }.prefix(count)
        .map { "\($0.0) \(String(format: "%.2f", $0.1))" }.joined(separator: ", ")
}

// MARK: the picture the subscriber received

struct ReceivedQuality {
    var psnr = Double.nan, worstPsnr = Double.nan, ssim = Double.nan
    var samples = 0, unreadable = 0
    /// Samples whose content was the next frame's (see receivedQuality).
    var nextFrame = 0
}

/// PSNR and SSIM of the luma planes the subscriber kept (room_watch.py --samples: the frame on show
/// every 0.5 s of the steady part) against the frames as drawn (xroom --reference, by the frame
/// number of each one's stamp), below the stamp rows (y ≥ 32: the stamp holds its draw time, which the
/// reference cannot know). ffmpeg's psnr and ssim filters, frame by frame (their stats files): PSNR
/// from the mean squared error over the samples (and of the worst sample), SSIM the mean over samples.
///
/// xroom draws a frame's content, then its stamp; a capturer that reads the stamp row and the content
/// as separate rectangles (krakl's X11 backend reads damage rectangle by rectangle) can catch frame
/// N+1's content under frame N's stamp: a whole, right picture with a stale label (seen: a scrolling
/// sample 16 px off everywhere, 13.7 dB against N, a match against N+1). So each sample is judged against
/// N and N+1 and the closer (lower squared error) is kept; `nextFrame` counts how often that was N+1.
/// (Typing's N and N+1 differ in 3 glyph cells, static's not at all: the choice cannot flatter.)
/// A sample whose stamp cannot be read cannot be matched: counted in `unreadable`, left out.
func receivedQuality(samplesFile: String, samples: [[Any]], scene: String, xroom: String, width: Int, height: Int) -> ReceivedQuality {
    var quality = ReceivedQuality()
    let matched = samples.compactMap { sample -> (index: Int, frame: Int)? in
        guard sample.count == 3, let index = sample[1] as? Int, let frame = sample[2] as? Int else { return nil }
        return (index, frame)
    }.enumerated().sorted { ($0.element.frame, $0.offset) < ($1.element.frame, $1.offset) }.map(\.element)
    quality.unreadable = samples.count - matched.count
    quality.samples = matched.count
    guard !matched.isEmpty, let input = FileHandle(forReadingAtPath: samplesFile) else { return quality }
    defer { try? input.close() }
    let planeBytes = width * height
    let decoded = samplesFile + ".sorted"
    defer { try? FileManager.default.removeItem(atPath: decoded) }
    guard FileManager.default.createFile(atPath: decoded, contents: nil), let output = FileHandle(forWritingAtPath: decoded) else { return quality }
    for sample in matched {
        try? input.seek(toOffset: UInt64(sample.index * planeBytes))
        guard let plane = try? input.read(upToCount: planeBytes), plane.count == planeBytes else { try? output.close(); return quality }
        output.write(plane)
    }
    try? output.close()
    // Per sample: (squared error, SSIM) against frame N (offset 0) and N+1 (offset 1).
    var judged: [[(mse: Double, ssim: Double)]] = []
    for offset in [0, 1] {
        guard let perFrame = compareLuma(decoded, frames: matched.map { $0.frame + offset }, scene: scene, xroom: xroom, width: width, height: height),
              perFrame.count == matched.count else { return quality }
        judged.append(perFrame)
    }
    let chosen = (0..<matched.count).map { judged[1][$0].mse < judged[0][$0].mse ? judged[1][$0] : judged[0][$0] }
    quality.nextFrame = (0..<matched.count).filter { judged[1][$0].mse < judged[0][$0].mse }.count
    func psnr(_ mse: Double) -> Double { mse <= 0 ? 99 : 10 * log10(255 * 255 / mse) }   // identical pictures: shown as 99 dB
    quality.psnr = psnr(chosen.map(\.mse).reduce(0, +) / Double(chosen.count))
    quality.worstPsnr = psnr(chosen.map(\.mse).max() ?? 0)
    quality.ssim = chosen.map(\.ssim).reduce(0, +) / Double(chosen.count)
    return quality
}

/// The luma planes in `decoded` against xroom's reference of `frames` (one each, never decreasing),
/// rows 32 and below: each plane's mean squared error and SSIM, from ffmpeg's psnr and ssim stats files.
private func compareLuma(_ decoded: String, frames: [Int], scene: String, xroom: String, width: Int, height: Int) -> [(mse: Double, ssim: Double)]? {
    let list = decoded + ".frames", reference = decoded + ".reference", psnrStats = decoded + ".psnr", ssimStats = decoded + ".ssim"
    defer { for path in [list, reference, psnrStats, ssimStats] { try? FileManager.default.removeItem(atPath: path) } }
    try? frames.map { "\($0)\n" }.joined().write(toFile: list, atomically: true, encoding: .utf8)
    guard measure(xroom, ["--reference", "\(width)x\(height)", scene, list, reference]).status == 0 else { return nil }
    let raw = ["-f", "rawvideo", "-pix_fmt", "gray", "-s", "\(width)x\(height)", "-i"]
    let crop = "crop=\(width):\(height - 32):0:32"
    let run = measure(ffmpeg, ["-v", "error", "-nostdin"] + raw + [decoded] + raw + [reference] + [
        "-lavfi", "[0:v]\(crop),split[a1][a2];[1:v]\(crop),split[b1][b2];[a1][b1]psnr=stats_file=\(psnrStats);[a2][b2]ssim=stats_file=\(ssimStats)",
        "-f", "null", "-"])
    guard run.status == 0 else { return nil }
    // One line a frame: "n:1 mse_avg:1.23 mse_y:1.23 psnr_avg:… psnr_y:…" and "n:1 Y:0.998 All:0.998 (27.1)".
    func column(_ path: String, _ key: String) -> [Double] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").compactMap { line in
            line.split(separator: " ").first { $0.hasPrefix(key) }.flatMap { Double($0.dropFirst(key.count)) }
        }
    }
    let mse = column(psnrStats, "mse_y:"), ssim = column(ssimStats, "Y:")
    guard mse.count == frames.count, ssim.count == frames.count else { return nil }
    return zip(mse, ssim).map { ($0, $1) }
}
