import Foundation
import KraklRTC
import Testing

/// SRTP/SRTCP sessions against libsrtp's published reference packets
/// (test/srtp_driver.c: srtp_validate, srtp_validate_gcm), and how they
/// treat tampering, replays, garbage and retransmissions.
@Suite(.tags(.unit))
struct RTCSrtpTests {
    struct Vector {
        let profile: SrtpProfile
        let key: String, salt: String
        let rtp: String, srtp: String
        let rtcp: String, srtcp: String
    }

    static let rtpPlain = "800f1234decafbadcafebabe" + String(repeating: "ab", count: 16)
    static let rtcpPlain = "81c8000bcafebabe" + String(repeating: "ab", count: 16)

    static let vectors = [
        Vector(profile: .aes128CmHmacSha1_80,
               key: "e1f97a0d3e018be0d64fa32c06de4139", salt: "0ec675ad498afeebb6960b3aabe6",
               rtp: rtpPlain,
               srtp: "800f1234decafbadcafebabe4e55dc4ce79978d88ca4d215949d2402b78d6acc99ea179b8dbb",
               rtcp: rtcpPlain,
               srtcp: "81c8000bcafebabe7128035be487b9bdbef89041f977a5a880000001993e08cd54d6c1230798"),
        Vector(profile: .aeadAes128Gcm,
               key: "000102030405060708090a0b0c0d0e0f", salt: "a0a1a2a3a4a5a6a7a8a9aaab",
               rtp: rtpPlain,
               srtp: "800f1234decafbadcafebabec5002ede04cfdd2eb91159e0880aa06ed2976826f796b201df3131a127e8a392",
               rtcp: rtcpPlain,
               srtcp: "81c8000bcafebabec98b8b5df0392a55852b6c21ac8e7025c52c6fbea2b3b446ea31123ba88ce61e80000001"),
    ]

    @Test(arguments: [0, 1])
    func libsrtpReferencePackets(index: Int) throws {
        let vector = Self.vectors[index]
        let key = try #require(dtlsBytes(hex: vector.key)), salt = try #require(dtlsBytes(hex: vector.salt))
        let sender = try SrtpSession(profile: vector.profile, key: key, salt: salt, direction: .outbound)
        let receiver = try SrtpSession(profile: vector.profile, key: key, salt: salt, direction: .inbound)
        let srtp = try sender.protect(rtp: try #require(dtlsBytes(hex: vector.rtp)))
        #expect(dtlsHex(srtp) == vector.srtp.uppercased(), "SRTP differs from libsrtp's reference packet")
        let srtcp = try sender.protect(rtcp: try #require(dtlsBytes(hex: vector.rtcp)))
        #expect(dtlsHex(srtcp) == vector.srtcp.uppercased(), "SRTCP differs from libsrtp's reference packet")
        #expect(receiver.unprotect(srtp: try #require(dtlsBytes(hex: vector.srtp))) == dtlsBytes(hex: vector.rtp))
        #expect(receiver.unprotect(srtcp: try #require(dtlsBytes(hex: vector.srtcp))) == dtlsBytes(hex: vector.rtcp))
        #expect(sender.counters.rtpProtected == 1 && sender.counters.rtcpProtected == 1)
        #expect(receiver.counters.rtpUnprotected == 1 && receiver.counters.rtcpUnprotected == 1)
    }

    static func session(_ profile: SrtpProfile, _ direction: SrtpSession.Direction, keyByte: UInt8 = 7) throws -> SrtpSession {
        try SrtpSession(profile: profile, key: Array(repeating: keyByte, count: profile.keyLength),
                        salt: Array(repeating: keyByte &+ 1, count: profile.saltLength), direction: direction)
    }

    static func rtp(sequence: UInt16, payload: [UInt8] = Array(0..<100)) -> [UInt8] {
        [0x80, 96, UInt8(sequence >> 8), UInt8(sequence & 0xff), 0, 0, 0x10, 0, 0x12, 0x34, 0x56, 0x78] + payload
    }

    @Test(arguments: SrtpProfile.allCases)
    func tamperingReplayAndGarbageAreCountedDrops(profile: SrtpProfile) throws {
        let sender = try Self.session(profile, .outbound)
        let receiver = try Self.session(profile, .inbound)
        let packet = try sender.protect(rtp: Self.rtp(sequence: 1))
        #expect(packet.count == Self.rtp(sequence: 1).count + profile.rtpOverhead)

        var tampered = packet
        tampered[30] ^= 0x01
        #expect(receiver.unprotect(srtp: tampered) == nil)
        #expect(receiver.counters.authenticationFailures == 1)
        #expect(receiver.lastDropReason == .authenticationFailed)

        #expect(receiver.unprotect(srtp: packet) == Self.rtp(sequence: 1))
        #expect(receiver.unprotect(srtp: packet) == nil, "a replayed packet was accepted")
        #expect(receiver.counters.replays == 1)

        let wrongKey = try Self.session(profile, .inbound, keyByte: 9)
        #expect(wrongKey.unprotect(srtp: packet) == nil)
        #expect(wrongKey.counters.authenticationFailures == 1)

        var rtcp = try sender.protect(rtcp: [0x81, 0xc8, 0, 6] + Array(repeating: 0x11, count: 24))
        rtcp[rtcp.count - 1] ^= 0x80
        #expect(receiver.unprotect(srtcp: rtcp) == nil)
        #expect(receiver.counters.authenticationFailures == 2)

        // Short, wrong-version and random datagrams: counted, never a crash.
        #expect(receiver.unprotect(srtp: [0x80, 1, 2]) == nil)
        #expect(receiver.unprotect(srtp: [0x40] + Array(repeating: 0, count: 40)) == nil)
        #expect(receiver.unprotect(srtcp: [0x81]) == nil)
        #expect(throws: SrtpError.self) { try sender.protect(rtp: [0x80, 0]) }
        // An extension header claiming more words than the packet holds.
        #expect(throws: SrtpError.self) { try sender.protect(rtp: [0x90, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xbe, 0xde, 0xff, 0xff]) }
        var generator = Fuzz.seeded("RTCSrtpTests garbage")
        let before = receiver.counters
        for _ in 0..<2_000 {
            var bytes = (0..<Int.random(in: 0..<300, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if bytes.count > 1, Bool.random(using: &generator) { bytes[0] = 0x80 | (bytes[0] & 0x3f) }
            #expect(receiver.unprotect(srtp: bytes) == nil)
            #expect(receiver.unprotect(srtcp: bytes) == nil)
        }
        let after = receiver.counters
        let dropped = (after.authenticationFailures + after.replays + after.malformed + after.otherDrops)
                    - (before.authenticationFailures + before.replays + before.malformed + before.otherDrops)
        #expect(dropped == 4_000, "every garbage packet must be counted as a drop")
    }

    @Test(arguments: SrtpProfile.allCases)
    func aNackedPacketCanBeProtectedAgain(profile: SrtpProfile) throws {
        let sender = try Self.session(profile, .outbound)
        let first = try sender.protect(rtp: Self.rtp(sequence: 500))
        let again = try sender.protect(rtp: Self.rtp(sequence: 500))
        #expect(first == again, "a retransmission must leave as the same bytes")
        // A receiver that lost the first copy takes the retransmission.
        let receiver = try Self.session(profile, .inbound)
        #expect(receiver.unprotect(srtp: again) == Self.rtp(sequence: 500))
    }

    @Test func wrongKeyLengthsAreRefused() {
        #expect(throws: SrtpError.self) {
            try SrtpSession(profile: .aes128CmHmacSha1_80, key: Array(repeating: 0, count: 16), salt: Array(repeating: 0, count: 12), direction: .outbound)
        }
        #expect(throws: SrtpError.self) {
            try SrtpSession(profile: .aeadAes128Gcm, key: Array(repeating: 0, count: 15), salt: Array(repeating: 0, count: 12), direction: .inbound)
        }
        // AES-256-GCM: a 128-bit key is refused rather than padded.
        #expect(throws: SrtpError.self) {
            try SrtpSession(profile: .aeadAes256Gcm, key: Array(repeating: 0, count: 16), salt: Array(repeating: 0, count: 12), direction: .outbound)
        }
    }

    @Test func aes256GcmUsesAll32KeyBytes() throws {
        let key = (0..<32).map { UInt8($0) }, salt = Array(repeating: UInt8(0xa5), count: 12)
        var lastByteChanged = key
        lastByteChanged[31] ^= 0x01
        let sender = try SrtpSession(profile: .aeadAes256Gcm, key: key, salt: salt, direction: .outbound)
        let packet = try sender.protect(rtp: Self.rtp(sequence: 9))
        #expect(packet.count == Self.rtp(sequence: 9).count + 16)
        #expect(try SrtpSession(profile: .aeadAes256Gcm, key: key, salt: salt, direction: .inbound).unprotect(srtp: packet) == Self.rtp(sequence: 9))
        let other = try SrtpSession(profile: .aeadAes256Gcm, key: lastByteChanged, salt: salt, direction: .inbound)
        #expect(other.unprotect(srtp: packet) == nil, "the 32nd key byte made no difference")
        #expect(other.counters.authenticationFailures == 1)
        // Not AES-128-GCM under the first half of the key either.
        let half = try SrtpSession(profile: .aeadAes128Gcm, key: Array(key.prefix(16)), salt: salt, direction: .inbound)
        #expect(half.unprotect(srtp: packet) == nil)
    }

    @Test(arguments: SrtpProfile.allCases)
    func dtlsKeysDriveSrtpBothWays(profile: SrtpProfile) throws {
        let pair = try RTCDtlsLoopbackTests.Pair(clientProfiles: [profile], serverProfiles: SrtpProfile.allCases)
        _ = pair.handshake()
        let clientKeys = try #require(pair.client.keys), serverKeys = try #require(pair.server.keys)
        #expect(clientKeys.profile == profile)
        let clientSends = try SrtpSession(sending: clientKeys), serverReceives = try SrtpSession(receiving: serverKeys)
        let serverSends = try SrtpSession(sending: serverKeys), clientReceives = try SrtpSession(receiving: clientKeys)
        for sequence in UInt16(65_530)...UInt16(65_535) {  // across nothing yet; then the wrap below
            #expect(serverReceives.unprotect(srtp: try clientSends.protect(rtp: Self.rtp(sequence: sequence))) == Self.rtp(sequence: sequence))
        }
        for sequence in UInt16(0)...UInt16(5) {  // the sequence number wraps: the rollover counter must follow
            #expect(serverReceives.unprotect(srtp: try clientSends.protect(rtp: Self.rtp(sequence: sequence))) == Self.rtp(sequence: sequence))
        }
        let report: [UInt8] = [0x81, 0xc9, 0, 7] + Array(repeating: 0x22, count: 28)
        #expect(clientReceives.unprotect(srtcp: try serverSends.protect(rtcp: report)) == report)
        // Our own direction's keys cannot read our own packets back: the halves differ.
        #expect(clientReceives.unprotect(srtp: try clientSends.protect(rtp: Self.rtp(sequence: 6))) == nil)
    }
}
