import Foundation
import KraklBackendABI
import Testing
@testable import KraklBase
@testable import KraklHost

/// Y4M playback, judged by ffmpeg: the file is written by ffmpeg, and the
/// frames we deliver must be byte for byte what ffmpeg decodes from it.
@Suite("File backend: Y4M playback", .serialized, .tags(.integration))
struct Y4MPlaybackTests {
    /// A 320×240 clip: a white square moving over a plain background, 15 frames.
    func makeClip(in dir: String) throws -> String? {
        guard let ffmpeg = Harness.which("ffmpeg") else { return nil }
        let clip = dir + "/clip.y4m"
        let result = try Harness.run(ffmpeg, ["-v", "error", "-y",
            "-f", "lavfi", "-i", "color=c=0x336699:s=320x240:r=30:d=0.5",
            "-f", "lavfi", "-i", "color=c=white:s=32x32:r=30:d=0.5",
            "-filter_complex", "[0][1]overlay=x='10+n*9':y=50:shortest=1,format=yuv420p", clip])
        try #require(result.status == 0, "ffmpeg failed: \(result.stderr)")
        return clip
    }

    @Test func framesEqualFfmpegsDecodeAndDamageCoversTheChange() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        guard let clip = try makeClip(in: dir) else {
            skipTest("ffmpeg is not installed (scripts/setup installs it)")
            return
        }
        let reference = dir + "/reference.yuv"
        let decode = try Harness.run(Harness.which("ffmpeg")!, ["-v", "error", "-y", "-i", clip, "-f", "rawvideo", "-pix_fmt", "yuv420p", reference])
        try #require(decode.status == 0, "\(decode.stderr)")
        let expected = try Data(contentsOf: URL(fileURLWithPath: reference))
        let frameSize = 320 * 240 * 3 / 2
        let expectedCount = expected.count / frameSize

        let run = try FrameCollector.collect(library: Harness.library("BackendFile"), options: ["path": .string(clip), "fps": .number("240")])
        #expect(expectedCount == 15)
        #expect(run.frames.count == expectedCount, "delivered \(run.frames.count) frames, ffmpeg decodes \(expectedCount)")
        #expect(run.events.last?.message == "end of file")
        for (index, frame) in run.frames.enumerated() where index < expectedCount {
            #expect(frame.format == KRAKL_FORMAT_I420.rawValue && frame.width == 320 && frame.height == 240)
            let ours = Data(frame.planes.joined())
            #expect(ours == expected.subdata(in: (index * frameSize)..<((index + 1) * frameSize)), "frame \(index) differs from ffmpeg's decode")
        }
        // Damage: the moving 32×32 square's old and new place, in 16×16 tiles.
        for (previous, frame) in zip(run.frames, run.frames.dropFirst()) {
            let diff = FrameDiff(previous, frame)
            #expect(diff.uncovered(by: frame.damage) == nil, "frame \(frame.sequence): a changed pixel is outside the damage")
            let area = frame.damage.reduce(0) { $0 + Int($1.width * $1.height) }
            #expect(area > 0 && area <= 4 * 48 * 48, "frame \(frame.sequence): damage area \(area) px for a 32×32 square moving 9 px")
        }
    }

    @Test func badY4MFilesAreClearErrors() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        try "hello".write(toFile: dir + "/text.y4m", atomically: true, encoding: .utf8)
        try "YUV4MPEG2 W64 H64 F30:1 C444\nFRAME\n".write(toFile: dir + "/c444.y4m", atomically: true, encoding: .utf8)
        // Exit 17: no such file; 16: not a Y4M file; 18: a Y4M we cannot play.
        for (file, message, status) in [("missing.y4m", "cannot open", 17), ("text.y4m", "is not a Y4M file", 16), ("c444.y4m", "C444 is not supported", 18)] as [(String, String, Int32)] {
            let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--option", "path=\(dir)/\(file)", "--frames", "1"])
            #expect(result.status == status && result.stderr.contains(message), "\(file): exit \(result.status): \(result.stderr)")
        }
        // A file cut short inside a frame: an error event, then the source ends; the agent says so (exit 13).
        try ("YUV4MPEG2 W64 H64 F30:1\nFRAME\n" + String(repeating: "x", count: 100)).write(toFile: dir + "/short.y4m", atomically: true, encoding: .utf8)
        let short = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--option", "path=\(dir)/short.y4m", "-q"], timeout: 30)
        #expect(short.status == 13 && short.stderr.contains("truncated"), "exit \(short.status): \(short.stderr)")
    }
}
