import KraklBase
import KraklHost
import Foundation
@testable import KraklRTC
import Testing

/// A `VideoSendStream` on a made-up clock: what it hands to `transmit` is recorded, nothing touches a socket.
final class SendStreamHarness {
    var now: UInt64 = 5_000_000_000
    private(set) var sent: [(bytes: [UInt8], rtcp: Bool)] = []
    private(set) var keyframeRequests = 0
    private(set) var bitrates: [Int] = []
    let stats = RtcStatsCell()
    let stream: VideoSendStream
    static let ssrc: UInt32 = 0x1111_2222
    static let rtxSSRC: UInt32 = 0x3333_4444

    init(rtxPayloadType: UInt8? = 97,
         extensions: [RtpHeaderExtensionKind: UInt8] = [.mid: 1, .absSendTime: 2, .transportWideSequence: 3],
         configure: (inout VideoSendConfiguration) -> Void = { _ in }) {
        var configuration = VideoSendConfiguration()
        configuration.protectedFramePackets = 0  // copies are their own test (RTCPublisherLoopbackTests)
        configure(&configuration)
        let parameters = VideoSendParameters(codec: .vp8, payloadType: 96, rtxPayloadType: rtxPayloadType,
                                             extensions: extensions, mid: "0")
        stream = VideoSendStream(configuration: configuration, parameters: parameters, ssrc: Self.ssrc, rtxSSRC: Self.rtxSSRC,
                                 cname: "test", stats: stats)
        stream.onKeyframeRequest = { [unowned self] in keyframeRequests += 1 }
        stream.onBitrate = { [unowned self] in bitrates.append($0) }
    }

    func poll() {
        stream.poll(now: now, clock: { self.now }, unixNanoseconds: { 1_764_000_000_000_000_000 }) { bytes, rtcp in
            sent.append((bytes, rtcp))
            return .sent
        }
    }

    func advance(ms: UInt64) { now += ms * 1_000_000; poll() }

    /// Packetizes one frame and lets the pacer send it (a few ms on the made-up clock).
    func frame(bytes: Int, keyframe: Bool = false) {
        stream.enqueue([OutgoingVideoFrame(data: [UInt8](repeating: 0x9d, count: bytes), keyframe: keyframe, captureNs: now,
                                           width: 640, height: 360)], queueOverflowed: false, now: now)
        for _ in 0..<50 { advance(ms: 1) }
    }

    var rtp: [RtpPacket] { sent.filter { !$0.rtcp }.compactMap { try? RtpPacket(parsing: $0.bytes) } }

    @discardableResult
    func rtcp(_ packets: [[UInt8]]) -> VideoSendStream.RemoteBye? {
        let bye = stream.handleRtcp(RtcpWriter.compound(packets), now: now, unixNanoseconds: { 1_764_000_000_000_000_000 })
        poll()
        return bye
    }
}

/// A transport-wide feedback packet reporting `count` packets from `base`, all received 1 ms apart
/// (one run-length chunk of "small delta", draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1).
func rtcTransportFeedback(mediaSSRC: UInt32, base: UInt16, count: UInt16, feedbackCount: UInt8) -> [UInt8] {
    var body: [UInt8] = []
    func be32(_ v: UInt32) { body += [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }
    be32(7)
    be32(mediaSSRC)
    body += [UInt8(base >> 8), UInt8(base & 0xff), UInt8(count >> 8), UInt8(count & 0xff)]
    body += [0, 0, 1, feedbackCount]  // reference time 1 (× 64 ms)
    let chunk = UInt16(0x2000) | count  // run length, symbol 01 (small delta)
    body += [UInt8(chunk >> 8), UInt8(chunk & 0xff)]
    body += [UInt8](repeating: 4, count: Int(count))  // 4 × 250 µs
    while body.count % 4 != 0 { body.append(0) }
    let words = (4 + body.count) / 4 - 1
    return [0x80 | 15, 205, UInt8(words >> 8), UInt8(words & 0xff)] + body
}

@Suite(.tags(.unit)) struct RTCVideoSendStreamTests {
    @Test func nothingLeavesBeforeStart() {
        let h = SendStreamHarness()
        #expect(!h.stream.enqueue([OutgoingVideoFrame(data: [1, 2, 3], keyframe: true, captureNs: h.now, width: 64, height: 64)],
                                  queueOverflowed: false, now: h.now))
        h.advance(ms: 100)
        #expect(h.sent.isEmpty)
        #expect(h.stream.nextDeadline(now: h.now) == nil)
    }

    @Test func startAsksForAKeyframeAndReportsTheTarget() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        #expect(h.keyframeRequests == 1)
        #expect(h.bitrates == [2_500_000])
    }

    @Test func aKeyframeMadeWhileConnectingIsNotAskedForAgain() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now, keyframeReady: true)
        #expect(h.keyframeRequests == 0, "the chain encoded while connecting starts with a keyframe")
        #expect(h.bitrates == [2_500_000])
    }

    @Test func framesArePacketizedWithTheNegotiatedExtensions() throws {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        h.frame(bytes: 3000, keyframe: true)
        let packets = h.rtp
        try #require(packets.count == 3, "3000 bytes at 1200 a packet: \(packets.count) packets")
        #expect(packets.allSatisfy { $0.ssrc == SendStreamHarness.ssrc && $0.payloadType == 96 })
        #expect(packets.map(\.marker) == [false, false, true])
        #expect(packets.allSatisfy { $0.extensionData(id: 1) == Array("0".utf8) && $0.extensionData(id: 2) != nil })
        let twcc = packets.compactMap { $0.extensionData(id: 3) }.map { UInt16($0[0]) << 8 | UInt16($0[1]) }
        #expect(twcc == [0, 1, 2])
        #expect(h.stats.snapshot.framesSent == 1 && h.stats.snapshot.keyframesSent == 1 && h.stats.snapshot.packetsSent == 3)
    }

    @Test func playoutDelayGoesOnKeyframesAndFirstPacketsOnlyWhenNegotiatedAndConfigured() throws {
        let all: [RtpHeaderExtensionKind: UInt8] = [.mid: 1, .absSendTime: 2, .transportWideSequence: 3, .playoutDelay: 5]
        // Negotiated and configured (0 and 1 s, to see both 12-bit halves): id 5, min 0 / max 100 × 10 ms.
        let h = SendStreamHarness(extensions: all) { $0.playoutDelay = PlayoutDelay(minimum: .zero, maximum: .seconds(1)) }
        h.stream.start(now: h.now)
        h.frame(bytes: 3000, keyframe: true)
        h.frame(bytes: 3000)
        let packets = h.rtp
        try #require(packets.count == 6)
        let delays = packets.map { $0.extensionData(id: 5) }
        #expect(delays == [[0x00, 0x00, 0x64], [0x00, 0x00, 0x64], [0x00, 0x00, 0x64], [0x00, 0x00, 0x64], nil, nil],
                "every keyframe packet, then the delta frame's first packet: \(delays)")
        #expect(packets.allSatisfy { $0.extensionData(id: 1) == Array("0".utf8) && $0.extensionData(id: 3) != nil })
        // The wire form: min in the high 12 bits.
        let longest = try #require(PlayoutDelay(minimum: .milliseconds(40950), maximum: .milliseconds(40950)))
        #expect(RtpHeaderExtension.playoutDelay(id: 7, longest).data == [0xFF, 0xFF, 0xFF])
        let short = try #require(PlayoutDelay(minimum: .milliseconds(20), maximum: .milliseconds(30)))
        #expect(RtpHeaderExtension.playoutDelay(id: 7, short).data == [0x00, 0x20, 0x03])
        #expect(PlayoutDelay(minimum: .milliseconds(50), maximum: .milliseconds(40)) == nil)
        #expect(PlayoutDelay(minimum: .zero, maximum: .milliseconds(40960)) == nil)

        // The viewer's setting.
        #expect(PlayoutDelay.setting(nil) == .immediate && PlayoutDelay.setting(" ") == .immediate && PlayoutDelay.setting("off") == nil)
        #expect(PlayoutDelay.setting("20, 100") == PlayoutDelay(minimum: .milliseconds(20), maximum: .milliseconds(100)))
        #expect(["100,20", "5", "a,b", "1,2,3", "-10,0", ",", "0,99999"].allSatisfy { PlayoutDelay.setting($0) == .immediate })
        #expect(["100,20", "5", "a,b"].allSatisfy { PlayoutDelay.reading($0).problem != nil } && PlayoutDelay.reading("20,100").problem == nil)

        // Configured but not negotiated, and negotiated but not configured: never written.
        for h in [SendStreamHarness { $0.playoutDelay = .immediate }, SendStreamHarness(extensions: all)] {
            h.stream.start(now: h.now)
            h.frame(bytes: 3000, keyframe: true)
            h.frame(bytes: 100)
            #expect(h.rtp.count == 4)
            #expect(h.rtp.allSatisfy { $0.extensionData(id: 5) == nil && $0.extensions.map(\.id).sorted() == [1, 2, 3] })
        }
    }

    @Test(arguments: [true, false])
    func nackResendsFromHistory(rtx: Bool) throws {
        let h = SendStreamHarness(rtxPayloadType: rtx ? 97 : nil)
        h.stream.start(now: h.now)
        h.frame(bytes: 3000, keyframe: true)
        h.frame(bytes: 500)
        let original = try #require(h.rtp.first)
        let before = h.rtp.count
        h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: [original.sequenceNumber])])
        for _ in 0..<10 { h.advance(ms: 1) }
        let resent = Array(h.rtp.dropFirst(before))
        // Two copies (VideoSendConfiguration.retransmissionCopies, issue 26), each a full resend.
        try #require(resent.count == 2, "two copies for one NACKed packet, got \(resent.count)")
        for copy in resent {
            if rtx {
                // RFC 4588: rtx SSRC and payload type, the original sequence number first in the payload.
                #expect(copy.ssrc == SendStreamHarness.rtxSSRC && copy.payloadType == 97)
                #expect(Array(copy.payload.prefix(2)) == [UInt8(original.sequenceNumber >> 8), UInt8(original.sequenceNumber & 0xff)])
                #expect(Array(copy.payload.dropFirst(2)) == original.payload)
            } else {
                #expect(copy.ssrc == SendStreamHarness.ssrc && copy.sequenceNumber == original.sequenceNumber)
                #expect(copy.payload == original.payload)
            }
        }
        if rtx { #expect(resent[1].sequenceNumber == resent[0].sequenceNumber &+ 1, "each RTX copy has the next RTX sequence number") }
        #expect(h.stats.snapshot.nacksReceived == 1 && h.stats.snapshot.retransmittedPackets == 2)

        // The same NACK again at once (less than an RTT later) is not answered again.
        h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: [original.sequenceNumber])])
        for _ in 0..<10 { h.advance(ms: 1) }
        #expect(h.rtp.count == before + 2)
        // A NACK for another SSRC, or for a packet never sent, sends nothing.
        h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: 99, lost: [original.sequenceNumber &+ 1])])
        h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: [original.sequenceNumber &- 100])])
        for _ in 0..<10 { h.advance(ms: 1) }
        #expect(h.rtp.count == before + 2)
    }

    /// Issue 26: aiortc asks for a lost packet only when it sees a new gap and forgets it once 128 newer
    /// packets came, so a packet whose resend is lost as well may never be asked for again (a 2.5 s freeze
    /// at 5 % loss). Every resend goes out twice, as two RTX packets, the second copies after all the first.
    @Test func aResendGoesOutTwice() throws {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        h.frame(bytes: 3000, keyframe: true)
        let sequences = h.rtp.map(\.sequenceNumber)
        try #require(sequences.count == 3)
        /// What a NACK for `lost` sends within 10 ms, as the original sequence numbers (RTX: first in the payload).
        func nack(_ lost: [UInt16]) -> [UInt16] {
            let before = h.rtp.count
            h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: lost)])
            for _ in 0..<10 { h.advance(ms: 1) }
            let resent = h.rtp.dropFirst(before)
            #expect(resent.allSatisfy { $0.ssrc == SendStreamHarness.rtxSSRC && $0.payloadType == 97 })
            #expect(Set(resent.map(\.sequenceNumber)).count == resent.count, "each RTX packet has its own sequence number")
            return resent.map { UInt16($0.payload[0]) << 8 | UInt16($0.payload[1]) }
        }

        #expect(nack([sequences[0]]) == [sequences[0], sequences[0]])
        // Asked again at once: those resends are still on their way (the NACK crossed them), so nothing.
        #expect(nack([sequences[0]]) == [])
        // Asked again later (past the window: 1.5 × the 20 ms assumed before an RTT is known): both were lost.
        h.advance(ms: 50)
        #expect(nack([sequences[0]]) == [sequences[0], sequences[0]])
        #expect(nack([sequences[1], sequences[2]]) == [sequences[1], sequences[2], sequences[1], sequences[2]])
        // A packet no longer (or never) in the history is refused.
        #expect(nack([sequences[0] &- 100]) == [])

        let stats = h.stats.snapshot
        #expect(stats.nackedPackets == 6, "six namings in five NACKs")
        #expect(stats.nackedPacketsResent == 4 && stats.nackedPacketsInFlight == 1 && stats.nackedPacketsRefused == 1)
        #expect(stats.retransmissionsRepeated == 4 && stats.retransmittedPackets == 8)
    }

    @Test func oneCopyWhenSoConfigured() {
        let h = SendStreamHarness { $0.retransmissionCopies = 1 }
        h.stream.start(now: h.now)
        h.frame(bytes: 1000, keyframe: true)
        let sequence = h.rtp[0].sequenceNumber
        for _ in 0..<2 {
            h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: [sequence])])
            h.advance(ms: 50)
        }
        #expect(h.stats.snapshot.retransmittedPackets == 2 && h.stats.snapshot.retransmissionsRepeated == 0,
                "asked twice, 50 ms apart: one resend each, got \(h.stats.snapshot.retransmittedPackets)")
    }

    @Test func anOutageSizedNackGetsAKeyframeInstead() {
        let h = SendStreamHarness { $0.nackBurstLimit = 4 }
        h.stream.start(now: h.now)
        h.frame(bytes: 100, keyframe: true)
        h.advance(ms: 400)
        let requests = h.keyframeRequests
        let before = h.rtp.count
        h.rtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc, lost: Array(0..<10))])
        #expect(h.keyframeRequests == requests + 1)
        #expect(h.rtp.count == before)
    }

    @Test func pliAsksForAKeyframeRateLimitedAndCoalesced() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        #expect(h.keyframeRequests == 1)
        h.frame(bytes: 100, keyframe: true)
        h.advance(ms: 400)
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        #expect(h.keyframeRequests == 2)
        #expect(h.stats.snapshot.plisReceived == 1)
        // Two more within the interval: not now, one at its end.
        h.advance(ms: 10)
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        #expect(h.keyframeRequests == 2)
        let due = h.stream.nextDeadline(now: h.now)
        #expect(due != nil && due! <= h.now + 300_000_000)
        h.advance(ms: 300)
        #expect(h.keyframeRequests == 3)
        h.advance(ms: 1000)
        #expect(h.keyframeRequests == 3, "coalesced into one request")
        // A PLI for someone else's stream is not ours to answer.
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: 12345)])
        #expect(h.keyframeRequests == 3)
    }

    @Test func aPliWhileTheKeyframeWaitsInThePacerIsSuppressed() {
        // The start-up probe off: this is about a keyframe the pacer holds, as a later one on a slow path is.
        let h = SendStreamHarness { $0.startBitrate = 150_000; $0.minimumBitrate = 150_000; $0.startupProbeCeiling = 0 }
        h.stream.start(now: h.now)
        // A 60 kB keyframe at 150 kbit/s × 2.5 takes over a second to leave.
        h.stream.enqueue([OutgoingVideoFrame(data: [UInt8](repeating: 1, count: 60_000), keyframe: true, captureNs: h.now, width: 64, height: 64)],
                         queueOverflowed: false, now: h.now)
        h.advance(ms: 1)
        h.advance(ms: 400)
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        #expect(h.keyframeRequests == 1)
        #expect(h.stats.snapshot.keyframeRequestsSuppressed == 1)
    }

    @Test func anSfusPliWhileTheKeyframeIsLeavingIsAnswered() {
        // The same slow keyframe, but the requests come from an SFU: the PLI is for a subscriber that
        // joined after the keyframe began to leave, which the keyframe in the pacer does not reach whole.
        let h = SendStreamHarness {
            $0.startBitrate = 150_000; $0.minimumBitrate = 150_000; $0.startupProbeCeiling = 0
            $0.keyframeRequestSender = .anSfu
        }
        h.stream.start(now: h.now)
        h.stream.enqueue([OutgoingVideoFrame(data: [UInt8](repeating: 1, count: 60_000), keyframe: true, captureNs: h.now, width: 64, height: 64)],
                         queueOverflowed: false, now: h.now)
        h.advance(ms: 1)
        #expect(h.rtp.count > 0, "part of the keyframe has left")
        h.advance(ms: 400)
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        #expect(h.keyframeRequests == 2)
        #expect(h.stats.snapshot.keyframeRequestsSuppressed == 0)
        // Still at most one request per interval: two more right away coalesce into one at its end.
        h.advance(ms: 10)
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        h.rtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: SendStreamHarness.ssrc)])
        #expect(h.keyframeRequests == 2)
        h.advance(ms: 300)
        #expect(h.keyframeRequests == 3)
    }

    @Test func firWithARepeatedSequenceNumberIsOneRequest() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        h.advance(ms: 400)
        let fir = RtcpWriter.fullIntraRequest(senderSSRC: 7, entries: [RtcpFirEntry(ssrc: SendStreamHarness.ssrc, sequenceNumber: 5)])
        h.rtcp([fir])
        h.advance(ms: 400)
        h.rtcp([fir])
        #expect(h.keyframeRequests == 2)
        #expect(h.stats.snapshot.firsReceived == 2)
    }

    @Test func byeEndsTheSessionWithThePrintableReason() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        #expect(h.rtcp([RtcpWriter.receiverReport(ssrc: 7, reports: [])]) == nil)
        let bye = h.rtcp([rtcHandBuiltBye(ssrcs: [7], reason: Array("room\u{7}closed".utf8))])
        #expect(bye == VideoSendStream.RemoteBye(reason: "roomclosed"))
        #expect(h.rtcp([rtcHandBuiltBye(ssrcs: [7], reason: nil)]) == VideoSendStream.RemoteBye(reason: nil))
    }

    @Test func rembLowersTheTargetAndThePacer() throws {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        h.rtcp([RtcpWriter.remb(senderSSRC: 7, bitrate: 400_000, ssrcs: [SendStreamHarness.ssrc])])
        let last = try #require(h.bitrates.last)
        #expect(last <= 400_000 && last >= 150_000, "REMB 400 kbit/s: target \(last)")
        #expect(h.stats.snapshot.rembBitrate == 400_000)
    }

    @Test func transportFeedbackReachesTheEstimator() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        for _ in 0..<10 { h.frame(bytes: 2000) }
        let sent = UInt16(h.rtp.count)
        h.rtcp([rtcTransportFeedback(mediaSSRC: SendStreamHarness.ssrc, base: 0, count: sent, feedbackCount: 0)])
        #expect(h.stats.snapshot.transportFeedbacks == 1)
        #expect((h.stats.snapshot.ackedBitrate ?? 0) > 0 || h.stats.snapshot.delayBasedBitrate != nil,
                "the estimator saw no acknowledged packets: \(h.stats.snapshot)")
    }

    @Test func senderReportsFollowTheIntervalOnceMediaLeft() throws {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        h.advance(ms: 600)
        #expect(h.sent.filter(\.rtcp).isEmpty, "no SR before any media packet")
        h.frame(bytes: 500)
        h.advance(ms: 1000)
        let reports = h.sent.filter(\.rtcp)
        try #require(!reports.isEmpty)
        let parsed = try RtcpPacket.parseCompound(reports[0].bytes)
        guard case .senderReport(let sr) = parsed.first else { Issue.record("not an SR: \(parsed)"); return }
        #expect(sr.ssrc == SendStreamHarness.ssrc && sr.packetCount == 1)
    }

    @Test func theLimiterCoalescesIntoOneRequestAtTheEndOfTheInterval() {
        var limiter = KeyframeRequestLimiter(interval: .nanoseconds(300))
        var answers: [Bool] = []
        answers.append(limiter.request(now: 1000))
        answers.append(limiter.request(now: 1100))
        answers.append(limiter.request(now: 1200))
        #expect(limiter.deferredUntil == 1300)
        answers.append(limiter.takeDue(now: 1299))
        answers.append(limiter.takeDue(now: 1300))
        answers.append(limiter.takeDue(now: 2000))
        answers.append(limiter.request(now: 1700))
        #expect(answers == [true, false, false, false, true, false, true])
    }
}

@Suite(.tags(.unit)) struct RTCVideoFanoutTests {
    /// Answering publishers on loopback that never connect: enough to see the fan-out's rules.
    static func peer() throws -> Publisher {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!], includeLoopback: true)
        return try Publisher(answering: RTCSdpAnswerTests.chromiumOffer, configuration: configuration)
    }

    @Test func theTargetFollowsTheWeakestPeerAboveTheFloor() throws {
        let fanout = VideoFanout(floorBitrate: 300_000)
        let bitrates = LockedBox<[Int]>([])
        fanout.onBitrate = { bps in bitrates.withLock { $0.append(bps) } }
        let a = try Self.peer(), b = try Self.peer()
        defer { a.close(); b.close() }
        fanout.add(a)
        fanout.add(b)
        #expect(fanout.count == 2)
        a.onBitrate?(2_000_000)
        b.onBitrate?(800_000)
        a.onBitrate?(2_100_000)  // not the lowest: no change
        b.onBitrate?(100_000)    // below the floor
        #expect(bitrates.value == [2_000_000, 800_000, 300_000])
        fanout.remove(b)
        #expect(bitrates.value.last == 2_100_000, "the weak peer left: the others' estimate counts")
        #expect(fanout.count == 1)
    }

    @Test func keyframeRequestsAreRateLimitedAcrossPeers() throws {
        let fanout = VideoFanout(keyframeInterval: .milliseconds(200))
        let requests = LockedBox(0)
        fanout.onKeyframeRequest = { requests.withLock { $0 += 1 } }
        let a = try Self.peer(), b = try Self.peer()
        defer { a.close(); b.close() }
        fanout.add(a)
        fanout.add(b)
        a.onKeyframeRequest?()
        b.onKeyframeRequest?()
        a.onKeyframeRequest?()
        #expect(requests.value == 1, "three requests at once reach the encoder once")
        // The coalesced one follows after the interval (bounded wait, no timing assertion beyond "eventually").
        let deadline = Date().addingTimeInterval(5)
        while requests.value < 2, Date() < deadline { usleep(10_000) }
        #expect(requests.value == 2)
    }
}

/// A value behind a lock, for test callbacks on other threads.
final class LockedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { self.stored = value }
    var value: Value { lock.lock(); defer { lock.unlock() }; return stored }
    func withLock<R>(_ body: (inout Value) -> R) -> R { lock.lock(); defer { lock.unlock() }; return body(&stored) }
}

/// The first keyframe after connecting as a probe of the path (StartupProbe, issue 17).
@Suite(.tags(.unit)) struct RTCStartupProbeStreamTests {
    /// Enqueues one keyframe of `bytes` and advances the made-up clock 1 ms at a time until the pacer let
    /// it all out (bounded); returns the made-up milliseconds it took.
    static func sendKeyframe(_ h: SendStreamHarness, bytes: Int, between: (Int) -> Void = { _ in }) -> Int {
        let before = h.rtp.count
        let start = h.now
        h.stream.enqueue([OutgoingVideoFrame(data: [UInt8](repeating: 0x9d, count: bytes), keyframe: true, captureNs: h.now,
                                             width: 1920, height: 1080)], queueOverflowed: false, now: h.now)
        // Until the frame's last packet (the marker bit) left, at most 5 s of the made-up clock.
        var step = 0
        while step < 5000 && !(h.rtp.count > before && h.rtp.last!.marker) {
            between(step)
            h.advance(ms: 1)
            step += 1
        }
        return Int((h.now - start) / 1_000_000)
    }

    @Test func theFirstKeyframeLeavesAtTheProbedRateAndTheSecondAtThePacingRate() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        // 400 kB at 2.5 × 2.5 Mbit/s would take 512 ms; doubling from 12.5 Mbit/s every 15 ms to 60 Mbit/s: under 100 ms.
        let first = Self.sendKeyframe(h, bytes: 400_000)
        #expect(first < 120, "the first keyframe took \(first) ms of the made-up clock")
        #expect(h.stream.startupProbe.state == .finished)
        let stats = h.stats.snapshot
        #expect(stats.startupProbeBytes >= 400_000)
        #expect(stats.startupProbePeakRate == 60_000_000, "peak \(stats.startupProbePeakRate)")
        // The probe is over: a later keyframe is paced at 2.5 × the estimate again.
        h.advance(ms: 500)
        let second = Self.sendKeyframe(h, bytes: 200_000)
        #expect(second >= 200, "the second keyframe took \(second) ms; at 6.25 Mbit/s it takes 256")
        #expect(h.stats.snapshot.startupProbeBytes == stats.startupProbeBytes)
    }

    @Test func reportedLossDuringTheProbeEndsIt() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        let took = Self.sendKeyframe(h, bytes: 400_000) { step in
            guard step == 20 else { return }
            // 10 % lost: the path did not carry the burst.
            let block = RtcpReportBlock(ssrc: SendStreamHarness.ssrc, fractionLost: 26, cumulativeLost: 5, extendedHighestSequence: 100,
                                        jitter: 0, lastSenderReport: 0, delaySinceLastSenderReport: 0)
            h.rtcp([RtcpWriter.receiverReport(ssrc: 7, reports: [block])])
        }
        #expect(h.stream.startupProbe.state == .stopped)
        // The rest left at the pacing rate: 2.5 × the estimate, which 10 % loss took to 2.4 Mbit/s.
        #expect(took > 250, "after the loss report the keyframe should have been paced at the estimate: \(took) ms")
        #expect(h.stats.snapshot.startupProbeBytes > 0 && h.stats.snapshot.startupProbeBytes < 400_000)
    }

    @Test func smallLossDoesNotEndTheProbeAndNoProbeWithoutAKeyframe() {
        let h = SendStreamHarness()
        h.stream.start(now: h.now)
        // Delta frames before the first keyframe do not start it.
        h.frame(bytes: 3000)
        #expect(h.stream.startupProbe.state == .waiting)
        let block = RtcpReportBlock(ssrc: SendStreamHarness.ssrc, fractionLost: 2, cumulativeLost: 1, extendedHighestSequence: 10,
                                    jitter: 0, lastSenderReport: 0, delaySinceLastSenderReport: 0)
        h.rtcp([RtcpWriter.receiverReport(ssrc: 7, reports: [block])])
        #expect(h.stream.startupProbe.state == .waiting, "1 % loss is no reason to give up the probe")
        _ = Self.sendKeyframe(h, bytes: 100_000)
        #expect(h.stream.startupProbe.state == .finished)
    }
}

