import Foundation
import Testing
@testable import KraklRTC

/// TURN failures a user meets (issue 16): an expired time-limited credential, a user over its
/// allocation quota, and a TURN server that dies while it carries the session.
@Suite(.serialized, .tags(.integration, .netns)) struct RTCTurnFailureTests {
    static let secret = "krakl-rest-secret"

    /// coturn's TURN REST API credential (`use-auth-secret`): base64(HMAC-SHA1(secret, user name)),
    /// the HMAC made by the openssl CLI, not by our own STUN code.
    static func restCredential(_ username: String) throws -> String? {
        guard let openssl = Harness.which("openssl") else {
            skipTest("openssl is not installed (Debian package openssl)")
            return nil
        }
        let result = try Harness.run(openssl, ["dgst", "-sha1", "-hmac", secret], timeout: 10, stdin: username)
        try #require(result.status == 0, "openssl dgst: \(result.stderr)")
        let hex = try #require(result.stdout.split(whereSeparator: \.isWhitespace).last.map(String.init))
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex, let next = hex.index(index, offsetBy: 2, limitedBy: hex.endIndex), let byte = UInt8(hex[index..<next], radix: 16) {
            bytes.append(byte)
            index = next
        }
        try #require(bytes.count == 20, "not an HMAC-SHA1: \(result.stdout)")
        return Data(bytes).base64EncodedString()
    }

    /// The expiry a TURN REST user name carries, either way round; nothing else is taken for one.
    @Test func restUserNamesGiveTheirExpiry() {
        #expect(TurnServer.restExpiry("1767225600:ann") == 1_767_225_600)
        #expect(TurnServer.restExpiry("ann:1767225600") == 1_767_225_600)
        #expect(TurnServer.restExpiry("1767225600:ann:x") == 1_767_225_600)
        for name in ["ann", "1767225600", "42:ann", "ann:42", "17672256OO:ann", "+767225600:ann", "١٧٦٧٢٢٥٦٠٠:ann", ""] {
            #expect(TurnServer.restExpiry(name) == nil, "\(name) taken for a REST user name")
        }
    }

    @Test func aTimeLimitedCredentialWorksUntilItExpires() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace, extra: ["--use-auth-secret", "--static-auth-secret=\(Self.secret)"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        let now = Int(Date().timeIntervalSince1970)

        // Valid for an hour: the session connects through the relay (the credential is made right).
        // Not relay-only: the probe cannot trickle relay candidates; direct UDP is dropped instead.
        let fresh = "\(now + 3600):krakl"
        let freshCredential = try #require(try Self.restCredential(fresh))
        do {
            let session = try RtcPublisherSession(namespace: namespace, seconds: 2,
                                                  extraProbeArguments: ["--ice-server", "turn:127.0.0.2,\(fresh),\(freshCredential)",
                                                                        "--connect-timeout", "10"])
            defer { session.stop() }
            try session.exchange()
            let result = try #require(session.probeResult(timeout: 60), "the probe gave no result: \(session.probe.log)")
            let stats = result["stats"] as? [String: Any] ?? [:]
            #expect(result["status"] as? Int == 0, "a fresh REST credential: \(result["result"] ?? "?")\ncoturn: \(turn.process.log.suffix(2000))")
            #expect((stats["selected_pair_types"] as? String)?.hasPrefix("relay/udp") == true, "not relayed: \(stats["selected_pair_types"] ?? "none")")
        }

        // Expired an hour ago: relay-only fails at once, saying the credential expired.
        let expired = "\(now - 3600):krakl"
        let expiredCredential = try #require(try Self.restCredential(expired))
        let (reason, log) = try RTCTurnTlsTests.relayOnlyFailure(in: namespace, label: "expired TURN REST credential",
                                                                 arguments: ["--ice-server", "turn:127.0.0.2,\(expired),\(expiredCredential)"], seconds: 2)
        #expect(reason.contains("TURN server 127.0.0.2:3478") && reason.contains("expired 36"), "unclear error: \(reason)")
        #expect(!reason.contains("did not answer"), "it waited for a time-out: \(reason)")
        #expect(!log.contains(expiredCredential), "the credential was printed")
    }

    /// coturn allows user u one allocation: of two TURN servers (UDP and TCP to the same coturn) one
    /// allocates, the other is refused with 486, reported clearly; the session connects through the first.
    @Test func anAllocationOverTheQuotaIsAClearRelayError() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace, extra: ["-v", "--user-quota=1"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 2,
                                              extraProbeArguments: ["--ice-server", "turn:127.0.0.2,u,p", "--ice-server", "turn:127.0.0.2?transport=tcp,u,p",
                                                                    "--connect-timeout", "10"])
        defer { session.stop() }
        try session.exchange()
        let result = try #require(session.probeResult(timeout: 60), "the probe gave no result: \(session.probe.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let errors = stats["relay_errors"] as? [String] ?? []
        print("TURN quota: \(result["result"] ?? "-"); relay errors \(errors)")
        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")\ncoturn: \(turn.process.log.suffix(2000))")
        #expect(errors.count == 1 && errors.allSatisfy { $0.contains("quota reached (486)") && $0.contains("127.0.0.2:3478") },
                "relay errors: \(errors)\ncoturn: \(turn.process.log.split(whereSeparator: \.isNewline).filter { $0.contains("ALLOCATE") || $0.contains("quota") }.joined(separator: "\n"))")
    }

    /// coturn is killed while the session runs through its relay (over TCP, all other UDP dropped):
    /// the session ends as connection lost, well before its --seconds, not left hanging.
    @Test func aTurnServerThatDiesEndsTheSessionAsConnectionLost() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace) else { return }
        guard try CoturnServer.blockAllUdpButRelays(in: namespace) else {
            skipTest("nft missing (Debian package nftables): UDP cannot be blocked")
            return
        }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 60,
                                              extraProbeArguments: ["--ice-server", "turn:127.0.0.2?transport=tcp,u,p", "--connect-timeout", "10"])
        defer { session.stop() }
        try session.exchange()
        try #require(session.waitConnected(timeout: 20) != nil, "not connected: \(session.probe.log)")
        // Media flows: the probe's once-a-second status lines count frames sent.
        try #require(session.probe.waitFor("\"frames_sent\"", timeout: 10), "no status line: \(session.probe.log)")
        turn.process.send(signal: SIGKILL)
        // Far less than the 60 s the probe would run: it must end on its own.
        let result = try #require(session.probeResult(timeout: 30), "the session did not end after coturn died: \(session.probe.log.suffix(2000))")
        let reason = result["result"] as? String ?? ""
        print("TURN server died mid-session: \(reason)")
        #expect(result["status"] as? Int == 4, "the probe must end as connection lost (status 4): \(reason)")
        #expect(reason.contains("connection lost") && reason.contains("relay carrying the session is gone")
                && reason.contains("TURN server 127.0.0.2:3478 over TCP"), "unclear reason: \(reason)")
    }

    /// coturn is killed while the session runs relay-only through its UDP relay (direct UDP dropped
    /// too): the session ends as connection lost once the relay is known gone (the kernel's ICMP
    /// port unreachable for the next datagram to the server), not after the 30 s consent time-out.
    @Test func aUdpTurnServerThatDiesEndsTheSessionAsConnectionLostBeforeConsentExpires() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace) else { return }
        guard try CoturnServer.blockDirectUdp(in: namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 90,
                                              extraProbeArguments: ["--ice-server", "turn:127.0.0.2,u,p", "--relay-only", "--connect-timeout", "10"],
                                              receiverSeconds: 120)
        defer { session.stop() }
        // Relay-only: the offer carries no host candidate (exchange() expects one); aiortc meets the relay as peer-reflexive.
        let offer = try #require(RtcPublisherSession.waitForSdp(session.probe, timeout: 30), "no offer: \(session.probe.log)")
        #expect(!offer.contains("typ host"), "relay-only, yet the offer lists host candidates")
        session.receiver.type(offer + "\n")
        let answer = try #require(RtcPublisherSession.waitForSdp(session.receiver, timeout: 30), "no answer: \(session.receiver.log)")
        session.probe.type(answer + "\n")
        try #require(session.waitConnected(timeout: 20) != nil, "not connected: \(session.probe.log)")
        try #require(session.probe.waitFor("\"frames_sent\"", timeout: 10), "no status line: \(session.probe.log)")
        let killedAt = Date()
        turn.process.send(signal: SIGKILL)
        let result = try #require(session.probeResult(timeout: 45), "the session did not end after coturn died: \(session.probe.log.suffix(2000))")
        let seconds = Date().timeIntervalSince(killedAt)
        let reason = result["result"] as? String ?? ""
        print(String(format: "UDP TURN server died mid-session: the session ended %.2f s after the kill: %@", seconds, reason))
        #expect(result["status"] as? Int == 4, "the probe must end as connection lost (status 4): \(reason)")
        #expect(reason.contains("connection lost") && reason.contains("relay carrying the session is gone")
                && reason.contains("TURN server 127.0.0.2:3478 over UDP"), "unclear reason: \(reason)")
        // Loose (a noisy machine): the point is that it is not the 30 s consent time-out.
        #expect(seconds < 20, "the session ended \(seconds) s after the TURN server died: the consent time-out, not the relay's failure")
    }
}
