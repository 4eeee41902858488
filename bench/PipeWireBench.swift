// krakl-bench pipewire: the PipeWire backend vs GStreamer's pipewiresrc, each
// reading a ScreenCast portal stream of the headless stack
// (scripts/pipewire-stack: sway headless at 1920x1080, xdg-desktop-portal-wlr
// at most 30 fps) into nothing, for a static screen, a terminal rewriting the
// time on one line, and a terminal printing lines (it scrolls).
//
//   krakl: krakl-agent --backend pipewire --no-record
//   gst:   bench/portal_gst.py opens its own portal session (CreateSession,
//          SelectSources, Start, OpenPipeWireRemote) and execs
//          gst-launch-1.0 pipewiresrc fd=FD path=NODE ! video/x-raw ! fakesink
//
// Both run as the stack's unprivileged user, one after the other (each its
// own portal session, like a person starting one of them). Reported, in
// steady state (3 s of warm-up left out): the capturer's CPU seconds per
// minute (its threads' schedstat), the stack's extra CPU (sway,
// xdg-desktop-portal-wlr and pipewire: they copy the screen into the
// stream's buffers) over a no-capturer baseline measured right before, the
// frames the capturer got in the window, and its peak RSS (VmHWM: the
// helper's Python is gone from it after the exec). Rounds interleave the
// capturers with rotating order, as X11Bench does; each row is the median
// round. fakesink counts nothing, so gst's frames come from one extra run
// per scene with `-v fakesink silent=false` (one line a buffer, which
// doubles gst's own CPU: that run is not measured).
import Foundation

struct PipeWireRow {
    var scene = "", capturer = ""
    var capturerCpu = 0.0, stackCpu = 0.0, rssMB = 0.0
    var frames = -1, windowSeconds = 0.0
    var note = ""
    var totals: [Double] = []
    var total: Double { capturerCpu + stackCpu }
}

/// A stack started with scripts/pipewire-stack; everything in it runs as its user.
final class BenchStack {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    static let script = repoRoot + "/scripts/pipewire-stack"
    let folder: String
    let environment: [String: String]
    let uid: String, gid: String

    /// `flags`: scripts/pipewire-stack start's (`--no-portal`: PipeWire and WirePlumber only).
    init(flags: [String] = []) throws {
        let started = measure("/bin/bash", [Self.script, "start"] + flags)
        guard started.status == 0 else {
            throw BenchError("scripts/pipewire-stack start failed: \(started.stderr.suffix(2000))")
        }
        let envFile = started.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        folder = (envFile as NSString).deletingLastPathComponent
        var environment: [String: String] = [:]
        for line in try String(contentsOfFile: envFile, encoding: .utf8).split(separator: "\n") where line.hasPrefix("export ") {
            let pair = line.dropFirst("export ".count)
            guard let eq = pair.firstIndex(of: "=") else { continue }
            environment[String(pair[..<eq])] = String(pair[pair.index(after: eq)...]).replacingOccurrences(of: "'", with: "")
        }
        environment["PATH"] = "/usr/local/bin:/usr/bin:/bin"
        environment["LANG"] = "C.UTF-8"
        self.environment = environment
        uid = environment["KRAKL_STACK_UID"] ?? "65534"
        gid = environment["KRAKL_STACK_GID"] ?? "65534"
    }

    func stop() { _ = measure("/bin/bash", [Self.script, "stop", folder]) }

    /// setpriv + env -i: the pid posix_spawn returns ends up as `arguments[0]` itself (exec, no fork).
    func asUser(_ arguments: [String]) -> [String] {
        ["--reuid=\(uid)", "--regid=\(gid)", "--clear-groups", "/usr/bin/env", "-i"]
            + environment.keys.sorted().map { "\($0)=\(environment[$0]!)" } + arguments
    }

    func spawn(_ arguments: [String], stdout: String = "/dev/null", stderr: String = "/dev/null") -> pid_t {
        launch("/usr/bin/setpriv", asUser(arguments), stdout: stdout, stderr: stderr)
    }

    @discardableResult
    func run(_ arguments: [String]) -> Measured { measure("/usr/bin/setpriv", asUser(arguments)) }

    /// The compositor side of a screen cast: sway, xdg-desktop-portal-wlr and pipewire of this stack.
    func compositorPids() -> [pid_t] {
        let marker = "KRAKL_STACK_DIR=\(folder)"
        let names: Set<String> = ["sway", "xdg-desktop-portal-wlr", "pipewire"]
        return ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }.filter { pid in
            guard let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"),
                  let environ = FileManager.default.contents(atPath: "/proc/\(pid)/environ") else { return false }
            let program = String(decoding: cmdline.prefix { $0 != 0 }, as: UTF8.self)
            return names.contains((program as NSString).lastPathComponent)
                && String(decoding: environ, as: UTF8.self).split(separator: "\0").contains { $0 == marker }
        }
    }

    /// Polls (bounded) until sway's tree shows a window with this app_id.
    func waitForWindow(appId: String, timeout: Double = 15) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if run(["swaymsg", "-t", "get_tree"]).stdout.contains("\"app_id\": \"\(appId)\"") { return true }
            usleep(100_000)
        }
        return false
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func stackCpuSeconds(_ pids: [pid_t]) -> Double { pids.reduce(0) { $0 + processCpuSeconds($1) } }

/// Peak resident set (VmHWM) of a running process, MB.
func peakRSSMB(_ pid: pid_t) -> Double {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
          let kb = line.split(separator: " ").dropFirst().first.flatMap({ Double($0) }) else { return .nan }
    return kb / 1024
}

/// Frames so far, from a capturer's stdout: the agent's status line
/// ("   58 frames | …", once a second) or gst -v's one line a buffer.
func framesSoFar(_ path: String, gstLines: Bool) -> Int {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return 0 }
    if gstLines { return text.components(separatedBy: "last-message = chain").count - 1 }
    for line in text.split(separator: "\n").reversed() {
        let words = line.split(separator: " ")
        if words.count > 1, words[1] == "frames", let n = Int(words[0]) { return n }
    }
    return 0
}

struct CapturerRun {
    var status: Int32 = 0
    var cpu = 0.0, stackCpu = 0.0, rssMB = Double.nan
    var frames = 0
    var stdout = "", stderr = ""
}

/// Runs a capturer as the stack's user: `warmUp` seconds (with `poke` half-way:
/// a static screen needs one change for a new session's first frame), then
/// `seconds` measured (its CPU, the compositor side's CPU, its frames), then
/// SIGINT (SIGKILL 5 s later if needed).
func measureCapturer(_ stack: BenchStack, _ arguments: [String], seconds: Double, warmUp: Double, gstLines: Bool,
                     poke: (() -> Void)?) -> CapturerRun {
    let outPath = work + "/pw-stdout", errPath = work + "/pw-stderr"
    let pid = stack.spawn(arguments, stdout: outPath, stderr: errPath)
    var run = CapturerRun()
    guard pid > 0 else { run.status = -1; return run }
    usleep(useconds_t(warmUp / 2 * 1_000_000))
    poke?()
    usleep(useconds_t(warmUp / 2 * 1_000_000))
    let compositor = stack.compositorPids()
    let start = (processCpuSeconds(pid), stackCpuSeconds(compositor), framesSoFar(outPath, gstLines: gstLines))
    usleep(useconds_t(seconds * 1_000_000))
    let end = (processCpuSeconds(pid), stackCpuSeconds(compositor), framesSoFar(outPath, gstLines: gstLines))
    run.rssMB = peakRSSMB(pid)
    kill(pid, SIGINT)
    var status: Int32 = 0
    let deadline = Date().addingTimeInterval(5)
    while waitpid(pid, &status, WNOHANG) == 0 {
        if Date() > deadline { kill(pid, SIGKILL) }
        usleep(10_000)
    }
    run.status = status
    run.cpu = end.0 - start.0
    run.stackCpu = end.1 - start.1
    run.frames = end.2 - start.2
    run.stdout = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
    run.stderr = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
    return run
}

func runPipeWireBench(seconds: Double, rounds: Int, scenes requested: [String]) throws {
    guard getuid() == 0 else {
        print("krakl-bench pipewire: run it as root: scripts/pipewire-stack starts the stack as uid 65534 (sway refuses root)")
        exit(1)
    }
    let python = "/opt/krakl-venv/bin/python3"
    guard FileManager.default.isExecutableFile(atPath: python) else { print("krakl-bench pipewire: \(python) (with dbus-next) is missing"); exit(1) }
    let helper = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("portal_gst.py").path
    // The stack's user writes the agent's stats here.
    let userWork = work + "/pw"
    try FileManager.default.createDirectory(atPath: userWork, withIntermediateDirectories: true)
    chmod(work, 0o755)
    chmod(userWork, 0o777)
    let registry = work + "/plugins-pipewire.json"
    try "{\"version\": 1, \"default\": \"pipewire\", \"backends\": {\"pipewire\": {\"library\": \"\(buildDir)/libBackendPipeWire.so\"}}}"
        .write(toFile: registry, atomically: true, encoding: .utf8)
    chmod(registry, 0o644)

    let allScenes: [(String, [String]?)] = [
        ("static", nil),
        // As the tests' clock terminal: one line rewritten 20 times a second.
        ("terminal", ["foot", "sh", "-c", "while :; do printf '\\r%s' \"$(date +%T.%N)\"; sleep 0.05; done"]),
        // A line printed 20 times a second: the terminal scrolls, most of the screen changes.
        ("scrolling", ["foot", "sh", "-c", "i=0; while :; do i=$((i+1)); echo \"line $i $(date +%T.%N) the quick brown fox jumps over the lazy dog\"; sleep 0.05; done"]),
    ]
    let scenes = allScenes.filter { requested.contains($0.0) }
    let warmUp = 3.0
    let minutes = seconds / 60
    let gstPipeline = ["pipewiresrc", "fd={fd}", "path={node}", "!", "video/x-raw", "!"]
    print("krakl-bench pipewire: \(scenes.map(\.0).joined(separator: ", ")) on the headless portal stack (sway 1920x1080, portal-wlr max 30 fps), \(Int(seconds)) s windows after \(Int(warmUp)) s warm-up, \(rounds) rounds")
    var rows: [PipeWireRow] = []
    for (scene, terminal) in scenes {
        let stack = try BenchStack()
        defer { stack.stop() }
        let check = stack.run(["/bin/sh", "-c", "test -r '\(buildDir)/libBackendPipeWire.so' && test -x '\(agent)' && test -r '\(helper)'"])
        guard check.status == 0 else {
            throw BenchError("uid \(stack.uid) cannot read \(buildDir) or \(helper): the build folder must be world-readable")
        }
        guard stack.run(["swaymsg", "output", "HEADLESS-1", "mode", "1920x1080"]).status == 0 else { throw BenchError("swaymsg mode failed") }
        if let terminal {
            _ = stack.spawn(terminal)
            guard stack.waitForWindow(appId: "foot") else { throw BenchError("the foot window never appeared") }
        }
        var colour = 0
        let poke: (() -> Void)? = terminal != nil ? nil : {
            // A new session on a static screen gets no first frame until something changes (docs/pipewire.md, trap 3).
            colour += 1
            stack.run(["swaymsg", "output", "HEADLESS-1", "bg", colour % 2 == 0 ? "#204060" : "#206040", "solid_color"])
        }
        let capturers: [(String, [String], Bool)] = [
            ("krakl pipewire backend", [agent, "--plugins", registry, "--backend", "pipewire", "--no-record",
                                        "--seconds", "\(Int(warmUp + seconds + 10))", "--stats-json", userWork + "/stats.json"], false),
            ("gst pipewiresrc ! fakesink", [python, helper, "--", "gst-launch-1.0", "-q"] + gstPipeline + ["fakesink"], false),
        ]
        var measured: [String: [PipeWireRow]] = [:]
        for round in 0..<rounds {
            for k in 0..<capturers.count {
                let (name, arguments, _) = capturers[(k + round) % capturers.count]
                print("  \(scene) round \(round + 1)/\(rounds): \(name) …")
                usleep(1_000_000) // the previous capturer's session winds down
                let compositor = stack.compositorPids()
                let idleStart = stackCpuSeconds(compositor)
                usleep(useconds_t(seconds / 2 * 1_000_000))
                let idle = (stackCpuSeconds(compositor) - idleStart) / (seconds / 2) // the scene alone, per second
                let run = measureCapturer(stack, arguments, seconds: seconds, warmUp: warmUp, gstLines: false, poke: poke)
                var row = PipeWireRow(scene: scene, capturer: name)
                row.capturerCpu = run.cpu / minutes
                row.stackCpu = max(0, run.stackCpu - idle * seconds) / minutes
                row.rssMB = run.rssMB
                row.frames = run.frames
                row.windowSeconds = seconds
                if name.hasPrefix("krakl") {
                    let json = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: userWork + "/stats.json")))) as? [String: Any] ?? [:]
                    row.note = String(format: "damage %.1f%% of the frame", (json["damage_share"] as? Double ?? 0) * 100)
                    if json.isEmpty { row.note = "no stats: \(run.stderr.suffix(300))" }
                } else if !run.stderr.contains("exec gst-launch") {
                    row.note = "helper failed: \(run.stderr.suffix(300))"
                }
                try? FileManager.default.removeItem(atPath: userWork + "/stats.json")
                measured[name, default: []].append(row)
            }
        }
        // gst's frames: one unmeasured run that prints a line a buffer.
        print("  \(scene): counting gst's frames (gst-launch -v, fakesink silent=false) …")
        usleep(1_000_000)
        let counted = measureCapturer(stack, [python, helper, "--", "gst-launch-1.0", "-v"] + gstPipeline + ["fakesink", "silent=false"],
                                      seconds: seconds, warmUp: warmUp, gstLines: true, poke: poke)
        for (name, _, _) in capturers {
            let all = (measured[name] ?? []).sorted { $0.total < $1.total }
            guard var median = all.isEmpty ? nil : all[all.count / 2] else { continue }
            median.totals = all.map(\.total)
            if name.hasPrefix("gst") {
                median.frames = counted.frames
                median.note = (median.note.isEmpty ? "" : median.note + "; ") + "frames from the -v run"
            }
            rows.append(median)
        }
    }
    print("")
    print("| scene | capturer | capturer CPU s / min | compositor side extra CPU s / min | total CPU s / min | total, all rounds | frames in \(Int(seconds)) s | peak RSS (MB) | note |")
    print("|---|---|---:|---:|---:|---|---:|---:|---|")
    for r in rows {
        print(String(format: "| %@ | %@ | %.2f | %.2f | %.2f | %@ | %d | %.1f | %@ |", r.scene, r.capturer, r.capturerCpu, r.stackCpu, r.total,
                     r.totals.map { String(format: "%.2f", $0) }.joined(separator: ", "), r.frames, r.rssMB, r.note))
    }
    print("")
    for (scene, _) in scenes {
        let pick = { (prefix: String) in rows.first { $0.scene == scene && $0.capturer.hasPrefix(prefix) } }
        guard let krakl = pick("krakl"), let gst = pick("gst") else { continue }
        print(String(format: "%@: capturer CPU krakl %.2f vs gst %.2f s/min; with the compositor side %.2f vs %.2f; frames %d vs %d",
                     scene, krakl.capturerCpu, gst.capturerCpu, krakl.total, gst.total, krakl.frames, gst.frames))
    }
}
