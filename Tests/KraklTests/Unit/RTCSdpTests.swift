import Foundation
import Testing
@testable import KraklRTC

enum SdpFixtures {
    static func answer(_ name: String) throws -> String {
        try String(contentsOfFile: Harness.repoRoot + "/Tests/Fixtures/sdp/\(name).sdp", encoding: .utf8)
    }

    static let offer: SdpVideoOffer = {
        var offer = SdpVideoOffer(sessionID: 4_200_000_001, iceUfrag: "kRtc", icePwd: "abcdefghijklmnopqrstuvwx",
                                  fingerprint: CertificateFingerprint(bytes: (0..<32).map { UInt8($0) }),
                                  streamID: "krakl-screen", trackID: "screen0", ssrc: 0x1122_3344, rtxSSRC: 0x5566_7788, cname: "krakl-cname")
        offer.candidates = [IceCandidate(foundation: "1", priority: IceCandidate.priority(kind: .host), address: "127.0.0.2", port: 50000, kind: .host)]
        return offer
    }()
}

@Suite(.tags(.unit)) struct RTCSdpTests {
    @Test func offerHasEverySendOnlyVideoAttribute() throws {
        let text = SdpFixtures.offer.sdp
        #expect(text.hasSuffix("\r\n"))
        #expect(!text.replacingOccurrences(of: "\r\n", with: "").contains("\n"), "every line ends in CRLF")
        let lines = text.split(separator: "\r\n").map(String.init)
        #expect(lines.first == "v=0")
        for expected in [
            "a=group:BUNDLE 0", "m=video 9 UDP/TLS/RTP/SAVPF 96 97 98 99", "a=ice-ufrag:kRtc", "a=ice-pwd:abcdefghijklmnopqrstuvwx",
            "a=ice-options:trickle", "a=setup:actpass", "a=mid:0", "a=sendonly", "a=rtcp-mux", "a=rtcp-rsize",
            "a=msid:krakl-screen screen0",
            "a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid",
            "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
            "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
            "a=rtpmap:96 VP8/90000", "a=rtpmap:97 rtx/90000", "a=fmtp:97 apt=96",
            "a=rtpmap:98 VP9/90000", "a=fmtp:98 profile-id=0", "a=rtpmap:99 rtx/90000", "a=fmtp:99 apt=98",
            "a=ssrc-group:FID 287454020 1432778632", "a=ssrc:287454020 cname:krakl-cname", "a=ssrc:1432778632 cname:krakl-cname",
            "a=candidate:1 1 udp 2130706431 127.0.0.2 50000 typ host",
        ] {
            #expect(lines.contains(expected), "offer lacks \(expected)")
        }
        for pt in [96, 98] {
            for fb in ["goog-remb", "transport-cc", "ccm fir", "nack", "nack pli"] {
                #expect(lines.contains("a=rtcp-fb:\(pt) \(fb)"), "no rtcp-fb \(fb) for \(pt)")
            }
        }
        let fingerprint = try #require(lines.first { $0.hasPrefix("a=fingerprint:") })
        #expect(fingerprint == "a=fingerprint:sha-256 00:01:02:03:04:05:06:07:08:09:0A:0B:0C:0D:0E:0F:10:11:12:13:14:15:16:17:18:19:1A:1B:1C:1D:1E:1F")
        // Session attributes come before the m-line, media attributes after it.
        let m = try #require(lines.firstIndex { $0.hasPrefix("m=video") })
        #expect(try #require(lines.firstIndex(of: "a=group:BUNDLE 0")) < m)
        #expect(try #require(lines.firstIndex(of: "a=mid:0")) > m)
    }

    @Test func offerReadBackAsAnAnswerWithRecvonlyGivesItsOwnChoices() throws {
        // Our own offer, flipped to recvonly/active, is what a mirror-image peer would answer.
        let mirrored = SdpFixtures.offer.sdp.replacingOccurrences(of: "a=sendonly", with: "a=recvonly")
            .replacingOccurrences(of: "a=setup:actpass", with: "a=setup:passive")
        let answer = try SdpAnswer(parsing: mirrored, offer: SdpFixtures.offer)
        #expect(answer.codec == .vp8)
        #expect(answer.payloadType == 96)
        #expect(answer.rtxPayloadType == 97)
        #expect(answer.extensions == [.mid: 1, .absSendTime: 2, .transportWideSequence: 3])
        #expect(answer.feedback == Set(RtcpFeedback.offered))
        #expect(answer.setup == .passive)
        #expect(answer.candidates.first?.transportAddress?.description == "127.0.0.2:50000")
    }

    @Test func janusKeepsOnlyMidAndAnswersActiveFullIce() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("janus"), offer: SdpFixtures.offer)
        #expect(a.codec == .vp8)
        #expect(a.payloadType == 96)
        #expect(a.rtxPayloadType == 97)
        #expect(a.extensions == [.mid: 1])
        #expect(a.feedback == [.nack, .pli, .fir, .remb, .transportCC])
        #expect(a.setup == .active)
        #expect(a.direction == .recvonly)
        #expect(!a.iceLite)
        #expect(a.iceUfrag == "Xq3c")
        #expect(a.icePwd == "m3Tfm4Cp1yRl2hFQb5ZKvD")
        #expect(a.iceOptions == ["trickle"])
        #expect(a.fingerprint.algorithm == "sha-256")
        #expect(a.fingerprint.bytes.prefix(3) == [0xD2, 0xB9, 0x31])
        #expect(a.candidates.map(\.description) == ["candidate:1 1 udp 2015363327 127.0.0.2 40126 typ host"])
        #expect(a.endOfCandidates)
        #expect(a.rtcpMux)
        #expect(!a.rtcpReducedSize)
        #expect(a.mid == "0")
    }

    @Test func aiortcKeepsMidAndAbsSendTimeNoTransportCC() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("aiortc"), offer: SdpFixtures.offer)
        #expect(a.codec == .vp8)
        #expect(a.rtxPayloadType == 97)
        #expect(a.extensions == [.mid: 1, .absSendTime: 2])
        #expect(a.feedback == [.nack, .pli, .remb])
        #expect(!a.accepts(.transportCC))
        #expect(!a.accepts(.fir))
        // Three fingerprints offered; DTLS verifies the sha-256 one.
        #expect(a.fingerprints.map(\.algorithm) == ["sha-256", "sha-384", "sha-512"])
        #expect(a.fingerprints.map(\.bytes.count) == [32, 48, 64])
        #expect(a.fingerprint.algorithm == "sha-256")
        #expect(a.setup == .active)
        #expect(a.port == 51712)
        #expect(a.connectionAddress == "127.0.0.2")
        #expect(a.candidates.first?.transportAddress == TransportAddress(ip: IPAddress("127.0.0.2")!, port: 51712))
    }

    @Test func chromeAcceptsEverythingAndTrickles() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("chrome"), offer: SdpFixtures.offer)
        #expect(a.codec == .vp8)
        #expect(a.payloadType == 96)
        #expect(a.rtxPayloadType == 97)
        #expect(a.extensions == [.mid: 1, .absSendTime: 2, .transportWideSequence: 3])
        #expect(a.feedback == Set(RtcpFeedback.offered))
        #expect(a.rtcpReducedSize)
        #expect(a.candidates.isEmpty)
        #expect(!a.endOfCandidates)
        #expect(a.iceUfrag == "8hhY")
    }

    @Test func livekitPrefersVP9IsIceLiteWithTcpCandidate() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("livekit"), offer: SdpFixtures.offer)
        #expect(a.codec == .vp9)
        #expect(a.payloadType == 98)
        #expect(a.rtxPayloadType == 99)
        #expect(a.parameters["profile-id"] == "0")
        #expect(a.iceLite)
        #expect(a.extensions == [.mid: 1, .transportWideSequence: 3])
        #expect(a.feedback == [.nack, .pli, .fir, .transportCC], "trailing spaces in rtcp-fb lines are ignored")
        #expect(a.candidates.map(\.transport) == ["udp", "tcp"])
        #expect(a.candidates[1].extensions.first?.name == "tcptype")
        #expect(a.fingerprint.bytes.first == 0xE4, "session-level fingerprint is inherited")
    }

    @Test func mediamtxHasNoRtxNoExtensionsAndDuplicatesComponentTwo() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("mediamtx"), offer: SdpFixtures.offer)
        #expect(a.codec == .vp8)
        #expect(a.rtxPayloadType == nil)
        #expect(a.extensions.isEmpty)
        #expect(a.feedback == [.nack, .pli, .fir])
        #expect(a.candidates.filter { $0.component == 1 }.count == 1)
        #expect(a.candidates.count == 2)
        #expect(!a.iceLite)
    }

    @Test func answerWithoutOfferStillPicksTheFirstKnownCodec() throws {
        let a = try SdpAnswer(parsing: SdpFixtures.answer("livekit"))
        #expect(a.codec == .vp9)
    }

    @Test func payloadTypeWeDidNotOfferIsNotUsed() throws {
        let text = try SdpFixtures.answer("janus").replacingOccurrences(of: "a=rtpmap:96 VP8/90000", with: "a=rtpmap:96 VP9/90000")
        #expect(throws: SdpError.noCommonCodec(answered: ["VP9/96", "RTX/97"])) { try SdpAnswer(parsing: text, offer: SdpFixtures.offer) }
    }

    nonisolated(unsafe) static let malformed: [(String, (String) -> String, SdpError)] = [   // read-only table
        ("no video m-line", { $0.replacingOccurrences(of: "m=video", with: "m=audio") }, .noVideoSection),
        ("rejected (port 0)", { $0.replacingOccurrences(of: "m=video 9 ", with: "m=video 0 ") }, .videoRejected),
        ("no fingerprint", { $0.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("a=fingerprint") }.joined(separator: "\r\n") }, .missingFingerprint),
        ("fingerprint too short", { $0.replacingOccurrences(of: "sha-256 D2:B9:31:", with: "sha-256 ") },
         .badFingerprint("sha-256 8F:DF:24:D8:0E:ED:D2:EF:25:9E:AF:6F:B8:34:AE:53:9C:E6:F3:8F:F2:64:15:FA:E8:7F:53:2D:38")),
        ("fingerprint not hex", { $0.replacingOccurrences(of: "sha-256 D2:B9", with: "sha-256 ZZ:B9") },
         .badFingerprint("sha-256 ZZ:B9:31:8F:DF:24:D8:0E:ED:D2:EF:25:9E:AF:6F:B8:34:AE:53:9C:E6:F3:8F:F2:64:15:FA:E8:7F:53:2D:38")),
        ("no common codec", { $0.replacingOccurrences(of: "VP8/90000", with: "H264/90000") }, .noCommonCodec(answered: ["H264/96", "RTX/97"])),
        ("no ice-pwd", { $0.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("a=ice-pwd") }.joined(separator: "\r\n") }, .missingIceCredentials("ice-pwd")),
        ("no ice-ufrag", { $0.split(whereSeparator: \.isNewline).filter { !$0.hasPrefix("a=ice-ufrag") }.joined(separator: "\r\n") }, .missingIceCredentials("ice-ufrag")),
        ("short ice-pwd", { $0.replacingOccurrences(of: "a=ice-pwd:m3Tfm4Cp1yRl2hFQb5ZKvD", with: "a=ice-pwd:short") },
         .badIceCredentials("ice-pwd must be 22-256 characters of A-Z a-z 0-9 + / (it has 5)")),
        ("setup actpass", { $0.replacingOccurrences(of: "a=setup:active", with: "a=setup:actpass") }, .badSetup("actpass")),
        ("inactive", { $0.replacingOccurrences(of: "a=recvonly", with: "a=inactive") }, .notReceiving(.inactive)),
        ("bad candidate", { $0.replacingOccurrences(of: "40126 typ host", with: "port typ host") },
         .badCandidate("1 1 udp 2015363327 127.0.0.2 port typ host", "port \"port\" is not 0-65535")),
        ("no v=0", { $0.replacingOccurrences(of: "v=0", with: "v=1") }, .malformedLine(number: 1, text: "v=1", reason: "only v=0 exists")),
    ]

    @Test(arguments: 0..<RTCSdpTests.malformed.count)
    func malformedAnswersGiveTypedErrors(index: Int) throws {
        let (name, edit, expected) = Self.malformed[index]
        let text = edit(try SdpFixtures.answer("janus"))
        #expect(throws: expected, "\(name)") { try SdpAnswer(parsing: text, offer: SdpFixtures.offer) }
    }

    @Test(arguments: ["", "hello world", "v=0\r\nm=video\r\n", "\u{0}\u{1}\u{2}", "v=0\r\nnot a line\r\n"])
    func garbageIsRejectedNotCrashed(text: String) {
        #expect(throws: SdpError.self) { try SdpAnswer(parsing: text) }
    }

    @Test func errorMessagesSayWhatIsMissing() {
        #expect(SdpError.missingFingerprint.description.contains("a=fingerprint"))
        #expect(SdpError.noCommonCodec(answered: ["H264/96"]).description.contains("H264/96"))
        #expect(SdpError.videoRejected.description.contains("port 0"))
    }

    @Test func candidatesRoundTripIncludingRelatedAddressAndMdns() throws {
        let texts = [
            "candidate:842163049 1 udp 1677729535 203.0.113.7 61665 typ srflx raddr 192.168.1.20 rport 61665 generation 0 network-cost 999",
            "candidate:3 1 udp 2113937151 9b36eaac-bb2e-49bb-bb78-21c41c499900.local 55013 typ host generation 0",
            "candidate:1 1 udp 2130706431 ::1 40000 typ host",
        ]
        for text in texts {
            let c = try IceCandidate(parsing: "a=" + text)
            #expect(c.sdpValue == text)
        }
        let srflx = try IceCandidate(parsing: texts[0])
        #expect(srflx.kind == .srflx)
        #expect(srflx.relatedAddress == "192.168.1.20")
        #expect(srflx.relatedPort == 61665)
        #expect(try IceCandidate(parsing: texts[1]).ip == nil)
        #expect(try IceCandidate(parsing: texts[2]).ip == IPAddress("::1"))
        #expect(IceCandidate.priority(kind: .host) == 2_130_706_431)
        #expect(throws: IceCandidateError.self) { try IceCandidate(parsing: "candidate:1 1 udp x 1.2.3.4 5 typ host") }
        #expect(throws: IceCandidateError.self) { try IceCandidate(parsing: "candidate:1 1 udp 1 1.2.3.4 5 typ host generation") }
    }
}
