import KraklBase
import KraklHost
import Foundation
@testable import KraklRTC
import Testing

/// Answering a remote offer: `SdpRemoteOffer` reads it, `SdpVideoAnswer` writes our answer.
@Suite(.tags(.unit)) struct RTCSdpAnswerTests {
    /// A Chromium-style recvonly offer (shape of Chromium 12x's `createOffer` with an audio and a video
    /// transceiver, recvonly, and a data channel): VP9 listed before VP8, VP8 on payload type 120.
    static let chromiumOffer = [
        "v=0", "o=- 8251843458123880217 2 IN IP4 127.0.0.1", "s=-", "t=0 0",
        "a=group:BUNDLE 0 1 2", "a=extmap-allow-mixed", "a=msid-semantic: WMS",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0 8 13 110 126", "c=IN IP4 0.0.0.0", "a=rtcp:9 IN IP4 0.0.0.0",
        "a=ice-ufrag:Yt3x", "a=ice-pwd:p8sYd1Gm0Jq5b0zNnwHkVt6u", "a=ice-options:trickle",
        "a=fingerprint:sha-256 7B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35:DC:B8:5F:64:1A:24:C2:43:F0:A1:58:D0:A1:2C:19:08",
        "a=setup:actpass", "a=mid:0", "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level",
        "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid", "a=recvonly", "a=rtcp-mux", "a=rtpmap:111 opus/48000/2",
        "a=rtcp-fb:111 transport-cc", "a=fmtp:111 minptime=10;useinbandfec=1", "a=rtpmap:63 red/48000/2",
        "a=rtpmap:9 G722/8000", "a=rtpmap:0 PCMU/8000", "a=rtpmap:8 PCMA/8000", "a=rtpmap:13 CN/8000",
        "a=rtpmap:110 telephone-event/48000", "a=rtpmap:126 telephone-event/8000",
        "m=video 9 UDP/TLS/RTP/SAVPF 98 99 120 121 45", "c=IN IP4 0.0.0.0", "a=rtcp:9 IN IP4 0.0.0.0",
        "a=ice-ufrag:Yt3x", "a=ice-pwd:p8sYd1Gm0Jq5b0zNnwHkVt6u", "a=ice-options:trickle",
        "a=fingerprint:sha-256 7B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35:DC:B8:5F:64:1A:24:C2:43:F0:A1:58:D0:A1:2C:19:08",
        "a=setup:actpass", "a=mid:1", "a=extmap:14 urn:ietf:params:rtp-hdrext:toffset",
        "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
        "a=extmap:13 urn:3gpp:video-orientation",
        "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
        "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid", "a=recvonly", "a=rtcp-mux", "a=rtcp-rsize",
        "a=rtpmap:98 VP9/90000", "a=rtcp-fb:98 goog-remb", "a=rtcp-fb:98 transport-cc", "a=rtcp-fb:98 ccm fir",
        "a=rtcp-fb:98 nack", "a=rtcp-fb:98 nack pli", "a=fmtp:98 profile-id=0",
        "a=rtpmap:99 rtx/90000", "a=fmtp:99 apt=98",
        "a=rtpmap:120 VP8/90000", "a=rtcp-fb:120 goog-remb", "a=rtcp-fb:120 transport-cc", "a=rtcp-fb:120 ccm fir",
        "a=rtcp-fb:120 nack", "a=rtcp-fb:120 nack pli",
        "a=rtpmap:121 rtx/90000", "a=fmtp:121 apt=120", "a=rtpmap:45 AV1/90000",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 0.0.0.0",
        "a=ice-ufrag:Yt3x", "a=ice-pwd:p8sYd1Gm0Jq5b0zNnwHkVt6u", "a=ice-options:trickle",
        "a=fingerprint:sha-256 7B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35:DC:B8:5F:64:1A:24:C2:43:F0:A1:58:D0:A1:2C:19:08",
        "a=setup:actpass", "a=mid:2", "a=sctp-port:5000", "a=max-message-size:262144",
    ].joined(separator: "\r\n") + "\r\n"

    static func answer(_ offer: String, codecs: [VideoCodec] = [.vp8, .vp9]) throws -> (SdpRemoteOffer, String) {
        let remote = try SdpRemoteOffer(parsing: offer, codecs: codecs)
        let fingerprint = CertificateFingerprint(algorithm: "sha-256", bytes: [UInt8](repeating: 0xAB, count: 32))
        var answer = SdpVideoAnswer(offer: remote, sessionID: 42, iceUfrag: "abcd", icePwd: "0123456789abcdefghijklmn",
                                    fingerprint: fingerprint, streamID: "krakl-screen", trackID: "screen", ssrc: 1111, rtxSSRC: 2222,
                                    cname: "c")
        answer.iceLite = true
        answer.candidates = [IceCandidate(foundation: "1", priority: 2_130_706_431, address: "127.0.0.2", port: 40000, kind: .host)]
        return (remote, answer.sdp)
    }

    static func sections(_ sdp: String) -> [[String]] {
        var result: [[String]] = []
        for line in sdp.split(whereSeparator: \.isNewline).map(String.init) {
            if line.hasPrefix("m=") { result.append([line]) } else if !result.isEmpty { result[result.count - 1].append(line) }
        }
        return result
    }

    @Test func answersAChromiumOfferWithVideoOnlyAndRejectsTheRest() throws {
        let (remote, sdp) = try Self.answer(Self.chromiumOffer)
        #expect(remote.codec == .vp8 && remote.payloadType == 120 && remote.rtxPayloadType == 121, "VP8 preferred, at the offer's type")
        #expect(remote.mid == "1" && remote.videoIndex == 1)
        let m = Self.sections(sdp)
        try #require(m.count == 3, "one m-section per offered one, in order: \(sdp)")
        #expect(m[0][0] == "m=audio 0 UDP/TLS/RTP/SAVPF 111" && m[0].contains("a=mid:0"))
        #expect(m[2][0] == "m=application 0 UDP/DTLS/SCTP webrtc-datachannel" && m[2].contains("a=mid:2"))
        #expect(m[1][0] == "m=video 9 UDP/TLS/RTP/SAVPF 120 121")
        #expect(m[1].contains("a=sendonly") && m[1].contains("a=setup:passive") && m[1].contains("a=mid:1"))
        #expect(m[1].contains("a=rtpmap:120 VP8/90000") && m[1].contains("a=fmtp:121 apt=120"))
        #expect(!m[1].contains { $0.contains("VP9") || $0.contains("AV1") || $0.hasPrefix("a=rtpmap:98") })
        // Feedback and extensions only as offered, with the offer's ids; toffset and video-orientation are not ours.
        #expect(m[1].filter { $0.hasPrefix("a=rtcp-fb:120") }.count == 5)
        #expect(m[1].filter { $0.hasPrefix("a=extmap:") }.sorted() == [
            "a=extmap:2 http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time",
            "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
            "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid",
        ])
        #expect(m[1].contains("a=ssrc-group:FID 1111 2222") && m[1].contains("a=end-of-candidates"))
        // Rejected sections stay out of BUNDLE (RFC 8843 §7.3.3); the answer is ICE-lite at session level.
        #expect(sdp.contains("a=group:BUNDLE 1\r\n") && sdp.contains("\r\na=ice-lite\r\n"))
        #expect(!m[0].contains { $0.hasPrefix("a=candidate") || $0.hasPrefix("a=extmap") } && m[0].contains("a=inactive"))
        #expect(m[0].filter { $0.hasPrefix("a=rtpmap") } == ["a=rtpmap:111 opus/48000/2"], "only the one format the m= line keeps")
        // And it is well-formed SDP: our own parser reads the same three sections back.
        let document = try SdpDocument(sdp)
        #expect(document.media.map(\.port) == [0, 9, 0] && document.session.has("ice-lite"))
    }

    @Test func theAnswerKeepsOnlyWhatTheOfferHad() throws {
        // No rtx, no transport-cc extension (so no transport-cc feedback either), only nack and pli.
        let offer = [
            "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0",
            "m=video 9 UDP/TLS/RTP/SAVPF 100", "c=IN IP4 0.0.0.0",
            "a=ice-ufrag:abcd", "a=ice-pwd:0123456789012345678901",
            "a=fingerprint:sha-256 " + Array(repeating: "01", count: 32).joined(separator: ":"),
            "a=setup:passive", "a=recvonly", "a=rtcp-mux",
            "a=rtpmap:100 VP8/90000", "a=rtcp-fb:100 nack", "a=rtcp-fb:100 nack pli", "a=rtcp-fb:100 transport-cc",
        ].joined(separator: "\r\n")
        let (remote, sdp) = try Self.answer(offer)
        #expect(remote.rtxPayloadType == nil && remote.extensions.isEmpty && remote.mid == "0")
        #expect(remote.feedback == [.nack, .pli])
        #expect(sdp.contains("a=setup:active"), "the offer is passive: we are the DTLS client")
        #expect(!sdp.contains("a=group:BUNDLE") && !sdp.contains("ssrc-group") && !sdp.contains("rtx"))
        #expect(!sdp.contains("a=rtcp-rsize"))
    }

    @Test func vp9WhenTheOfferHasNoVp8() throws {
        let offer = Self.chromiumOffer.replacingOccurrences(of: "a=rtpmap:120 VP8/90000", with: "a=rtpmap:120 H264/90000")
        let (remote, sdp) = try Self.answer(offer)
        #expect(remote.codec == .vp9 && remote.payloadType == 98 && remote.rtxPayloadType == 99)
        #expect(sdp.contains("a=fmtp:98 profile-id=0"))
        // Told to send VP8 only, the same offer is refused with a reason.
        #expect(throws: SdpError.self) { try SdpRemoteOffer(parsing: offer, codecs: [.vp8]) }
    }

    @Test(arguments: [
        ("audio only", "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\na=recvonly\r\na=rtcp-mux\r\n", "no m=video"),
        ("video we cannot send", "m=video 9 UDP/TLS/RTP/SAVPF 102\r\na=rtpmap:102 H264/90000\r\na=recvonly\r\na=rtcp-mux\r\n", "none of VP8, VP9"),
        ("send-only video", "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\na=sendonly\r\na=rtcp-mux\r\n", "does not receive"),
        ("disabled video", "m=video 0 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\na=recvonly\r\na=rtcp-mux\r\n", "port 0"),
        ("no rtcp-mux", "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\na=recvonly\r\n", "rtcp-mux"),
        ("VP9 profile 2 only", "m=video 9 UDP/TLS/RTP/SAVPF 98\r\na=rtpmap:98 VP9/90000\r\na=fmtp:98 profile-id=2\r\na=recvonly\r\na=rtcp-mux\r\n", "none of VP8, VP9"),
    ])
    func anOfferWithoutUsableVideoIsAClearError(name: String, media: String, expected: String) {
        let offer = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\n"
            + "a=fingerprint:sha-256 " + Array(repeating: "01", count: 32).joined(separator: ":") + "\r\n" + media
        do {
            _ = try SdpRemoteOffer(parsing: offer)
            Issue.record("\(name): accepted")
        } catch {
            #expect(error.description.contains(expected), "\(name): \(error.description)")
            #expect(error.description.hasPrefix("SDP offer"), "\(name): says which SDP: \(error.description)")
        }
    }

    @Test func hostileOffersAreErrorsNotCrashes() {
        let base = Self.chromiumOffer
        var hostile: [String] = [
            "", "v=0", "v=1\r\n", "garbage", String(repeating: "a", count: 100_000),
            "v=0\r\nm=video / UDP/TLS/RTP/SAVPF 96\r\n", "v=0\r\nm=video 99999999 UDP/TLS/RTP/SAVPF 96\r\n",
            "v=0\r\nm=\r\n", "v=0\r\nm=video 9\r\n", "v=0\r\n=\r\n", "v=0\r\na=\r\n",
            // A bare line feed or other control bytes inside a line: quoted escaped, still one line
            // (a random mutation found it: "S=0\no=- …" was echoed with its line break).
            "S=0\no=- 1 2 IN IP4 127.0.0.1\r\n", "v=0\r\nx=\u{1}\u{7F}\u{85}\t\r\n",
            base.replacingOccurrences(of: "a=mid:1", with: "a=mid:has space"),
            base.replacingOccurrences(of: "a=mid:1", with: "a=mid:" + String(repeating: "x", count: 200)),
            base.replacingOccurrences(of: "a=mid:2", with: "a=mid:1"),
            base.replacingOccurrences(of: "a=ice-pwd:p8sYd1Gm0Jq5b0zNnwHkVt6u", with: "a=ice-pwd:short"),
            base.replacingOccurrences(of: "a=fingerprint:sha-256 7B", with: "a=fingerprint:sha-256 ZZ"),
            base.replacingOccurrences(of: "a=setup:actpass", with: "a=setup:holdconn"),
            base.replacingOccurrences(of: "m=video 9 UDP/TLS/RTP/SAVPF 98 99 120 121 45", with: "m=video 9 UDP/TLS/RTP/SAVPF 98 99 120 121 45\r\na=candidate:x"),
            base + String(repeating: "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\n", count: 100),
        ]
        // Random bytes and random cuts of a good offer.
        var generator = Fuzz.seeded("RTCSdpAnswerTests.hostileOffersAreErrorsNotCrashes")
        for _ in 0..<200 {
            var bytes = Array(base.utf8)
            for _ in 0..<8 { bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator) }
            hostile.append(String(decoding: bytes.prefix(Int.random(in: 0...bytes.count, using: &generator)), as: UTF8.self))
        }
        var accepted = 0
        for (index, text) in hostile.enumerated() {
            do {
                let (_, sdp) = try Self.answer(text)
                accepted += 1
                // Whatever got through must still be a well-formed answer: no line breaks smuggled in, each line <type>=<value>.
                #expect(sdp.split(separator: "\r\n").allSatisfy { $0.count >= 2 && Array($0)[1] == "=" }, "case \(index)")
            } catch let error as SdpError {
                // Clear and bounded: says it is the SDP, one line, and echoes no 100 KB input.
                #expect(error.description.hasPrefix("SDP ") && !error.description.contains("\n") && error.description.count <= 300,
                        "case \(index): \(error.description.prefix(400))")
            } catch {
                Issue.record("case \(index): not an SdpError: \(error)")
            }
        }
        #expect(accepted < hostile.count, "the hand-written cases must fail")
    }

    @Test func anAnsweringPublisherWritesItsAnswerAndClosesCleanly() throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!], includeLoopback: true)
        let publisher = try Publisher(answering: Self.chromiumOffer, configuration: configuration)
        let answer = try #require(publisher.answerSDP)
        #expect(answer.contains("a=ice-lite") && answer.contains("a=candidate:") && answer.contains("127.0.0.1"))
        #expect(answer.contains("a=fingerprint:\(publisher.certificate.fingerprint.sdpValue)"))
        #expect(answer.contains("a=ssrc:\(publisher.ssrc) cname:\(publisher.cname)"))
        #expect(publisher.role == .answererLite && publisher.stats.codec == "VP8" && publisher.stats.dtlsRole == "server")
        publisher.start()
        publisher.close()
        publisher.close()
        #expect(publisher.stats.state == "closed")

        // Full ICE on request; closed without ever starting.
        let full = try Publisher(answering: Self.chromiumOffer, configuration: configuration, iceLite: false)
        #expect(full.role == .answerer && full.answerSDP?.contains("a=ice-lite") == false)
        full.close()
    }

    @Test func playoutDelayIsAnsweredOnlyWhenOfferedAndConfigured() throws {
        let extmap = "a=extmap:5 http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"
        // Chromium 156 offers it on id 5, after transport-cc.
        let offered = Self.chromiumOffer.replacingOccurrences(
            of: "a=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid\r\na=recvonly\r\na=rtcp-mux\r\na=rtcp-rsize",
            with: extmap + "\r\na=extmap:4 urn:ietf:params:rtp-hdrext:sdes:mid\r\na=recvonly\r\na=rtcp-mux\r\na=rtcp-rsize")
        try #require(offered != Self.chromiumOffer)
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!], includeLoopback: true)
        configuration.playoutDelay = .immediate
        for (offer, configured, expected) in [(offered, true, true), (offered, false, false), (Self.chromiumOffer, true, false)] {
            var c = configuration
            if !configured { c.playoutDelay = nil }
            let publisher = try Publisher(answering: offer, configuration: c)
            defer { publisher.close() }
            let video = Self.sections(try #require(publisher.answerSDP))[1]
            #expect(video.contains(extmap) == expected, "offered \(offer == offered), configured \(configured): \(video)")
            #expect(video.filter { $0.hasPrefix("a=extmap:") }.count == (expected ? 4 : 3))
            #expect((publisher.remoteOffer?.extensions[.playoutDelay] == 5) == expected)
        }
        // We never offer it (Janus, WHIP): only a viewer that asked gets it.
        #expect(!SdpVideoOffer(sessionID: 1, iceUfrag: "abcd", icePwd: "0123456789abcdefghijklmn",
                               fingerprint: CertificateFingerprint(algorithm: "sha-256", bytes: [UInt8](repeating: 1, count: 32)),
                               streamID: "s", trackID: "t", ssrc: 1, rtxSSRC: 2, cname: "c").sdp.contains("playout-delay"))
    }

    @Test func answeringPublishersShareOneLoop() throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!], includeLoopback: true)
        let loop = try EventLoop(name: "krakl-test-rtc")
        loop.start()
        defer { loop.stop(timeout: .seconds(2)) }
        let peers = try (0..<3).map { _ in try Publisher(answering: Self.chromiumOffer, configuration: configuration, loop: loop) }
        for peer in peers { peer.start() }
        for peer in peers { peer.close() }
        #expect(loop.isRunning, "closing a peer leaves a shared loop running")
        #expect(peers.allSatisfy { $0.stats.state == "closed" })
    }
}
