import Foundation
import FrameStamp
import KraklBackendABI
import Testing

/// The frame stamp must survive what the pipeline does to pictures: VP8 at
/// a low bitrate, judged by ffmpeg's own encoder and decoder.
@Suite("Frame stamp", .tags(.integration))
struct FrameStampTests {
    @Test func roundTripAndCorruptionIsDetected() {
        let width = 640, height = 480
        var pixels = [UInt8](repeating: 90, count: width * height * 4)
        let stamp = FrameStamp(frameNumber: 0xDEAD_BEEF, captureTimeMs: 123_456_789)
        pixels.withUnsafeMutableBufferPointer { #expect(stamp.draw(into: $0.baseAddress!, width: width, height: height, stride: width * 4)) }
        let read = pixels.withUnsafeBufferPointer { FrameStamp.read(packed: $0.baseAddress!, width: width, height: height, stride: width * 4) }
        #expect(read == stamp)
        // Flip one data block: the CRC must catch it.
        let block = 2 + 5 // a bit of the frame number
        let perRow = width / 16
        for y in (block / perRow * 16)..<(block / perRow * 16 + 16) {
            for x in (block % perRow * 16 * 4)..<((block % perRow * 16 + 16) * 4) { pixels[y * width * 4 + x] ^= 0xFF }
        }
        let corrupted = pixels.withUnsafeBufferPointer { FrameStamp.read(packed: $0.baseAddress!, width: width, height: height, stride: width * 4) }
        #expect(corrupted == nil)
        #expect(FrameStamp.area(width: 100, height: 20) == nil, "too small a frame has no room for the stamp")
    }

    @Test func survivesVP8AtLowBitrate() throws {
        try Harness.requireBuild()
        guard let ffmpeg = Harness.which("ffmpeg") else {
            skipTest("ffmpeg is not installed (scripts/setup installs it)")
            return
        }
        let run = try FrameCollector.collect(library: Harness.library("BackendFile"), options: [
            "scene": .string("scrolling"), "width": .number("640"), "height": .number("480"), "fps": .number("120"), "frames": .number("45"),
        ])
        let dir = try Harness.temporaryDirectory()
        let raw = Data(run.frames.flatMap { $0.planes[0] })
        try raw.write(to: URL(fileURLWithPath: dir + "/frames.bgr0"))
        let encode = try Harness.run(ffmpeg, ["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr0", "-s", "640x480", "-r", "30",
                                              "-i", dir + "/frames.bgr0", "-c:v", "libvpx", "-b:v", "250k", "-deadline", "realtime",
                                              "-cpu-used", "8", dir + "/out.webm"])
        try #require(encode.status == 0, "\(encode.stderr)")
        let decode = try Harness.run(ffmpeg, ["-v", "error", "-y", "-i", dir + "/out.webm", "-f", "rawvideo", "-pix_fmt", "gray", dir + "/out.gray"])
        try #require(decode.status == 0, "\(decode.stderr)")
        let gray = try Data(contentsOf: URL(fileURLWithPath: dir + "/out.gray"))
        let frameSize = 640 * 480
        #expect(gray.count / frameSize == run.frames.count)
        var read = 0
        gray.withUnsafeBytes { bytes in
            for (index, frame) in run.frames.enumerated() where (index + 1) * frameSize <= gray.count {
                let base = bytes.baseAddress!.assumingMemoryBound(to: UInt8.self) + index * frameSize
                let stamp = FrameStamp.read(width: 640, height: 480) { x, y in base[y * 640 + x] }
                #expect(stamp?.frameNumber == UInt32(frame.sequence), "frame \(index): read \(String(describing: stamp))")
                #expect(stamp?.captureTimeMs == UInt32(truncatingIfNeeded: frame.timestamp / 1_000_000))
                if stamp != nil { read += 1 }
            }
        }
        #expect(read == run.frames.count)
    }
}
