import Foundation
import KraklRTC
import Testing

/// Our SRTP against pylibsrtp (a separately built libsrtp, driven from
/// Python, in /opt/krakl-venv): what we protect it must unprotect to the
/// same bytes, and what it protects we must unprotect.
@Suite(.tags(.integration))
struct RTCSrtpPylibsrtpTests {
    static let python = "/opt/krakl-venv/bin/python"

    static let script = """
    import json, sys
    from pylibsrtp import Policy, Session
    job = json.load(open(sys.argv[1]))
    direction = Policy.SSRC_ANY_INBOUND if job["mode"] == "unprotect" else Policy.SSRC_ANY_OUTBOUND
    session = Session(policy=Policy(key=bytes.fromhex(job["key"]), ssrc_type=direction, srtp_profile=job["profile"]))
    out = {"rtp": [], "rtcp": []}
    for kind in ("rtp", "rtcp"):
        for packet in job[kind]:
            data = bytes.fromhex(packet)
            try:
                if job["mode"] == "unprotect":
                    result = session.unprotect(data) if kind == "rtp" else session.unprotect_rtcp(data)
                else:
                    result = session.protect(data) if kind == "rtp" else session.protect_rtcp(data)
                out[kind].append(result.hex())
            except Exception as error:
                out[kind].append("error: " + str(error))
    print(json.dumps(out))
    """

    /// Runs the script on a job; nil (after printing SKIP) without the venv.
    static func pylibsrtp(mode: String, profile: SrtpProfile, key: [UInt8], rtp: [[UInt8]], rtcp: [[UInt8]]) throws -> (rtp: [String], rtcp: [String])? {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            skipTest("\(python) missing (scripts/setup makes the venv with pylibsrtp)")
            return nil
        }
        let folder = try Harness.temporaryDirectory()
        try script.write(toFile: folder + "/srtp.py", atomically: true, encoding: .utf8)
        let job: [String: Any] = ["mode": mode, "profile": Int(profile.rawValue), "key": dtlsHex(key),
                                  "rtp": rtp.map(dtlsHex), "rtcp": rtcp.map(dtlsHex)]
        try JSONSerialization.data(withJSONObject: job).write(to: URL(fileURLWithPath: folder + "/job.json"))
        let result = try Harness.run(python, [folder + "/srtp.py", folder + "/job.json"], timeout: 60)
        try #require(result.status == 0, "pylibsrtp script failed: \(result.stderr)")
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: [String]])
        return (answer["rtp"] ?? [], answer["rtcp"] ?? [])
    }

    /// Packets shaped like the publisher's: VP8-sized payloads, a one-byte
    /// header extension block, a CSRC, the marker bit, a sequence wrap.
    static func packets(count: Int) -> [[UInt8]] {
        (0..<count).map { index in
            let sequence = UInt16(truncatingIfNeeded: 65_530 + index)
            var packet: [UInt8] = [index % 3 == 0 ? 0x90 : 0x81, index % 5 == 0 ? 0xe0 : 0x60,
                                   UInt8(sequence >> 8), UInt8(sequence & 0xff), 0, 1, 0x5f, UInt8(index), 0xca, 0xfe, 0xba, 0xbe]
            if index % 3 == 0 {
                packet += [0xbe, 0xde, 0, 1, 0x10, UInt8(index), 0, 0]  // RFC 8285 one-byte form, mid-like
            } else {
                packet += [0, 0, 0, 42]  // one CSRC
            }
            packet += (0..<(20 + index * 37 % 1100)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ index) }
            return packet
        }
    }

    static let reports: [[UInt8]] = [
        [0x80, 0xc8, 0, 6, 0xca, 0xfe, 0xba, 0xbe] + Array(repeating: 0x33, count: 20),             // SR, no blocks
        [0x81, 0xcd, 0, 2, 0xca, 0xfe, 0xba, 0xbe, 0, 0, 0, 1],                                   // NACK-shaped feedback
        [0x80, 0xc8, 0, 6, 0xca, 0xfe, 0xba, 0xbe] + Array(repeating: 0x44, count: 20)
            + [0x81, 0xca, 0, 3, 0xca, 0xfe, 0xba, 0xbe, 1, 4, 0x6b, 0x72, 0x6b, 0x6c],            // SR + SDES compound
    ]

    @Test(arguments: SrtpProfile.allCases)
    func pylibsrtpUnprotectsWhatWeProtect(profile: SrtpProfile) throws {
        let key = (0..<profile.keyLength + profile.saltLength).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        let sender = try SrtpSession(profile: profile, key: Array(key.prefix(profile.keyLength)),
                                     salt: Array(key.suffix(profile.saltLength)), direction: .outbound)
        let plainRtp = Self.packets(count: 40)
        let protectedRtp = try plainRtp.map { try sender.protect(rtp: $0) }
        let protectedRtcp = try Self.reports.map { try sender.protect(rtcp: $0) }
        guard let answer = try Self.pylibsrtp(mode: "unprotect", profile: profile, key: key, rtp: protectedRtp, rtcp: protectedRtcp) else { return }
        #expect(answer.rtp == plainRtp.map { dtlsHex($0).lowercased() }, "pylibsrtp read different RTP from our SRTP")
        #expect(answer.rtcp == Self.reports.map { dtlsHex($0).lowercased() }, "pylibsrtp read different RTCP from our SRTCP")
        // And it notices tampering in our packets: the negative control.
        var bent = protectedRtp[0]
        bent[20] ^= 0x04
        guard let tampered = try Self.pylibsrtp(mode: "unprotect", profile: profile, key: key, rtp: [bent], rtcp: []) else { return }
        #expect(tampered.rtp.first?.hasPrefix("error") == true, "pylibsrtp accepted a tampered packet")
    }

    @Test(arguments: SrtpProfile.allCases)
    func weUnprotectWhatPylibsrtpProtects(profile: SrtpProfile) throws {
        let key = (0..<profile.keyLength + profile.saltLength).map { UInt8(truncatingIfNeeded: 200 &- $0 &* 3) }
        let plainRtp = Self.packets(count: 40)
        guard let answer = try Self.pylibsrtp(mode: "protect", profile: profile, key: key, rtp: plainRtp, rtcp: Self.reports) else { return }
        let receiver = try SrtpSession(profile: profile, key: Array(key.prefix(profile.keyLength)),
                                       salt: Array(key.suffix(profile.saltLength)), direction: .inbound)
        let rtp = answer.rtp.map { dtlsBytes(hex: $0).flatMap { receiver.unprotect(srtp: $0) } }
        let rtcp = answer.rtcp.map { dtlsBytes(hex: $0).flatMap { receiver.unprotect(srtcp: $0) } }
        #expect(rtp == plainRtp.map { Optional($0) }, "we read different RTP from pylibsrtp's SRTP")
        #expect(rtcp == Self.reports.map { Optional($0) }, "we read different RTCP from pylibsrtp's SRTCP")
        #expect(receiver.counters.rtpUnprotected == 40 && receiver.counters.rtcpUnprotected == Self.reports.count)
    }
}
