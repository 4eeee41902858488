import Foundation
import Testing
@testable import KraklRTC

/// Bounded fuzzing of every parser that reads bytes from the network: valid
/// samples mutated by a seeded PRNG (so a failure reproduces), plus random
/// bytes. Each run stops after 20 000 inputs or 2 s. A crash fails the whole
/// test process; the expectations check that both outcomes were reached.
enum Fuzz {
    /// SplitMix64: tiny, deterministic, good enough to pick mutations
    /// (the DTLS and join-code fuzz tests use it too, seeded from a printed seed).
    struct Rng: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(next() % UInt64(n)) }
        mutating func byte() -> UInt8 { UInt8(truncatingIfNeeded: next()) }
        mutating func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in byte() } }
    }

    /// A generator seeded from the clock, or from `KRAKL_FUZZ_SEED`; the seed is printed with the
    /// test's name, so a failing run is reproduced from its log.
    static func seeded(_ test: String, salt: UInt64 = 0) -> Rng {
        let fresh = UInt64(Date().timeIntervalSince1970 * 1000) ^ salt
        let seed = ProcessInfo.processInfo.environment["KRAKL_FUZZ_SEED"].flatMap { UInt64($0) } ?? fresh
        print("\(test) seed \(seed) (KRAKL_FUZZ_SEED=\(seed) runs it again)")
        return Rng(state: seed)
    }

    static func mutate(_ input: [UInt8], _ rng: inout Rng) -> [UInt8] {
        var b = input
        for _ in 0...rng.below(4) {
            switch rng.below(8) {
            case 0 where !b.isEmpty: b[rng.below(b.count)] ^= 1 << UInt8(rng.below(8))
            case 1 where !b.isEmpty: b[rng.below(b.count)] = rng.byte()
            case 2 where !b.isEmpty: b.removeLast(rng.below(b.count) + 1)          // truncate
            case 3: b.insert(contentsOf: (0..<rng.below(8)).map { _ in rng.byte() }, at: rng.below(b.count + 1))
            case 4 where b.count > 2:                                             // drop a slice
                let start = rng.below(b.count - 1)
                b.removeSubrange(start..<min(b.count, start + 1 + rng.below(16)))
            case 5 where !b.isEmpty:                                              // interesting values
                b[rng.below(b.count)] = [0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE][rng.below(6)]
            case 6 where b.count > 4:                                             // duplicate a slice
                let start = rng.below(b.count - 2), end = min(b.count, start + 1 + rng.below(32))
                b.insert(contentsOf: b[start..<end], at: rng.below(b.count + 1))
            default: break
            }
        }
        return b
    }

    struct Outcome { var accepted = 0, rejected = 0, inputs = 0 }

    /// Runs `parse` on mutated seeds and random bytes; `parse` returns normally for a value and throws for an error.
    static func run(seed: UInt64, samples: [[UInt8]], iterations: Int = 20_000, seconds: Double = 2,
                    parse: ([UInt8]) throws -> Void) -> Outcome {
        var rng = Rng(state: seed)
        var outcome = Outcome()
        let deadline = Date().addingTimeInterval(seconds)
        for i in 0..<iterations {
            // The time limit applies after the first 1000 inputs: a loaded CI machine ran only 768 in 2 s,
            // and the count is what the checks below are about.
            if i >= 1000, i % 256 == 0, Date() > deadline { break }
            let input: [UInt8]
            if i % 10 == 9 {
                input = (0..<rng.below(96)).map { _ in rng.byte() }
            } else {
                input = mutate(samples[rng.below(samples.count)], &rng)
            }
            do {
                try parse(input)
                outcome.accepted += 1
            } catch {
                outcome.rejected += 1
            }
            outcome.inputs += 1
        }
        return outcome
    }
}

@Suite(.tags(.unit)) struct RTCFuzzTests {
    func check(_ outcome: Fuzz.Outcome, _ name: String) {
        #expect(outcome.inputs >= 1000, "\(name): the fuzz loop ran only \(outcome.inputs) inputs")
        #expect(outcome.accepted > 0, "\(name): no mutated sample parsed; the mutations are too destructive to test anything")
        #expect(outcome.rejected > 0, "\(name): nothing was rejected")
    }

    @Test func stun() {
        let key = StunMessage.shortTermKey(password: Rfc5769.password)
        let samples = [Rfc5769.request, Rfc5769.responseIPv4, Rfc5769.responseIPv6, Rfc5769.longTermRequest,
                       StunMessage.bindingRequest(username: "a:b", priority: 1, controlling: true, tieBreaker: 2, useCandidate: true)
                           .encoded(integrityKey: key, fingerprint: true)]
        check(Fuzz.run(seed: 1, samples: samples) { bytes in
            let m = try StunMessage(parsing: bytes)
            _ = try? m.validateIntegrity(key: key)
            _ = try? m.validateFingerprint()
            _ = m.unknownComprehensionRequired
        }, "STUN")
    }

    @Test func sdpAnswers() throws {
        let samples = try ["janus", "aiortc", "chrome", "livekit", "mediamtx"].map { Array(try SdpFixtures.answer($0).utf8) }
        // Line-level damage too: SDP parsers break on missing or repeated lines more than on flipped bits.
        var rng = Fuzz.Rng(state: 77)
        let lineMutated: [[UInt8]] = (0..<200).map { i in
            var lines = String(decoding: samples[i % samples.count], as: UTF8.self).split(separator: "\r\n").map(String.init)
            for _ in 0...rng.below(3) {
                let at = rng.below(lines.count)
                switch rng.below(3) {
                case 0: lines.remove(at: at)
                case 1: lines.insert(lines[at], at: rng.below(lines.count))
                default: lines[at] = String(lines[at].prefix(rng.below(lines[at].count + 1)))
                }
            }
            return Array(lines.joined(separator: "\r\n").utf8)
        }
        check(Fuzz.run(seed: 2, samples: samples + lineMutated, iterations: 5_000) { bytes in
            _ = try SdpAnswer(parsing: String(decoding: bytes, as: UTF8.self), offer: SdpFixtures.offer)
        }, "SDP")
    }

    @Test func iceCandidates() {
        let samples = ["candidate:842163049 1 udp 1677729535 203.0.113.7 61665 typ srflx raddr 192.168.1.20 rport 61665 generation 0",
                       "candidate:1 1 tcp 2130706431 127.0.0.2 7881 typ host tcptype passive"].map { Array($0.utf8) }
        check(Fuzz.run(seed: 3, samples: samples) { bytes in
            let c = try IceCandidate(parsing: String(decoding: bytes, as: UTF8.self))
            _ = c.transportAddress
        }, "candidate")
    }

    @Test func rtcp() {
        let sr = RtcpWriter.compound([
            RtcpWriter.senderReport(RtcpSenderReport(ssrc: 1, ntpTime: 2, rtpTimestamp: 3, packetCount: 4, octetCount: 5,
                                                     reports: [RtcpReportBlock(ssrc: 6, fractionLost: 7, cumulativeLost: -8, extendedHighestSequence: 9,
                                                                               jitter: 10, lastSenderReport: 11, delaySinceLastSenderReport: 12)])),
            RtcpWriter.sourceDescription(ssrc: 1, cname: "fuzz"), RtcpWriter.bye(ssrcs: [1]),
        ])
        let feedback = RtcpWriter.compound([
            RtcpWriter.nack(senderSSRC: 1, mediaSSRC: 2, lost: [1, 5, 9, 300]), RtcpWriter.pictureLossIndication(senderSSRC: 1, mediaSSRC: 2),
            RtcpWriter.fullIntraRequest(senderSSRC: 1, entries: [RtcpFirEntry(ssrc: 2, sequenceNumber: 3)]),
            RtcpWriter.remb(senderSSRC: 1, bitrate: 2_500_000, ssrcs: [2, 3]),
        ])
        let twcc: [[UInt8]] = [
            [0xaf, 0xcd, 0x0, 0x7, 0x9b, 0x74, 0xf6, 0x1f, 0x93, 0x71, 0xdc, 0xbc, 0x85, 0x3c, 0x0, 0x9,
             0x63, 0xf9, 0x16, 0xb3, 0xd5, 0x52, 0x0, 0x30, 0x9b, 0xaa, 0x6a, 0xaa, 0x7b, 0x1, 0x9, 0x1],
            [0xaf, 0xcd, 0x0, 0x7, 0xfa, 0x17, 0xfa, 0x17, 0x19, 0x3d, 0xd8, 0xbb, 0x1, 0x74, 0x0, 0x6,
             0x45, 0xb1, 0x5a, 0x40, 0x40, 0x2, 0x20, 0x04, 0x1f, 0xfe, 0x1f, 0x9a, 0xd0, 0x0, 0xd0, 0x0],
        ]
        check(Fuzz.run(seed: 4, samples: [sr, feedback] + twcc) { bytes in
            for packet in try RtcpPacket.parseCompound(bytes) {
                if case .receiverReport(_, let reports) = packet { _ = reports.first?.roundTripSeconds(arrivalCompactNtp: 0) }
            }
        }, "RTCP")
    }

    @Test func transportWideFeedbackAlone() {
        // Straight into the TWCC reader, without the compound layer's length checks in front of it.
        let sample: [UInt8] = [0x8f, 0xcd, 0x00, 0x07, 0, 0, 0, 1, 0, 0, 0, 2, 0xFF, 0xF0, 0x00, 0xEB, 0xFF, 0xFF, 0xFF, 0x00,
                               0x00, 0xDD, 0x9F, 0x1C, 4, 4, 4, 4, 4, 4, 4, 4]
        check(Fuzz.run(seed: 5, samples: [sample]) { bytes in _ = try TransportWideFeedback(parsing: bytes) }, "TWCC")
    }

    @Test func rtp() {
        var sender = RtpVideoSender(codec: .vp8, ssrc: 1, payloadType: 96, maxPayloadSize: 100)
        sender.mid = (1, "0")
        var samples = sender.packets(frame: [UInt8](repeating: 7, count: 150), keyframe: true, captureNanoseconds: 0, width: 64, height: 64)
            .map { packet -> [UInt8] in
                var p = packet
                p.setExtension(.absSendTime(id: 2, nanoseconds: 123_456_789))
                p.setExtension(.transportSequence(id: 3, 42))
                p.paddingCount = 3
                return p.serialized()
            }
        samples.append([0xB1, 0x60, 0x00, 0x01, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 9, 0x10, 0x00, 0x00, 0x02,
                        0x05, 0x03, 0xA, 0xB, 0xC, 0x00, 0x00, 0x00, 0x77, 0x00, 0x00, 0x03])
        check(Fuzz.run(seed: 6, samples: samples) { bytes in
            let p = try RtpPacket(parsing: bytes)
            if p.payloadType == 97 { _ = try? RtxPacketizer.unwrap(p) }
        }, "RTP")
    }

    @Test func vp8Depacketizer() throws {
        var p = Vp8Packetizer(maxPayloadSize: 50)
        let samples = p.packetize([UInt8](repeating: 3, count: 120)) + [[0xF0, 0xF0, 0x80, 0x01, 0x02, 0x03, 0x04]]
        check(Fuzz.run(seed: 7, samples: samples) { bytes in _ = try RTCVp8DecodeTests.depacketize(bytes) }, "VP8 descriptor")
    }
}
