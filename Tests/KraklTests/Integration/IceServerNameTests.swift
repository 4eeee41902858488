import Foundation
import Testing
import KraklRTC
import KraklRoom
import KraklSession

/// ICE servers by name (issue 16): getaddrinfo bounded in time, every address used, clear errors.
/// Names come from a hosts file of the test (ip netns exec bind-mounts /etc/netns/NAME/hosts over
/// /etc/hosts), never from a DNS server.
@Suite(.serialized, .tags(.integration, .netns)) struct IceServerNameTests {
    @Test func addressesNeedNoLookupAndUnusableServersSayWhy() {
        let servers = [IceServer(url: "stun:127.0.0.2"), IceServer(url: "turn:[::1]:3479", username: "u", credential: "secret-pw"),
                       IceServer(url: "turn:127.0.0.2?transport=tcp", username: "u", credential: "secret-pw"),
                       IceServer(url: "turns:127.0.0.2", username: "u", credential: "secret-pw"),
                       IceServer(url: "turns:127.0.0.2?transport=udp", username: "u", credential: "secret-pw"),
                       IceServer(url: "turn:127.0.0.2")]
        let resolved = ResolvedIceServers.resolve(servers, timeout: .seconds(2))
        #expect(resolved.stunServers == [TransportAddress(ip: IPAddress("127.0.0.2")!, port: 3478)])
        #expect(resolved.turnServers == [TurnServer(address: TransportAddress(ip: IPAddress("::1")!, port: 3479), username: "u", password: "secret-pw"),
                                         TurnServer(address: TransportAddress(ip: IPAddress("127.0.0.2")!, port: 3478), username: "u", password: "secret-pw",
                                                    transport: .tcp),
                                         // turns: is TLS on 5349 by default, the certificate checked for the URL's host.
                                         TurnServer(address: TransportAddress(ip: IPAddress("127.0.0.2")!, port: 5349), username: "u", password: "secret-pw",
                                                    transport: .tls, tlsName: "127.0.0.2")])
        #expect(resolved.problems.count == 2, "\(resolved.problems)")
        #expect(resolved.problems.contains { $0.contains("turns:") && $0.contains("DTLS") })
        #expect(resolved.problems.contains { $0.contains("needs a user name and credential") })
        #expect(!resolved.problems.joined().contains("secret-pw"), "a credential in: \(resolved.problems)")
    }

    @Test func localhostResolvesFromTheHostsFile() {
        let result = HostNameResolver.resolve(["localhost"], timeout: .seconds(2))["localhost"]
        guard case .success(let addresses) = result else {
            Issue.record("localhost did not resolve: \(String(describing: result))")
            return
        }
        #expect(addresses.contains(IPAddress("127.0.0.1")!), "localhost is \(addresses)")
    }

    /// A session whose only TURN server is a name with two addresses, both coturn's (listening on
    /// 127.0.0.2 and 127.0.0.3), direct UDP blocked: both are allocated on, media flows through a relay.
    @Test func aNameWithSeveralAddressesIsAllocatedOnEach() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let hosts = try HostsFile(namespace: namespace, "127.0.0.2 turn.krakl.test\n127.0.0.3 turn.krakl.test\n")
        defer { hosts.remove() }
        guard let turn = try CoturnServer.start(in: namespace, extra: ["-v", "--listening-ip=127.0.0.3"]) else { return }
        guard try CoturnServer.blockDirectUdp(in: namespace) else {
            skipTest("nft missing (Debian package nftables): direct UDP cannot be blocked")
            return
        }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 3,
                                              extraProbeArguments: ["--ice-server", "turn:turn.krakl.test:3478,u,p", "--connect-timeout", "15"])
        defer { session.stop() }
        try session.exchange()
        let result = try #require(session.probeResult(timeout: 60), "the probe gave no result: \(session.probe.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        print("TURN by name: \(result["result"] ?? "-"), pair \(stats["selected_pair_types"] ?? "-") (\(stats["selected_pair"] ?? "-")), relay errors \(stats["relay_errors"] ?? "-")")
        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")\n\(session.probe.log)\ncoturn: \(turn.process.log.suffix(3000))")
        #expect((stats["selected_pair_types"] as? String)?.hasPrefix("relay/udp") == true)
        // One allocation per address of the name (the namespace has one IPv4 base): two, not one.
        let allocations = turn.process.log.components(separatedBy: "ALLOCATE processed, success").count - 1
        #expect(allocations == 2, "\(allocations) allocations for a name of two addresses: \(turn.process.log.suffix(3000))")
    }

    /// RFC 6761: .invalid never resolves. Relay-only with that as the only TURN server: the session
    /// ends at once, naming the name.
    @Test func aNameThatDoesNotResolveIsAClearError() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let hosts = try HostsFile(namespace: namespace, "127.0.0.2 turn.krakl.test\n")
        defer { hosts.remove() }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 3,
                                              extraProbeArguments: ["--ice-server", "turn:nonexistent.invalid:3478,u,secret-pw", "--relay-only",
                                                                    "--connect-timeout", "10"])
        defer { session.stop() }
        let result = try #require(session.probeResult(timeout: 30), "the probe gave no result: \(session.probe.log)")
        let reason = result["result"] as? String ?? ""
        print("unresolvable TURN name: \(reason)")
        #expect(result["status"] as? Int != 0)
        #expect(reason.contains("nonexistent.invalid") && reason.contains("does not resolve"), "unclear error: \(reason)\n\(session.probe.log)")
        #expect(reason.contains("relay-only"), "unclear error: \(reason)")
        #expect(!reason.contains("secret-pw") && !session.probe.log.contains("secret-pw"), "the credential was printed")
    }
}

/// /etc/netns/NAME/hosts: what programs started with `ip netns exec NAME` see as /etc/hosts.
struct HostsFile {
    let directory: String

    init(namespace: RtcTestNamespace, _ text: String) throws {
        directory = "/etc/netns/\(namespace.name)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try text.write(toFile: directory + "/hosts", atomically: true, encoding: .utf8)
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}
