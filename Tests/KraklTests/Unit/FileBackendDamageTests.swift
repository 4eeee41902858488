import Foundation
import FrameStamp
import KraklBackendABI
import Testing
@testable import KraklBase
@testable import KraklHost

/// The file backend's reported damage must match the pixels that actually
/// changed: every changed pixel inside a reported rectangle, and no
/// rectangle without a changed pixel. Frames are diffed one by one.
@Suite("File backend: damage matches the pixel diff", .serialized, .tags(.unit))
struct FileBackendDamageTests {
    func run(scene: String, frames: Int, width: Int = 640, height: Int = 480) throws -> FrameCollector {
        try Harness.requireBuild()
        return try FrameCollector.collect(library: Harness.library("BackendFile"), options: [
            "scene": .string(scene), "width": .number("\(width)"), "height": .number("\(height)"),
            "fps": .number("240"), "frames": .number("\(frames)"),
        ])
    }

    /// Checks every frame after the first against its predecessor; returns the mean damage share.
    @discardableResult
    func expectExactDamage(_ frames: [CapturedFrame], sourceLocation: SourceLocation = #_sourceLocation) -> Double {
        var shares: [Double] = []
        for (previous, frame) in zip(frames, frames.dropFirst()) {
            let diff = FrameDiff(previous, frame)
            if frame.damage.isEmpty { shares.append(1); continue }
            if let pixel = diff.uncovered(by: frame.damage) {
                Issue.record("frame \(frame.sequence): pixel (\(pixel.x),\(pixel.y)) changed outside the reported damage", sourceLocation: sourceLocation)
                return 0
            }
            for r in frame.damage where !diff.anyChanged(in: r) {
                Issue.record("frame \(frame.sequence): damage (\(r.x),\(r.y) \(r.width)x\(r.height)) has no changed pixel", sourceLocation: sourceLocation)
                return 0
            }
            shares.append(frame.damage.reduce(0.0) { $0 + Double($1.width * $1.height) } / Double(frame.width * frame.height))
        }
        return shares.reduce(0, +) / Double(max(shares.count, 1))
    }

    @Test func staticSceneDeliversOneFrameThenNothing() throws {
        let run = try run(scene: "static", frames: 60)
        #expect(run.frames.count == 1, "static delivered \(run.frames.count) frames over 60 intervals")
        #expect(run.frames.first?.damage.isEmpty == true, "the first frame must be whole (no damage rectangles)")
    }

    @Test func typingDamageIsExactAndSmall() throws {
        let run = try run(scene: "typing", frames: 90, width: 1280, height: 720)
        #expect(run.frames.count == 90)
        let share = expectExactDamage(run.frames)
        // A few 8×16 cells plus the 1184×16 frame stamp on a 1280×720 screen.
        #expect(share > 0 && share < 0.05, "typing damage share \(share)")
        #expect(run.frames.dropFirst().allSatisfy { !$0.damage.isEmpty })
    }

    @Test func scrollingDamageIsExactAndLarge() throws {
        let run = try run(scene: "scrolling", frames: 60)
        #expect(run.frames.count == 60)
        let share = expectExactDamage(run.frames)
        #expect(share > 0.5, "scrolling damage share \(share)")
    }

    @Test func videoChangesTheWholeFrame() throws {
        let run = try run(scene: "video", frames: 20)
        #expect(run.frames.count == 20)
        for (previous, frame) in zip(run.frames, run.frames.dropFirst()) {
            #expect(frame.damage.isEmpty, "video frames report the whole frame")
            // Most pixels: the moving bright block and the stamp keep some.
            let changed = Double(FrameDiff(previous, frame).changedCount) / Double(frame.width * frame.height)
            #expect(changed > 0.8, "only \(changed) of the pixels changed")
        }
    }

    @Test func framesCarryAReadableStamp() throws {
        let run = try run(scene: "typing", frames: 10)
        for frame in run.frames {
            let stamp = frame.planes[0].withUnsafeBufferPointer {
                FrameStamp.read(packed: $0.baseAddress!, width: frame.width, height: frame.height, stride: frame.width * 4)
            }
            #expect(stamp?.frameNumber == UInt32(frame.sequence))
            #expect(stamp?.captureTimeMs == UInt32(truncatingIfNeeded: frame.timestamp / 1_000_000))
        }
    }
}
