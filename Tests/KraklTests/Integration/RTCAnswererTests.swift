import KraklBase
import KraklHost
import Foundation
import Glibc
@testable import FrameStamp
@testable import KraklEncoder
import KraklRTC
import Testing

/// Stamped 640×360 VP8 frames at ~30 fps on a thread of its own, into whatever `deliver` does with them
/// (one publisher, or a fan-out). A keyframe request makes the next frame a keyframe, as the encoder
/// pipeline does.
final class StampedVideoSource: @unchecked Sendable {
    static let width = 640, height = 360
    private let keyframeWanted = LockedBox(true)
    private let running = LockedBox(true)
    private let framesMade = LockedBox(0)
    private var thread: Thread?

    var frames: Int { framesMade.value }

    func requestKeyframe() { keyframeWanted.withLock { $0 = true } }

    func start(deliver: @escaping @Sendable (EncodedFrame) -> Void) throws {
        // Both are the painting thread's alone from here on.
        nonisolated(unsafe) let encoder = try VpxEncoder(codec: .vp8, width: Self.width, height: Self.height, bitrateKbps: 1500, fps: 30, threads: 1)
        nonisolated(unsafe) let image = I420Image(width: Self.width, height: Self.height)
        thread = Thread { [self] in
            var number: UInt32 = 0
            // Bounded: at most two minutes of frames, whatever the test does.
            while running.value, number < 3600 {
                let started = MonotonicClock.nanoseconds()
                Self.paint(image, frame: number, captureMs: UInt32(truncatingIfNeeded: started / 1_000_000))
                let keyframe = keyframeWanted.withLock { wanted in defer { wanted = false }; return wanted }
                if let packets = try? encoder.encode(image, pts: Int64(number) * 3000, duration: 3000, keyframe: keyframe, activeMap: nil) {
                    for packet in packets {
                        deliver(EncodedFrame(data: packet.data, keyframe: packet.keyframe, timestampNs: started, width: Self.width,
                                             height: Self.height, codec: .vp8))
                    }
                }
                framesMade.withLock { $0 += 1 }
                number += 1
                let next = started + 33_333_333
                let now = MonotonicClock.nanoseconds()
                if next > now { usleep(UInt32((next - now) / 1000)) }
            }
        }
        thread?.start()
    }

    func stop() { running.withLock { $0 = false } }

    /// Grey with a bar moving across (so frames differ) and the frame stamp in the luma plane.
    static func paint(_ image: I420Image, frame: UInt32, captureMs: UInt32) {
        memset(image.y, 96, image.strideY * image.height)
        memset(image.u, 128, image.strideUV * image.chromaHeight)
        memset(image.v, 128, image.strideUV * image.chromaHeight)
        let barX = Int(frame * 8) % (image.width - 32)
        for y in 200..<300 { memset(image.y + y * image.strideY + barX, 220, 32) }
        let stamp = FrameStamp(frameNumber: frame, captureTimeMs: captureMs)
        let perRow = image.width / FrameStamp.blockSize
        for (index, bit) in stamp.bits.enumerated() {
            let bx = (index % perRow) * FrameStamp.blockSize, by = (index / perRow) * FrameStamp.blockSize
            for y in by..<(by + FrameStamp.blockSize) { memset(image.y + y * image.strideY + bx, bit ? 255 : 0, FrameStamp.blockSize) }
        }
    }
}

/// One aiortc offerer (Tests/Fixtures/aiortc_offerer.py) and our answering publisher for it.
final class AiortcViewer {
    static var script: String { Harness.repoRoot + "/Tests/Fixtures/aiortc_offerer.py" }
    let process: DtlsTestProcess
    let publisher: Publisher
    let events = LockedBox<[PublisherEvent]>([])
    let closedReasons = LockedBox<[String]>([])

    /// Starts the offerer, answers its offer (addresses: 127.0.0.2 only) and hands it the answer.
    /// - Parameter playoutDelay: add the playout-delay extension (id 14) to aiortc's video offer, as
    ///   Chromium offers it, and ask for 0,0: aiortc then receives packets carrying an extension it
    ///   never negotiated (which it must skip).
    init(iceLite: Bool, loop: EventLoop?, arguments: [String] = [], playoutDelay: Bool = false) throws {
        process = try DtlsTestProcess(RtcPublisherSession.python, [Self.script, "--seconds", "60"] + arguments)
        var offer = try #require(RtcPublisherSession.waitForSdp(process, timeout: 30), "no offer from aiortc: \(process.log)")
        var configuration = PublisherConfiguration()
        if playoutDelay {
            let mark = "m=video "
            let range = try #require(offer.range(of: mark), "no video section in aiortc's offer")
            // Before the section's first attribute line (after m= and c=).
            let firstAttribute = try #require(offer.range(of: "\r\na=", range: range.upperBound..<offer.endIndex))
            offer.insert(contentsOf: "\r\na=extmap:14 http://www.webrtc.org/experiments/rtp-hdrext/playout-delay", at: firstAttribute.lowerBound)
            configuration.playoutDelay = .immediate
        }
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.2")!])
        configuration.label = "Answerer test"
        publisher = try Publisher(answering: offer, configuration: configuration, iceLite: iceLite, loop: loop)
        publisher.onEvent = { [events] event in events.withLock { $0.append(event) } }
        publisher.onClosed = { [closedReasons] reason in closedReasons.withLock { $0.append(reason) } }
        let answer = try #require(publisher.answerSDP)
        #expect(answer.contains("a=extmap:14 http://www.webrtc.org/experiments/rtp-hdrext/playout-delay") == playoutDelay)
        process.type(answer + "\n")
    }

    var connected: Bool { events.withLock { $0.contains { if case .connected = $0 { return true } else { return false } } } }

    /// The offerer's report, after our close() ended its track (or its stdin ends).
    func report(timeout: Double) -> [String: Any]? {
        if let report = RtcPublisherSession.jsonLine(process, marker: "{\"report\"", timeout: timeout) { return report["report"] as? [String: Any] }
        process.stop()
        return RtcPublisherSession.jsonLine(process, marker: "{\"report\"", timeout: 5)?["report"] as? [String: Any]
    }

    static func wait(seconds: Double, until done: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if done() { return true }
            usleep(20_000)
        }
        return done()
    }

    /// What every viewer must have seen: live video whose stamps advance.
    func expectAdvancingVideo(_ report: [String: Any], minimumFrames: Int, _ name: String) {
        let decoded = report["frames_decoded"] as? Int ?? 0
        let distinct = report["distinct_stamps"] as? Int ?? 0
        let first = report["first_stamp"] as? Int ?? -1, last = report["last_stamp"] as? Int ?? -1
        print("\(name): aiortc decoded \(decoded) frames, \(distinct) distinct stamps \(first)…\(last), decreasing \(report["decreasing"] ?? "?"), states \(report["states"] ?? "?"); our stats: \(publisher.stats.framesSent) frames sent, state \(publisher.stats.state), pair \(publisher.stats.selectedPair ?? "-")")
        #expect(report["error"] is NSNull || report["error"] == nil, "\(name): aiortc refused the answer: \(report["error"] ?? "")")
        #expect(decoded >= minimumFrames, "\(name): aiortc decoded \(decoded) frames")
        #expect(distinct >= minimumFrames, "\(name): \(distinct) distinct stamps")
        #expect(last > first, "\(name): stamps did not advance (\(first) → \(last))")
        #expect(report["decreasing"] as? Int == 0, "\(name): stamps went backwards")
        #expect(report["sizes"] as? [String] == ["640x360"])
    }
}

@Suite(.serialized, .tags(.integration, .netns)) struct RTCAnswererTests {
    static func prerequisites() -> Bool {
        guard FileManager.default.isExecutableFile(atPath: RtcPublisherSession.python) else {
            skipTest("\(RtcPublisherSession.python) missing (scripts/setup makes the venv with aiortc)")
            return false
        }
        return true
    }

    /// aiortc offers (recvonly video), we answer, frames flow for ~3 s, our close() ends its track.
    static func oneViewer(iceLite: Bool, arguments: [String] = [], playoutDelay: Bool = false) throws {
        let viewer = try AiortcViewer(iceLite: iceLite, loop: nil, arguments: arguments, playoutDelay: playoutDelay)
        let source = StampedVideoSource()
        viewer.publisher.onKeyframeRequest = { [source] in source.requestKeyframe() }
        viewer.publisher.start()
        try source.start { [publisher = viewer.publisher] frame in
            publisher.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs, width: frame.width, height: frame.height)
        }
        defer { source.stop() }
        #expect(AiortcViewer.wait(seconds: 15) { viewer.connected }, "never connected: \(viewer.events.value) \(viewer.publisher.stats)")
        let startFrames = source.frames
        _ = AiortcViewer.wait(seconds: 10) { source.frames >= startFrames + 90 }
        viewer.publisher.close()
        source.stop()
        let report = try #require(viewer.report(timeout: 20), "no report from aiortc: \(viewer.process.log)")
        viewer.expectAdvancingVideo(report, minimumFrames: 30, iceLite ? "ICE-lite" : "full ICE, controlled")
        #expect(report["track_ended"] as? Bool == true, "our close() (BYE, close_notify) should end aiortc's track")
        #expect(viewer.publisher.stats.iceChecksSent == 0 || !iceLite, "an ICE-lite agent sent \(viewer.publisher.stats.iceChecksSent) checks")
        #expect(viewer.closedReasons.value.isEmpty, "onClosed is for ends we did not ask for")
    }

    @Test func aiortcOffersAndDecodesTheAnswerersVideoIceLite() throws {
        guard Self.prerequisites(), try InNamespace.enter(suite: "RTCAnswererTests") != nil else { return }
        try Self.oneViewer(iceLite: true)
    }

    @Test func aiortcOffersAndDecodesTheAnswerersVideoFullIce() throws {
        guard Self.prerequisites(), try InNamespace.enter(suite: "RTCAnswererTests") != nil else { return }
        try Self.oneViewer(iceLite: false)
    }

    /// The playout-delay extension on the packets (as Chromium viewers get it) does not stop aiortc decoding.
    @Test func aiortcDecodesPacketsCarryingPlayoutDelay() throws {
        guard Self.prerequisites(), try InNamespace.enter(suite: "RTCAnswererTests") != nil else { return }
        try Self.oneViewer(iceLite: true, playoutDelay: true)
    }

    /// An offer with audio and a data channel too: both rejected (port 0), video still flows.
    @Test func audioAndDataChannelAreRejectedAndVideoStillFlows() throws {
        guard Self.prerequisites(), try InNamespace.enter(suite: "RTCAnswererTests") != nil else { return }
        try Self.oneViewer(iceLite: true, arguments: ["--audio", "--datachannel"])
    }

    /// One encoder, two aiortc viewers on one shared network loop, through a VideoFanout.
    @Test func oneEncoderFeedsTwoViewers() throws {
        guard Self.prerequisites(), try InNamespace.enter(suite: "RTCAnswererTests") != nil else { return }
        let loop = try EventLoop(name: "krakl-test-viewers")
        loop.start()
        defer { loop.stop(timeout: .seconds(2)) }
        let fanout = VideoFanout()
        let source = StampedVideoSource()
        let bitrates = LockedBox<[Int]>([])
        let keyframeRequests = LockedBox(0)
        fanout.onKeyframeRequest = { [source] in keyframeRequests.withLock { $0 += 1 }; source.requestKeyframe() }
        fanout.onBitrate = { bps in bitrates.withLock { $0.append(bps) } }
        try source.start { frame in
            fanout.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs, width: frame.width, height: frame.height)
        }
        defer { source.stop() }

        let first = try AiortcViewer(iceLite: true, loop: loop)
        fanout.add(first.publisher)
        first.publisher.start()
        #expect(AiortcViewer.wait(seconds: 15) { first.connected }, "first viewer never connected")
        // The second joins later, while frames already flow: its connect must get it a keyframe.
        _ = AiortcViewer.wait(seconds: 5) { first.publisher.stats.framesSent >= 30 }
        let second = try AiortcViewer(iceLite: true, loop: loop)
        fanout.add(second.publisher)
        second.publisher.start()
        #expect(AiortcViewer.wait(seconds: 15) { second.connected }, "second viewer never connected")
        #expect(fanout.count == 2)
        let mark = source.frames
        _ = AiortcViewer.wait(seconds: 10) { source.frames >= mark + 90 }

        for viewer in [first, second] {
            fanout.remove(viewer.publisher)
            viewer.publisher.close()
        }
        source.stop()
        for (index, viewer) in [first, second].enumerated() {
            let report = try #require(viewer.report(timeout: 20), "no report from viewer \(index + 1): \(viewer.process.log)")
            viewer.expectAdvancingVideo(report, minimumFrames: 30, "viewer \(index + 1) of 2")
        }
        print("fan-out: encoder keyframe requests \(keyframeRequests.value), bitrate reports \(bitrates.value)")
        #expect(keyframeRequests.value >= 2, "each viewer's connect asks for a keyframe (rate-limited, not lost)")
        #expect(loop.isRunning)
    }
}
