import Foundation
import Glibc
import Testing

/// A camera for the tests: Tests/Fixtures/camera_node.c (a PipeWire node with a webcam's
/// properties that drives the graph as a V4L2 node does, YUY2 or NV12 1280x720 at 30 fps,
/// playing a clip of CameraClip), as the stack's user.
final class TestCamera {
    let process: Process
    let node: Int

    private static let tool = BuiltOnce {
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let path = folder + "/camera_node"
        let flags = try Harness.run("/usr/bin/pkg-config", ["--cflags", "--libs", "libpipewire-0.3"], timeout: 30)
        try #require(flags.status == 0, "pkg-config libpipewire-0.3: \(flags.stderr)")
        let cc = try Harness.run("/usr/bin/cc", ["-O1", "-Wall", "-Werror", Harness.repoRoot + "/Tests/Fixtures/camera_node.c", "-o", path]
                                 + flags.stdout.split(whereSeparator: \.isWhitespace).map(String.init), timeout: 120)
        try #require(cc.status == 0, "cc camera_node: \(cc.stderr)")
        return path
    }

    /// `clip`: a folder of raw 1280x720 frames in `format` (CameraClip.make), played in a loop.
    init(_ stack: PipeWireStack, clip: String, name: String = "HD Webcam", nodeName: String = "krakl-test-camera",
         format: String = "YUY2") throws {
        process = try stack.spawn([try Self.tool.get(), clip, format, name, nodeName])
        node = try #require(try stack.waitForNode(named: nodeName, timeout: 30), "the test camera's node never appeared")
    }

    /// SIGKILL: a child of the test runner starts with its blocked signals (SIGTERM among them),
    /// and the camera has nothing to finish.
    func stop() {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    deinit { stop() }
}

/// Camera-like clips of a QR code (Tests/Fixtures/camera_clip.sh, which the bench uses too): 1 s
/// of raw 1280x720 frames, the code on a grey view with a fresh sensor-like noise every frame,
/// drawn the ways a phone's screen held up to a webcam looks, by ffmpeg's filters.
enum CameraClip: String, CaseIterable {
    case still, moving, tilted, rotated, blurred, mirrored, small, inverted, dim, glare, empty

    /// Writes the clip's frames into a folder of `folder` in `format` (YUY2 or NV12) and returns it.
    func make(qr: String, in folder: String, format: String = "YUY2") throws -> String {
        let made = try Harness.run("/bin/bash", [Harness.repoRoot + "/Tests/Fixtures/camera_clip.sh", rawValue, qr,
                                                 folder + "/clip-\(rawValue)-\(format)", format], timeout: 120)
        try #require(made.status == 0, "camera_clip.sh \(rawValue): \(made.stderr)")
        chmod(folder, 0o755)
        return folder + "/clip-\(rawValue)-\(format)"
    }
}

extension Harness.Result {
    /// What a run of the agent said on both streams.
    var said: String { stdout + "\n" + stderr }
}

@Suite(.serialized, .tags(.integration, .browser))
struct CameraScanTests {
    // The scan's lines go to stdout in lines mode, the agent's own messages to stderr: judged together.
    /// A join code (the suite's independent generator) as a QR picture.
    static func codePicture(in folder: String) throws -> (code: String, png: String) {
        let made = try Harness.run("/usr/bin/python3", [Harness.repoRoot + "/Tests/Fixtures/make_join_code.py", "--kind", "janus", "--url",
                                                        "http://127.0.0.1:8088/janus", "--room", "4242", "--identity", "Mubashir's phone"], timeout: 30)
        let code = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(code.hasPrefix("krakl:"), "make_join_code.py: \(made.stderr)")
        let png = folder + "/code.png"
        let drawn = try Harness.run("/usr/bin/qrencode", ["-l", "M", "-s", "4", "-m", "4", "-o", png, code], timeout: 30)
        try #require(drawn.status == 0, "qrencode: \(drawn.stderr)")
        chmod(png, 0o644)
        return (code, png)
    }

    static func stackWithTools(_ flags: [String] = ["--no-portal"]) throws -> PipeWireStack? {
        for tool in ["gst-launch-1.0", "ffmpeg", "qrencode"] where Harness.which(tool) == nil {
            skipTest("\(tool) is not installed (scripts/setup installs it)")
            return nil
        }
        guard let stack = try PipeWireStack(flags) else { return nil }
        let check = try stack.run(["/bin/sh", "-c", "test -r '\(Harness.library("BackendPipeWire"))' && test -x '\(Harness.agent)'"], timeout: 10)
        try #require(check.status == 0, "the stack's user (uid \(stack.uid)) cannot read \(Harness.buildDir); the tests need a world-readable build folder")
        return stack
    }

    /// A camera playing `clip` of a join code's QR (the code CameraScanTests' generator made), and
    /// a registry for this build, both in a folder the stack's user can read.
    static func cameraShowingACode(_ stack: PipeWireStack, clip: CameraClip = .still,
                                   name: String = "HD Webcam") throws -> (camera: TestCamera, registry: String) {
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let registry = try Self.registry(folder)
        let (_, png) = try Self.codePicture(in: folder)
        return (try TestCamera(stack, clip: try clip.make(qr: png, in: folder), name: name), registry)
    }

    static func registry(_ folder: String) throws -> String {
        let registry = try Harness.registryForThisBuild(in: folder)
        chmod(registry, 0o644)
        return registry
    }

    /// Every kind of picture a camera gives of the code is read, and how long that took.
    @Test(arguments: CameraClip.allCases.filter { $0 != .empty })
    func cameraPicturesOfTheCodeAreRead(_ clip: CameraClip) throws {
        guard let stack = try Self.stackWithTools() else { return }
        let (camera, registry) = try Self.cameraShowingACode(stack, clip: clip)
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "--scan-only", "--headless",
                                    "--scan-timeout", "30"], timeout: 60)
        let found = result.said.split(separator: "\n").first { $0.contains("found a join code") } ?? ""
        print("camera clip \(clip.rawValue): exit \(result.status): \(found)")
        #expect(result.status == 0, "\(clip.rawValue): exit \(result.status): \(result.said.suffix(1500))")
        #expect(found.contains("after the camera's first picture"), "\(result.said.suffix(1500))")
        #expect(result.stdout.contains("identity: Mubashir's phone") && result.stdout.contains("room:     4242"), "\(result.stdout)")
    }

    /// A camera that shows no code: the hint after 10 s, nothing found at the time-out (50), and
    /// a progress line that names the camera, its size and rate.
    @Test func aCameraWithoutACodeGivesTheHintAndTimesOut() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let (camera, registry) = try Self.cameraShowingACode(stack, clip: .empty, name: "Studio Cam")
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "studio", "--scan-only", "--headless",
                                    "--scan-timeout", "12"], timeout: 60)
        #expect(result.status == 50, "exit \(result.status): \(result.said.suffix(1500))")
        #expect(result.said.contains("no join code found within 12 s"), "\(result.said.suffix(1500))")
        #expect(result.said.contains("hold the code 20–40 cm from the camera"), "\(result.said.suffix(1500))")
        #expect(!result.said.contains("found a join code"))
        let progress = result.said.split(separator: "\n").last { $0.hasPrefix("looking at camera") } ?? ""
        #expect(progress.contains("\"Studio Cam\"") && progress.contains("1280x720, 30 fps, YUY2"), "\(result.said.suffix(1500))")
        print("no code: \(progress)")
    }

    /// Where the session has the xdg-desktop-portal Camera interface (a desktop with an Access
    /// backend: here the stack's stand-in, which answers AccessDialog as a person would), the
    /// camera is asked for through it and read on the PipeWire connection it opens: allowed, the
    /// code is read; denied, "not allowed" (20); `--option via=pipewire` reads PipeWire directly
    /// without asking.
    @Test(arguments: ["allow", "deny"])
    func theCameraPortalIsAskedWhenTheSessionHasOne(_ answer: String) throws {
        guard let stack = try Self.stackWithTools(["--no-portal", "--camera-portal", answer]) else { return }
        let (camera, registry) = try Self.cameraShowingACode(stack)
        defer { camera.stop() }
        let asked = stack.folder + "/log/portal-access.log"
        let direct = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "--scan-only", "--headless", "--option", "via=pipewire",
                                    "--scan-timeout", "30"], timeout: 60)
        #expect(direct.status == 0 && direct.stdout.contains("identity: Mubashir's phone"), "\(direct.said.suffix(1500))")
        #expect(!(try String(contentsOfFile: asked, encoding: .utf8)).contains("AccessDialog"), "via=pipewire asked the portal")

        let scan = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "--scan-only", "--headless", "-v",
                                  "--scan-timeout", "30"], timeout: 60)
        let dialog = try String(contentsOfFile: asked, encoding: .utf8)
        #expect(dialog.contains("AccessDialog app_id='' title='Turn On Camera?' -> \(answer == "allow" ? 0 : 1)"), "the portal's Access backend: \(dialog)")
        if answer == "allow" {
            #expect(scan.status == 0 && scan.stdout.contains("identity: Mubashir's phone"), "\(scan.said.suffix(1500))")
            #expect(scan.said.contains("the Camera portal allowed the camera"), "\(scan.said.suffix(1500))")
        } else {
            #expect(scan.status == 20, "exit \(scan.status): \(scan.said.suffix(1500))")
            #expect(scan.said.contains("the camera was not allowed"), "\(scan.said.suffix(1500))")
        }
    }

    /// No camera: its own status (56) and words that say what to do, for the scan and for the
    /// list; a name that is no camera's lists the cameras there are.
    @Test func noCameraIsAClearErrorWithItsOwnStatus() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let registry = try Self.registry(folder)
        let scan = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "--scan-only", "--headless"], timeout: 60)
        #expect(scan.status == 56, "exit \(scan.status): \(scan.said)")
        #expect(scan.said.contains("no camera found") && scan.said.contains("is the camera plugged in"), "\(scan.said)")
        let list = try stack.run([Harness.agent, "--plugins", registry, "sources", "--cameras"], timeout: 60)
        #expect(list.status == 56 && list.said.contains("no camera found"), "\(list)")

        let (_, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, clip: try CameraClip.still.make(qr: png, in: folder))
        defer { camera.stop() }
        let listed = try stack.run([Harness.agent, "--plugins", registry, "sources", "--cameras"], timeout: 60)
        #expect(listed.status == 0 && listed.stdout.contains("\(camera.node)  camera \"HD Webcam\" (krakl-test-camera)"), "\(listed)")
        let wrong = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera=Front Camera", "--scan-only", "--headless"], timeout: 60)
        #expect(wrong.status == 56, "exit \(wrong.status): \(wrong.said)")
        #expect(wrong.said.contains("no camera \"Front Camera\"; cameras: \"HD Webcam\" (node \(camera.node), krakl-test-camera)"), "\(wrong.said)")
        // By the number sources --cameras shows.
        let byNumber = try stack.run([Harness.agent, "--plugins", registry, "--scan", "--camera", "\(camera.node)", "--scan-only", "--headless",
                                      "--scan-timeout", "30"], timeout: 60)
        #expect(byNumber.status == 0 && byNumber.stdout.contains("identity: Mubashir's phone"), "\(byNumber)")
    }

    /// Through the daemon: `connect --scan --camera` scans the daemon's camera, the client prints
    /// the scan's lines, and the found code is joined (its room is not there: the join's own
    /// status, not a scan's); with no camera of that name, 56 from the daemon too.
    @Test func theDaemonScansACamera() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let (camera, registry) = try Self.cameraShowingACode(stack)
        defer { camera.stop() }
        let daemon = try stack.spawn([Harness.agent, "daemon", "--plugins", registry, "--connect-timeout", "3"])
        defer { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() }
        var status = try stack.run([Harness.agent, "status"], timeout: 10)
        for _ in 0..<100 where status.status != 0 {
            usleep(100_000)
            status = try stack.run([Harness.agent, "status"], timeout: 10)
        }
        try #require(status.status == 0, "the daemon never answered: \(status)")
        let wrong = try stack.run([Harness.agent, "connect", "--scan", "--camera", "Front Camera"], timeout: 60)
        #expect(wrong.status == 56 && wrong.said.contains("no camera \"Front Camera\""), "\(wrong)")
        let connect = try stack.run([Harness.agent, "connect", "--scan", "--camera"], timeout: 90)
        print("connect --scan --camera: exit \(connect.status): \(connect.said.suffix(400))")
        #expect(connect.said.contains("krakl-agent: scanning: found a join code"), "\(connect)")
        #expect(connect.status != 0 && connect.status != 50 && connect.status != 56, "the code's room is not there: \(connect)")
    }

    /// --preview: the camera's picture on the built-in viewer's page while the scan looks; with no
    /// display it is not opened and its address is said; Chromium decodes the camera's 1280x720.
    @Test func thePreviewShowsTheCameraOnTheViewerPage() throws {
        guard let stack = try Self.stackWithTools(), try ViewerBrowserTests.browserPrerequisites() else { return }
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let (_, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, clip: try CameraClip.empty.make(qr: png, in: folder))
        defer { camera.stop() }
        let agent = try stack.spawn([Harness.agent, "--plugins", try Self.registry(folder), "--scan", "--camera", "--preview", "--scan-only",
                                     "--headless", "--listen", "127.0.0.1:0", "--scan-timeout", "60"], output: folder + "/agent.out")
        defer { kill(agent.processIdentifier, SIGKILL); agent.waitUntilExit() }
        var said = ""
        for _ in 0..<200 where !said.contains("preview: ") {
            usleep(100_000)
            said = (try? String(contentsOfFile: folder + "/agent.out", encoding: .utf8)) ?? ""
        }
        let line = said.split(separator: "\n").first { $0.contains("preview: ") }.map(String.init) ?? ""
        print("preview: \(line)")
        #expect(line.contains("not opened: no display"), "\(said)")
        let url = try #require(line.range(of: #"http://127\.0\.0\.1:[0-9]+/"#, options: .regularExpression).map { String(line[$0]) }, "\(said)")
        let viewer = try ViewerBrowserTests.Viewer()
        defer { viewer.quit() }
        _ = try viewer.send(["cmd": "open", "url": url, "timeout": 10], timeout: 60)
        var decoded = 0.0, size = ""
        for _ in 0..<50 where decoded < 10 {
            let state = try viewer.send(["cmd": "state"])
            let stats = state["stats"] as? [String: Any] ?? [:]
            decoded = (stats["framesDecoded"] as? NSNumber)?.doubleValue ?? 0
            size = "\(stats["frameWidth"] ?? "?")x\(stats["frameHeight"] ?? "?")"
            usleep(200_000)
        }
        print("preview in Chromium: \(decoded) frames decoded, \(size)")
        #expect(decoded >= 10 && size == "1280x720", "the page shows no camera picture: \(decoded) frames, \(size)")
    }

    /// The camera mode keeps the backend contract: the conformance suite on a camera node.
    @Test func cameraModePassesConformance() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let (_, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, clip: try CameraClip.moving.make(qr: png, in: folder, format: "NV12"), format: "NV12")
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "conformance", Harness.library("BackendPipeWire"), "--option", "camera="], timeout: 240)
        #expect(result.status == 0 && !result.stdout.contains("FAIL"), "\(result.stdout)\(result.said)")
    }
}
