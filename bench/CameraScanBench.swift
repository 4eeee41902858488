// krakl-bench scan --camera: how fast `krakl-agent --scan --camera` reads a join code a camera
// sees, what watching a camera costs, and which camera pictures it reads next to plain zbar.
//
//   swift build -c release && .build/release/krakl-bench scan --camera [--rounds 10]
//
// The camera is the tests' camera (Tests/Fixtures/camera_node.c: a PipeWire node with a webcam's
// properties that drives the graph, YUY2 1280x720 at 30 fps) playing raw frames made by
// Tests/Fixtures/camera_clip.sh (the tests' clips: a grey view with sensor-like noise, the code drawn in ways a phone held up to a
// webcam looks), in a PipeWire + WirePlumber stack of scripts/pipewire-stack --no-portal.
//  - latency: a fresh agent scans the camera showing no code; half a second after its first
//    line the camera's view turns to the code (the camera reads its frames through a symbolic
//    link that is swapped, at most 33 ms before the next frame shows it); time from the swap to the agent's exit with the code (an upper bound
//    on "decoded": it includes printing the summary and exiting);
//  - CPU of the agent over 10 s watching the camera with no code (the noisy view unchanged),
//    and while a patch moves across the view every picture (every picture a look);
//  - per kind of picture: whether the agent reads it and how soon after the camera's first
//    picture, against zbarimg (zbar's defaults, Debian zbar-tools) on the clip's first 10 frames.
import Foundation
import KraklBase
import KraklHost

func runCameraScanBench(rounds: Int) throws {
    let zbarimg = which("zbarimg"), qrencode = which("qrencode")
    let repo = BenchStack.repoRoot
    let clipScript = repo + "/Tests/Fixtures/camera_clip.sh"
    let made = measure("/usr/bin/python3", [repo + "/Tests/Fixtures/make_join_code.py", "--kind", "janus", "--url", "http://127.0.0.1:8088/janus",
                                            "--room", "4242", "--identity", "Bench", "--secret", "bench"])
    let code = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    guard code.hasPrefix("krakl:") else { throw BenchError("make_join_code.py: \(made.stderr)") }
    chmod(work, 0o755)
    let png = work + "/code.png"
    _ = measure(qrencode, ["-l", "M", "-s", "4", "-m", "4", "-o", png, code])
    // A patch of noise: moves like a code, is never one.
    let patch = work + "/patch.png"
    _ = measure(ffmpeg, ["-v", "error", "-y", "-f", "lavfi", "-i", "nullsrc=s=400x400,geq=random(1)*255:128:128", "-frames:v", "1", patch])
    chmod(png, 0o644)
    chmod(patch, 0o644)
    func clip(_ kind: String, _ picture: String = png) throws -> String {
        let out = work + "/clip-\(kind)" + (picture == png ? "" : "-patch")
        let result = measure("/bin/bash", [clipScript, kind, picture, out])
        guard result.status == 0 else { throw BenchError("camera_clip.sh \(kind): \(result.stderr)") }
        return out
    }
    try "{\"version\": 1, \"backends\": {\"pipewire\": {\"library\": \"\(buildDir)/libBackendPipeWire.so\"}, \"file\": {\"library\": \"\(buildDir)/libBackendFile.so\"}}}"
        .write(toFile: work + "/plugins-camera.json", atomically: true, encoding: .utf8)
    chmod(work + "/plugins-camera.json", 0o644)
    let stack = try BenchStack(flags: ["--no-portal"])
    defer { stack.stop() }

    // The camera reads work/view/fNN.yuv; `view` is a symbolic link to one clip's folder.
    let view = work + "/view"
    func show(_ folder: String) {
        let next = work + "/view.next"
        unlink(next)
        symlink(folder, next)
        rename(next, view)
    }
    let empty = try clip("empty")
    show(empty)
    let cameraNode = work + "/camera_node"
    let flags = measure("/usr/bin/pkg-config", ["--cflags", "--libs", "libpipewire-0.3"]).stdout.split(whereSeparator: \.isWhitespace).map(String.init)
    let built = measure(which("cc"), ["-O1", repo + "/Tests/Fixtures/camera_node.c", "-o", cameraNode] + flags)
    guard built.status == 0 else { throw BenchError("cannot build Tests/Fixtures/camera_node.c: \(built.stderr)") }
    chmod(cameraNode, 0o755)
    let camera = stack.spawn([cameraNode, view, "YUY2", "Bench Cam", "krakl-bench-camera"])
    defer { stopAndReap(camera) }
    let deadline = Date().addingTimeInterval(30)
    while Date() < deadline && !stack.run(["pw-cli", "ls", "Node"]).stdout.contains("krakl-bench-camera") { usleep(100_000) }
    let scanArguments = ["--plugins", work + "/plugins-camera.json", "--scan", "--camera", "--scan-only", "--headless"]
    func agentChild(_ extra: [String], name: String) -> BenchChild? {
        BenchChild("/usr/bin/setpriv", stack.asUser([agent] + scanArguments + extra), out: work + "/\(name).out", err: work + "/\(name).err")
    }

    // Latency: the view turns to the code while the agent watches.
    let still = try clip("still")
    var latencies: [Double] = []
    for _ in 0..<rounds {
        show(empty)
        guard let child = agentChild(["--scan-timeout", "30"], name: "latency") else { continue }
        _ = child.poll(timeout: 20) { $0.contains("looking at camera") ? true : nil }
        usleep(500_000)
        show(still)
        let shown = MonotonicClock.milliseconds()
        while child.isRunning && MonotonicClock.milliseconds() - shown < 10_000 { usleep(2_000) }
        if child.stdout.contains("identity: Bench") { latencies.append(MonotonicClock.milliseconds() - shown) }
        child.stop()
    }
    show(empty)

    // CPU watching the camera: no code and a still view, then a patch moving across it.
    // The agent's CPU, and the camera's over the same window (it streams only while read).
    func agentCpu(seconds: Double) -> (agent: Double, camera: Double) {
        guard let child = agentChild(["--scan-timeout", "\(Int(seconds) + 30)", "-q"], name: "cpu") else { return (.nan, .nan) }
        defer { child.stop() }
        usleep(2_000_000)
        let start = processCpuSeconds(child.pid), cameraStart = processCpuSeconds(camera)
        usleep(useconds_t(seconds * 1_000_000))
        return ((processCpuSeconds(child.pid) - start) / seconds * 100, (processCpuSeconds(camera) - cameraStart) / seconds * 100)
    }
    let (idleCpu, cameraCpu) = agentCpu(seconds: 10)
    show(try clip("moving", patch))
    usleep(300_000)
    let busyCpu = agentCpu(seconds: 10).agent

    let sorted = latencies.sorted()
    print("krakl-bench scan --camera: krakl-agent --scan --camera on a PipeWire camera node (YUY2 1280x720, 30 fps); a \(code.utf8.count)-byte join code "
          + "at ~5 px a module; \(rounds) rounds")
    print("| code appears → found (p50 / p99 / max) | agent CPU, camera view unchanged | agent CPU, view changing every picture | the test camera itself (camera_node.c, 30 fps) |")
    print("|---|---:|---:|---:|")
    print(String(format: "| %.0f / %.0f / %.0f ms (n=%d) | %.2f %% | %.1f %% | %.1f %% |", sorted.nearestRank(0.5) ?? .nan, sorted.nearestRank(0.99) ?? .nan,
                 sorted.last ?? .nan, sorted.count, idleCpu, busyCpu, cameraCpu))

    // Kinds of pictures: the agent (zbar with the inverted and mirrored looks, every picture a
    // fresh noise) against zbarimg with zbar's defaults on the first 10 frames of the same clip.
    print("")
    print("| picture | agent: found, after the camera's first picture | zbarimg (zbar's defaults): frames read of 10 |")
    print("|---|---|---:|")
    for kind in ["still", "moving", "tilted", "rotated", "blurred", "mirrored", "small", "inverted", "dim", "glare"] {
        let folder = try clip(kind)
        show(folder)
        usleep(300_000)
        var said = "not found in 20 s"
        if let child = agentChild(["--scan-timeout", "20"], name: "kind") {
            while child.isRunning { usleep(20_000) }
            if let line = (child.stdout + child.stderr).split(separator: "\n").first(where: { $0.contains("found a join code") }),
               let open = line.range(of: "("), let close = line.range(of: " after the camera") {
                said = "yes, " + line[open.upperBound..<close.lowerBound]
            }
        }
        var read = 0
        for index in 0..<10 {
            let frame = work + "/frame.png"
            _ = measure(ffmpeg, ["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "yuyv422", "-s", "1280x720", "-i", folder + String(format: "/f%02d.yuv", index),
                                 "-frames:v", "1", frame])
            if measure(zbarimg, ["-q", "--raw", "-Sdisable", "-Sqrcode.enable", frame]).status == 0 { read += 1 }
        }
        print("| \(kind) | \(said) | \(read) |")
    }
}
