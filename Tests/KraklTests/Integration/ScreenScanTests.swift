import Foundation
import Glibc
import KraklBase
import KraklHost
import Testing

/// `krakl-agent --scan` (issue 12 items 1, 3, 4): the join code from a QR on
/// the "screen" of a backend. Here the file backend plays a Y4M clip ffmpeg
/// made from a qrencode picture laid over a 1080p or 4K screen, so the
/// scanner gets real frames through the real host, with the file backend's
/// tile damage; the codes come from the independent Python generator.
@Suite(.serialized, .tags(.integration)) struct ScreenScanTests {
    /// A clip of `seconds` at `fps` of a grey screen with `qr` laid at (x, y) from `appearsAt` s on.
    static func clip(_ qrPNG: String, size: String, seconds: Double, fps: Int, appearsAt: Double, x: Int, y: Int, in folder: String) throws -> String {
        let out = folder + "/screen-\(UUID().uuidString.prefix(6)).y4m"
        let result = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error", "-f", "lavfi", "-i", "color=c=0x707070:s=\(size):d=\(seconds):r=\(fps)",
                                                                "-i", qrPNG, "-filter_complex",
                                                                "[0][1]overlay=x=\(x):y=\(y):enable='gte(t,\(appearsAt))',format=yuv420p",
                                                                "-f", "yuv4mpegpipe", "-y", out], timeout: 120)
        try #require(result.status == 0, "ffmpeg: \(result.stderr)")
        return out
    }

    /// qrencode with `pixels` per module.
    static func qrPNG(_ text: String, pixels: Int, in folder: String) throws -> String {
        let output = folder + "/qr-\(UUID().uuidString.prefix(6)).png"
        let result = try Harness.run(Harness.which("qrencode")!, ["-l", "M", "-s", "\(pixels)", "-m", "4", "-o", output, text])
        try #require(result.status == 0, "qrencode: \(result.stderr)")
        return output
    }

    static func scan(_ clip: String, timeout: Int, registry: String) throws -> Harness.Result {
        try Harness.agent(["--scan", "--scan-only", "--backend", "file", "--plugins", registry, "--option", "path=" + clip,
                           "--scan-timeout", "\(timeout)"], timeout: Double(timeout) + 30)
    }

    static func prerequisites() throws -> Bool {
        try Harness.requireBuild()
        guard Harness.which("qrencode") != nil else { skipTest("qrencode is not installed (Debian qrencode)"); return false }
        guard Harness.which("ffmpeg") != nil else { skipTest("ffmpeg is not installed"); return false }
        return true
    }

    /// "found a join code after 5.1 s" → 5.1
    static func foundAfter(_ output: String) -> Double? {
        guard let range = output.range(of: "found a join code after ") else { return nil }
        return Double(output[range.upperBound...].prefix { $0.isNumber || $0 == "." })
    }

    /// The file backend plays a clip's unchanged frames faster than real time, so "after 5 s" is 5 s of
    /// the clip here; the real-time case is the X11 one (Xvfb) of the next session.
    @Test func aCodeThatAppearsAfterFiveSecondsOfA1080pClipIsFound() throws {
        guard try Self.prerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try QRScanTests.makeCode(identity: "Late", room: "5555")
        let clip = try Self.clip(try Self.qrPNG(code, pixels: 3, in: folder), size: "1920x1080", seconds: 7, fps: 10, appearsAt: 5,
                                 x: 1500, y: 700, in: folder)
        let result = try Self.scan(clip, timeout: 20, registry: try Harness.registryForThisBuild(in: folder))
        let after = Self.foundAfter(result.stdout)
        print("scan 1080p: found \(after.map { String($0) } ?? "never") s into the scan; the code appears 5 s into the clip")
        #expect(result.status == 0, "exit \(result.status): \(result.stdout) \(result.stderr)")
        #expect(result.stdout.contains("identity: Late") && result.stdout.contains("room:     5555"), "\(result.stdout)")
        #expect(after != nil, "no 'found' line: \(result.stdout)")
        #expect(result.stdout.contains("frames looked at"), "no progress line: \(result.stdout)")
    }

    @Test func aSmallCodeOnA4KScreenIsFound() throws {
        guard try Self.prerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try QRScanTests.makeCode(identity: "Tiny", room: "4096")
        // 2 px a module: the smallest a screen shows a code at.
        let clip = try Self.clip(try Self.qrPNG(code, pixels: 2, in: folder), size: "3840x2160", seconds: 1, fps: 2, appearsAt: 0,
                                 x: 3000, y: 1700, in: folder)
        let result = try Self.scan(clip, timeout: 20, registry: try Harness.registryForThisBuild(in: folder))
        print("scan 4K, 2 px a module: found after \(Self.foundAfter(result.stdout).map { String($0) } ?? "never") s")
        #expect(result.status == 0 && result.stdout.contains("identity: Tiny"), "exit \(result.status): \(result.stdout) \(result.stderr)")
    }

    @Test func aForeignCodeIsReportedOnceAndScanningGoesOnUntilTheTimeOut() throws {
        guard try Self.prerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let clip = try Self.clip(try Self.qrPNG("https://example.org/not-a-join-code", pixels: 4, in: folder), size: "1280x720", seconds: 3,
                                 fps: 10, appearsAt: 0.5, x: 300, y: 200, in: folder)
        let registry = try Harness.registryForThisBuild(in: folder)
        let result = try Harness.agent(["--scan", "--scan-only", "--backend", "file", "--plugins", registry, "--option", "path=" + clip,
                                        "--option", "loop=true", "--scan-timeout", "3"], timeout: 40)
        let mentions = result.stdout.components(separatedBy: "not a krakl join code").count - 1
        #expect(result.status == 50, "exit \(result.status) (50 = nothing within the time-out): \(result.stdout) \(result.stderr)")
        #expect(mentions == 1, "the foreign code was reported \(mentions) times: \(result.stdout)")
        #expect(result.stdout.contains("https://example.org"), "\(result.stdout)")
    }

    @Test func anExpiredCodeIsReportedAndScanningGoesOn() throws {
        guard try Self.prerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try QRScanTests.makeCode(identity: "Old", ttl: -600)
        let clip = try Self.clip(try Self.qrPNG(code, pixels: 4, in: folder), size: "1280x720", seconds: 2, fps: 10, appearsAt: 0.2,
                                 x: 100, y: 100, in: folder)
        let result = try Self.scan(clip, timeout: 3, registry: try Harness.registryForThisBuild(in: folder))
        #expect(result.status == 50 || result.status == 51, "exit \(result.status): \(result.stdout) \(result.stderr)")
        #expect(result.stdout.contains("expired") && result.stdout.contains("still looking for a fresh code"), "\(result.stdout)")
    }

    /// A camera-like clip for the file backend (a camera backend dropped in later gets frames like
    /// these): the code on a sheet, seen in perspective, blurred, with sensor noise that changes every
    /// frame and light falling off to the corners (ffmpeg's perspective, gblur, noise, vignette).
    @Test func aCodeInACameraLikeClipIsFound() throws {
        guard try Self.prerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        let code = try QRScanTests.makeCode(identity: "Camera", room: "31")
        let png = try Self.qrPNG(code, pixels: 6, in: folder)
        let clip = folder + "/camera.y4m"
        let filter = "[1]pad=iw+40:ih+40:20:20:color=0xe8e8e8[sheet];[0][sheet]overlay=x=(W-w)/2:y=(H-h)/2,"
            + "perspective=x0=60:y0=30:x1=W-20:y1=70:x2=40:y2=H-40:x3=W-90:y3=H-10:sense=destination,"
            + "gblur=sigma=1.3,vignette=angle=PI/3,noise=alls=18:allf=t,format=yuv420p"
        let made = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error", "-f", "lavfi", "-i", "color=c=0x606060:s=1280x720:d=2:r=10",
                                                              "-i", png, "-filter_complex", filter, "-f", "yuv4mpegpipe", "-y", clip], timeout: 120)
        try #require(made.status == 0, "ffmpeg: \(made.stderr)")
        let result = try Self.scan(clip, timeout: 20, registry: try Harness.registryForThisBuild(in: folder))
        #expect(result.status == 0 && result.stdout.contains("identity: Camera"), "exit \(result.status): \(result.stdout) \(result.stderr)")
    }

    @Test func ctrlCStopsTheScanCleanly() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try DtlsTestProcess(Harness.agent, ["--scan", "--backend", "file", "--plugins", registry, "--option", "scene=static",
                                                        "--scan-timeout", "60"])
        defer { agent.stop() }
        #expect(agent.waitFor("frames looked at", timeout: 20), "no progress line: \(agent.log)")
        agent.signal(SIGINT)
        let asked = MonotonicClock.milliseconds()
        #expect(agent.waitForExit(seconds: 10), "still scanning after Ctrl-C")
        print(String(format: "scan: Ctrl-C ended it in %.0f ms", (agent.exitedAtMs ?? .nan) - asked))
        #expect(agent.exitStatus == 0 && agent.log.contains("scanning stopped"), "exit \(agent.exitStatus.map(String.init) ?? "none"): \(agent.log)")
    }

    // MARK: a real X server

    /// The code drawn as a gray PGM (qrencode → ffmpeg), `pixels` a module.
    static func qrPGM(_ text: String, pixels: Int, in folder: String) throws -> String {
        let png = try qrPNG(text, pixels: pixels, in: folder)
        let pgm = png + ".pgm"
        let result = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error", "-i", png, "-pix_fmt", "gray", "-y", pgm])
        try #require(result.status == 0, "ffmpeg: \(result.stderr)")
        return pgm
    }

    /// `--scan --backend x11` on an Xvfb screen of `size`; the code (at `pixels` a module) is drawn on the
    /// root window `after` seconds into the scan. Returns ms from the drawing to the agent's exit with the code.
    func scanX11(width: Int, height: Int, pixels: Int, after: Double, identity: String) throws -> Double? {
        guard try Self.prerequisites(), let xvfb = try XvfbServer(width: width, height: height) else { return nil }
        defer { xvfb.kill() }
        let folder = try Harness.temporaryDirectory()
        let code = try QRScanTests.makeCode(identity: identity, room: "7777")
        let pgm = try Self.qrPGM(code, pixels: pixels, in: folder)
        let registry = try Harness.registryForThisBuild(in: folder)
        let agent = try DtlsTestProcess(Harness.agent, ["--scan", "--scan-only", "--backend", "x11", "--plugins", registry,
                                                        "--option", "display=\(xvfb.display)", "--scan-timeout", "30"])
        defer { agent.stop() }
        #expect(agent.waitFor("scanning the x11 screen", timeout: 20), "the scan did not start: \(agent.log)")
        _ = agent.waitFor("\u{1}never\u{1}", timeout: after)
        let tool = try XvfbServer.xfill()
        let drawn = try Harness.run(tool, [xvfb.display, "pgm", pgm, "\(width - 700)", "\(height - 700)"])
        try #require(drawn.status == 0, "xfill: \(drawn.stderr)")
        let drawnAt = MonotonicClock.milliseconds()
        _ = agent.waitForExit(seconds: 20)
        #expect(agent.exitStatus == 0, "exit \(agent.exitStatus.map(String.init) ?? "none"): \(agent.log.suffix(500))")
        #expect(agent.log.contains("identity: \(identity)"), "\(agent.log.suffix(500))")
        return agent.exitedAtMs.map { $0 - drawnAt }
    }

    @Test func x11ACodeAppearingAfterFiveSecondsOfScanningOnA1080pScreenIsFound() throws {
        guard let ms = try scanX11(width: 1920, height: 1080, pixels: 4, after: 5, identity: "X11 late") else { return }
        print(String(format: "scan x11 1920x1080, 4 px a module, drawn 5 s into the scan: found and exited %.0f ms after it was drawn", ms))
        // The 1 s target is measured by `krakl-bench scan` (docs/PERFORMANCE.md); a shared CI machine
        // took 1.2 s once. Here: found while the scan ran; the 10 s bound (10× the target) only
        // guards against a scan that never looks again.
        #expect(ms <= 10_000, "found \(ms) ms after the code appeared")
    }

    /// Small (2 px a module, the least a screen shows) and large (8 px) codes at 1080p and 4K.
    @Test(arguments: [(1920, 1080, 2), (1920, 1080, 8), (3840, 2160, 2), (3840, 2160, 8)])
    func x11SmallAndLargeCodesAreFound(width: Int, height: Int, pixels: Int) throws {
        guard let ms = try scanX11(width: width, height: height, pixels: pixels, after: 1, identity: "X11 \(width) \(pixels)") else { return }
        print(String(format: "scan x11 %dx%d, %d px a module: found and exited %.0f ms after it was drawn", width, height, pixels, ms))
        // The 1 s target is measured by `krakl-bench scan` (docs/PERFORMANCE.md); a shared CI machine
        // took 1.2 s once. Here: found while the scan ran; the 10 s bound (10× the target) only
        // guards against a scan that never looks again.
        #expect(ms <= 10_000, "found \(ms) ms after the code appeared")
    }

    // MARK: the real ScreenCast portal

    /// `qrencode -t ANSIUTF8` printed in a foot terminal on the headless sway output, read through
    /// the ScreenCast portal and PipeWire by `--scan --backend pipewire`.
    @Test func aCodePrintedInATerminalIsFoundThroughThePortal() throws {
        guard try Self.prerequisites(), let stack = try PipeWireStack() else { return }
        try PipeWireBackendTests().requireReadableBuild(stack)
        let code = try QRScanTests.makeCode(identity: "Portal", room: "9999")
        let codeFile = stack.folder + "/code.txt"
        try code.write(toFile: codeFile, atomically: true, encoding: .utf8)
        chmod(codeFile, 0o644)
        let registry = try Harness.registryForThisBuild(in: stack.folder)
        chmod(registry, 0o644)
        // A clock ticking under the code: the portal sends frames only when the screen changes, and
        // the terminal may have drawn the code before the scan's stream began (seen on a busy CI machine).
        _ = try stack.spawn(["foot", "sh", "-c", "qrencode -t ANSIUTF8 -m 2 < '\(codeFile)'; while :; do printf '\\r%s' \"$(date +%T.%N)\"; sleep 0.2; done"])
        let result = try stack.run([Harness.agent, "--scan", "--scan-only", "--backend", "pipewire", "--plugins", registry,
                                    "--scan-timeout", "60"], timeout: 120)
        print("scan through the portal: \(result.stdout.split(separator: "\n").filter { $0.contains("found") }.first ?? "nothing found")")
        #expect(result.status == 0, "exit \(result.status): \(result.stdout.suffix(600)) \(result.stderr.suffix(600))")
        #expect(result.stdout.contains("identity: Portal") && result.stdout.contains("room:     9999"), "\(result.stdout.suffix(600))")
    }
}
