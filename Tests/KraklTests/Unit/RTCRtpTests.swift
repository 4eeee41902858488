import Testing
@testable import KraklRTC

@Suite(.tags(.unit)) struct RTCRtpTests {
    @Test func headerWithOneByteExtensionsIsByteExact() throws {
        let packet = RtpPacket(marker: true, payloadType: 96, sequenceNumber: 0x1234, timestamp: 0xDEAD_BEEF, ssrc: 0x1122_3344, extensions: [
            .mid(id: 1, "0"),
            .absSendTime(id: 2, nanoseconds: 1_500_000_000),
            .transportSequence(id: 3, 0x0102),
        ], payload: [0xAA, 0xBB])
        // RFC 3550 §5.1 header, then RFC 8285 §4.2: 0xBEDE, length 3 words, elements ID|len-1, zero padding.
        let expected: [UInt8] = [
            0x90, 0xE0, 0x12, 0x34, 0xDE, 0xAD, 0xBE, 0xEF, 0x11, 0x22, 0x33, 0x44,
            0xBE, 0xDE, 0x00, 0x03,
            0x10, 0x30,                     // id 1, 1 byte: "0"
            0x22, 0x06, 0x00, 0x00,         // id 2, 3 bytes: 1.5 s in 6.18 = 0x060000
            0x31, 0x01, 0x02,               // id 3, 2 bytes
            0x00, 0x00, 0x00,               // padding to 32 bits
            0xAA, 0xBB,
        ]
        #expect(packet.serialized() == expected)
        #expect(packet.headerSize == 28)
        let back = try RtpPacket(parsing: expected)
        #expect(back == packet)
        #expect(back.extensionData(id: 3) == [0x01, 0x02])
    }

    @Test func absSendTimeIsSixPointEighteenAndWrapsAt64Seconds() {
        #expect(RtpHeaderExtension.absSendTime(id: 2, nanoseconds: 0).data == [0, 0, 0])
        #expect(RtpHeaderExtension.absSendTime(id: 2, nanoseconds: 250_000_000).data == [0x01, 0x00, 0x00], "0.25 s = 2^16")
        #expect(RtpHeaderExtension.absSendTime(id: 2, nanoseconds: 64_000_000_000).data == [0, 0, 0], "64 s wraps to zero")
        #expect(RtpHeaderExtension.absSendTime(id: 2, nanoseconds: 63_999_999_999).data == [0xFF, 0xFF, 0xFF])
    }

    @Test func parsesTwoByteExtensionsPaddingAndCsrcs() throws {
        let bytes: [UInt8] = [
            0xB1, 0x60, 0x00, 0x01, 0, 0, 0, 1, 0, 0, 0, 2,  // V=2 P=1 X=1 CC=1
            0, 0, 0, 9,                                     // CSRC
            0x10, 0x00, 0x00, 0x02,                         // two-byte profile, 2 words
            0x05, 0x03, 0xA, 0xB, 0xC, 0x00, 0x00, 0x00,    // id 5, 3 bytes, padding
            0x77,                                           // payload
            0x00, 0x00, 0x03,                               // 3 bytes of padding
        ]
        let p = try RtpPacket(parsing: bytes)
        #expect(p.csrcs == [9])
        #expect(p.extensions == [RtpHeaderExtension(id: 5, data: [0xA, 0xB, 0xC])])
        #expect(p.payload == [0x77])
        #expect(p.paddingCount == 3)
        #expect(!p.marker)
        #expect(p.payloadType == 96)
    }

    @Test(arguments: [
        [UInt8](), [0x80, 0x60, 0, 1], [0x40] + [UInt8](repeating: 0, count: 11),
        [0xA0, 0x60, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0x09],          // padding count larger than the body
        [0x90, 0x60, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0xBE, 0xDE, 0, 5], // extension longer than the packet
        [0x90, 0x60, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0xBE, 0xDE, 0, 1, 0x1F, 0, 0, 0], // element of 16 bytes in a 4-byte block
    ])
    func malformedPacketsThrow(bytes: [UInt8]) {
        #expect(throws: RtpError.self) { try RtpPacket(parsing: bytes) }
    }

    @Test func clockMapsNanosecondsTo90kHzAndWraps() {
        var clock = RtpClock(baseTimestamp: 1000)
        #expect(clock.timestamp(captureNanoseconds: 5_000_000_000) == 1000)
        #expect(clock.timestamp(captureNanoseconds: 5_033_333_333) == 4000, "1/30 s is 3000 ticks")
        #expect(clock.timestamp(captureNanoseconds: 6_000_000_000) == 91000)
        #expect(clock.timestamp(captureNanoseconds: 4_000_000_000) == 1000 &- 90000, "earlier times count back")
        var wrapping = RtpClock(baseTimestamp: 0xFFFF_FF00)
        _ = wrapping.timestamp(captureNanoseconds: 0)
        #expect(wrapping.timestamp(captureNanoseconds: 1_000_000_000) == 0xFFFF_FF00 &+ 90000)
        #expect(wrapping.timestamp(captureNanoseconds: 86_400_000_000_000) == 0xFFFF_FF00 &+ UInt32(truncatingIfNeeded: UInt64(86_400) * 90_000))
    }

    @Test func vp8DescriptorForPictureID0x1234() {
        var p = Vp8Packetizer(maxPayloadSize: 1200, initialPictureID: 0x1234)
        let payloads = p.packetize([1, 2, 3])
        // RFC 7741 §4.2: X|S, I, M|PictureID high, PictureID low.
        #expect(payloads == [[0x90, 0x80, 0x92, 0x34, 1, 2, 3]])
        #expect(p.pictureID == 0x1235)
    }

    @Test func vp8SplitsAtMaxPayloadWithBalancedSizesAndStartBitOnFirst() {
        let frame = (0..<3000).map { UInt8(truncatingIfNeeded: $0 * 7) }
        var p = Vp8Packetizer(maxPayloadSize: 1200, initialPictureID: 0x7FFF)
        let payloads = p.packetize(frame)
        #expect(payloads.count == 3)
        #expect(payloads.allSatisfy { $0.count <= 1200 })
        #expect(payloads.map(\.count) == [1004, 1004, 1004])
        #expect(payloads.map { Array($0.prefix(4)) } == [[0x90, 0x80, 0xFF, 0xFF], [0x80, 0x80, 0xFF, 0xFF], [0x80, 0x80, 0xFF, 0xFF]])
        #expect(payloads.flatMap { $0.dropFirst(4) } == frame)
        #expect(p.pictureID == 0, "15-bit PictureID wraps")
        #expect(p.packetize([9]).first?.prefix(4) == [0x90, 0x80, 0x80, 0x00])
    }

    @Test func vp9KeyframeCarriesScalabilityStructureAndBEFlags() {
        var p = Vp9Packetizer(maxPayloadSize: 100, initialPictureID: 0x1234)
        let frame = (0..<250).map { UInt8($0 & 0xFF) }
        let key = p.packetize(frame, keyframe: true, width: 1280, height: 720)
        #expect(key.count == 3)
        // RFC 9628 §4.2: I|B|V, PictureID, then SS: N_S=0 Y=1 G=1, 1280, 720, N_G=1, T=0 U=0 R=1, P_DIFF=1.
        #expect(Array(key[0].prefix(11)) == [0x8A, 0x92, 0x34, 0x18, 0x05, 0x00, 0x02, 0xD0, 0x01, 0x04, 0x01])
        #expect(key[1][0] == 0x80, "middle packet: I only")
        #expect(key[2][0] == 0x84, "last packet: I|E")
        #expect(key.allSatisfy { $0.count <= 100 })
        #expect(Array(key[0].dropFirst(11)) + key[1].dropFirst(3) + key[2].dropFirst(3) == frame)
        let delta = p.packetize([1, 2, 3], keyframe: false, width: 1280, height: 720)
        #expect(delta == [[0xCC, 0x92, 0x35, 1, 2, 3]], "I|P|B|E, next PictureID, no SS")
    }

    @Test func videoSenderNumbersPacketsAndMarksTheLast() throws {
        var sender = RtpVideoSender(codec: .vp8, ssrc: 0xCAFE, payloadType: 96, maxPayloadSize: 500,
                                    initialSequenceNumber: 65534, clock: RtpClock(baseTimestamp: 10), initialPictureID: 5)
        sender.mid = (1, "0")
        let first = sender.packets(frame: [UInt8](repeating: 1, count: 1200), keyframe: true, captureNanoseconds: 1_000_000_000, width: 640, height: 480)
        let second = sender.packets(frame: [2], keyframe: false, captureNanoseconds: 1_100_000_000, width: 640, height: 480)
        #expect(first.map(\.sequenceNumber) == [65534, 65535, 0])
        #expect(first.map(\.marker) == [false, false, true])
        #expect(Set(first.map(\.timestamp)) == [10])
        #expect(second.map(\.sequenceNumber) == [1])
        #expect(second[0].timestamp == 10 + 9000)
        #expect(second[0].marker)
        #expect(first.allSatisfy { $0.extensionData(id: 1) == Array("0".utf8) && $0.ssrc == 0xCAFE && $0.payloadType == 96 })
        #expect(first.allSatisfy { $0.serialized().count <= 500 + 12 + 8 })
    }

    @Test func sendHistoryFindsRecentPacketsAndForgetsOldOnes() {
        var history = RtpSendHistory(capacity: 1000)
        #expect(history.capacity == 1024)
        for i in 0..<3000 {
            let seq = UInt16(truncatingIfNeeded: 64000 + i)
            history.store(RtpPacket(payloadType: 96, sequenceNumber: seq, timestamp: 0, ssrc: 1, payload: [UInt8(i & 0xFF)]), sentNanoseconds: UInt64(i))
        }
        let newest = UInt16(truncatingIfNeeded: 64000 + 2999)
        #expect(history.entry(sequenceNumber: newest)?.packet.payload == [UInt8(2999 & 0xFF)])
        #expect(history.entry(sequenceNumber: newest &- 1023) != nil)
        #expect(history.entry(sequenceNumber: newest &- 1024) == nil, "overwritten by a newer packet")
        #expect(history.entry(sequenceNumber: 64000) == nil)
        let resent = history.takeForRetransmission(sequenceNumber: newest, nowNanoseconds: 99)
        #expect(resent?.sequenceNumber == newest)
        #expect(history.entry(sequenceNumber: newest)?.retransmissions == 1)
        #expect(history.entry(sequenceNumber: newest)?.sentNanoseconds == 99)
    }

    @Test func rtxCarriesTheOriginalSequenceNumberOnItsOwnStream() throws {
        var original = RtpPacket(marker: true, payloadType: 96, sequenceNumber: 0xABCD, timestamp: 777, ssrc: 1,
                                 extensions: [.mid(id: 1, "0")], payload: [9, 8, 7])
        original.paddingCount = 4
        var rtx = RtxPacketizer(ssrc: 2, payloadType: 97, initialSequenceNumber: 65535)
        let a = rtx.wrap(original), b = rtx.wrap(original)
        #expect(a.payload == [0xAB, 0xCD, 9, 8, 7])
        #expect(a.ssrc == 2 && a.payloadType == 97 && a.timestamp == 777 && a.marker)
        #expect(a.paddingCount == 0)
        #expect(a.extensions == original.extensions)
        #expect([a.sequenceNumber, b.sequenceNumber] == [65535, 0])
        let parsed = try RtpPacket(parsing: a.serialized())
        let (osn, payload) = try RtxPacketizer.unwrap(parsed)
        #expect(osn == 0xABCD)
        #expect(payload == [9, 8, 7])
    }
}
