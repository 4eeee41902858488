import Foundation
import Glibc
import Testing

/// A camera for the tests: a PipeWire Video/Source node with a camera's properties (media.role
/// Camera and a product name, as WirePlumber gives a V4L2 webcam), made by gst-launch's
/// pipewiresink from a looping clip of raw frames the test made (no decoding: the camera costs
/// the machine little while the agent is measured). It sends YUY2 at 30 fps, as a webcam does.
final class TestCamera {
    let process: Process
    let node: Int

    /// `frames`: a printf pattern of raw 1280x720 frames in `format` (CameraClip.make), played in a loop.
    init(_ stack: PipeWireStack, frames: String, name: String = "HD Webcam", nodeName: String = "krakl-test-camera",
         format: String = "YUY2") throws {
        let properties = "\"props,media.class=Video/Source,media.role=Camera,node.description=\\\"\(name)\\\",node.name=\(nodeName)\""
        // identity drop-allocation: pipewiresink 0.3.65 crashes (gst_buffer_peek_memory) when upstream
        // writes into the buffers of its pool; with its own buffers it does not.
        process = try stack.spawn(["gst-launch-1.0", "-q", "multifilesrc", "location=\(frames)", "loop=true",
                                   "caps=video/x-raw,format=\(format),width=1280,height=720,framerate=30/1", "!",
                                   "identity", "drop-allocation=true", "!", "pipewiresink", "mode=provide", "stream-properties=\(properties)"])
        // 30 s: a first gst-launch on a fresh machine builds GStreamer's plugin registry.
        node = try #require(try stack.waitForNode(named: nodeName, timeout: 30), "the test camera's node never appeared")
    }

    func stop() {
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }

    deinit { stop() }
}

/// Camera-like clips of a QR code: 1 s (30 frames) at 1280x720, the code on a grey, noisy view
/// (a fresh noise pattern every frame, as a sensor gives), drawn the ways a phone's screen held
/// up to a webcam looks. Made with ffmpeg's filters, so the distortions are ffmpeg's, not ours.
enum CameraClip: String, CaseIterable {
    case still, moving, tilted, rotated, blurred, mirrored, small, inverted, dim, glare, empty

    /// The filter that draws the code ([1], the QR picture) onto the view ([0]).
    var filter: String {
        let place = "overlay=(W-w)/2:(H-h)/2"
        switch self {
        case .still: return "[1]scale=420:420:flags=neighbor[q];[0][q]\(place)"
        // Across a third of the frame in the clip's second (and back to the start at each loop).
        case .moving: return "[1]scale=380:380:flags=neighbor[q];[0][q]overlay=x='300+12*n':y=170:eval=frame"
        // Held at 30° from the camera's axis: the far edge narrower, the whole shorter (cos 30°).
        case .tilted:
            return "[1]scale=460:460:flags=neighbor,pad=iw:ih:0:0:white,perspective=x0=60:y0=0:x1=W-60:y1=0:x2=0:y2=H*0.87:x3=W:y3=H*0.87:sense=destination:eval=init,"
                + "crop=iw:ih*0.87:0:0[q];[0][q]\(place)"
        case .rotated: return "[1]scale=400:400:flags=neighbor,rotate=30*PI/180:ow=rotw(30*PI/180):oh=roth(30*PI/180):c=0x787870[q];[0][q]\(place)"
        // Out of focus: a Gaussian blur of 1.5 px on modules of ~5 px.
        case .blurred: return "[1]scale=420:420:flags=neighbor[q];[0][q]\(place),gblur=sigma=1.5"
        case .mirrored: return "[1]scale=420:420:flags=neighbor,hflip[q];[0][q]\(place)"
        // A tenth of the frame's area: 303x303 of 1280x720 (~3.7 px a module for this code).
        case .small: return "[1]scale=303:303:flags=neighbor[q];[0][q]overlay=200:120"
        // A page in dark mode: light modules on dark.
        case .inverted: return "[1]scale=420:420:flags=neighbor,negate[q];[0][q]\(place)"
        // A dim screen in a bright room: dark 100, light 170 of 255.
        case .dim: return "[1]scale=420:420:flags=neighbor,lutyuv=y='100+val*70/255'[q];[0][q]\(place)"
        // A reflection over a quarter of the code.
        case .glare: return "[1]scale=420:420:flags=neighbor,drawbox=x=0:y=0:w=210:h=210:color=white@0.55:t=fill[q];[0][q]\(place)"
        case .empty: return "[0]null"
        }
    }

    /// Writes the clip's frames into `folder` as raw pictures in `format` (YUY2 or NV12, GStreamer's
    /// names) and returns their pattern, numbered from 0 as multifilesrc reads them.
    func make(qr: String, in folder: String, format: String = "YUY2") throws -> String {
        let directory = folder + "/clip-\(rawValue)-\(format)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let pixels = format == "NV12" ? "nv12" : "yuyv422"
        let made = try Harness.run("/usr/bin/ffmpeg", ["-v", "error", "-y", "-f", "lavfi", "-i", "color=c=0x787870:s=1280x720:r=30", "-loop", "1", "-i", qr,
                                                        "-filter_complex", filter + ",noise=alls=6:allf=t,format=\(pixels)", "-frames:v", "30",
                                                        "-start_number", "0", "-f", "image2", "-c:v", "rawvideo", directory + "/f%02d.yuv"], timeout: 120)
        try #require(made.status == 0, "ffmpeg (\(rawValue)): \(made.stderr)")
        chmod(folder, 0o755)
        chmod(directory, 0o755)
        return directory + "/f%02d.yuv"
    }
}

extension Harness.Result {
    /// What a run of the agent said on both streams.
    var said: String { stdout + "\n" + stderr }
}

@Suite(.serialized)
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

    static func stackWithTools() throws -> PipeWireStack? {
        for tool in ["gst-launch-1.0", "ffmpeg", "qrencode"] where Harness.which(tool) == nil {
            skipTest("\(tool) is not installed (scripts/setup installs it)")
            return nil
        }
        guard let stack = try PipeWireStack(["--no-portal"]) else { return nil }
        let check = try stack.run(["/bin/sh", "-c", "test -r '\(Harness.library("BackendPipeWire"))' && test -x '\(Harness.agent)'"], timeout: 10)
        try #require(check.status == 0, "the stack's user (uid \(stack.uid)) cannot read \(Harness.buildDir); the tests need a world-readable build folder")
        return stack
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
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let (code, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, frames: try clip.make(qr: png, in: folder))
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "--plugins", try Self.registry(folder), "--scan", "--camera", "--scan-only", "--headless",
                                    "--scan-timeout", "30"], timeout: 60)
        let found = result.said.split(separator: "\n").first { $0.contains("found a join code") } ?? ""
        print("camera clip \(clip.rawValue): exit \(result.status): \(found)")
        #expect(result.status == 0, "\(clip.rawValue): exit \(result.status): \(result.said.suffix(1500))")
        #expect(found.contains("after the camera's first picture"), "\(result.said.suffix(1500))")
        #expect(result.stdout.contains("identity: Mubashir's phone") && result.stdout.contains("room:     4242"), "\(result.stdout)")
        _ = code
    }

    /// A camera that shows no code: the hint after 10 s, nothing found at the time-out (50), and
    /// a progress line that names the camera, its size and rate.
    @Test func aCameraWithoutACodeGivesTheHintAndTimesOut() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let (_, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, frames: try CameraClip.empty.make(qr: png, in: folder), name: "Studio Cam")
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "--plugins", try Self.registry(folder), "--scan", "--camera", "studio", "--scan-only", "--headless",
                                    "--scan-timeout", "12"], timeout: 60)
        #expect(result.status == 50, "exit \(result.status): \(result.said.suffix(1500))")
        #expect(result.said.contains("no join code found within 12 s"), "\(result.said.suffix(1500))")
        #expect(result.said.contains("hold the code 20–40 cm from the camera"), "\(result.said.suffix(1500))")
        #expect(!result.said.contains("found a join code"))
        let progress = result.said.split(separator: "\n").last { $0.hasPrefix("looking at camera") } ?? ""
        #expect(progress.contains("\"Studio Cam\"") && progress.contains("1280x720, 30 fps, YUY2"), "\(result.said.suffix(1500))")
        print("no code: \(progress)")
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
        let camera = try TestCamera(stack, frames: try CameraClip.still.make(qr: png, in: folder))
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

    /// The camera mode keeps the backend contract: the conformance suite on a camera node.
    @Test func cameraModePassesConformance() throws {
        guard let stack = try Self.stackWithTools() else { return }
        let folder = try Harness.temporaryDirectory()
        chmod(folder, 0o755)
        let (_, png) = try Self.codePicture(in: folder)
        let camera = try TestCamera(stack, frames: try CameraClip.moving.make(qr: png, in: folder, format: "NV12"), format: "NV12")
        defer { camera.stop() }
        let result = try stack.run([Harness.agent, "conformance", Harness.library("BackendPipeWire"), "--option", "camera="], timeout: 240)
        #expect(result.status == 0 && !result.stdout.contains("FAIL"), "\(result.stdout)\(result.said)")
    }
}
