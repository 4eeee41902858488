import Foundation
import KraklRTC
import Testing

/// Our DTLS-SRTP against OpenSSL's own command-line peers over real UDP on
/// 127.0.0.1: the handshake, the negotiated profile, the exported SRTP
/// keying material (compared byte for byte with what openssl prints),
/// certificate fingerprints, and close_notify both ways.
@Suite(.serialized, .tags(.integration)) struct RTCDtlsOpenSSLTests {
    static let label = "EXTRACTOR-dtls_srtp"

    @Test(arguments: SrtpProfile.allCases)
    func ourClientAgainstOpenSSLServer(profile: SrtpProfile) throws {
        let folder = try Harness.temporaryDirectory()
        let peer = try DtlsTestPeerIdentity(in: folder)
        guard let server = try DtlsTestProcess.openssl(["s_server", "-dtls1_2", "-accept", "127.0.0.1:0",
                                                "-cert", peer.certificatePath, "-key", peer.keyPath,
                                                "-use_srtp", profile.opensslName, "-Verify", "1",
                                                "-keymatexport", Self.label, "-keymatexportlen", "\(profile.keyingMaterialLength)"]) else { return }
        defer { server.stop() }
        let accept = try #require(server.value(after: "ACCEPT "), "s_server never printed ACCEPT")
        let port = try #require(accept.split(separator: ":").last.flatMap { UInt16($0) }, "no port in ACCEPT line")

        let ours = try Certificate()
        let transport = try DtlsTransport(role: .client, certificate: ours, expectedFingerprint: peer.fingerprint)
        let socket = try DtlsTestUdpSocket()
        let pump = DtlsTestPump(transport, socket: socket, peer: DtlsTestUdpSocket.loopback(port: port))
        let started = ContinuousClock.now
        pump.deliver(transport.start())
        pump.run(seconds: 10) { $0.transport.keys != nil || $0.failure != nil }
        let elapsed = ContinuousClock.now - started
        #expect(pump.failure == nil, "handshake failed: \(String(describing: pump.failure))")
        let keys = try #require(transport.keys, "no keys: the handshake did not finish")
        print("DTLS handshake, our client vs openssl s_server (\(profile.opensslName)): \(dtlsMilliseconds(elapsed)), \(pump.datagramsSent) datagrams sent, largest \(pump.largestDatagram) bytes")

        #expect(keys.profile == profile)
        #expect(transport.remoteFingerprint == peer.fingerprint)
        #expect(pump.largestDatagram <= transport.mtu)
        #expect(server.waitFor("SRTP Extension negotiated, profile=\(profile.opensslName)"), "s_server did not report the profile")
        let printed = try #require(server.value(after: "Keying material: "), "s_server printed no keying material")
        #expect(dtlsHex(keys.keyingMaterial) == printed.uppercased(), "our exported SRTP keying material differs from OpenSSL's")
        // We are the client: our key is the first K bytes, the server's the next K (RFC 5764 §4.2).
        #expect(keys.localKey == Array(keys.keyingMaterial[0..<profile.keyLength]))
        // s_server saw and printed our certificate: the CN is ours.
        #expect(server.waitFor("CN = \(ours.commonName)"), "s_server did not see our certificate")

        // Our close_notify: s_server reads it as the end of the connection ("DONE").
        pump.deliver(transport.close())
        #expect(transport.state == .closed)
        #expect(server.waitFor("DONE"), "s_server did not see our close_notify")
    }

    @Test(arguments: SrtpProfile.allCases)
    func ourServerAgainstOpenSSLClient(profile: SrtpProfile) throws {
        let folder = try Harness.temporaryDirectory()
        let peer = try DtlsTestPeerIdentity(in: folder)
        let ours = try Certificate()
        let transport = try DtlsTransport(role: .server, certificate: ours, expectedFingerprint: peer.fingerprint)
        let socket = try DtlsTestUdpSocket()
        let pump = DtlsTestPump(transport, socket: socket)
        guard let client = try DtlsTestProcess.openssl(["s_client", "-dtls1_2", "-connect", "127.0.0.1:\(socket.port)",
                                                "-cert", peer.certificatePath, "-key", peer.keyPath,
                                                "-use_srtp", profile.opensslName,
                                                "-keymatexport", Self.label, "-keymatexportlen", "\(profile.keyingMaterialLength)"]) else { return }
        defer { client.stop() }
        pump.run(seconds: 10) { $0.transport.keys != nil || $0.failure != nil }
        #expect(pump.failure == nil, "handshake failed: \(String(describing: pump.failure))")
        let keys = try #require(transport.keys, "no keys: the handshake did not finish")
        #expect(keys.profile == profile)
        #expect(pump.largestDatagram <= transport.mtu)
        #expect(client.waitFor("SRTP Extension negotiated, profile=\(profile.opensslName)"), "s_client did not report the profile")
        let printed = try #require(client.value(after: "Keying material: "), "s_client printed no keying material")
        #expect(dtlsHex(keys.keyingMaterial) == printed.uppercased(), "our exported SRTP keying material differs from OpenSSL's")
        // We are the server: our key is the second K bytes.
        #expect(keys.localKey == Array(keys.keyingMaterial[profile.keyLength..<2 * profile.keyLength]))
        // s_client verified the chain it got and names our CN as the subject.
        #expect(client.waitFor("CN = \(ours.commonName)"), "s_client did not see our certificate")

        // "Q" makes s_client shut down: its close_notify becomes remoteClosed here.
        client.type("Q\n")
        let closed = pump.run(seconds: 10) { $0.events.contains(.remoteClosed) }
        #expect(closed, "no remoteClosed after s_client's close_notify")
        #expect(transport.state == .closed)
        #expect(client.waitForExit(seconds: 10), "s_client did not end")
    }

    @Test func openSSLServerWithTheWrongCertificateFailsClosed() throws {
        let folder = try Harness.temporaryDirectory()
        let peer = try DtlsTestPeerIdentity(in: folder)
        guard let server = try DtlsTestProcess.openssl(["s_server", "-dtls1_2", "-accept", "127.0.0.1:0",
                                                "-cert", peer.certificatePath, "-key", peer.keyPath,
                                                "-use_srtp", SrtpProfile.aes128CmHmacSha1_80.opensslName]) else { return }
        defer { server.stop() }
        let accept = try #require(server.value(after: "ACCEPT "), "s_server never printed ACCEPT")
        let port = try #require(accept.split(separator: ":").last.flatMap { UInt16($0) }, "no port in ACCEPT line")
        // The answer announced some other certificate (an attacker's view of it).
        let announced = try Certificate().fingerprint
        let transport = try DtlsTransport(role: .client, certificate: try Certificate(), expectedFingerprint: announced)
        let pump = DtlsTestPump(transport, socket: try DtlsTestUdpSocket(), peer: DtlsTestUdpSocket.loopback(port: port))
        pump.deliver(transport.start())
        pump.run(seconds: 10) { $0.failure != nil || $0.transport.keys != nil }
        #expect(transport.keys == nil, "keys were exported despite the wrong certificate")
        #expect(pump.failure == .fingerprintMismatch(expected: announced, received: peer.fingerprint))
        let message = pump.failure?.description ?? ""
        #expect(message.contains(announced.short) && message.contains(peer.fingerprint.short), "the error does not name both fingerprints")
        // OpenSSL heard why: our bad_certificate alert.
        #expect(server.waitFor("bad certificate", timeout: 5), "s_server did not report our alert")
    }

    /// We offer AEAD suites only: a server that has nothing else gets no handshake
    /// (with CBC, OpenSSL 3.0 would make any forged record fatal; docs/webrtc.md).
    @Test func openSSLServerWithOnlyACbcSuiteGetsNoHandshake() throws {
        let folder = try Harness.temporaryDirectory()
        let peer = try DtlsTestPeerIdentity(in: folder)
        guard let server = try DtlsTestProcess.openssl(["s_server", "-dtls1_2", "-accept", "127.0.0.1:0",
                                                "-cert", peer.certificatePath, "-key", peer.keyPath, "-cipher", "ECDHE-ECDSA-AES128-SHA",
                                                "-use_srtp", SrtpProfile.aeadAes128Gcm.opensslName]) else { return }
        defer { server.stop() }
        let accept = try #require(server.value(after: "ACCEPT "), "s_server never printed ACCEPT")
        let port = try #require(accept.split(separator: ":").last.flatMap { UInt16($0) }, "no port in ACCEPT line")
        let transport = try DtlsTransport(role: .client, certificate: try Certificate(), expectedFingerprint: peer.fingerprint)
        let pump = DtlsTestPump(transport, socket: try DtlsTestUdpSocket(), peer: DtlsTestUdpSocket.loopback(port: port))
        pump.deliver(transport.start())
        pump.run(seconds: 10) { $0.failure != nil || $0.transport.keys != nil }
        #expect(transport.keys == nil, "a handshake finished on a CBC suite")
        #expect(pump.failure != nil, "no failure reported")
        #expect(server.waitFor("no shared cipher", timeout: 5), "s_server did not report the missing shared cipher: \(server.log)")
    }
}
