import Foundation
import Testing
import KraklRTC

/// coturn (docs/testing.md, "TURN") in the test's namespace, relaying on ports 20000-20100 so that
/// nftables can tell relayed traffic from direct traffic between the publisher and aiortc.
final class CoturnServer {
    static let program = "/usr/bin/turnserver"
    static let relayPorts = "20000-20100"
    let process: DtlsTestProcess

    /// nil (after SKIP) when coturn is not installed. With `tls` (certificate and key files) it
    /// also listens for TLS on 5349, else TLS is off.
    static func start(in namespace: RtcTestNamespace, extra: [String] = [], tls: (cert: String, key: String)? = nil) throws -> CoturnServer? {
        guard FileManager.default.isExecutableFile(atPath: program) else {
            skipTest("\(program) missing (Debian package coturn; scripts/setup installs it)")
            return nil
        }
        let (p, a) = namespace.command(program, ["-n", "--listening-ip=127.0.0.2", "--relay-ip=127.0.0.2", "--listening-port=3478",
                                                 "--min-port=20000", "--max-port=20100", "--realm=krakl"]
                                                + (extra.contains("--use-auth-secret") ? [] : ["--lt-cred-mech", "--user=u:p"])
                                                + (tls.map { ["--cert=\($0.cert)", "--pkey=\($0.key)", "--tls-listening-port=5349"] } ?? ["--no-tls"])
                                                + ["--no-dtls", "--no-cli", "--allow-loopback-peers", "--simple-log",
                                                 "--log-file=stdout"] + extra)
        let server = CoturnServer(process: try DtlsTestProcess(p, a))
        // Its last start-up line; a request sent a little early is retransmitted anyway.
        try #require(server.process.waitFor("Total General servers", timeout: 15), "coturn did not start: \(server.process.log)")
        return server
    }

    private init(process: DtlsTestProcess) { self.process = process }
    deinit { process.stop() }

    /// Drops all UDP in the namespace except to and from the TURN port and the relay ports:
    /// the publisher and aiortc cannot reach each other directly, only through the relay.
    static func blockDirectUdp(in namespace: RtcTestNamespace) throws -> Bool {
        guard try namespace.prepareFaults() else { return false }
        // Accept rules then a drop: one rule of four "!=" tests also dropped coturn's answers.
        for rule in [["udp", "dport", "3478", "accept"], ["udp", "sport", "3478", "accept"],
                     ["udp", "sport", relayPorts, "accept"], ["udp", "dport", relayPorts, "accept"], ["meta", "l4proto", "udp", "drop"]] {
            let result = try namespace.run(RtcTestNamespace.nft, ["add", "rule", "inet", "krakl", "input"] + rule)
            try #require(result.status == 0, "nft: \(result.stderr)")
        }
        return true
    }
}

@Suite(.serialized, .tags(.integration, .netns)) struct RTCTurnRelayTests {
    @Test func mediaFlowsThroughCoturnWhenDirectUdpIsBlocked() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace, extra: ["-v"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        // Direct UDP is blocked: the pair must be relayed, and the allocation released on close.
        try turn.expectMediaThroughTheRelay(in: namespace, label: "TURN relay", arguments: ["--turn", "127.0.0.2:3478,u,p"])
    }

    @Test func wrongTurnCredentialsFailClearlyWithinTheConnectBudget() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace) else { return }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 5,
                                              extraProbeArguments: ["--turn", "127.0.0.2:3478,u,wrong", "--relay-only", "--connect-timeout", "10"])
        defer { session.stop() }
        // The allocation fails before any answer is needed; should the probe wait for one anyway, it gets it.
        if session.probeResult(timeout: 10) == nil, let offer = RtcPublisherSession.waitForSdp(session.probe, timeout: 5) {
            #expect(!offer.contains("typ host"), "relay-only, yet the offer lists host candidates")
            session.receiver.type(offer + "\n")
            if let answer = RtcPublisherSession.waitForSdp(session.receiver, timeout: 20) { session.probe.type(answer + "\n") }
        }
        let result = try #require(session.probeResult(timeout: 30), "the probe gave no result: \(session.probe.log)")
        let reason = result["result"] as? String ?? ""
        print("wrong TURN credentials: \(reason)")
        #expect(result["status"] as? Int == 3, "the probe must fail to connect (status 3): \(reason)")
        #expect(reason.contains("refused the credentials"), "unclear error: \(reason)\ncoturn: \(turn.process.log.suffix(2000))")
        #expect(!reason.contains("wrong"), "the password appeared in the error")
    }
}

/// TURN over TCP (RFC 8656 §3.1): all UDP in the namespace is dropped except coturn's relay ports,
/// so the publisher reaches coturn only over TCP and aiortc only through the relayed UDP.
@Suite(.serialized, .tags(.integration, .netns)) struct RTCTurnTcpTests {
    @Test func mediaFlowsThroughCoturnOverTcpWhenAllUdpIsBlocked() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace(),
              let turn = try CoturnServer.start(in: namespace, extra: ["-v"]) else { return }
        guard try CoturnServer.blockAllUdpButRelays(in: namespace) else {
            skipTest("nft missing (Debian package nftables): UDP cannot be blocked")
            return
        }
        try turn.expectMediaThroughTheRelay(in: namespace, label: "TURN over TCP", arguments: ["--ice-server", "turn:127.0.0.2:3478?transport=tcp,u,p"])
        // The allocation was a TCP session of coturn's, which the publisher closed when it ended.
        #expect(turn.process.waitFor("TCP socket closed remotely", timeout: 5), "coturn logged no TCP session: \(turn.process.log.suffix(2000))")
    }

    /// Nothing listens on the TURN server's TCP port: relay-only fails at once with the reason,
    /// not after the allocation's time-out.
    @Test func aRefusedTcpConnectionFailsRelayOnlyClearly() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 5,
                                              extraProbeArguments: ["--ice-server", "turn:127.0.0.2:3478?transport=tcp,u,p", "--relay-only",
                                                                    "--connect-timeout", "10"])
        defer { session.stop() }
        if session.probeResult(timeout: 5) == nil, let offer = RtcPublisherSession.waitForSdp(session.probe, timeout: 5) {
            session.receiver.type(offer + "\n")
            if let answer = RtcPublisherSession.waitForSdp(session.receiver, timeout: 20) { session.probe.type(answer + "\n") }
        }
        let result = try #require(session.probeResult(timeout: 30), "the probe gave no result: \(session.probe.log)")
        let reason = result["result"] as? String ?? ""
        print("refused TURN TCP connection: \(reason)")
        #expect(result["status"] as? Int == 3, "the probe must fail to connect (status 3): \(reason)")
        #expect(reason.contains("over TCP") && reason.contains("refused"), "unclear error: \(reason)")
        #expect(!reason.contains("did not answer"), "it waited for a time-out: \(reason)")
    }
}
