import Testing
@testable import KraklRTC

@Suite(.tags(.unit)) struct RTCRtcpTests {
    @Test func senderReportAndSdesAreByteExact() {
        let ntp = NtpTime.from(unixNanoseconds: 1_700_000_000_500_000_000)
        #expect(ntp == 0xE8FE_6F80_8000_0000, "1700000000.5 s after 1970 is 3908988800.5 s after 1900")
        let sr = RtcpWriter.senderReport(RtcpSenderReport(ssrc: 0x5566_7788, ntpTime: ntp, rtpTimestamp: 0x0102_0304,
                                                          packetCount: 10, octetCount: 12000))
        let sdes = RtcpWriter.sourceDescription(ssrc: 0x5566_7788, cname: "krakl")
        // RFC 3550 §6.4.1 (SR) and §6.5 (SDES with one CNAME chunk, null-terminated, padded to 32 bits).
        let expected: [UInt8] = [
            0x80, 0xC8, 0x00, 0x06, 0x55, 0x66, 0x77, 0x88, 0xE8, 0xFE, 0x6F, 0x80, 0x80, 0x00, 0x00, 0x00,
            0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x0A, 0x00, 0x00, 0x2E, 0xE0,
            0x81, 0xCA, 0x00, 0x03, 0x55, 0x66, 0x77, 0x88, 0x01, 0x05, 0x6B, 0x72, 0x61, 0x6B, 0x6C, 0x00,
        ]
        #expect(RtcpWriter.compound([sr, sdes]) == expected)
        #expect(NtpTime.compact(ntp) == 0x6F80_8000)
    }

    @Test func compoundReadsBackWhatWasWritten() throws {
        let block = RtcpReportBlock(ssrc: 9, fractionLost: 3, cumulativeLost: -5, extendedHighestSequence: 70000, jitter: 12,
                                    lastSenderReport: 0xAABB_CCDD, delaySinceLastSenderReport: 0x10000)
        let sr = RtcpSenderReport(ssrc: 1, ntpTime: 42, rtpTimestamp: 43, packetCount: 44, octetCount: 45, reports: [block])
        let bytes = RtcpWriter.compound([RtcpWriter.senderReport(sr), RtcpWriter.sourceDescription(ssrc: 1, cname: "abcd"), RtcpWriter.bye(ssrcs: [1])])
        let packets = try RtcpPacket.parseCompound(bytes)
        #expect(packets == [.senderReport(sr), .sourceDescription([(1, "abcd")]), .bye(ssrcs: [1], reason: nil)])
    }

    @Test func receiverReportGivesLossJitterAndRoundTrip() throws {
        let bytes: [UInt8] = [
            0x81, 0xC9, 0x00, 0x07,   // V=2, RC=1, PT=201 RR, length 7 words
            0x11, 0x22, 0x33, 0x44,   // reporter
            0x55, 0x66, 0x77, 0x88,   // our SSRC
            0x40,                     // fraction lost 64/256
            0xFF, 0xFF, 0xFE,         // cumulative lost −2 (24-bit two's complement)
            0x00, 0x01, 0xFF, 0xFF,   // one wrap, highest sequence 65535
            0x00, 0x00, 0x01, 0x00,   // jitter 256
            0x12, 0x34, 0x56, 0x78,   // LSR
            0x00, 0x01, 0x80, 0x00,   // DLSR 1.5 s
        ]
        let packets = try RtcpPacket.parseCompound(bytes)
        guard case .receiverReport(let ssrc, let reports)? = packets.first else {
            Issue.record("not a receiver report: \(packets)")
            return
        }
        #expect(ssrc == 0x1122_3344)
        let r = try #require(reports.first)
        #expect(r.ssrc == 0x5566_7788)
        #expect(r.lossFraction == 0.25)
        #expect(r.cumulativeLost == -2)
        #expect(r.extendedHighestSequence == 0x1FFFF)
        #expect(r.jitter == 256)
        // Arrival 1.75 s after the SR was sent: 1.75 − 1.5 = 0.25 s round trip.
        #expect(r.roundTripSeconds(arrivalCompactNtp: 0x1234_5678 &+ 0x0001_C000) == 0.25)
        #expect(r.roundTripSeconds(arrivalCompactNtp: 0x1234_5678) == nil, "negative RTT is rejected")
        var noSR = r
        noSR.lastSenderReport = 0
        #expect(noSR.roundTripSeconds(arrivalCompactNtp: 0x1234_5678) == nil)
    }

    @Test func pliFirNackRemb() throws {
        let pli: [UInt8] = [0x81, 0xCE, 0x00, 0x02, 0, 0, 0, 1, 0, 0, 0, 2]
        let fir: [UInt8] = [0x84, 0xCE, 0x00, 0x04, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0x07, 0, 0, 0]
        // NACK PID 100, BLP 0x8005: bits 0, 2 and 15 → 101, 103, 116 (RFC 4585 §6.2.1).
        let nack: [UInt8] = [0x81, 0xCD, 0x00, 0x03, 0, 0, 0, 1, 0, 0, 0, 2, 0x00, 0x64, 0x80, 0x05]
        // REMB: one SSRC, exponent 3, mantissa 125000 → 1 000 000 bit/s (draft-alvestrand-rmcat-remb-03 §2.2).
        let remb: [UInt8] = [0x8F, 0xCE, 0x00, 0x05, 0, 0, 0, 1, 0, 0, 0, 0, 0x52, 0x45, 0x4D, 0x42,
                             0x01, 0x0D, 0xE8, 0x48, 0x55, 0x66, 0x77, 0x88]
        let packets = try RtcpPacket.parseCompound(pli + fir + nack + remb)
        #expect(packets == [
            .pictureLossIndication(senderSSRC: 1, mediaSSRC: 2),
            .fullIntraRequest(senderSSRC: 1, entries: [RtcpFirEntry(ssrc: 2, sequenceNumber: 7)]),
            .nack(senderSSRC: 1, mediaSSRC: 2, lost: [100, 101, 103, 116]),
            .remb(senderSSRC: 1, bitrate: 1_000_000, ssrcs: [0x5566_7788]),
        ])
        #expect(RtcpWriter.pictureLossIndication(senderSSRC: 1, mediaSSRC: 2) == pli)
        #expect(RtcpWriter.fullIntraRequest(senderSSRC: 1, entries: [RtcpFirEntry(ssrc: 2, sequenceNumber: 7)]) == fir)
        #expect(RtcpWriter.nack(senderSSRC: 1, mediaSSRC: 2, lost: [100, 101, 103, 116]) == nack)
        // The writer picks the smallest exponent: 2 and 250000 (0x3D090) say the same 1 Mbit/s more precisely.
        var smallestExponent = remb
        smallestExponent.replaceSubrange(17..<20, with: [0x0B, 0xD0, 0x90])
        #expect(RtcpWriter.remb(senderSSRC: 1, bitrate: 1_000_000, ssrcs: [0x5566_7788]) == smallestExponent)
        #expect(try RtcpPacket.parseCompound(smallestExponent) == [.remb(senderSSRC: 1, bitrate: 1_000_000, ssrcs: [0x5566_7788])])
    }

    @Test func nackAcrossTheSequenceWrap() throws {
        let bytes = RtcpWriter.nack(senderSSRC: 1, mediaSSRC: 2, lost: [65534, 65535, 0, 1, 40])
        guard case .nack(_, _, let lost)? = try RtcpPacket.parseCompound(bytes).first else {
            Issue.record("no NACK")
            return
        }
        #expect(lost == [65534, 65535, 0, 1, 40])
        #expect(bytes.count == 12 + 8, "two FCI entries: 65534 with BLP for 65535, 0, 1; then 40")
    }

    /// Expected arrivals from a reference time and the receive deltas (µs) a test vector lists.
    static func arrivals(reference: Int64, deltas: [Int64?]) -> [Int64?] {
        var t = reference * 64_000
        return deltas.map { d in d.map { t += $0; return t } }
    }

    static func feedback(_ bytes: [UInt8]) throws -> TransportWideFeedback {
        let packets = try RtcpPacket.parseCompound(bytes)
        guard packets.count == 1, case .transportFeedback(let f) = packets[0] else {
            throw RtcpError.badFeedback("expected one transport-cc packet, got \(packets)")
        }
        return f
    }

    // Byte vectors from pion/rtcp's transport_layer_cc_test.go (TestTransportLayerCC_Unmarshal
    // example1/3/4/6 and TestTransportLayerCC_Marshal example6); deltas are the values that test expects.
    @Test func twccPionExample1RunLengthOneSmallDelta() throws {
        let f = try Self.feedback([0xaf, 0xcd, 0x0, 0x5, 0xfa, 0x17, 0xfa, 0x17, 0x43, 0x3, 0x2f, 0xa0,
                                   0x0, 0x99, 0x0, 0x1, 0x3d, 0xe8, 0x2, 0x17, 0x20, 0x1, 0x94, 0x1])
        #expect(f.senderSSRC == 4_195_875_351)
        #expect(f.mediaSSRC == 1_124_282_272)
        #expect(f.baseSequenceNumber == 153)
        #expect(f.referenceTime == 4_057_090)
        #expect(f.feedbackCount == 23)
        #expect(f.packets.map(\.sequenceNumber) == [153])
        #expect(f.packets.map(\.arrivalMicroseconds) == Self.arrivals(reference: 4_057_090, deltas: [37000]))
    }

    @Test func twccPionExample3LargeDeltasInRuns() throws {
        let f = try Self.feedback([0xaf, 0xcd, 0x0, 0x7, 0xfa, 0x17, 0xfa, 0x17, 0x19, 0x3d, 0xd8, 0xbb, 0x1, 0x74, 0x0, 0x6,
                                   0x45, 0xb1, 0x5a, 0x40, 0x40, 0x2, 0x20, 0x04, 0x1f, 0xfe, 0x1f, 0x9a, 0xd0, 0x0, 0xd0, 0x0])
        #expect(f.baseSequenceNumber == 372)
        #expect(f.referenceTime == 4_567_386)
        #expect(f.feedbackCount == 64)
        #expect(f.packets.map(\.sequenceNumber) == Array(372...377))
        #expect(f.packets.map(\.arrivalMicroseconds) == Self.arrivals(reference: 4_567_386, deltas: [2047500, 2022500, 52000, 0, 52000, 0]))
    }

    @Test func twccPionExample4SmallDeltaRun() throws {
        let f = try Self.feedback([0xaf, 0xcd, 0x0, 0x7, 0xfa, 0x17, 0xfa, 0x17, 0x19, 0x3d, 0xd8, 0xbb, 0x0, 0x4, 0x0, 0x7,
                                   0x10, 0x63, 0x6e, 0x1, 0x20, 0x7, 0x4c, 0x24, 0x24, 0x10, 0xc, 0xc, 0x10, 0x0, 0x0, 0x3])
        #expect(f.packets.map(\.sequenceNumber) == Array(4...10))
        #expect(f.referenceTime == 1_074_030)
        #expect(f.packets.map(\.arrivalMicroseconds) == Self.arrivals(reference: 1_074_030, deltas: [19000, 9000, 9000, 4000, 3000, 3000, 4000]))
    }

    @Test func twccPionExample6TwoBitVectorThenLostRun() throws {
        let f = try Self.feedback([0xaf, 0xcd, 0x0, 0x7, 0x9b, 0x74, 0xf6, 0x1f, 0x93, 0x71, 0xdc, 0xbc, 0x85, 0x3c, 0x0, 0x9,
                                   0x63, 0xf9, 0x16, 0xb3, 0xd5, 0x52, 0x0, 0x30, 0x9b, 0xaa, 0x6a, 0xaa, 0x7b, 0x1, 0x9, 0x1])
        #expect(f.baseSequenceNumber == 34108)
        #expect(f.feedbackCount == 179)
        #expect(f.packets.map(\.sequenceNumber) == Array(34108...34116))
        #expect(f.packets.map(\.received) == [true, true, true, true, true, false, true, false, false])
        #expect(f.packets.map(\.arrivalMicroseconds) == Self.arrivals(reference: 6_551_830,
                                                                      deltas: [38750, 42500, 26500, 42500, 30750, nil, 66250, nil, nil]))
    }

    @Test func twccPionMarshalExample6OneBitVector() throws {
        let f = try Self.feedback([0xaf, 0xcd, 0x0, 0x7, 0xfa, 0x17, 0xfa, 0x17, 0x43, 0x3, 0x2f, 0xa0, 0x9c, 0x14, 0x0, 0xc,
                                   0x75, 0x84, 0x20, 0x0, 0xbe, 0xc0, 0xc1, 0x3f, 0x3b, 0x3f, 0x53, 0x90, 0x3b, 0x0, 0x0, 0x3])
        #expect(f.baseSequenceNumber == 39956)
        #expect(f.packets.count == 12)
        #expect(f.packets.map(\.arrivalMicroseconds) == Self.arrivals(reference: 7_701_536,
                                                                      deltas: [48250, 15750, 14750, 15750, 20750, nil, 36000, 14750, nil, nil, nil, nil]))
    }

    @Test func twccDraftChunkExamples() throws {
        // draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1.3 example 1: run of 221 "not received";
        // §3.1.4 example 1: 1-bit vector 0x9F1C = 0 1 1 1 1 1 0 0 0 1 1 1 0 0. A negative large delta (−1 ms) too.
        var bytes: [UInt8] = [0x8f, 0xcd, 0x00, 0x07, 0, 0, 0, 1, 0, 0, 0, 2, 0xFF, 0xF0, 0x00, 0xEB, 0xFF, 0xFF, 0xFF, 0x00,
                              0x00, 0xDD, 0x9F, 0x1C]
        bytes += [4, 4, 4, 4, 4, 4, 4, 4]          // 8 small deltas of 1 ms: 32 bytes, whole words
        var f = try Self.feedback(bytes)
        #expect(f.referenceTime == -1, "reference time is 24-bit signed")
        #expect(f.packets.count == 235)
        #expect(f.packets.first?.sequenceNumber == 0xFFF0)
        #expect(f.packets.last?.sequenceNumber == 0xFFF0 &+ 234, "sequence numbers wrap")
        #expect(f.packets.prefix(221).allSatisfy { !$0.received })
        #expect(f.packets.dropFirst(221).map(\.received) == [false, true, true, true, true, true, false, false, false, true, true, true, false, false])
        #expect(f.packets.compactMap(\.arrivalMicroseconds) == (1...8).map { -64_000 + Int64($0) * 1000 })

        // 2-bit vector with a large negative delta: received small (+0.25 ms), received large (−1 ms).
        let negative: [UInt8] = [0x8f, 0xcd, 0x00, 0x06, 0, 0, 0, 1, 0, 0, 0, 2, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x10, 0x05,
                                 0xD8, 0x00, 0x01, 0xFF, 0xFC, 0x00, 0x00, 0x00]
        f = try Self.feedback(negative)
        let reference: Int64 = 16 * 64_000
        let expected: [Int64?] = [reference + 250, reference + 250 - 1000]
        #expect(f.packets.map(\.arrivalMicroseconds) == expected)
        #expect(f.feedbackCount == 5)
    }

    @Test func twccRejectsTruncatedDeltasAndReservedSymbols() {
        // pion example8/example9: the chunks promise more deltas than the packet holds.
        let short1: [UInt8] = [0xaf, 0xcd, 0x0, 0x5, 0xfa, 0x17, 0xfa, 0x17, 0x43, 0x3, 0x2f, 0xa0, 0x0, 0x99, 0x0, 0x3,
                               0x3d, 0xe8, 0x2, 0x17, 0x20, 0x3, 0x94, 0x1]
        let short2: [UInt8] = [0xaf, 0xcd, 0x0, 0x5, 0xfa, 0x17, 0xfa, 0x17, 0x43, 0x3, 0x2f, 0xa0, 0x0, 0x99, 0x0, 0x2,
                               0x3d, 0xe8, 0x2, 0x17, 0x40, 0x2, 0x94, 0x1]
        // Draft §3.1.3 example 2 (0x6018): symbol 11 is reserved; libwebrtc drops such packets too.
        let reserved: [UInt8] = [0x8f, 0xcd, 0x00, 0x05, 0, 0, 0, 1, 0, 0, 0, 2, 0, 1, 0, 24, 0, 0, 0, 0, 0x60, 0x18, 0, 0]
        for bytes in [short1, short2, reserved] {
            #expect(throws: RtcpError.self) { try RtcpPacket.parseCompound(bytes) }
        }
    }

    @Test(arguments: [
        [UInt8](), [0x80, 0xC9, 0x00],
        [0x40, 0xC9, 0x00, 0x01, 0, 0, 0, 1],                          // version 1
        [0x81, 0xC9, 0x00, 0x07, 0, 0, 0, 1],                          // length beyond the datagram
        [0x81, 0xC9, 0x00, 0x01, 0, 0, 0, 1],                          // RR claims a block it lacks
        [0xA1, 0xCE, 0x00, 0x02, 0, 0, 0, 1, 0, 0, 0, 2, 0x80, 0xC9, 0x00, 0x01, 0, 0, 0, 1], // padding on a non-last packet
        [0x81, 0xCD, 0x00, 0x03, 0, 0, 0, 1, 0, 0, 0, 2, 0, 1],         // NACK FCI cut
        [0x81, 0xCA, 0x00, 0x02, 0, 0, 0, 1, 0x01, 0x09, 0x41, 0x42],   // SDES item longer than the packet
    ])
    func malformedCompoundsThrow(bytes: [UInt8]) {
        #expect(throws: RtcpError.self) { try RtcpPacket.parseCompound(bytes) }
    }

    @Test func demuxByFirstBytes() {
        #expect(RtcpPacket.looksLikeRtcp(RtcpWriter.pictureLossIndication(senderSSRC: 1, mediaSSRC: 2)))
        #expect(!RtcpPacket.looksLikeRtcp(RtpPacket(payloadType: 96, sequenceNumber: 1, timestamp: 1, ssrc: 1, payload: [0]).serialized()))
        #expect(!StunMessage.looksLikeStun(RtcpWriter.bye(ssrcs: [1])))
    }
}
