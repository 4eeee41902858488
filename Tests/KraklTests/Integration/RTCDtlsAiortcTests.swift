import Foundation
import KraklRTC
import Testing

/// Our DTLS-SRTP against aiortc's RTCDtlsTransport (pyOpenSSL + pylibsrtp),
/// the WebRTC peer the publisher must interoperate with. aiortc's DTLS runs
/// over an ICE transport; the harness gives it a stand-in that is a plain
/// UDP socket on 127.0.0.1, so no ICE is involved. Each side then sends one
/// SRTP packet that the other must decrypt: that proves the keys are split
/// the same way on both ends, not only that the handshake finished.
@Suite(.serialized, .tags(.integration)) struct RTCDtlsAiortcTests {
    static let python = "/opt/krakl-venv/bin/python"

    /// argv: role ("client"/"server" for aiortc), our UDP port, our fingerprint.
    /// Prints JSON lines: its port and fingerprint; "connected"; each RTP
    /// packet it decrypted; its final state.
    static let script = """
    import asyncio, json, sys
    from aiortc.rtcdtlstransport import RTCCertificate, RTCDtlsTransport, RTCDtlsParameters, RTCDtlsFingerprint

    def say(**fields):
        print(json.dumps(fields), flush=True)

    class UdpIce:
        # Only what RTCDtlsTransport uses of RTCIceTransport: role, _send, _recv.
        def __init__(self, peer):
            self.role = "controlled"
            self.peer = peer
            self.queue = asyncio.Queue()
        def connection_made(self, transport):
            self.transport = transport
        def datagram_received(self, data, addr):
            self.queue.put_nowait(data)
        def error_received(self, exc):
            pass
        def connection_lost(self, exc):
            pass
        async def _send(self, data):
            self.transport.sendto(data, self.peer)
        async def _recv(self):
            return await self.queue.get()

    async def main():
        role, our_port, our_fingerprint = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        loop = asyncio.get_running_loop()
        ice = UdpIce(("127.0.0.1", our_port))
        await loop.create_datagram_endpoint(lambda: ice, local_addr=("127.0.0.1", 0))
        certificate = RTCCertificate.generateCertificate()
        dtls = RTCDtlsTransport(ice, [certificate])
        dtls._set_role(role)
        async def handle_rtp(data, arrival_time_ms=None):
            say(rtp=data.hex())
        dtls._handle_rtp_data = handle_rtp
        fingerprint = [f.value for f in certificate.getFingerprints() if f.algorithm == "sha-256"][0]
        say(port=ice.transport.get_extra_info("sockname")[1], fingerprint=fingerprint)
        await asyncio.wait_for(dtls.start(RTCDtlsParameters(fingerprints=[RTCDtlsFingerprint("sha-256", our_fingerprint)])), 10)
        say(state=dtls.state)
        if dtls.state != "connected":
            return
        await dtls._send_rtp(bytes.fromhex("8060abcd0000303900c0ffee") + b"from aiortc" * 20)
        for _ in range(500):
            if dtls.state == "closed":
                break
            await asyncio.sleep(0.01)
        say(final=dtls.state)

    asyncio.run(main())
    """

    static let theirPacket = [0x80, 0x60, 0xab, 0xcd, 0, 0, 0x30, 0x39, 0x00, 0xc0, 0xff, 0xee] + Array(String(repeating: "from aiortc", count: 20).utf8)
    static let ourPacket = [0x80, 0x60, 0x00, 0x07, 0, 0, 0x10, 0, 0x12, 0x34, 0x56, 0x78] + Array(String(repeating: "from krakl", count: 30).utf8)

    @Test(arguments: [DtlsRole.client, .server])
    func handshakeAndSrtpWithAiortc(ourRole: DtlsRole) throws {
        guard FileManager.default.isExecutableFile(atPath: Self.python) else {
            skipTest("\(Self.python) missing (scripts/setup makes the venv with aiortc)")
            return
        }
        let folder = try Harness.temporaryDirectory()
        try Self.script.write(toFile: folder + "/dtls.py", atomically: true, encoding: .utf8)
        let socket = try DtlsTestUdpSocket()
        let certificate = try Certificate()
        let peer = try DtlsTestProcess(Self.python, [folder + "/dtls.py", ourRole == .client ? "server" : "client",
                                                                    "\(socket.port)", certificate.fingerprint.hex])
        defer { peer.stop() }
        let hello = try #require(peer.value(after: "{\"port\": ", timeout: 30), "aiortc did not start: \(peer.log)")
        let port = try #require(UInt16(hello.prefix { $0.isNumber }))
        let theirHex = try #require(hello.split(separator: "\"").dropLast().last.map(String.init))
        let theirs = try #require(CertificateFingerprint(sdp: "sha-256 " + theirHex))

        let transport = try DtlsTransport(role: ourRole, certificate: certificate, expectedFingerprint: theirs)
        let pump = DtlsTestPump(transport, socket: socket, peer: DtlsTestUdpSocket.loopback(port: port))
        let started = ContinuousClock.now
        pump.deliver(transport.start())
        pump.run(seconds: 15) { $0.transport.keys != nil || $0.failure != nil }
        let elapsed = ContinuousClock.now - started
        #expect(pump.failure == nil, "handshake failed: \(String(describing: pump.failure)); aiortc: \(peer.log)")
        let keys = try #require(transport.keys, "no keys from the aiortc handshake")
        print("DTLS handshake with aiortc, we are \(ourRole): \(dtlsMilliseconds(elapsed)), profile \(keys.profile.opensslName)")
        #expect(peer.waitFor("\"state\": \"connected\""), "aiortc did not report connected: \(peer.log)")

        // aiortc's SRTP packet, decrypted with our receiving keys.
        let receiving = try SrtpSession(receiving: keys)
        var decrypted: [UInt8]?
        let deadline = Date().addingTimeInterval(10)
        while decrypted == nil, Date() < deadline {
            guard let (bytes, _) = socket.receive(timeout: 0.1) else { continue }
            if DtlsTransport.isDtls(bytes) { pump.deliver(transport.receive(bytes)); continue }
            decrypted = receiving.unprotect(srtp: bytes)
        }
        #expect(decrypted == Self.theirPacket, "could not read aiortc's SRTP: \(String(describing: receiving.lastDropReason))")

        // Ours, decrypted by aiortc with its receiving keys.
        let sending = try SrtpSession(sending: keys)
        socket.send(try sending.protect(rtp: Self.ourPacket), to: DtlsTestUdpSocket.loopback(port: port))
        #expect(peer.waitFor("\"rtp\": \"\(dtlsHex(Self.ourPacket).lowercased())\""), "aiortc did not read our SRTP: \(peer.log)")

        // Our close_notify ends aiortc's transport.
        pump.deliver(transport.close())
        #expect(peer.waitFor("\"final\": \"closed\""), "aiortc did not close on our close_notify: \(peer.log)")
    }
}
