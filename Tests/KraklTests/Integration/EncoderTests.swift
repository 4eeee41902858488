import Foundation
import KraklBackendABI
import Testing
@testable import KraklBase
@testable import KraklHost
@testable import KraklEncoder

/// The encoder path through the real agent, judged by real decoders
/// (ffmpeg/ffprobe).
@Suite("Encoder: recordings judged by ffmpeg", .serialized, .tags(.integration))
struct EncoderRecordingTests {
    struct Run {
        let dir: String
        let result: Harness.Result
        var recording: String { dir + "/out.webm" }
        var input: String { dir + "/input.yuv" }
        var stats: [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/stats.json")))) as? [String: Any] ?? [:]
        }
    }

    /// Runs the agent on the file backend with `options`, recording to out.webm,
    /// dumping the encoder's input and writing stats.json in a fresh folder.
    /// The agent runs ahead of the other suites' processes (nice -10, as root): these tests judge what
    /// the encoder makes with the CPU it needs, not how starved it was. Starved, libvpx's realtime
    /// speed control trades quality and rate accuracy for time (a full run of the suite measured
    /// scrolling at 1190 kbit/s for a 1000 target, and 26.0 dB PSNR where 28 is the floor).
    func record(_ options: [String], _ flags: [String], timeout: Double = 120) throws -> Run {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        let arguments = ["--plugins", registry, "-q"] + options.flatMap { ["--option", $0] } + flags
            + ["--record", dir + "/out.webm", "--dump-input", dir + "/input.yuv", "--stats-json", dir + "/stats.json"]
        let result = geteuid() == 0
            ? try Harness.run("/usr/bin/nice", ["-n", "-10", Harness.agent] + arguments, timeout: timeout, currentDirectory: try Harness.temporaryDirectory())
            : try Harness.agent(arguments, timeout: timeout)
        #expect(result.status == 0, "\(result.stderr)")
        return Run(dir: dir, result: result)
    }

    struct Packet { let ptsMs: Double; let size: Int; let keyframe: Bool }

    /// ffprobe's view of the recording's packets.
    static func packets(_ file: String) throws -> [Packet] {
        let probe = try Harness.run(Harness.which("ffprobe")!, ["-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts_time,size,flags",
                                                                "-of", "csv=p=0", file])
        try #require(probe.status == 0, "ffprobe: \(probe.stderr)")
        return probe.stdout.split(separator: "\n").compactMap { line in
            let f = line.split(separator: ",")
            guard f.count >= 3, let t = Double(f[0]), let size = Int(f[1]) else { return nil }
            return Packet(ptsMs: t * 1000, size: size, keyframe: f[2].hasPrefix("K"))
        }
    }

    static func probe(_ file: String) throws -> String {
        try Harness.run(Harness.which("ffprobe")!, ["-v", "error", "-count_frames", "-show_entries",
                                                    "stream=codec_name,width,height,nb_read_frames", "-of", "default=nw=1", file]).stdout
    }

    /// Average PSNR (dB) of the decoded recording against the pictures the encoder was given, frame by frame.
    static func psnr(recording: String, input: String, width: Int, height: Int) throws -> Double {
        let result = try Harness.run(Harness.which("ffmpeg")!, ["-v", "info", "-i", recording, "-f", "rawvideo", "-pix_fmt", "yuv420p",
            "-s", "\(width)x\(height)", "-i", input, "-lavfi", "[0:v]setpts=N/(25*TB)[a];[1:v]setpts=N/(25*TB)[b];[a][b]psnr", "-f", "null", "-"])
        try #require(result.status == 0, "ffmpeg psnr: \(result.stderr.suffix(500))")
        let line = try #require(result.stderr.split(separator: "\n").last { $0.contains("PSNR") && $0.contains("average:") })
        let value = line.split(separator: " ").first { $0.hasPrefix("average:") }!.dropFirst("average:".count)
        return value == "inf" ? 99 : Double(value) ?? 0
    }

    /// Luma PSNR (dB) of each decoded frame against the picture the encoder was given for it, in order.
    static func lumaPsnrByFrame(recording: String, input: String, width: Int, height: Int) throws -> [Double] {
        let stats = try Harness.temporaryDirectory() + "/psnr.log"
        let result = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error", "-i", recording, "-f", "rawvideo", "-pix_fmt", "yuv420p",
            "-s", "\(width)x\(height)", "-i", input,
            "-lavfi", "[0:v]setpts=N/(25*TB)[a];[1:v]setpts=N/(25*TB)[b];[a][b]psnr=stats_file=\(stats)", "-f", "null", "-"])
        try #require(result.status == 0, "ffmpeg psnr: \(result.stderr.suffix(500))")
        return try String(contentsOfFile: stats, encoding: .utf8).split(separator: "\n").compactMap { line in
            guard let field = line.split(separator: " ").first(where: { $0.hasPrefix("psnr_y:") }) else { return nil }
            let value = field.dropFirst("psnr_y:".count)
            return value == "inf" ? 99 : Double(value)
        }
    }

    static var haveFfmpeg: Bool {
        if Harness.which("ffmpeg") == nil || Harness.which("ffprobe") == nil {
            skipTest("ffmpeg/ffprobe are not installed (scripts/setup installs them)")
            return false
        }
        return true
    }

    /// Each scene at 640×480 and 1 Mbit/s: VP8 of the right size, as many
    /// frames as the encoder wrote, PSNR above a floor.
    @Test(arguments: [("typing", 42.0), ("scrolling", 28.0), ("video", 36.0), ("static", 33.0)])
    func recordingDecodesAboveThePSNRFloor(scene: String, floor: Double) throws {
        guard Self.haveFfmpeg else { return }
        let limit = scene == "static" ? ["--seconds", "3"] : ["--frames", "60"]
        let run = try record(["scene=\(scene)", "width=640", "height=480"], limit + ["--bitrate", "1000"])
        let probe = try Self.probe(run.recording)
        #expect(probe.contains("codec_name=vp8") && probe.contains("width=640") && probe.contains("height=480"), "\(probe)")
        let frames = run.stats["encoded_frames"] as? Int ?? -1
        #expect(probe.contains("nb_read_frames=\(frames)"), "ffprobe decoded a different count than the \(frames) encoded:\n\(probe)")
        let inputSize = (try FileManager.default.attributesOfItem(atPath: run.input)[.size] as? Int) ?? 0
        #expect(inputSize / (640 * 480 * 3 / 2) == frames)
        let quality = try Self.psnr(recording: run.recording, input: run.input, width: 640, height: 480)
        #expect(quality >= floor, "\(scene): PSNR \(quality) dB is below the \(floor) dB floor")
        print("\(scene): \(frames) frames, PSNR \(String(format: "%.2f", quality)) dB (floor \(floor))")
    }

    /// VP8 version 2 (no loop filter, the default) is a stream every RFC 6386 decoder takes: FFmpeg's
    /// own VP8 decoder and libvpx's give the same pixels; `--vp8-profile 0` gives version 0.
    @Test func vp8Version2DecodesTheSameInFFmpegAndLibvpx() throws {
        guard Self.haveFfmpeg else { return }
        let run = try record(["scene=scrolling", "width=640", "height=480"], ["--frames", "45", "--bitrate", "1000"])
        let versions = try Harness.run(Harness.which("ffprobe")!, ["-v", "error", "-show_entries", "stream=profile", "-of", "csv=p=0", run.recording])
        #expect(versions.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "2", "the default stream's version: \(versions.stdout)")
        var decoded: [Data] = []
        for decoder in [[], ["-c:v", "libvpx"]] {
            let out = run.dir + "/decoded-\(decoded.count).yuv"
            // Every decoded frame once, none made up: without passthrough ffmpeg resamples to the frame
            // rate it guesses from the timestamps, and two frames captured 1 ms apart (a busy machine
            // delivers late frames back to back) made it guess 1000 fps and write 1498 frames.
            let result = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error"] + decoder + ["-i", run.recording, "-fps_mode", "passthrough",
                                                                                                  "-f", "rawvideo", "-pix_fmt", "yuv420p", out])
            try #require(result.status == 0, "ffmpeg \(decoder): \(result.stderr.suffix(300))")
            decoded.append(try Data(contentsOf: URL(fileURLWithPath: out)))
        }
        #expect(decoded[0].count == 45 * 640 * 480 * 3 / 2, "FFmpeg decoded \(decoded[0].count / (640 * 480 * 3 / 2)) of 45 frames")
        #expect(decoded[0] == decoded[1], "FFmpeg's VP8 decoder and libvpx disagree on a version-2 stream")
        let quality = try Self.psnr(recording: run.recording, input: run.input, width: 640, height: 480)
        #expect(quality >= 28, "scrolling PSNR \(quality) dB")

        let zero = try record(["scene=scrolling", "width=640", "height=480"], ["--frames", "10", "--vp8-profile", "0"])
        let version0 = try Harness.run(Harness.which("ffprobe")!, ["-v", "error", "-show_entries", "stream=profile", "-of", "csv=p=0", zero.recording])
        #expect(version0.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "--vp8-profile 0 gave \(version0.stdout)")
        let bad = try Harness.agent(["--vp8-profile", "4", "--frames", "1"])
        #expect(bad.status == 2 && bad.stderr.contains("--vp8-profile 4"), "\(bad.status): \(bad.stderr)")
    }

    @Test func vp9RecordsAndDecodes() throws {
        guard Self.haveFfmpeg else { return }
        let run = try record(["scene=typing", "width=640", "height=480"], ["--frames", "30", "--codec", "vp9", "--bitrate", "1000"])
        let probe = try Self.probe(run.recording)
        #expect(probe.contains("codec_name=vp9"), "\(probe)")
        let frames = run.stats["encoded_frames"] as? Int ?? -1
        #expect(probe.contains("nb_read_frames=\(frames)"), "\(probe)")
        let quality = try Self.psnr(recording: run.recording, input: run.input, width: 640, height: 480)
        #expect(quality >= 38, "VP9 typing PSNR \(quality)")
    }

    /// A static screen: the first frame, then only the periodic refresh frames, all of them together under a tenth of the first.
    @Test func staticSceneCostsAlmostNothingAfterTheFirstFrame() throws {
        guard Self.haveFfmpeg else { return }
        let run = try record(["scene=static", "width=1280", "height=720"], ["--seconds", "5", "--refresh", "1"])
        let packets = try Self.packets(run.recording)
        try #require(packets.count >= 2, "\(packets.count) packets")
        #expect(packets[0].keyframe)
        let rest = packets.dropFirst()
        #expect(rest.count <= 6, "\(rest.count) frames after the first in 5 s with a 1 s refresh")
        #expect((run.stats["refresh_frames"] as? Int) == rest.count, "every later frame is a refresh")
        let restBytes = rest.reduce(0) { $0 + $1.size }
        #expect(restBytes * 10 < packets[0].size, "after the first frame: \(restBytes) bytes vs the first frame's \(packets[0].size)")
    }

    /// With no periodic refresh (`--refresh 0`, what rooms and the viewer use), an unchanged 1080p
    /// screen is re-encoded pass after pass until it converges, and then nothing more is sent. The
    /// old three passes at 1, 2 and 4 s raised a coarse keyframe by 0.04 dB (issue 27: a room saw
    /// 27.7 dB of a static screen where Chromium's share reached 47). Measured here: 37.6 dB for the
    /// keyframe, 47.1 dB for the last frame, 64 frames in a 6 s run, the last at 3.1 s.
    @Test func anUnchangedScreenIsRefinedUntilItConvergesThenNothingMore() throws {
        guard Self.haveFfmpeg else { return }
        let run = try record(["scene=static", "width=1920", "height=1080"], ["--seconds", "10", "--refresh", "0"])
        let psnr = try Self.lumaPsnrByFrame(recording: run.recording, input: run.input, width: 1920, height: 1080)
        try #require(psnr.count >= 2, "\(psnr.count) frames decoded")
        let first = psnr[0], last = psnr[psnr.count - 1]
        #expect(last >= first + 5 && last >= 44, "the first frame \(first) dB, the last \(last) dB: the refinement did not raise the picture")
        // Passes at 30 a second that never stopped would make ~270 frames in the 9 s after settling;
        // the refinement ends by SettleRefinement.passLimit (90) at the latest, then one frame follows.
        let frames = run.stats["encoded_frames"] as? Int ?? -1
        #expect((3...(2 + SettleRefinement.passLimit + 1)).contains(frames), "\(frames) frames encoded in 10 s of an unchanged screen")
        #expect((run.stats["refresh_frames"] as? Int ?? 0) >= 1, "no refinement pass at all")
    }

    /// Over 20 s of scrolling at 1 Mbit/s CBR, the recording's bitrate (as
    /// ffprobe measures it from the packets) is within ±15 %. Measured here: 1044 and 1053 kbit/s
    /// alone, 1122 beside four busy loops and 1190 in a full run without the head start of `record`,
    /// 1046 beside four busy loops with it.
    @Test func scrollingBitrateStaysWithin15PercentOfTarget() throws {
        guard Self.haveFfmpeg else { return }
        let run = try record(["scene=scrolling", "width=1280", "height=720"], ["--seconds", "20", "--bitrate", "1000"], timeout: 90)
        let packets = try Self.packets(run.recording)
        try #require(packets.count > 100)
        let seconds = (packets.last!.ptsMs - packets.first!.ptsMs) / 1000 * Double(packets.count) / Double(packets.count - 1)
        let kbps = Double(packets.reduce(0) { $0 + $1.size }) * 8 / seconds / 1000
        #expect(abs(kbps - 1000) <= 150, "measured \(kbps) kbit/s over \(seconds) s for a 1000 kbit/s target")
        print(String(format: "scrolling 1280x720, 1000 kbit/s target: %.0f kbit/s over %.1f s", kbps, seconds))
    }

    /// SIGUSR1 asks for a keyframe; the recording shows a second one.
    @Test func keyframeOnRequestFromTheCommandLine() throws {
        guard Self.haveFfmpeg else { return }
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        let agent = try RunningAgent(["--plugins", registry, "--option", "width=320", "--option", "height=240", "--record", dir + "/out.webm"])
        #expect(agent.read(until: "kbit/s p50"), "no status line: \(agent.output)")
        agent.signal(SIGUSR1)
        // The next status line comes after frames that followed the request.
        #expect(agent.read(until: "kbit/s p50", count: 2))
        #expect(agent.stop() == 0)
        let keyframes = try Self.packets(dir + "/out.webm").enumerated().filter { $0.element.keyframe }.map(\.offset)
        #expect(keyframes.count == 2 && keyframes.first == 0, "keyframes at \(keyframes)")
    }

    @Test func ivfRecordingIsReadable() throws {
        guard Self.haveFfmpeg else { return }
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        let result = try Harness.agent(["--plugins", registry, "-q", "-o", "width=320", "-o", "height=240", "--frames", "20",
                                        "--record", dir + "/out.ivf", "--stats-json", dir + "/stats.json"])
        #expect(result.status == 0, "\(result.stderr)")
        let stats = (try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/stats.json")))) as? [String: Any] ?? [:]
        let probe = try Self.probe(dir + "/out.ivf")
        #expect(probe.contains("codec_name=vp8") && probe.contains("nb_read_frames=\(stats["encoded_frames"] as? Int ?? -1)"), "\(probe)")
    }

    /// A backend that sends frames of an undefined format: each is dropped
    /// before it reaches libyuv or libvpx, with one message that says why.
    @Test func framesOfAnUnknownFormatAreDroppedWithAMessage() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        _ = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: dir, name: "fixture", defines: ["-DBAD_FORMAT"])
        try "{\"version\": 1, \"default\": \"fixture\", \"backends\": {\"fixture\": {\"library\": \"libfixture.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        let result = try Harness.agent(["--plugins", dir + "/plugins.json", "-q", "--seconds", "1", "--record", dir + "/out.webm"])
        // Not one usable frame: exit 25, and no recording is named (none exists).
        #expect(result.status == 25 && result.stderr.contains("delivered no usable frame"), "\(result.stderr)")
        #expect(result.stderr.components(separatedBy: "unknown pixel format 99").count == 2, "one message: \(result.stderr)")
        #expect(result.stdout.contains("dropped") && result.stdout.contains("invalid frames from the backend"), "\(result.stdout)")
        #expect(result.stdout.contains("encoded: 0 frames") && result.stdout.contains("recording: none"), "\(result.stdout)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/out.webm"))
    }

    @Test func recordingErrorsAreClear() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let unwritable = try Harness.agent(["--plugins", registry, "--frames", "5", "--record", "/nonexistent/dir/out.webm", "-q"])
        // An output that cannot be written is exit 23 (docs/exit-codes.md), found before capture starts.
        #expect(unwritable.status == 23 && unwritable.stderr.contains("cannot write /nonexistent/dir/out.webm")
                && !unwritable.stdout.contains("capturing from"), "exit \(unwritable.status): \(unwritable.stderr)")
        let extensionless = try Harness.agent(["--record", "out.mp4"])
        #expect(extensionless.status == 2 && extensionless.stderr.contains("must end in .webm or .ivf"))
        let tiny = try Harness.agent(["--record", "krakl-recording.webm", "--max-size", "8x8"])
        #expect(tiny.status == 2 && tiny.stderr.contains("--max-size 8x8"))
    }
}

/// The pieces, in process: keyframe on request, conversion of damaged
/// areas against libyuv's whole-frame conversion, active maps, errors.
@Suite("Encoder: pipeline in process", .tags(.unit))
struct EncoderPipelineTests {
    /// Collects encoded frames and lets a test wait for a count.
    final class Collector: EncodedFrameSink, @unchecked Sendable {
        let condition = Condition()
        var frames: [EncodedFrame] = []
        var finished = false
        /// Called in `write` for each frame (before it is counted): a sink that reacts to a frame.
        var onWrite: ((EncodedFrame) -> Void)?
        func write(_ frame: EncodedFrame) throws(EncoderError) {
            onWrite?(frame)
            condition.lock(); frames.append(frame); condition.broadcast(); condition.unlock()
        }
        func finish() throws(EncoderError) { condition.lock(); finished = true; condition.unlock() }
        func waitFor(_ count: Int, timeout: Double = 30) -> Int {
            condition.lock(); defer { condition.unlock() }
            _ = condition.wait(while: { frames.count < count }, until: Date().addingTimeInterval(timeout))
            return frames.count
        }
    }

    /// Feeds a backend's frames into a pipeline, as the agent does.
    final class Feeder: FrameSink {
        let pipeline: EncoderPipeline
        init(_ pipeline: EncoderPipeline) { self.pipeline = pipeline }
        func frame(_ frame: UnsafePointer<krakl_frame>) { pipeline.submit(FrameInfo(frame)) }
        func event(_ event: SourceEvent) {}
    }

    /// A running pipeline fed by the file backend's `scene`, as the agent runs it.
    struct Running {
        let collector = Collector()
        let pipeline: EncoderPipeline
        let feeder: Feeder
        let source: BackendSource

        init(settings: EncoderSettings = EncoderSettings(), scene: String, width: Int, height: Int) throws {
            try Harness.requireBuild()
            let collector = self.collector
            pipeline = try EncoderPipeline(settings: settings, output: { _, _, _ in collector }, onFailure: { Issue.record("\($0)") })
            feeder = Feeder(pipeline)
            let library = try BackendLibrary.load(path: Harness.library("BackendFile"), backend: "file")
            var options = JSONObject()
            options["scene"] = .string(scene); options["width"] = .number("\(width)"); options["height"] = .number("\(height)")
            source = try BackendSource(library: library, backendName: "file", options: options, sink: feeder, logger: { _, _, _ in })
            pipeline.start()
            try source.start()
        }
    }

    /// For receivers that ask (a room, the viewer): an unchanged screen is refined after it settles
    /// until it converges (SettleRefinement), each pass followed by the next and the last by a frame
    /// of no blocks, and then nothing at all (issues 17 and 27).
    @Test func aSettledScreenIsRefinedUntilItConvergesThenNothing() throws {
        var settings = EncoderSettings()
        settings.refreshForReceiversThatAsk()
        let run = try Running(settings: settings, scene: "static", width: 320, height: 240)
        let (collector, pipeline, source) = (run.collector, run.pipeline, run.source)
        // The keyframe, its follow-up, at least one pass (1 s after the change) and the pass's follow-up.
        #expect(collector.waitFor(4, timeout: 15) >= 4, "the first frame, its follow-up, a pass and its follow-up")
        // Then frames stop: wait for a quiet second (bounded: 90 passes are 3 s at 30 fps; 20 s is a
        // hang guard), and then judge that 3 s more bring nothing.
        var count = collector.waitFor(1)
        for _ in 0..<20 {
            let next = collector.waitFor(count + 1, timeout: 1)
            if next == count { break }
            count = next
        }
        #expect(collector.waitFor(count + 1, timeout: 3) == count, "an unchanged screen kept being encoded after \(count) frames")
        try source.stop()
        pipeline.finish()
        let summary = pipeline.statistics.summary()
        #expect((1...SettleRefinement.passLimit).contains(summary.refreshFrames) && summary.keyframes == 1,
                "\(summary.refreshFrames) passes, \(summary.keyframes) keyframes")
        collector.condition.lock()
        let frames = collector.frames
        collector.condition.unlock()
        // The keyframe, its follow-up, the passes, the last pass's follow-up: nothing else.
        #expect(frames.count == summary.refreshFrames + 3, "\(frames.count) frames for \(summary.refreshFrames) passes")
        #expect(frames.map(\.keyframe) == [true] + Array(repeating: false, count: frames.count - 1), "\(frames.map(\.keyframe))")
        // The follow-up (one frame interval after the keyframe) carries no blocks: a few bytes.
        if frames.count >= 2 {
            #expect(frames[1].data.count * 20 < frames[0].data.count, "follow-up \(frames[1].data.count) bytes after a \(frames[0].data.count)-byte keyframe")
            let gap = Double(frames[1].timestampNs &- frames[0].timestampNs) / 1e6
            #expect(gap < 900, "the follow-up came \(gap) ms after the keyframe: it is due one frame interval after it, the first pass 1 s after")
        }
    }

    @Test func keyframeRequestMakesTheNextFrameAKeyframe() throws {
        let run = try Running(scene: "typing", width: 320, height: 240)
        let (collector, pipeline, source) = (run.collector, run.pipeline, run.source)
        // Past the keyframe request spacing (0.3 s) after the first keyframe: half a second at 30 fps.
        #expect(collector.waitFor(15) >= 15)
        collector.condition.lock()
        let before = collector.frames.count
        collector.condition.unlock()
        pipeline.requestKeyframe()
        #expect(collector.waitFor(before + 3) >= before + 3)
        try source.stop()
        pipeline.finish()
        let keyframes = collector.frames.enumerated().filter { $0.element.keyframe }.map(\.offset)
        // The frame being encoded when the request came may finish first; the one after is the keyframe.
        #expect(keyframes.count == 2 && keyframes[0] == 0 && (before...before + 1).contains(keyframes[1]), "keyframes at \(keyframes), request after \(before)")
        #expect(collector.finished)
    }

    /// A keyframe serves the requests made before it was handed to the sinks (a transport that came up
    /// while the first keyframe was in libvpx must not get a second one), but not one made while it
    /// was being handed over: that may come from a sink it had already passed (a viewer added then).
    @Test func aRequestDuringTheKeyframesHandOverIsServedByTheNextKeyframe() throws {
        let collector = Collector()
        var settings = EncoderSettings()
        settings.keyframeRequestSpacing = .milliseconds(100)
        let pipeline = try EncoderPipeline(settings: settings, output: { _, _, _ in collector }, onFailure: { Issue.record("\($0)") })
        var asked = false
        collector.onWrite = { [weak pipeline] frame in
            guard frame.keyframe, !asked else { return }
            asked = true
            pipeline?.requestKeyframe()
        }
        pipeline.start()
        try Harness.requireBuild()
        let library = try BackendLibrary.load(path: Harness.library("BackendFile"), backend: "file")
        var options = JSONObject()
        options["scene"] = .string("typing"); options["width"] = .number("320"); options["height"] = .number("240")
        let feeder = Feeder(pipeline)   // the source holds its sink weakly
        let source = try BackendSource(library: library, backendName: "file", options: options, sink: feeder, logger: { _, _, _ in })
        try source.start()
        // The spacing is 0.1 s: a second keyframe within 30 frames (1 s at 30 fps) when the request was kept.
        #expect(collector.waitFor(30) >= 30)
        try source.stop()
        pipeline.finish()
        collector.condition.lock()
        let keyframes = collector.frames.enumerated().filter { $0.element.keyframe }.map(\.offset)
        collector.condition.unlock()
        #expect(keyframes.count == 2 && keyframes.first == 0, "keyframes at \(keyframes): the request made during the first one's hand-over was dropped")
        withExtendedLifetime(feeder) {}
    }

    /// A keyframe asked for before anything was captured (a receiver's PLI
    /// right after connecting; SIGUSR1 at start-up) waits for the first
    /// frame instead of trapping on a deadline already in the past.
    @Test func keyframeRequestBeforeTheFirstFrameWaitsForIt() throws {
        let collector = Collector()
        let pipeline = try EncoderPipeline(settings: EncoderSettings(), output: { _, _, _ in collector }, onFailure: { Issue.record("\($0)") })
        pipeline.start()
        pipeline.requestKeyframe()
        // Let the encoder thread reach its wait with the request and no picture
        // (bounded: it either traps here or goes on waiting).
        for _ in 0..<20 { pipeline.requestKeyframe(); usleep(5_000) }
        try Harness.requireBuild()
        let library = try BackendLibrary.load(path: Harness.library("BackendFile"), backend: "file")
        var options = JSONObject()
        options["scene"] = .string("typing"); options["width"] = .number("320"); options["height"] = .number("240")
        let feeder = Feeder(pipeline)
        let source = try BackendSource(library: library, backendName: "file", options: options, sink: feeder, logger: { _, _, _ in })
        try source.start()
        #expect(collector.waitFor(5) >= 5)
        try source.stop()
        pipeline.finish()
        #expect(collector.frames.first?.keyframe == true)
    }

    /// setBitrate while running: the frames after the change follow the new target. Judged 8 s after the change:
    /// libvpx's CBR buffer takes seconds to settle after a 2.5× cut, and on a busy machine 4 s was not always
    /// enough (a full run read 1.02 Mbit/s for the 800 kbit/s target; under 3 busy loops, 1 run in 3).
    @Test func bitrateChangesWhileRunning() throws {
        var settings = EncoderSettings()
        settings.bitrateKbps = 2000
        let run = try Running(settings: settings, scene: "scrolling", width: 640, height: 480)
        let (collector, pipeline, source) = (run.collector, run.pipeline, run.source)
        #expect(collector.waitFor(90) >= 90)
        pipeline.setBitrate(kbps: 800)
        collector.condition.lock()
        let changeAt = collector.frames.count
        collector.condition.unlock()
        #expect(collector.waitFor(changeAt + 240) >= changeAt + 240)
        try source.stop()
        pipeline.finish()
        // Mean bytes per frame over a second before the change and the last second after it.
        func kbps(_ frames: ArraySlice<EncodedFrame>) -> Double { Double(frames.reduce(0) { $0 + $1.data.count }) * 8 * 30 / Double(frames.count) / 1000 }
        let before = kbps(collector.frames[(changeAt - 30)..<changeAt])
        let after = kbps(collector.frames[(collector.frames.count - 30)...])
        // "Before" above 1300 (not 1500): libvpx was still climbing to 2000 after 3 s when a loaded CI run
        // read 1494. The change is what is judged: the last second after it sits around 800.
        #expect(before > 1300 && after > 600 && after < 1000, "before \(before) kbit/s, after \(after) kbit/s (2000 then 800 target)")
    }

    /// Builds a BGRx frame over `pixels` and runs `body` with it.
    func withFrame(_ pixels: [UInt8], width: Int, height: Int, damage: [krakl_rect], _ body: (FrameInfo) -> Void) {
        pixels.withUnsafeBufferPointer { buffer in
            damage.withUnsafeBufferPointer { rects in
                var frame = krakl_frame()
                frame.struct_size = UInt32(MemoryLayout<krakl_frame>.size)
                frame.format = KRAKL_FORMAT_BGRX.rawValue
                frame.width = UInt32(width); frame.height = UInt32(height)
                frame.plane_count = 1
                frame.stride.0 = UInt32(width * 4)
                frame.plane.0 = buffer.baseAddress
                frame.timestamp_ns = 1
                frame.damage_count = UInt32(rects.count)
                frame.damage = rects.count > 0 ? rects.baseAddress : nil
                withUnsafePointer(to: &frame) { body(FrameInfo($0)) }
            }
        }
    }

    func packed(_ image: I420Image) -> [UInt8] {
        var bytes: [UInt8] = []
        image.appendPacked(to: &bytes)
        return bytes
    }

    /// Converting only the damaged area gives exactly what converting the
    /// whole changed frame gives, at the same size and scaled down.
    @Test(arguments: [(640, 480), (1280, 960)])
    func damagedConversionEqualsWholeFrameConversion(width: Int, height: Int) {
        var random = SystemRandomNumberGenerator()
        var pixels = (0..<(width * height * 4)).map { _ in UInt8.random(in: 0...255, using: &random) }
        let maximum = (width: 640, height: 480)
        let size = outputSize(width: width, height: height, maximum: maximum)
        let partial = I420Image(width: size.width, height: size.height), whole = I420Image(width: size.width, height: size.height)
        let converter = FrameConverter()
        withFrame(pixels, width: width, height: height, damage: []) { #expect(converter.convert($0, into: partial) == nil) }
        // Change two rectangles (one at an odd position) and convert only them.
        let changes = [krakl_rect(x: 101, y: 33, width: 57, height: 21), krakl_rect(x: 0, y: Int32(height - 16), width: 16, height: 16)]
        for r in changes {
            for y in Int(r.y)..<Int(r.y + r.height) { for x in (Int(r.x) * 4)..<(Int(r.x + r.width) * 4) { pixels[y * width * 4 + x] &+= 77 } }
        }
        withFrame(pixels, width: width, height: height, damage: changes) { frame in
            let rects = converter.convert(frame, into: partial)
            #expect(rects != nil && rects!.count == 2)
        }
        withFrame(pixels, width: width, height: height, damage: []) { _ = FrameConverter().convert($0, into: whole) }
        let a = packed(partial), b = packed(whole)
        let first = a.indices.first { a[$0] != b[$0] }
        #expect(first == nil, "damaged-area conversion differs from whole-frame conversion at \(width)x\(height), first at byte \(first ?? -1) of \(a.count)")
    }

    /// An I420 frame larger than the maximum (an X11 screen above 1080p) is scaled whole, but only
    /// the damage mapped to output pixels is reported as changed: every output byte that differs
    /// from the previous picture lies inside the reported rectangles.
    @Test(arguments: [(1280, 960), (1000, 700)])
    func scaledI420DamageCoversEveryChangedPixel(width: Int, height: Int) {
        var random = SystemRandomNumberGenerator()
        let cw = (width + 1) / 2, ch = (height + 1) / 2
        var planes = [width * height, cw * ch, cw * ch].map { count in (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) } }
        func withI420(damage: [krakl_rect], _ body: (FrameInfo) -> Void) {
            planes[0].withUnsafeBufferPointer { y in planes[1].withUnsafeBufferPointer { u in planes[2].withUnsafeBufferPointer { v in
                damage.withUnsafeBufferPointer { rects in
                    var frame = krakl_frame()
                    frame.struct_size = UInt32(MemoryLayout<krakl_frame>.size)
                    frame.format = KRAKL_FORMAT_I420.rawValue
                    frame.width = UInt32(width); frame.height = UInt32(height)
                    frame.plane_count = 3
                    frame.stride = (UInt32(width), UInt32(cw), UInt32(cw), 0)
                    frame.plane = (y.baseAddress, u.baseAddress, v.baseAddress, nil)
                    frame.timestamp_ns = 1
                    frame.damage_count = UInt32(rects.count)
                    frame.damage = rects.count > 0 ? rects.baseAddress : nil
                    withUnsafePointer(to: &frame) { body(FrameInfo($0)) }
                }
            } } }
        }
        let size = outputSize(width: width, height: height, maximum: (640, 480))
        let image = I420Image(width: size.width, height: size.height)
        let converter = FrameConverter()
        withI420(damage: []) { #expect(converter.convert($0, into: image) == nil) }
        let before = packed(image)
        // Two changed areas, whole 2x2 blocks as the X11 backend reports them.
        let changes = [krakl_rect(x: 102, y: 34, width: 58, height: 22), krakl_rect(x: 0, y: Int32(height - 16), width: 16, height: 16)]
        for r in changes {
            for y in Int(r.y)..<Int(r.y + r.height) { for x in Int(r.x)..<Int(r.x + r.width) { planes[0][y * width + x] &+= 77 } }
            for y in Int(r.y) / 2..<Int(r.y + r.height) / 2 { for x in Int(r.x) / 2..<Int(r.x + r.width) / 2 { planes[1][y * cw + x] &+= 55; planes[2][y * cw + x] &+= 33 } }
        }
        var reported: [PixelRect] = []
        withI420(damage: changes) { reported = converter.convert($0, into: image) ?? [PixelRect(x: 0, y: 0, width: size.width, height: size.height)] }
        let after = packed(image)
        let outsideArea = reported.reduce(0) { $0 + $1.width * $1.height } < size.width * size.height / 4
        #expect(outsideArea, "reported \(reported): most of the picture")
        let (w, h) = (size.width, size.height), (ow, oh) = ((w + 1) / 2, (h + 1) / 2)
        func inside(_ x: Int, _ y: Int) -> Bool { reported.contains { x >= $0.x && x < $0.x + $0.width && y >= $0.y && y < $0.y + $0.height } }
        var uncovered: (plane: Int, x: Int, y: Int)?
        for i in before.indices where before[i] != after[i] && uncovered == nil {
            if i < w * h {
                if !inside(i % w, i / w) { uncovered = (0, i % w, i / w) }
            } else {
                let j = (i - w * h) % (ow * oh), x = j % ow * 2, y = j / ow * 2
                if !inside(x, y) { uncovered = (i < w * h + ow * oh ? 1 : 2, x, y) }
            }
        }
        #expect(uncovered == nil, "plane \(uncovered?.plane ?? -1) changed at (\(uncovered?.x ?? -1), \(uncovered?.y ?? -1)) outside \(reported)")
        #expect(before != after)
    }

    /// The encoder takes the staging picture by swapping (no copy) and hands its last one back, stale
    /// where that frame changed; each encoded picture is still the whole latest frame: after whole,
    /// partial, elsewhere-partial and same-area damage (the hand-back repaired, or rewritten in place).
    @Test func everyEncodedPictureIsTheWholeLatestFrame() throws {
        let (width, height) = (320, 240)
        let dump = try Harness.temporaryDirectory() + "/input.yuv"
        let collector = Collector()
        let pipeline = try EncoderPipeline(settings: EncoderSettings(), dumpInput: dump, output: { _, _, _ in collector },
                                           onFailure: { Issue.record("\($0)") })
        pipeline.start()
        var random = SystemRandomNumberGenerator()
        var pixels = (0..<(width * height * 4)).map { _ in UInt8.random(in: 0...255, using: &random) }
        var expected: [[UInt8]] = []
        let steps: [[krakl_rect]] = [
            [],                                                                          // whole
            [krakl_rect(x: 0, y: 0, width: 320, height: 200)],                           // most of it
            [krakl_rect(x: 200, y: 180, width: 40, height: 40)],                         // elsewhere: repaired
            [krakl_rect(x: 200, y: 180, width: 40, height: 40)],                         // the same area: rewritten
            [krakl_rect(x: 10, y: 10, width: 30, height: 30), krakl_rect(x: 0, y: 220, width: 320, height: 20)],
        ]
        for (index, damage) in steps.enumerated() {
            for r in damage {
                for y in Int(r.y)..<Int(r.y + r.height) { for x in (Int(r.x) * 4)..<(Int(r.x + r.width) * 4) { pixels[y * width * 4 + x] &+= 91 } }
            }
            let whole = I420Image(width: width, height: height)
            withFrame(pixels, width: width, height: height, damage: []) { _ = FrameConverter().convert($0, into: whole) }
            expected.append(packed(whole))
            let before = collector.waitFor(0)
            withFrame(pixels, width: width, height: height, damage: damage) { pipeline.submit($0) }
            #expect(collector.waitFor(before + 1) > before, "step \(index) was not encoded")
        }
        pipeline.finish()
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: dump)))
        let size = width * height * 3 / 2
        let pictures = stride(from: 0, to: bytes.count - size + 1, by: size).map { Array(bytes[$0..<($0 + size)]) }
        // Every picture is a submitted frame, in order (a follow-up frame repeats the one before it).
        var at = 0
        for (index, picture) in pictures.enumerated() {
            guard let step = expected[at...].firstIndex(of: picture) else {
                Issue.record("encoded picture \(index) is none of the frames submitted from step \(at) on")
                continue
            }
            at = step
        }
        #expect(pictures.count >= expected.count && at == expected.count - 1, "\(pictures.count) pictures, the last is step \(at)")
    }

    /// There is one picture: while the encoder has it (here: inside the sink's write, which is
    /// still inside the encode step) a capture waits and does not write into it, while a keyframe
    /// request from another thread goes through at once; the waiting capture is encoded next.
    @Test func aCaptureWaitsForTheEncodeAndAKeyframeRequestDoesNot() throws {
        let (width, height) = (64, 48)
        let dump = try Harness.temporaryDirectory() + "/input.yuv"
        let collector = Collector()
        let pipeline = try EncoderPipeline(settings: EncoderSettings(), dumpInput: dump, output: { _, _, _ in collector },
                                           onFailure: { Issue.record("\($0)") })
        let grey = [UInt8](repeating: 0x40, count: width * height * 4)
        let white = [UInt8](repeating: 0xF0, count: width * height * 4)
        let submitted = Locked(wrappedValue: false), requested = Locked(wrappedValue: false)
        let submittedInsideWrite = Locked(wrappedValue: true), requestedInsideWrite = Locked(wrappedValue: false)
        let firstWrite = Locked(wrappedValue: true)
        collector.onWrite = { [self] _ in
            guard firstWrite.wrappedValue else { return }
            firstWrite.wrappedValue = false
            startThread(name: "test-capture") { [self] in
                withFrame(white, width: width, height: height, damage: []) { pipeline.submit($0) }
                submitted.wrappedValue = true
            }
            startThread(name: "test-network") {
                pipeline.requestKeyframe()
                requested.wrappedValue = true
            }
            // The request must get through while the encoder is here (bounded: 10 s)…
            let deadline = MonotonicClock.nanoseconds() + 10_000_000_000
            while !requested.wrappedValue && MonotonicClock.nanoseconds() < deadline { usleep(1000) }
            requestedInsideWrite.wrappedValue = requested.wrappedValue
            // …and the capture, which takes well under a millisecond unblocked, must not, however long
            // the encoder stays (0.2 s here).
            let stay = MonotonicClock.nanoseconds() + 200_000_000
            while !submitted.wrappedValue && MonotonicClock.nanoseconds() < stay { usleep(1000) }
            submittedInsideWrite.wrappedValue = submitted.wrappedValue
        }
        pipeline.start()
        withFrame(grey, width: width, height: height, damage: []) { pipeline.submit($0) }
        // Next, the keyframe asked for and the white capture: one frame, or the grey picture's keyframe
        // first and then the white one (the refresh after 1 s makes a third frame either way).
        #expect(collector.waitFor(3) >= 3, "the capture made during the first encode was not encoded")
        pipeline.finish()
        #expect(requestedInsideWrite.wrappedValue, "a keyframe request waited for the encode")
        #expect(!submittedInsideWrite.wrappedValue, "a capture went into the picture while the encoder had it")
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: dump)))
        let size = width * height * 3 / 2
        let lumas = stride(from: 0, to: bytes.count - size + 1, by: size).map { Set(bytes[$0..<($0 + width * height)]) }
        // Every encoded picture is one frame whole (never part grey, part white); the first is the
        // grey one and the white one follows.
        #expect(lumas.count >= 2 && lumas.allSatisfy { $0.count == 1 }, "luma values per picture: \(lumas)")
        if let first = lumas.first?.first, let last = lumas.last?.first {
            #expect(first < last, "luma \(first) first, \(last) last")
        }
    }

    @Test func outputSizeFitsAndStaysEven() {
        #expect(outputSize(width: 3840, height: 2160, maximum: (1920, 1080)) == (1920, 1080))
        #expect(outputSize(width: 2560, height: 1600, maximum: (1920, 1080)) == (1728, 1080))
        #expect(outputSize(width: 1281, height: 721, maximum: (1920, 1080)) == (1280, 720))
        #expect(outputSize(width: 800, height: 600, maximum: (1920, 1080)) == (800, 600))
    }

    @Test func damageBecomesAPaddedMacroblockMap() {
        var damage = DamageAccumulator()
        damage.add(PixelRect(x: 17, y: 0, width: 2, height: 2))    // inside block (1, 0)
        damage.add(PixelRect(x: 30, y: 30, width: 4, height: 4))   // straddles blocks (1,1) (2,1) (1,2) (2,2)
        let (map, share) = damage.macroblockMap(width: 64, height: 48) // 4 × 3 blocks
        #expect(map == [0, 1, 0, 0,
                        0, 1, 1, 0,
                        0, 1, 1, 0])
        #expect(abs(share - 5.0 / 12.0) < 1e-9)
        damage.addWhole()
        #expect(damage.macroblockMap(width: 64, height: 48).activeShare == 1)
    }

    /// Damage that reaches past the picture marks only the blocks it covers inside it; damage
    /// wholly outside (a stale rectangle after the screen shrank) marks none. A 70×40 picture has
    /// 5 × 3 blocks, the last column and row partial.
    @Test func damageOutsideThePictureMarksNoBlock() {
        var damage = DamageAccumulator()
        damage.add(PixelRect(x: 60, y: 30, width: 50, height: 50))   // from block (3, 1) past the corner
        damage.add(PixelRect(x: 80, y: 0, width: 10, height: 10))    // right of the picture
        damage.add(PixelRect(x: -20, y: 0, width: 10, height: 10))   // left of it
        damage.add(PixelRect(x: 0, y: 45, width: 10, height: 10))    // below it
        let (map, share) = damage.macroblockMap(width: 70, height: 40)
        #expect(BlockGrid(width: 70, height: 40) == BlockGrid(width: 80, height: 48))
        #expect(map == [0, 0, 0, 0, 0,
                        0, 0, 0, 1, 1,
                        0, 0, 0, 1, 1])
        #expect(abs(share - 4.0 / 15.0) < 1e-9)
    }

    @Test func encoderRejectsBadSizesAndBitrates() {
        #expect(throws: EncoderError.self) { try VpxEncoder(codec: .vp8, width: 15, height: 16, bitrateKbps: 1000, fps: 30, threads: 1) }
        #expect(throws: EncoderError.self) { try VpxEncoder(codec: .vp8, width: 20000, height: 16, bitrateKbps: 1000, fps: 30, threads: 1) }
        #expect(throws: EncoderError.self) { try VpxEncoder(codec: .vp9, width: 64, height: 64, bitrateKbps: 0, fps: 30, threads: 1) }
        do {
            _ = try VpxEncoder(codec: .vp8, width: 15, height: 16, bitrateKbps: 1000, fps: 30, threads: 1)
        } catch {
            #expect(error.message.contains("sizes must be even"))
        }
    }

    /// libvpx's VP8 token buffer is found through this binary's memset (ZeroFill, linked as in the
    /// agent), its pages go back after a large frame, and that changes no byte of the bitstream: the
    /// same pictures (noise, so every frame is large) encode the same with and without the release.
    @Test func givingTheTokenPagesBackChangesNoByte() throws {
        let width = 640, height = 480   // the buffer is 7 MB: over ZeroFill's 4 MB floor
        func encodeAll(releasing: Bool) throws -> (packets: [[UInt8]], encoder: VpxEncoder) {
            let encoder = try VpxEncoder(codec: .vp8, width: width, height: height, bitrateKbps: 20_000, fps: 30, threads: 1,
                                         releasesTokenPages: releasing)
            let picture = I420Image(width: width, height: height)
            var seed: UInt32 = 12345
            var packets: [[UInt8]] = []
            for frame in 0..<6 {
                // New noise in every frame (the first 6 rows keep the previous frame's).
                for row in 6..<height {
                    for column in 0..<width {
                        seed = seed &* 1_103_515_245 &+ 12345
                        picture.y[row * picture.strideY + column] = UInt8(truncatingIfNeeded: seed >> 16)
                    }
                }
                packets += try encoder.encode(picture, pts: Int64(frame * 3000), duration: 3000, keyframe: frame == 0, activeMap: nil).map(\.data)
            }
            return (packets, encoder)
        }
        let released = try encodeAll(releasing: true), kept = try encodeAll(releasing: false)
        let tokens = try #require(released.encoder.tokenBuffer, "the token buffer is found (40 × 30 blocks × 384 tokens × 16 bytes)")
        #expect(tokens.count == 40 * 30 * 384 * 16)
        #expect(kept.encoder.tokenBuffer == nil)
        #expect(released.packets.allSatisfy { $0.count >= VpxEncoder.tokenReleaseBytes }, "every frame large enough to release after")
        #expect(released.encoder.tokenReleases == released.packets.count)
        #expect(released.packets == kept.packets, "the bitstream is the same byte for byte")
        // Given back means not resident until libvpx writes tokens there again.
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = (Int(bitPattern: tokens.baseAddress!) + page - 1) / page * page
        var resident = [UInt8](repeating: 0, count: 16)
        #expect(mincore(UnsafeMutableRawPointer(bitPattern: start), 16 * page, &resident) == 0)
        #expect(resident.allSatisfy { $0 & 1 == 0 }, "the buffer's first pages were given back after the last large frame")
    }

    /// Small frames, none large enough to release after: the pages still go back every
    /// `tokenReleaseFrames` frames, so what stays resident follows the recent frames.
    @Test func tokenPagesGoBackEverySoManySmallFrames() throws {
        let width = 640, height = 480
        let encoder = try VpxEncoder(codec: .vp8, width: width, height: height, bitrateKbps: 2_000, fps: 30, threads: 1)
        let tokens = try #require(encoder.tokenBuffer)
        let picture = I420Image(width: width, height: height)
        var sizes: [Int] = []
        for frame in 0..<(2 * VpxEncoder.tokenReleaseFrames) {
            // A flat picture with one moving 16×16 square: every frame is small.
            let x = (frame * 16) % (width - 16)
            for row in 0..<16 { memset(picture.y + (200 + row) * picture.strideY + x, Int32(40 + frame % 200), 16) }
            sizes += try encoder.encode(picture, pts: Int64(frame * 3000), duration: 3000, keyframe: frame == 0, activeMap: nil).map(\.data.count)
        }
        #expect(sizes.count == 2 * VpxEncoder.tokenReleaseFrames)
        #expect(sizes.allSatisfy { $0 < VpxEncoder.tokenReleaseBytes }, "largest frame \(sizes.max() ?? 0) bytes")
        #expect(encoder.tokenReleases == 2, "given back \(encoder.tokenReleases) times in \(sizes.count) small frames")
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = (Int(bitPattern: tokens.baseAddress!) + page - 1) / page * page
        var resident = [UInt8](repeating: 0, count: 4)
        #expect(mincore(UnsafeMutableRawPointer(bitPattern: start), 4 * page, &resident) == 0)
        #expect(resident.allSatisfy { $0 & 1 == 0 }, "the first pages were given back after the last frame")
    }
}

@Suite("Encoder: frame-rate cap", .tags(.unit))
struct EncoderFrameRateCapTests {
    let interval: UInt64 = 33_333_333 // 30 fps
    let ms: UInt64 = 1_000_000

    /// The regression the stored credit prevents: a 30 fps source whose frame was taken 2 ms late.
    /// The next capture comes a whole interval after the previous one, only 31 ms after the late
    /// take; a take-time rule made it wait 2 ms, and the wait carried over to every later frame.
    @Test func aFrameOnTimeAfterALateTakeIsTakenAtOnce() {
        var cap = FrameRateCap(interval: interval)
        let first: UInt64 = 1_000 * ms
        #expect(cap.allows(now: first))
        cap.take(now: first + 2 * ms)
        #expect(cap.allows(now: first + interval), "opens at \(cap.opensAt())")
        // Capture jitter (a frame 5 ms early) passes too.
        cap.take(now: first + interval)
        #expect(cap.allows(now: first + 2 * interval - 5 * ms))
    }

    /// A 60 fps source is held to 30: a frame half an interval after the last take waits.
    @Test func aFasterSourceIsHeldToTheCap() {
        var cap = FrameRateCap(interval: interval)
        let first: UInt64 = 1_000 * ms
        cap.take(now: first)
        #expect(!cap.allows(now: first + interval / 2))
        #expect(cap.allows(now: first + interval))
    }

    /// Nothing pending (a keyframe request or a refresh of the current picture): time alone decides.
    @Test func withoutCreditOnlyTimeCounts() {
        var cap = FrameRateCap(interval: interval)
        let first: UInt64 = 1_000 * ms
        // Spend the stored credit with a burst at the minimum spacing.
        var now = first
        for _ in 0..<4 {
            now = max(now, cap.opensAt())
            cap.take(now: now)
        }
        #expect(!cap.allows(now: now + 10 * ms))
        #expect(cap.allows(now: now + interval))
    }
}
