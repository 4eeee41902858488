import Foundation
import KraklRTC
import Testing

/// Our client against our server, in memory: roles, key symmetry, MTU,
/// retransmission, wrong fingerprints on either side, close_notify.
@Suite(.tags(.unit))
struct RTCDtlsLoopbackTests {
    struct Pair {
        let clientCertificate: Certificate
        let serverCertificate: Certificate
        let client: DtlsTransport
        let server: DtlsTransport

        init(mtu: Int = 1200, clientProfiles: [SrtpProfile] = SrtpProfile.offered,
             serverProfiles: [SrtpProfile] = SrtpProfile.offered,
             clientExpects: CertificateFingerprint? = nil, serverExpects: CertificateFingerprint? = nil) throws {
            clientCertificate = try Certificate()
            serverCertificate = try Certificate()
            client = try DtlsTransport(role: .client, certificate: clientCertificate,
                                       expectedFingerprint: clientExpects ?? serverCertificate.fingerprint, mtu: mtu, profiles: clientProfiles)
            server = try DtlsTransport(role: .server, certificate: serverCertificate,
                                       expectedFingerprint: serverExpects ?? clientCertificate.fingerprint, mtu: mtu, profiles: serverProfiles)
        }

        func handshake() -> DtlsTestWire {
            var wire = DtlsTestWire()
            wire.run(client, server, first: client.start())
            return wire
        }
    }

    @Test func clientAndServerAgreeOnMirroredKeys() throws {
        let pair = try Pair()
        let wire = pair.handshake()
        let clientKeys = try #require(pair.client.keys, "client did not connect")
        let serverKeys = try #require(pair.server.keys, "server did not connect")
        #expect(wire.eventsA.filter({ $0.isConnected }).count == 1)
        #expect(wire.eventsB.filter({ $0.isConnected }).count == 1)
        // AES-256-GCM is first in both lists; its master key is 32 bytes, its salt 12.
        #expect(clientKeys.profile == .aeadAes256Gcm)
        #expect(clientKeys.localKey.count == 32 && clientKeys.localSalt.count == 12 && clientKeys.keyingMaterial.count == 88)
        #expect(clientKeys.keyingMaterial == serverKeys.keyingMaterial)
        #expect(clientKeys.localKey == serverKeys.remoteKey && clientKeys.localSalt == serverKeys.remoteSalt)
        #expect(clientKeys.remoteKey == serverKeys.localKey && clientKeys.remoteSalt == serverKeys.localSalt)
        #expect(clientKeys.localKey != clientKeys.remoteKey)
        #expect(pair.client.remoteFingerprint == pair.serverCertificate.fingerprint)
        #expect(pair.server.remoteFingerprint == pair.clientCertificate.fingerprint)
        #expect(pair.client.timeout == nil && pair.server.timeout == nil, "a timer still runs after the handshake")
        // Application data flows both ways over the finished connection.
        let data = pair.client.send(Array("hello".utf8))
        #expect(data.datagrams.count == 1)
        #expect(pair.server.receive(data.datagrams[0]).events == [.applicationData(Array("hello".utf8))])
    }

    @Test func profileFollowsWhatBothSidesSupport() throws {
        let pair = try Pair(clientProfiles: SrtpProfile.offered, serverProfiles: [.aes128CmHmacSha1_80])
        _ = pair.handshake()
        #expect(pair.client.keys?.profile == .aes128CmHmacSha1_80)
        #expect(pair.client.keys?.localSalt.count == 14)
        // A server without AES-256-GCM picks AES-128-GCM from our offer (OpenSSL: the server's order decides).
        let older = try Pair(clientProfiles: SrtpProfile.offered, serverProfiles: [.aeadAes128Gcm, .aes128CmHmacSha1_80])
        _ = older.handshake()
        #expect(older.server.keys?.profile == .aeadAes128Gcm)
        #expect(older.server.keys?.localKey.count == 16)
    }

    @Test func offersAes256GcmFirst() {
        #expect(SrtpProfile.offered == [.aeadAes256Gcm, .aeadAes128Gcm, .aes128CmHmacSha1_80])
        #expect(SrtpProfile.aeadAes256Gcm.opensslName == "SRTP_AEAD_AES_256_GCM" && SrtpProfile.aeadAes256Gcm.rawValue == 0x0008)
        #expect(SrtpProfile.aeadAes256Gcm.keyingMaterialLength == 2 * (32 + 12))
    }

    @Test func everyDatagramFitsTheMtu() throws {
        // 300 bytes forces the certificate flight into several fragments.
        let pair = try Pair(mtu: 300)
        let wire = pair.handshake()
        #expect(pair.client.keys != nil && pair.server.keys != nil, "handshake did not finish at MTU 300")
        #expect(wire.datagrams.allSatisfy { $0.count <= 300 }, "a datagram exceeds the MTU")
        #expect(wire.datagrams.count > 4, "nothing was fragmented")
    }

    @Test func lostFlightIsRetransmittedWhenTheTimerFires() throws {
        let pair = try Pair()
        var dropped = 0
        var wire = DtlsTestWire()
        // Lose the server's whole first answer; only the client's timer can recover.
        wire.run(pair.client, pair.server, first: pair.client.start()) { fromClient, datagram in
            if fromClient { return datagram }
            dropped += 1
            return nil
        }
        #expect(dropped > 0)
        #expect(pair.client.keys == nil)
        let due = try #require(pair.client.timeout, "no retransmission timer while waiting for the server")
        #expect(due <= 0.25 + 0.01, "first retransmission later than 250 ms")
        let deadline = try #require(pair.client.nextDeadline)
        #expect(deadline <= ContinuousClock.now + .milliseconds(260))
        // A timer is what we wait for here: bounded by its own deadline plus 2 s.
        let limit = Date().addingTimeInterval(due + 2)
        while let left = pair.client.timeout, left > 0, Date() < limit { usleep(UInt32(min(left, 0.01) * 1_000_000) + 100) }
        let retransmitted = pair.client.onTimer()
        #expect(!retransmitted.datagrams.isEmpty, "the timer sent nothing")
        var rest = DtlsTestWire()
        rest.run(pair.client, pair.server, first: retransmitted)
        // OpenSSL answers a repeated ClientHello only once its own timer has
        // run out (RFC 6347 §4.2.4 would have it answer at once); its timer
        // started a little after the client's, so an event loop may have to
        // fire it too. Bounded: a few timer periods.
        for _ in 0..<4 where pair.client.keys == nil || pair.server.keys == nil {
            guard let wait = [pair.client.timeout, pair.server.timeout].compactMap({ $0 }).min() else { break }
            usleep(UInt32(min(wait, 1) * 1_000_000) + 1_000)
            if let due = pair.server.timeout, due <= 0 { rest.run(pair.server, pair.client, first: pair.server.onTimer()) }
            if let due = pair.client.timeout, due <= 0 { rest.run(pair.client, pair.server, first: pair.client.onTimer()) }
        }
        #expect(pair.client.keys != nil && pair.server.keys != nil, "no recovery after the retransmission")
    }

    @Test func clientExpectingAnotherFingerprintFailsClosed() throws {
        let announced = try Certificate().fingerprint
        let pair = try Pair(clientExpects: announced)
        let wire = pair.handshake()
        let expected = DtlsError.fingerprintMismatch(expected: announced, received: pair.serverCertificate.fingerprint)
        #expect(wire.eventsA.contains(.failed(expected)))
        #expect(pair.client.state == .failed(expected))
        #expect(pair.client.keys == nil && pair.server.keys == nil, "keys exported despite the mismatch")
        // The server learns it through our alert and fails too.
        #expect(wire.eventsB.contains(where: { $0.isFailure }), "the server did not fail")
        let message = expected.description
        #expect(message.contains(announced.short) && message.contains(pair.serverCertificate.fingerprint.short))
        // A failed transport stays failed: nothing more goes in or out.
        #expect(pair.client.receive([22, 254, 253, 0, 0]).datagrams.isEmpty)
        #expect(pair.client.onTimer().datagrams.isEmpty)
    }

    @Test func serverExpectingAnotherFingerprintFailsClosed() throws {
        let announced = try Certificate().fingerprint
        let pair = try Pair(serverExpects: announced)
        let wire = pair.handshake()
        #expect(wire.eventsB.contains(.failed(.fingerprintMismatch(expected: announced, received: pair.clientCertificate.fingerprint))))
        #expect(pair.server.keys == nil)
        // The client never gets the server's Finished, so it never has keys either.
        #expect(pair.client.keys == nil)
        #expect(wire.eventsA.contains(where: { $0.isFailure }), "the client did not hear the alert")
    }

    @Test func closeNotifyBecomesRemoteClosedOnTheOtherSide() throws {
        let pair = try Pair()
        _ = pair.handshake()
        try #require(pair.client.keys != nil)
        let bye = pair.client.close()
        #expect(pair.client.state == .closed)
        #expect(!bye.datagrams.isEmpty, "close sent no close_notify")
        var events: [DtlsEvent] = []
        var replies: [[UInt8]] = []
        for datagram in bye.datagrams {
            let output = pair.server.receive(datagram)
            events += output.events
            replies += output.datagrams
        }
        #expect(events == [.remoteClosed])
        #expect(pair.server.state == .closed)
        #expect(!replies.isEmpty, "the server did not answer with its own close_notify")
        // Closing twice, or after the peer closed, is harmless.
        #expect(pair.client.close().datagrams.isEmpty)
        #expect(pair.server.close().datagrams.isEmpty)
    }

    @Test func recognisesDtlsByFirstByte() {
        #expect(DtlsTransport.isDtls([22, 254, 253]))
        #expect(DtlsTransport.isDtls([63]))
        #expect(!DtlsTransport.isDtls([0, 1]))    // STUN
        #expect(!DtlsTransport.isDtls([0x80]))    // RTP/RTCP
        #expect(!DtlsTransport.isDtls([]))
    }
}
