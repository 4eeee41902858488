// krakl-bench scan: how fast `krakl-agent --scan --backend x11` finds a join
// code that appears on the screen, and what scanning costs, next to zbarimg
// reading the same full-screen pictures.
//
//   swift build -c release && .build/release/krakl-bench scan [--rounds 10]
//
// On Xvfb at 1920x1080 (code at 4 px a module) and 3840x2160 (2 px a module):
//  - latency: a fresh agent scans; a second after its first progress line the
//    code is drawn on the root window (Tests/Fixtures/xfill.c, XPutImage) at
//    a new place each round; time from the draw to the agent's exit with the
//    code (it prints the summary and exits: an upper bound on "decoded");
//  - CPU of the agent over 10 s while the screen does not change, and while
//    it changes whole every frame (bench/xactivity.c full, 30 fps);
//  - zbarimg (Debian zbar-tools) on the same screen as a PNG: its time per
//    picture, and what that is as a share of a core at our 5 looks a second.
import Foundation
import KraklBase
import KraklHost

func runScanBench(rounds: Int) throws {
    let xvfb = which("Xvfb"), xsetroot = which("xsetroot"), cc = which("cc"), qrencode = which("qrencode"), zbarimg = which("zbarimg")
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let xfill = work + "/xfill", activity = work + "/xactivity"
    for (source, out) in [(repo + "/Tests/Fixtures/xfill.c", xfill), (repo + "/bench/xactivity.c", activity)] {
        let built = measure(cc, ["-O2", source, "-o", out, "-lX11"])
        guard built.status == 0 else { throw BenchError("cannot build \(source): \(built.stderr)") }
    }
    let made = measure("/usr/bin/python3", [repo + "/Tests/Fixtures/make_join_code.py", "--kind", "janus", "--url", "http://127.0.0.1:8088/janus",
                                            "--room", "1234", "--identity", "Bench", "--secret", "bench"])
    let code = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    guard code.hasPrefix("krakl:") else { throw BenchError("make_join_code.py: \(made.stderr)") }
    try "{\"version\": 1, \"default\": \"x11\", \"backends\": {\"x11\": {\"library\": \"\(buildDir)/libBackendX11.so\"}}}"
        .write(toFile: work + "/plugins-scan.json", atomically: true, encoding: .utf8)
    print("krakl-bench scan: krakl-agent --scan --backend x11 on Xvfb; a \(code.utf8.count)-byte join code drawn by XPutImage; \(rounds) rounds a size")
    print("| screen | module | code appears → found (p50 / p99 / max) | agent CPU, screen unchanged | agent CPU, screen changing whole at 30 fps | zbarimg a picture (same screen) | zbarimg at 5 a second |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (width, height, pixels) in [(1920, 1080, 4), (3840, 2160, 2)] {
        let xserver = BenchXvfb(xvfb, xsetroot: xsetroot, size: "\(width)x\(height)", background: "#707070")
        defer { xserver.stop() }
        let display = xserver.display
        let png = work + "/code-\(pixels).png", pgm = png + ".pgm"
        _ = measure(qrencode, ["-l", "M", "-s", "\(pixels)", "-m", "4", "-o", png, code])
        _ = measure(ffmpeg, ["-v", "error", "-i", png, "-pix_fmt", "gray", "-y", pgm])
        let side = (try? String(contentsOfFile: pgm, encoding: .isoLatin1).split(separator: "\n").dropFirst().first?.split(separator: " ").first.flatMap { Int($0) }) ?? 400
        let scanArguments = ["--scan", "--scan-only", "--backend", "x11", "--plugins", work + "/plugins-scan.json", "--option", "display=\(display)"]

        // Latency, a fresh agent each round.
        var latencies: [Double] = []
        for round in 0..<rounds {
            _ = measure(xsetroot, ["-display", display, "-solid", "#707070"])   // no code left from the last round
            guard let agentChild = BenchChild(agent, scanArguments + ["--scan-timeout", "30"], out: work + "/scan.out", err: work + "/scan.err") else { continue }
            _ = agentChild.poll(timeout: 20) { $0.contains("frames looked at") || $0.contains("scanning the x11") ? true : nil }
            usleep(1_000_000)
            let x = (round * 397) % max(1, width - side), y = (round * 211) % max(1, height - side)
            _ = measure(xfill, [display, "pgm", pgm, "\(x)", "\(y)"])
            let drawn = MonotonicClock.milliseconds()
            while agentChild.isRunning && MonotonicClock.milliseconds() - drawn < 10_000 { usleep(2_000) }
            let found = MonotonicClock.milliseconds() - drawn
            if agentChild.stdout.contains("identity: Bench") { latencies.append(found) }
            agentChild.stop()
        }
        _ = measure(xsetroot, ["-display", display, "-solid", "#707070"])

        // CPU while scanning an unchanged screen, then one changing whole every frame.
        func agentCpu(seconds: Double) -> Double {
            guard let child = BenchChild(agent, scanArguments + ["--scan-timeout", "\(Int(seconds) + 30)", "-q"], out: work + "/cpu.out", err: work + "/cpu.err") else { return .nan }
            defer { child.stop() }
            usleep(1_000_000)
            let start = processCpuSeconds(child.pid)
            usleep(useconds_t(seconds * 1_000_000))
            return (processCpuSeconds(child.pid) - start) / seconds * 100
        }
        let idleCpu = agentCpu(seconds: 10)
        let painter = launch(activity, [display, "full"])
        usleep(500_000)
        let busyCpu = agentCpu(seconds: 10)
        stopAndReap(painter)

        // zbarimg on the same screen as a picture (the code on the grey screen).
        let screen = work + "/screen-\(width).png"
        _ = measure(ffmpeg, ["-v", "error", "-f", "lavfi", "-i", "color=c=0x707070:s=\(width)x\(height):d=1", "-i", png, "-filter_complex",
                             "[0][1]overlay=x=\(width / 3):y=\(height / 3)", "-frames:v", "1", "-y", screen])
        var zbarMs: [Double] = []
        for _ in 0..<5 {
            let m = measure(zbarimg, ["-q", "--raw", "-Sdisable", "-Sqrcode.enable", screen])
            if m.status == 0 { zbarMs.append(m.cpuSeconds * 1000) }
        }
        let z = zbarMs.sorted().nearestRank(0.5) ?? .nan
        let sorted = latencies.sorted()
        print(String(format: "| %dx%d | %d px | %.0f / %.0f / %.0f ms (n=%d) | %.2f %% | %.1f %% | %.0f ms CPU | %.1f %% |", width, height, pixels,
                     sorted.nearestRank(0.5) ?? .nan, sorted.nearestRank(0.99) ?? .nan, sorted.last ?? .nan, sorted.count,
                     idleCpu, busyCpu, z, z * 5 / 10))
    }
}
