// krakl-bench: the encoder path side by side with ffmpeg and GStreamer on
// the same content, same size, same bitrate, in one run.
//
//   swift build -c release && .build/release/krakl-bench [--seconds 10] [--scenes static,typing,scrolling,video]
//
// For each scene of the file backend at 1920x1080, 30 fps:
//  1. krakl: `krakl-agent` captures and encodes live (damage-driven), as in use.
//  2. The same scene is captured once more and written out as the constant
//     30 fps BGRx stream a full-frame capturer hands an encoder (a frame every
//     interval, changed or not); ffmpeg (-c:v libvpx, realtime) and GStreamer
//     (vp8enc deadline=1) encode that file.
// Reported per run: CPU seconds per minute of content, per-frame encode
// latency p50/p99 (krakl: its own timing; ffmpeg: -benchmark_all; GStreamer
// has no per-frame timing), bitrate (ffprobe over the output's packets),
// PSNR/SSIM (ffmpeg's filters, decoded output against the encoder's input),
// and peak RSS (wait4's ru_maxrss of the process).
import Foundation
import KraklBackendABI
import KraklBase
import KraklHost
import Synchronization

StandardStream.lineBufferOutput()   // setvbuf(stdout, nil, _IOLBF, 0): KraklBase's one place that touches Glibc's stdout

// MARK: options

/// The command line, parsed once at start (`BenchOptions.parse`) and then only read, from any
/// thread: the top-level `options` below is an immutable global of a Sendable type.
struct BenchOptions: Sendable {
    var seconds = 10.0
    var scenes = ["static", "typing", "scrolling", "video"]
    var bitrateKbps = 2500
    var width = 1920, height = 1080
    var x11Mode = false
    var pipewireMode = false
    var rtcMode = false
    var turnMode = false
    var roomMode = false
    /// `room --service twilio`: the Twilio room emulator instead of Janus.
    var roomService = "janus"
    var roomShareMode = false
    var smapsPrefix: String?
    /// roomshare: which publishers, in the order of the first round (issue 27).
    var roomSharePublisherList = ["krakl", "gst", "chromium"]
    /// roomshare: keep the subscriber's sampled frames and report in this folder.
    var keepSamplesFolder: String?
    var viewerMode = false
    var viewerLoss = true
    var scanMode = false
    var scanCamera = false
    var isolateMode = false
    var soakMode = false
    var soakMinutes = 60
    var soakIsolate = false
    var roundsGiven = false
    var joins = 10
    var joinsGiven = false
    var scenesGiven = false
    var rounds = 3
    var onlyScenarios: [String] = []
    /// rtc: extra arguments for every krakl-rtc-probe (A/B runs of a publisher setting).
    var rtcProbeArguments: [String] = []

    /// The options `arguments` give; prints the usage and exits 2 on a word it does not know.
    static func parse(_ arguments: ArraySlice<String>) -> BenchOptions {
        var o = BenchOptions()
        var words = arguments
        while let word = words.popFirst() {
            switch word {
            case "x11": o.x11Mode = true
            case "pipewire": o.pipewireMode = true
            case "rtc": o.rtcMode = true
            case "turn": o.turnMode = true
            case "room": o.roomMode = true
            case "--service": o.roomService = words.popFirst() ?? o.roomService
            case "roomshare": o.roomShareMode = true
            case "--smaps": o.smapsPrefix = words.popFirst()
            case "--publishers": o.roomSharePublisherList = (words.popFirst() ?? "").split(separator: ",").map(String.init)
            case "--keep-samples": o.keepSamplesFolder = words.popFirst()
            case "viewer": o.viewerMode = true
            case "--no-loss": o.viewerLoss = false
            case "scan": o.scanMode = true
            case "--camera": o.scanCamera = true
            case "isolate": o.isolateMode = true
            case "soak": o.soakMode = true
            case "--minutes": o.soakMinutes = max(1, Int(words.popFirst() ?? "") ?? o.soakMinutes)
            case "--isolate": o.soakIsolate = true
            case "--joins": o.joins = max(1, Int(words.popFirst() ?? "") ?? o.joins); o.joinsGiven = true
            case "--rounds": o.rounds = max(1, Int(words.popFirst() ?? "") ?? o.rounds); o.roundsGiven = true
            case "--seconds": o.seconds = Double(words.popFirst() ?? "") ?? o.seconds
            case "--scenes": o.scenes = (words.popFirst() ?? "").split(separator: ",").map(String.init); o.scenesGiven = true
            case "--probe-arg": if let argument = words.popFirst() { o.rtcProbeArguments.append(argument) }
            case "--only": o.onlyScenarios = (words.popFirst() ?? "").split(separator: "|").map(String.init) // labels hold commas
            case "--bitrate": o.bitrateKbps = Int(words.popFirst() ?? "") ?? o.bitrateKbps
            case "--size":
                let parts = (words.popFirst() ?? "").split(separator: "x").compactMap { Int($0) }
                if parts.count == 2 { (o.width, o.height) = (parts[0], parts[1]) }
            default:
                print("usage: krakl-bench [x11|pipewire|rtc [--rounds N] [--only 'TEXT|TEXT'] [--probe-arg ARG]...|turn [--rounds N] [--seconds S (1080p media sessions; 0: connect only)] [--joins N (krakl-agent joins a WHIP room through the relay)]|room [--service janus|twilio] [--joins N]|roomshare [--rounds N] [--seconds S] [--scenes a,b] [--publishers krakl,gst,chromium] [--smaps PREFIX] [--keep-samples DIR]|viewer [--rounds N] [--seconds S] [--no-loss]|scan [--camera] [--rounds N]|soak [--minutes N] [--isolate]|isolate [--rounds N]] [--seconds S] [--scenes a,b] [--bitrate KBPS] [--size WxH]")
                exit(2)
            }
        }
        return o
    }
}
let options = BenchOptions.parse(CommandLine.arguments.dropFirst())
let fps = 30

let buildDir = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
    .deletingLastPathComponent().path
let agent = buildDir + "/krakl-agent"
let backendLibrary = buildDir + "/libBackendFile.so"
let work = NSTemporaryDirectory() + "krakl-bench-\(getpid())"
try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
// Every mode ends with exit(), which skips a top-level defer: clean up at exit.
atexit { try? FileManager.default.removeItem(atPath: work) }
let frameCount = Int(options.seconds * Double(fps))
try "{\"version\": 1, \"default\": \"x11\", \"backends\": {\"x11\": {\"library\": \"\(buildDir)/libBackendX11.so\"}}}"
    .write(toFile: work + "/plugins-x11.json", atomically: true, encoding: .utf8)
try "{\"version\": 1, \"default\": \"file\", \"backends\": {\"file\": {\"library\": \"\(backendLibrary)\"}}}"
    .write(toFile: work + "/plugins.json", atomically: true, encoding: .utf8)

func which(_ name: String) -> String {
    for dir in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":") where FileManager.default.isExecutableFile(atPath: "\(dir)/\(name)") {
        return "\(dir)/\(name)"
    }
    print("krakl-bench: \(name) is not installed (scripts/setup installs it)")
    exit(1)
}
let ffmpeg = which("ffmpeg"), ffprobe = which("ffprobe"), gst = which("gst-launch-1.0")

// MARK: processes

struct Measured {
    var status: Int32 = 0
    var cpuSeconds = 0.0
    var peakRSSMB = 0.0
    var stdout = ""
    var stderr = ""
}

/// posix_spawn with stdin from /dev/null and stdout/stderr to the given
/// files (or /dev/null); returns the pid, or -1.
func launch(_ program: String, _ arguments: [String], stdout: String = "/dev/null", stderr: String = "/dev/null") -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    let argv = ([program] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    return posix_spawn(&pid, program, &actions, nil, argv, environ) == 0 ? pid : -1
}

extension Measured {
    /// What wait4 reported for a finished child whose output went to `out` and `err`.
    init(status: Int32, usage: rusage, out: String, err: String) {
        self.status = status
        cpuSeconds = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
        peakRSSMB = Double(usage.ru_maxrss) / 1024
        stdout = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        stderr = (try? String(contentsOfFile: err, encoding: .utf8)) ?? ""
    }
}

/// Runs a program to completion; CPU and peak RSS come from wait4.
func measure(_ program: String, _ arguments: [String]) -> Measured {
    let outPath = work + "/stdout", errPath = work + "/stderr"
    let pid = launch(program, arguments, stdout: outPath, stderr: errPath)
    guard pid > 0 else { return Measured(status: -1) }
    var status: Int32 = 0
    var usage = rusage()
    wait4(pid, &status, 0, &usage)
    return Measured(status: status, usage: usage, out: outPath, err: errPath)
}

/// Bitrate (kbit/s) of a recording from its packets, as ffprobe reads them.
func bitrate(_ file: String) -> Double {
    let probe = measure(ffprobe, ["-v", "error", "-select_streams", "v:0", "-show_entries", "packet=size", "-of", "csv=p=0", file])
    let bytes = probe.stdout.split(separator: "\n").compactMap { Int($0) }.reduce(0, +)
    return Double(bytes) * 8 / options.seconds / 1000
}

/// PSNR and SSIM (Y, dB / ratio) of `recording` against raw `reference` frames, frame by frame.
func quality(_ recording: String, reference: String, pixelFormat: String) -> (psnr: Double, ssim: Double) {
    let filter = "[0:v]format=yuv420p,setpts=N/(30*TB)[a];[1:v]format=yuv420p,setpts=N/(30*TB)[b];[a]split[a1][a2];[b]split[b1][b2];[a1][b1]psnr;[a2][b2]ssim"
    let run = measure(ffmpeg, ["-v", "info", "-i", recording, "-f", "rawvideo", "-pix_fmt", pixelFormat, "-s", "\(options.width)x\(options.height)",
                               "-i", reference, "-lavfi", filter, "-f", "null", "-"])
    func number(after key: String, on marker: String) -> Double {
        guard let line = run.stderr.split(separator: "\n").last(where: { $0.contains(marker) }),
              let part = line.split(separator: " ").first(where: { $0.hasPrefix(key) }) else { return .nan }
        let text = part.dropFirst(key.count)
        return text == "inf" ? 99 : Double(text) ?? .nan
    }
    return (number(after: "average:", on: "PSNR y:"), number(after: "All:", on: "SSIM Y:"))
}

if options.x11Mode {
    try runX11Bench(seconds: options.seconds, rounds: options.rounds)
    exit(0)
}
if options.isolateMode {
    try runIsolateBench(seconds: options.seconds, rounds: options.roundsGiven ? options.rounds : 2)
    exit(0)
}
if options.soakMode {
    try runSoakBench(minutes: options.soakMinutes, isolate: options.soakIsolate)
    exit(0)
}
if options.scanMode {
    if options.scanCamera { try runCameraScanBench(rounds: options.roundsGiven ? options.rounds : 10) } else { try runScanBench(rounds: options.roundsGiven ? options.rounds : 10) }
    exit(0)
}
if options.roomShareMode {
    try runRoomShareBench(seconds: options.seconds == 10 ? 20 : options.seconds, rounds: options.rounds, scenes: options.scenesGiven ? options.scenes : ["static", "typing", "scrolling"],
                          publishers: options.roomSharePublisherList, smapsOut: options.smapsPrefix, keepSamples: options.keepSamplesFolder)
    exit(0)
}
if options.roomMode {
    if options.roomService == "twilio" { try runTwilioRoomBench(joins: options.joins) } else { try runRoomBench(joins: options.joins) }
    exit(0)
}
if options.viewerMode {
    try runViewerBench(seconds: options.seconds, rounds: options.roundsGiven ? options.rounds : 5, loss: options.viewerLoss)
    exit(0)
}
if options.turnMode {
    // --joins N: the agent's whole join through a relay (candidates trickled to the room), not the probe's connect.
    if options.joinsGiven { try runTurnJoinBench(joins: options.joins) } else { try runTurnBench(rounds: options.rounds, mediaSeconds: options.seconds) }
    exit(0)
}
if options.rtcMode {
    try runRtcBench(seconds: options.seconds, rounds: options.rounds, only: options.onlyScenarios, probeArguments: options.rtcProbeArguments)
    exit(0)
}
if options.pipewireMode {
    try runPipeWireBench(seconds: options.seconds, rounds: options.rounds, scenes: options.scenesGiven ? options.scenes : ["static", "terminal", "scrolling"])
    exit(0)
}

func percentile(_ values: [Double], _ p: Double) -> Double { values.sorted().nearestRank(p) ?? .nan }

// MARK: the constant-rate raw stream for ffmpeg and GStreamer

/// Keeps the newest frame and writes one frame per 1/30 s tick of capture
/// time: what a capturer without damage delivers. Frames come on the backend's
/// capture thread and finish() on the caller's, so the stream is behind a Mutex.
final class RawStreamWriter: FrameSink {
    private struct Stream {
        let file: UnsafeMutablePointer<FILE>
        let frameBytes: Int
        var latest: [UInt8]
        var written = 0
        var start: UInt64?

        mutating func writeLatest() {
            fwrite(latest, 1, frameBytes, file)
            written += 1
        }
    }
    private let stream: Mutex<Stream>
    let limit: Int
    let done = DispatchSemaphore(value: 0)

    init(path: String, limit: Int) {
        let frameBytes = options.width * options.height * 4
        stream = Mutex(Stream(file: fopen(path, "wb")!, frameBytes: frameBytes, latest: [UInt8](repeating: 0, count: frameBytes)))
        self.limit = limit
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let info = FrameInfo(pointer)
        let (width, height, limit) = (options.width, options.height, limit)
        let reachedLimit = stream.withLock { stream in
            let stamp = info.raw.timestamp_ns
            let first = stream.start ?? stamp
            stream.start = first
            let tick = Int((Double(stamp - first) / 1e9 * Double(fps)).rounded())
            while stream.written < min(tick, limit) { stream.writeLatest() }   // unchanged ticks repeat the picture
            let stride = info.strides[0]
            stream.latest.withUnsafeMutableBufferPointer { out in
                for row in 0..<height { memcpy(out.baseAddress! + row * width * 4, info.planes[0]! + row * stride, width * 4) }
            }
            if stream.written < limit { stream.writeLatest() }
            return stream.written >= limit
        }
        if reachedLimit { done.signal() }
    }

    func event(_ event: SourceEvent) {}

    func finish() {
        stream.withLock { stream in
            while stream.written < limit { stream.writeLatest() }
            fclose(stream.file)
        }
    }
}

func makeRawStream(scene: String, path: String) throws {
    let library = try BackendLibrary.load(path: backendLibrary, backend: "file")
    var backendOptions = JSONObject()
    backendOptions["scene"] = .string(scene)
    backendOptions["width"] = .number("\(options.width)")
    backendOptions["height"] = .number("\(options.height)")
    backendOptions["fps"] = .number("\(fps)")
    let writer = RawStreamWriter(path: path, limit: frameCount)
    let source = try BackendSource(library: library, backendName: "file", options: backendOptions, sink: writer, logger: { _, _, _ in })
    try source.start()
    _ = writer.done.wait(timeout: .now() + options.seconds + 2)
    try source.stop()
    try source.destroy()
    writer.finish()
}

// MARK: runs

struct Row {
    var scene = "", encoder = ""
    var cpuPerMinute = 0.0, latencyP50 = Double.nan, latencyP99 = Double.nan
    var kbps = 0.0, psnr = Double.nan, ssim = Double.nan, rssMB = 0.0
    var note = ""
}
var rows: [Row] = []

print("krakl-bench: \(options.scenes.joined(separator: ", ")) at \(options.width)x\(options.height), \(fps) fps, \(options.bitrateKbps) kbit/s, \(Int(options.seconds)) s of content each")
for scene in options.scenes {
    let sceneOptions = ["--option", "scene=\(scene)", "--option", "width=\(options.width)", "--option", "height=\(options.height)", "--option", "fps=\(fps)"]
    // krakl, measured run (no dumps, so nothing extra on its threads).
    let stats = work + "/stats.json", recording = work + "/krakl.webm"
    print("  \(scene): krakl-agent …")
    let run = measure(agent, ["--plugins", work + "/plugins.json", "-q"] + sceneOptions + ["--seconds", "\(options.seconds)", "--bitrate", "\(options.bitrateKbps)",
                              "--record", recording, "--stats-json", stats])
    _ = run
    let json = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: stats)))) as? [String: Any] ?? [:]
    var row = Row(scene: scene, encoder: "krakl (encoder path)")
    let contentMinutes = options.seconds / 60
    row.cpuPerMinute = (json["encoder_cpu_seconds"] as? Double ?? .nan) / contentMinutes
    row.latencyP50 = json["encode_ms_p50"] as? Double ?? .nan
    row.latencyP99 = json["encode_ms_p99"] as? Double ?? .nan
    row.kbps = bitrate(recording)
    row.rssMB = run.peakRSSMB
    row.note = String(format: "%d frames encoded; whole agent incl. synthetic capture: %.1f CPU s/min", json["encoded_frames"] as? Int ?? 0,
                      run.cpuSeconds / contentMinutes)
    // Quality run: same scene, dumping the encoder's input to compare against.
    let input = work + "/krakl-input.yuv", qualityRecording = work + "/krakl-q.webm"
    _ = measure(agent, ["--plugins", work + "/plugins.json", "-q"] + sceneOptions + ["--seconds", "\(options.seconds)", "--bitrate", "\(options.bitrateKbps)",
                        "--record", qualityRecording, "--dump-input", input])
    (row.psnr, row.ssim) = quality(qualityRecording, reference: input, pixelFormat: "yuv420p")
    try? FileManager.default.removeItem(atPath: input)
    rows.append(row)

    print("  \(scene): writing the constant-rate raw stream …")
    let raw = work + "/\(scene).bgrx"
    try makeRawStream(scene: scene, path: raw)
    let rawInput = ["-f", "rawvideo", "-pix_fmt", "bgr0", "-s", "\(options.width)x\(options.height)", "-r", "\(fps)", "-i", raw]

    print("  \(scene): ffmpeg …")
    let ffOut = work + "/ffmpeg.webm"
    let ff = measure(ffmpeg, ["-y", "-loglevel", "info", "-benchmark_all"] + rawInput + ["-c:v", "libvpx", "-deadline", "realtime", "-cpu-used", "6",
                     "-b:v", "\(options.bitrateKbps)k", "-minrate", "\(options.bitrateKbps)k", "-maxrate", "\(options.bitrateKbps)k", "-lag-in-frames", "0", ffOut])
    var ffRow = Row(scene: scene, encoder: "ffmpeg -c:v libvpx")
    ffRow.cpuPerMinute = ff.cpuSeconds / contentMinutes
    // -benchmark_all logs two encode_video lines a frame (send, receive): sum each pair.
    let encodeLines = ff.stderr.split(separator: "\n").filter { $0.contains("encode_video") }.compactMap { line -> Double? in
        let fields = line.split(separator: " ")
        guard let real = fields.firstIndex(of: "real"), real > 0 else { return nil }
        return Double(fields[real - 1]).map { $0 / 1000 }
    }
    let perFrame = stride(from: 0, to: encodeLines.count - 1, by: 2).map { encodeLines[$0] + encodeLines[$0 + 1] }
    ffRow.latencyP50 = percentile(perFrame, 0.5)
    ffRow.latencyP99 = percentile(perFrame, 0.99)
    ffRow.kbps = bitrate(ffOut)
    (ffRow.psnr, ffRow.ssim) = quality(ffOut, reference: raw, pixelFormat: "bgr0")
    ffRow.rssMB = ff.peakRSSMB
    ffRow.note = ff.status == 0 ? "reads the raw file, converts, encodes" : "exit \(ff.status)"
    rows.append(ffRow)

    print("  \(scene): gst-launch-1.0 …")
    let gstOut = work + "/gst.webm"
    let g = measure(gst, ["-q", "filesrc", "location=\(raw)", "!", "rawvideoparse", "width=\(options.width)", "height=\(options.height)", "format=bgrx",
                          "framerate=\(fps)/1", "!", "videoconvert", "!", "vp8enc", "deadline=1", "cpu-used=6", "end-usage=cbr",
                          "target-bitrate=\(options.bitrateKbps * 1000)", "lag-in-frames=0", "!", "webmmux", "!", "filesink", "location=\(gstOut)"])
    var gRow = Row(scene: scene, encoder: "gst vp8enc deadline=1")
    gRow.cpuPerMinute = g.cpuSeconds / contentMinutes
    gRow.kbps = bitrate(gstOut)
    (gRow.psnr, gRow.ssim) = quality(gstOut, reference: raw, pixelFormat: "bgr0")
    gRow.rssMB = g.peakRSSMB
    gRow.note = g.status == 0 ? "no per-frame timing" : "exit \(g.status): \(g.stderr.prefix(200))"
    rows.append(gRow)
    try? FileManager.default.removeItem(atPath: raw)
}

func cell(_ value: Double, _ format: String) -> String { value.isNaN ? "n/a" : String(format: format, value) }
print("")
print("| scene | encoder | CPU s / min of content | encode latency p50 / p99 (ms) | bitrate (kbit/s) | PSNR Y (dB) | SSIM | peak RSS (MB) | note |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for r in rows {
    print("| \(r.scene) | \(r.encoder) | \(cell(r.cpuPerMinute, "%.2f")) | \(cell(r.latencyP50, "%.1f")) / \(cell(r.latencyP99, "%.1f")) | \(cell(r.kbps, "%.0f")) | \(cell(r.psnr, "%.2f")) | \(cell(r.ssim, "%.4f")) | \(cell(r.rssMB, "%.1f")) | \(r.note) |")
}
print("")
for scene in options.scenes {
    guard let k = rows.first(where: { $0.scene == scene && $0.encoder.hasPrefix("krakl") }),
          let f = rows.first(where: { $0.scene == scene && $0.encoder.hasPrefix("ffmpeg") }),
          let g = rows.first(where: { $0.scene == scene && $0.encoder.hasPrefix("gst") }) else { continue }
    print(String(format: "%@: krakl uses %.1fx less CPU than ffmpeg and %.1fx less than GStreamer", scene, f.cpuPerMinute / k.cpuPerMinute, g.cpuPerMinute / k.cpuPerMinute))
}
