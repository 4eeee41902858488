import KraklBase
import Foundation
import Testing
@testable import KraklRTC

/// A test CA and a server certificate for turn.krakl.test signed by it, made with the openssl CLI
/// (ECDSA P-256, valid two days), and a second CA that signed nothing.
struct TurnTestCertificates {
    let folder: String
    var caFile: String { folder + "/ca.pem" }
    var otherCAFile: String { folder + "/other-ca.pem" }
    var certFile: String { folder + "/server.pem" }
    var keyFile: String { folder + "/server.key" }
    static let name = "turn.krakl.test"

    /// nil (after SKIP) when openssl is not installed.
    static func make() throws -> TurnTestCertificates? {
        guard let openssl = Harness.which("openssl") else {
            skipTest("openssl is not installed (Debian package openssl)")
            return nil
        }
        let certificates = TurnTestCertificates(folder: try Harness.temporaryDirectory())
        let folder = certificates.folder
        try "subjectAltName=DNS:\(name)\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            .write(toFile: folder + "/server.ext", atomically: true, encoding: .utf8)
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for arguments in [["req", "-x509"] + key + ["-keyout", folder + "/ca.key", "-out", certificates.caFile, "-days", "2", "-subj", "/CN=krakl test CA"],
                          ["req", "-x509"] + key + ["-keyout", folder + "/other-ca.key", "-out", certificates.otherCAFile, "-days", "2",
                                                     "-subj", "/CN=krakl other CA"],
                          ["req"] + key + ["-keyout", certificates.keyFile, "-out", folder + "/server.csr", "-subj", "/CN=\(name)"],
                          ["x509", "-req", "-in", folder + "/server.csr", "-CA", certificates.caFile, "-CAkey", folder + "/ca.key",
                           "-CAcreateserial", "-out", certificates.certFile, "-days", "2", "-extfile", folder + "/server.ext"]] {
            let result = try Harness.run(openssl, arguments, timeout: 30)
            try #require(result.status == 0, "openssl \(arguments.prefix(2).joined(separator: " ")): \(result.stderr)")
        }
        return certificates
    }
}

extension CoturnServer {
    /// Drops all UDP in the namespace except coturn's relay ports: the publisher reaches coturn only
    /// over TCP (or TLS), aiortc only through the relayed UDP. False when nft is missing.
    static func blockAllUdpButRelays(in namespace: RtcTestNamespace) throws -> Bool {
        guard try namespace.prepareFaults() else { return false }
        for rule in [["udp", "sport", relayPorts, "accept"], ["udp", "dport", relayPorts, "accept"], ["meta", "l4proto", "udp", "drop"]] {
            let result = try namespace.run(RtcTestNamespace.nft, ["add", "rule", "inet", "krakl", "input"] + rule)
            try #require(result.status == 0, "nft: \(result.stderr)")
        }
        return true
    }

    /// A 5 s publisher session through the relay `server` (with `arguments`), judged as media through
    /// a relay: connected over a relayed pair, aiortc decoding in order, the allocation released.
    /// Returns the probe's stats for checks of the transport's own.
    @discardableResult
    func expectMediaThroughTheRelay(in namespace: RtcTestNamespace, label: String, arguments: [String]) throws -> [String: Any] {
        let session = try RtcPublisherSession(namespace: namespace, seconds: 5, extraProbeArguments: arguments + ["--connect-timeout", "15"])
        defer { session.stop() }
        try session.exchange()
        let result = try #require(session.probeResult(timeout: 60), "the probe gave no result: \(session.probe.log)")
        let report = try #require(session.receiverReport(timeout: 30), "aiortc gave no report: \(session.receiver.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let sent = stats["frames_sent"] as? Int ?? 0
        let decoded = report["frames_decoded"] as? Int ?? 0
        print("\(label): connected \(stats["connect_ms"] ?? "-") ms after the answer over \(stats["selected_pair_types"] ?? "-") (\(stats["selected_pair"] ?? "-")); \(decoded) of \(sent) frames decoded; relay errors \(stats["relay_errors"] ?? "-")")
        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")\n\(session.probe.log)\ncoturn: \(process.log.suffix(3000))")
        #expect((stats["selected_pair_types"] as? String)?.hasPrefix("relay/udp") == true,
                "the selected pair is \(stats["selected_pair_types"] ?? "none")")
        // Frames flow (a small number, not a rate: krakl-bench turn measures it).
        #expect(sent >= 30, "only \(sent) frames sent in 5 s")
        #expect(Double(decoded) >= 0.8 * Double(sent), "aiortc decoded \(decoded) of \(sent) frames through the relay")
        #expect(report["decreasing"] as? Int == 0, "frame numbers went backwards \(report["decreasing"] ?? "?") times")
        #expect((report["stamps_read"] as? Int ?? 0) >= decoded * 9 / 10, "frame stamps unreadable in most frames")
        #expect(process.waitFor("refreshed, realm=<krakl>, username=<u>, lifetime=0", timeout: 5),
                "coturn logged no deallocation: \(process.log.suffix(2000))")
        return stats
    }
}

/// TURN over TLS (`turns:`, RFC 7065; RFC 8656 §3.1): coturn with a certificate of a test CA for
/// turn.krakl.test (a name from the test's hosts file), reached on 5349 (the default port).
@Suite(.serialized, .tags(.integration, .netns)) struct RTCTurnTlsTests {
    /// Relay-only runs end before an answer is needed; should the probe wait for one, it gets it.
    static func answerIfAsked(_ session: RtcPublisherSession) {
        if session.probeResult(timeout: 5) == nil, let offer = RtcPublisherSession.waitForSdp(session.probe, timeout: 5) {
            session.receiver.type(offer + "\n")
            if let answer = RtcPublisherSession.waitForSdp(session.receiver, timeout: 20) { session.probe.type(answer + "\n") }
        }
    }

    /// A relay-only publisher session with `arguments` that must fail to connect (the probe's status 3):
    /// its reason (printed after `label`) and the probe's log, for the checks of the case.
    static func relayOnlyFailure(in namespace: RtcTestNamespace, label: String, arguments: [String], seconds: Double = 5,
                                 connectTimeout: Int = 10) throws -> (reason: String, log: String) {
        let session = try RtcPublisherSession(namespace: namespace, seconds: seconds,
                                              extraProbeArguments: arguments + ["--relay-only", "--connect-timeout", "\(connectTimeout)"])
        defer { session.stop() }
        answerIfAsked(session)
        let result = try #require(session.probeResult(timeout: Double(connectTimeout) + 20), "the probe gave no result: \(session.probe.log)")
        let reason = result["result"] as? String ?? ""
        print("\(label): \(reason)")
        #expect(result["status"] as? Int == 3, "the probe must fail to connect (status 3): \(reason)")
        return (reason, session.probe.log)
    }

    @Test func mediaFlowsThroughCoturnOverTlsWhenAllUdpIsBlocked() throws {
        guard RtcPublisherSession.prerequisites(), let certificates = try TurnTestCertificates.make(),
              let namespace = try RtcTestNamespace() else { return }
        let hosts = try HostsFile(namespace: namespace, "127.0.0.2 \(TurnTestCertificates.name)\n")
        defer { hosts.remove() }
        guard let turn = try CoturnServer.start(in: namespace, extra: ["-v"], tls: (certificates.certFile, certificates.keyFile)) else { return }
        guard try CoturnServer.blockAllUdpButRelays(in: namespace) else {
            skipTest("nft missing (Debian package nftables): UDP cannot be blocked")
            return
        }
        try turn.expectMediaThroughTheRelay(in: namespace, label: "TURN over TLS",
                                            arguments: ["--ice-server", "turns:\(TurnTestCertificates.name),u,p", "--ice-ca", certificates.caFile])
        // The allocation was made over TLS on 5349.
        #expect(turn.process.log.contains("TLS"), "coturn logged no TLS session: \(turn.process.log.suffix(3000))")
    }

    /// The server's certificate is from a CA the agent was not told to trust: relay-only fails at
    /// once, naming the server and the verification failure, not after an Allocate time-out.
    @Test func aCertificateFromAnotherCAFailsClearly() throws {
        guard RtcPublisherSession.prerequisites(), let certificates = try TurnTestCertificates.make(),
              let namespace = try RtcTestNamespace() else { return }
        let hosts = try HostsFile(namespace: namespace, "127.0.0.2 \(TurnTestCertificates.name)\n")
        defer { hosts.remove() }
        guard let turn = try CoturnServer.start(in: namespace, tls: (certificates.certFile, certificates.keyFile)) else { return }
        let (reason, log) = try Self.relayOnlyFailure(in: namespace, label: "turns: with the wrong CA",
                                                      arguments: ["--ice-server", "turns:\(TurnTestCertificates.name):5349,u,secret-pw",
                                                                  "--ice-ca", certificates.otherCAFile])
        #expect(reason.contains("TURN server \(TurnTestCertificates.name) (127.0.0.2:5349) over TLS"), "the server is not named: \(reason)")
        #expect(reason.contains("not trusted for \(TurnTestCertificates.name)") && reason.contains("local issuer"),
                "unclear error: \(reason)\ncoturn: \(turn.process.log.suffix(2000))")
        #expect(!reason.contains("did not answer"), "it waited for a time-out: \(reason)")
        #expect(!log.contains("secret-pw"), "the credential was printed")
    }

    /// A certificate for turn.krakl.test does not do for turns:127.0.0.2 (no IP address in it).
    @Test func aCertificateForAnotherNameFailsClearly() throws {
        guard RtcPublisherSession.prerequisites(), let certificates = try TurnTestCertificates.make(),
              let namespace = try RtcTestNamespace() else { return }
        guard let turn = try CoturnServer.start(in: namespace, tls: (certificates.certFile, certificates.keyFile)) else { return }
        defer { turn.process.stop() }
        let (reason, _) = try Self.relayOnlyFailure(in: namespace, label: "turns: by an address the certificate is not for",
                                                    arguments: ["--ice-server", "turns:127.0.0.2,u,p", "--ice-ca", certificates.caFile])
        #expect(reason.contains("not trusted for 127.0.0.2") && reason.contains("mismatch"), "unclear error: \(reason)")
    }

    /// An unreadable CA file: the relay fails at once saying which file.
    @Test func anUnreadableCAFileFailsClearly() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let (reason, _) = try Self.relayOnlyFailure(in: namespace, label: "turns: with an unreadable CA file",
                                                    arguments: ["--ice-server", "turns:127.0.0.2,u,p", "--ice-ca", "/nonexistent/ca.pem"])
        #expect(reason.contains("/nonexistent/ca.pem"), "the file is not named: \(reason)")
    }
}

/// What a `turns:` server sends before the handshake is done reaches OpenSSL through our memory
/// BIOs: mutated records (a ServerHello, an alert, application data) and random bytes either keep
/// the handshake waiting or fail it with a reason; none completes it, none crashes.
@Suite(.tags(.unit)) struct TurnTlsFuzzTests {
    @Test func fuzzedServerBytesNeverCompleteOrCrashTheHandshake() throws {
        let context = try TLSClientContext(caFile: nil)
        let random32 = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        let serverHello: [UInt8] = [0x16, 0x03, 0x03, 0x00, 0x2A, 0x02, 0x00, 0x00, 0x26, 0x03, 0x03] + random32 + [0x00, 0x13, 0x01, 0x00]
        let samples: [[UInt8]] = [serverHello, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28], [0x17, 0x03, 0x03, 0x00, 0x04, 1, 2, 3, 4],
                                  serverHello + [0x16, 0x03, 0x03, 0x00, 0x04, 0x0B, 0x00, 0x00, 0x00]]
        var reasons = Set<String>()
        let outcome = Fuzz.run(seed: 0x7155_5349, samples: samples, iterations: 3_000) { input in
            let session = try TurnTlsSession(context: context, name: "turn.krakl.test")
            #expect(session.handshake() == nil && !session.takeOutgoing().isEmpty, "no ClientHello")
            session.feed(input[...])
            let failure = session.handshake()
            #expect(!session.handshakeDone, "a handshake completed on fuzzed bytes")
            if let failure {
                reasons.insert(String(failure.reason.prefix(60)))
                throw StunError.truncated(needed: 0, got: input.count)
            }
        }
        print("TURN TLS handshake fuzz: \(outcome.inputs) inputs, \(outcome.accepted) left it waiting, \(outcome.rejected) failed it; \(reasons.count) distinct reasons")
        #expect(outcome.inputs >= 1000 && outcome.rejected > 0)
        #expect(reasons.allSatisfy { $0.contains("turn.krakl.test") }, "a reason does not name the server: \(reasons)")
    }
}

/// `krakl-agent --join` through `turns:` (the options as a user gives them): a WHIP room on aiortc,
/// coturn with the test certificate, relay-only.
@Suite(.serialized, .tags(.integration, .netns)) struct AgentTurnTlsTests {
    struct Rig {
        let room: RoomSessionTests.WhipRoom
        let certificates: TurnTestCertificates
        let hosts: HostsFile
        let turn: CoturnServer

        init?() throws {
            guard let room = try RoomSessionTests.WhipRoom(), let certificates = try TurnTestCertificates.make() else { return nil }
            hosts = try HostsFile(namespace: room.namespace, "127.0.0.2 \(TurnTestCertificates.name)\n")
            // A user whose password is long enough to look for in the agent's output.
            guard let turn = try CoturnServer.start(in: room.namespace, extra: ["-v", "--user=ann:secret-pw"],
                                                    tls: (certificates.certFile, certificates.keyFile)) else {
                hosts.remove()
                return nil
            }
            self.room = room
            self.certificates = certificates
            self.turn = turn
        }

        func agent(caFile: String) throws -> DtlsTestProcess {
            let (code, _) = try room.codeFile(identity: "Ann")
            let (program, argv) = room.namespace.command(Harness.agent, [
                "--join", "@" + code, "--once", "--address", "127.0.0.2", "--plugins", room.registry, "--option", "scene=typing",
                "--option", "width=640", "--option", "height=360", "--ice-server", "turns:\(TurnTestCertificates.name),ann,secret-pw",
                "--ice-ca", caFile, "--ice-transport", "relay", "--connect-timeout", "10"])
            return try DtlsTestProcess(program, argv)
        }
    }

    @Test func theAgentSharesThroughTurns() throws {
        guard let rig = try Rig() else { return }
        defer { rig.hosts.remove() }
        // Direct UDP between the agent and the room dropped: the relay is the only path.
        guard try CoturnServer.blockDirectUdp(in: rig.room.namespace) else {
            return skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
        }
        let agent = try rig.agent(caFile: rig.certificates.caFile)
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log)\ncoturn: \(rig.turn.process.log.suffix(2000))")
        // The path as the person sees it, and the relay candidate trickled to the room (issue 24).
        #expect(agent.waitFor("connected relay/tls -> host", timeout: 10), "no relay/tls pair in the status line: \(agent.log.suffix(600))")
        #expect(CandidateDeliveryTests.relayThenEnd(rig.room.server), "the room was not sent the relay candidate and the end: \(rig.room.server.requests("PATCH"))")
        _ = agent.waitFor("\u{1}never\u{1}", timeout: 3)  // frames flow for 3 s
        agent.signal(SIGTERM)
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 10)
        #expect(status == 0, "exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(500))")
        #expect(rig.turn.process.log.contains("ALLOCATE processed, success"), "no allocation: \(rig.turn.process.log.suffix(2000))")
        rig.room.server.process.stop()
        let numbers = (rig.room.server.events.last { $0["report"] != nil }?["report"] as? [String: Any]) ?? [:]
        print("agent through turns: \(numbers["frames"] ?? "-") frames decoded by aiortc")
        #expect(numbers["frames"] as? Int ?? 0 >= 45, "aiortc decoded too few frames through the relay: \(numbers)")
        #expect(!agent.log.contains("secret-pw"), "the credential was printed")
    }

    /// The other CA: the session ends at once with the relay's own status (58), saying which server and why.
    @Test func aWrongCAEndsTheAgentsSessionClearly() throws {
        guard let rig = try Rig() else { return }
        defer { rig.hosts.remove() }
        let agent = try rig.agent(caFile: rig.certificates.otherCAFile)
        defer { agent.stop() }
        let (status, _) = RoomSessionTests.waitExit(agent, seconds: 40)
        let log = agent.log
        print("agent, turns: with the wrong CA: exit \(status.map(String.init) ?? "none"): \(log.split(whereSeparator: \.isNewline).filter { $0.contains("not trusted") }.first ?? "-")")
        #expect(status == 58, "exit \(status.map(String.init) ?? "none") (58 = the relay's certificate is not trusted): \(log.suffix(800))")
        #expect(log.contains("TURN server \(TurnTestCertificates.name) (127.0.0.2:5349) over TLS: the server's certificate is not trusted for \(TurnTestCertificates.name)"),
                "unclear error: \(log.suffix(800))")
        #expect(!log.contains("secret-pw"), "the credential was printed")
    }
}

/// A `turns:` server that accepts the TCP connection and never says a word (a TLS port behind
/// something that swallows it): relay-only fails when the Allocate's time is up, saying it was over TLS.
@Suite(.tags(.integration, .netns)) struct RTCTurnTlsSilentServerTests {
    @Test func aSilentTlsServerFailsWithinTheAllocateTime() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        // Listens (the kernel completes connections from the backlog) and never accepts or reads.
        let (p, a) = namespace.command("/usr/bin/python3", ["-c", "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.2', 5349))\ns.listen(8)\nprint('listening', flush=True)\ntime.sleep(120)"])
        let silent = try DtlsTestProcess(p, a)
        defer { silent.stop() }
        try #require(silent.waitFor("listening", timeout: 10), "the silent server did not start: \(silent.log)")
        let (reason, _) = try RTCTurnTlsTests.relayOnlyFailure(in: namespace, label: "silent turns: server",
                                                               arguments: ["--ice-server", "turns:127.0.0.2,u,p"], connectTimeout: 20)
        #expect(reason.contains("TURN server 127.0.0.2:5349 did not answer Allocate") && reason.contains("over TLS"), "unclear error: \(reason)")
    }
}
