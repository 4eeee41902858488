import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklRoom
import Testing

/// The WebSocket client (RFC 6455) against an independent server: Python's `websockets` library for
/// the well-behaved paths, raw sockets for the misbehaving ones (Tests/Fixtures/ws_server.py).
@Suite(.serialized, .tags(.integration)) struct WebSocketTests {
    /// Tests/Fixtures/ws_server.py, started once per test.
    final class Server {
        let process: DtlsTestProcess
        let port: Int

        let secure: Bool

        init?(tls: (cert: String, key: String)? = nil) throws {
            secure = tls != nil
            guard WhipTestServer.prerequisites() else { return nil }
            guard (try? Harness.run(WhipTestServer.python, ["-c", "import websockets"], timeout: 20).status) == 0 else {
                skipTest("the websockets package is missing from \(WhipTestServer.python) (scripts/setup installs it)")
                return nil
            }
            process = try DtlsTestProcess(WhipTestServer.python, [Harness.repoRoot + "/Tests/Fixtures/ws_server.py", "120"]
                                          + (tls.map { ["--tls", $0.cert, $0.key] } ?? []))
            guard let ready = process.value(after: "{\"event\": \"ready\", \"port\": ", timeout: 20), let port = Int(ready.prefix { $0.isNumber }) else {
                throw WhipNamespaceThread.Failed(description: "ws_server.py did not start: \(process.log)")
            }
            self.port = port
        }

        func url(_ path: String) -> URL { URL(string: secure ? "wss://localhost:\(port)\(path)" : "ws://127.0.0.1:\(port)\(path)")! }

        /// Waits (bounded) for a line of the server's with all of `parts`.
        func saw(_ parts: String..., timeout: Double = 5) -> Bool {
            let deadline = Date().addingTimeInterval(timeout)
            while Date() < deadline {
                if process.log.split(whereSeparator: \.isNewline).contains(where: { line in parts.allSatisfy { line.contains($0) } }) { return true }
                _ = process.waitFor("\u{1}never\u{1}", timeout: 0.05)
            }
            return false
        }
    }

    static func options(handshake: Double = 5) -> WebSocket.Options {
        var options = WebSocket.Options()
        options.handshakeTimeout = .seconds(handshake)
        options.proxies = .direct
        return options
    }

    static func deadline(_ seconds: Double) -> UInt64 { MonotonicClock.nanoseconds() + UInt64(seconds * 1e9) }

    @Test func acceptValueMatchesTheRFCExample() {
        // RFC 6455 §1.3: the key "dGhlIHNhbXBsZSBub25jZQ==" is answered with this accept value.
        #expect(WebSocket.acceptValue(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }

    @Test func textAndBinaryEchoBothWaysAndACloseWithCode1000() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/echo"), options: Self.options())
        try socket.send(text: "hello, Ada's screen ✓")
        #expect(socket.receive(until: Self.deadline(5)) == .text("hello, Ada's screen ✓"))
        let bytes = (0..<70_000).map { UInt8($0 & 0xFF) }   // the 64-bit length form
        try socket.send(binary: bytes)
        #expect(socket.receive(until: Self.deadline(5)) == .binary(bytes))
        #expect(server.saw("\"message\"", "\"binary\"", "\"length\": 70000"), "the server did not get the binary message whole (masking, length)")
        socket.close(code: 1000, reason: "done")
        let end = socket.receive(until: Self.deadline(5))
        #expect(end == .closed(code: 1000, reason: "done", byServer: false))
        #expect(server.saw("\"closed\"", "\"code\": 1000"))
    }

    @Test func fragmentedMessagesAreReassembled() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/echo"), options: Self.options())
        let text = String(repeating: "fragment-✓-", count: 300)
        try socket.send(text: "fragments:7:" + text)
        #expect(socket.receive(until: Self.deadline(5)) == .text(text))
        socket.invalidate()
    }

    @Test func theServersCloseCodeAndReasonReachUsAndAreEchoed() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/echo"), options: Self.options())
        try socket.send(text: "close:4001:room completed")
        #expect(socket.receive(until: Self.deadline(5)) == .closed(code: 4001, reason: "room completed", byServer: true))
        #expect(server.saw("\"closed\"", "\"code\": 4001"))
        #expect(throws: RoomError.self) { try socket.send(text: "after close") }
    }

    @Test func pingsAreAnswered() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/echo"), options: Self.options())
        try socket.send(text: "ping")
        #expect(socket.receive(until: Self.deadline(5)) == .text("pong seen"))
        #expect(server.saw("\"pong\""))
        socket.invalidate()
    }

    @Test func anIdleSocketIsPingedAndTheServerAnswers() throws {
        guard let server = try Server() else { return }
        var options = Self.options()
        options.pingAfterIdle = .milliseconds(300)
        let socket = try WebSocket.connect(to: server.url("/idle"), options: options)
        // 1.5 s of silence: pings go out every 0.3 s, the library answers each, the socket stays open.
        #expect(socket.receive(until: Self.deadline(1.5)) == .timedOut)
        socket.close()
        #expect(socket.receive(until: Self.deadline(5)) == .closed(code: 1000, reason: "", byServer: false))
    }

    @Test func anOversizedMessageIsRefusedWith1009() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/big?bytes=\(2 << 20)"), options: Self.options())
        guard case .closed(let code, let reason, false) = socket.receive(until: Self.deadline(10)) else {
            Issue.record("a 2 MiB message was not refused")
            return
        }
        #expect(code == 1009)
        #expect(reason.contains("1048576"))
        #expect(server.saw("\"closed\"", "\"code\": 1009"), "the server did not get our 1009 close")
    }

    @Test func aMessageJustUnderTheCapArrives() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/big?bytes=\(1 << 20)"), options: Self.options())
        guard case .text(let text) = socket.receive(until: Self.deadline(10)) else {
            Issue.record("a 1 MiB message did not arrive")
            return
        }
        #expect(text.utf8.count == 1 << 20)
        socket.invalidate()
    }

    @Test(arguments: [
        ("/raw/mid-message", UInt16(1006), "inside a message"),
        ("/raw/no-close", UInt16(1006), "without a close frame"),
    ])
    func aServerThatClosesTheConnectionIsAbnormal(path: String, code: UInt16, words: String) throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url(path), options: Self.options())
        var result = socket.receive(until: Self.deadline(5))
        if path == "/raw/no-close" {
            #expect(result == .text("hi"))
            result = socket.receive(until: Self.deadline(5))
        }
        guard case .closed(let got, let reason, true) = result else {
            Issue.record("\(path): \(result)")
            return
        }
        #expect(got == code)
        #expect(reason.contains(words))
    }

    @Test(arguments: [
        ("/raw/masked", UInt16(1002)), ("/raw/bad-utf8", UInt16(1007)), ("/raw/reserved-bits", UInt16(1002)),
        ("/raw/control-fragment", UInt16(1002)),
    ])
    func protocolViolationsCloseWithTheRightCode(path: String, code: UInt16) throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url(path), options: Self.options())
        guard case .closed(let got, _, false) = socket.receive(until: Self.deadline(5)) else {
            Issue.record("\(path) was not refused")
            return
        }
        #expect(got == code)
        #expect(server.saw("\"client-close\"", "\"code\": \(code)", path), "\(path): the server did not get our close \(code)")
    }

    @Test func handshakeFailuresAreClearAndBounded() throws {
        guard let server = try Server() else { return }
        func failure(_ path: String, handshake: Double = 5) -> (RoomError?, Double) {
            let started = MonotonicClock.milliseconds()
            do {
                _ = try WebSocket.connect(to: server.url(path), options: Self.options(handshake: handshake))
                return (nil, MonotonicClock.milliseconds() - started)
            } catch {
                return (error, MonotonicClock.milliseconds() - started)
            }
        }
        let (silent, silentMs) = failure("/raw/no-reply", handshake: 1)
        guard case .unreachable(let message)? = silent else { Issue.record("no-reply: \(String(describing: silent))"); return }
        #expect(message.contains("no reply within 1 s"))
        // A hang guard, not a timing check: ten times the budget.
        #expect(silentMs < 10_000)
        guard case .badReply(let accept)? = failure("/raw/bad-accept").0 else { Issue.record("bad accept was taken"); return }
        #expect(accept.contains("Sec-WebSocket-Accept"))
        guard case .unauthorized(403, _)? = failure("/raw/status-403").0 else { Issue.record("403 was not a refusal"); return }
        guard case .badReply(let huge)? = failure("/raw/huge-head").0 else { Issue.record("a 64 KB head was taken"); return }
        #expect(huge.contains("16 KB"))
    }

    /// wss:// with the certificate checked against a CA and the host name; then ws:// and wss://
    /// through a real HTTP proxy (tinyproxy) by CONNECT, and NO_PROXY going around it.
    @Test func wssChecksTheCertificateAndBothGoThroughAnHttpProxy() throws {
        let folder = try Harness.temporaryDirectory()
        guard let made = try HTTPClientTests.certificates(in: folder), let secure = try Server(tls: (made.cert, made.key)),
              let plain = try Server(), let proxy = try Tinyproxy() else { return }
        var options = Self.options()
        options.caFile = made.ca
        let direct = try WebSocket.connect(to: secure.url("/echo"), options: options)
        try direct.send(text: "over TLS")
        #expect(direct.receive(until: Self.deadline(5)) == .text("over TLS"))
        direct.invalidate()
        // Not trusted without the test CA: refused with the reason.
        do {
            _ = try WebSocket.connect(to: secure.url("/echo"), options: Self.options())
            Issue.record("a certificate from an unknown CA was accepted")
        } catch {
            #expect("\(error)".contains("not trusted"), "\(error)")
        }

        options.proxies = ProxySettings(https: proxy.address, http: proxy.address)
        for (server, words) in [(secure, "through the proxy, TLS inside"), (plain, "through the proxy, plain")] {
            let socket = try WebSocket.connect(to: server.url("/echo"), options: options)
            try socket.send(text: words)
            #expect(socket.receive(until: Self.deadline(5)) == .text(words))
            socket.close()
            _ = socket.receive(until: Self.deadline(5))
        }
        #expect(proxy.waitForLog("CONNECT localhost:\(secure.port) HTTP/1.1"), "no CONNECT for wss in the proxy's log: \(proxy.log)")
        #expect(proxy.waitForLog("CONNECT 127.0.0.1:\(plain.port) HTTP/1.1"), "no CONNECT for ws in the proxy's log: \(proxy.log)")
        let seen = proxy.requests
        options.proxies?.noProxy = NoProxyList("localhost,127.0.0.1")
        let bypass = try WebSocket.connect(to: plain.url("/echo"), options: options)
        try bypass.send(text: "direct")
        #expect(bypass.receive(until: Self.deadline(5)) == .text("direct"))
        bypass.invalidate()
        #expect(proxy.requests == seen, "NO_PROXY hosts went through the proxy: \(proxy.log)")
    }

    @Test func invalidateEndsAWaitingReadAtOnce() throws {
        guard let server = try Server() else { return }
        let socket = try WebSocket.connect(to: server.url("/idle"), options: Self.options())
        let started = MonotonicClock.milliseconds()
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { socket.invalidate() }
        let result = socket.receive(until: Self.deadline(30))
        guard case .closed(1006, _, false) = result else { Issue.record("\(result)"); return }
        // Bounded far below the 30 s the read was allowed.
        #expect(MonotonicClock.milliseconds() - started < 10_000)
    }

    @Test func cancellingAnAttemptEndsAConnectThatWaits() throws {
        guard let server = try Server() else { return }
        let attempt = WebSocket.Attempt()
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { attempt.cancel() }
        let started = MonotonicClock.milliseconds()
        #expect(throws: RoomError.self) {
            _ = try WebSocket.connect(to: server.url("/raw/no-reply"), options: Self.options(handshake: 30), attempt: attempt)
        }
        // A hang guard (50x the 0.2 s until the cancel; the handshake's own time-out is 30 s).
        #expect(MonotonicClock.milliseconds() - started < 10_000)
    }

    /// A seeded fuzz of the frame parser: random and mutated frames in random pieces never crash it,
    /// never make it hold more than the cap, and every outcome is a message, nil or a typed error.
    @Test func theFrameParserSurvivesHostileBytes() {
        var random = Fuzz.Rng(state: 0x5EED_0F_F2A3E5)
        let samples: [[UInt8]] = [
            WebSocketFrameEncoderTestFrames.serverFrame(0x1, Array("hello".utf8)),
            WebSocketFrameEncoderTestFrames.serverFrame(0x2, [UInt8](repeating: 7, count: 300)),
            WebSocketFrameEncoderTestFrames.serverFrame(0x8, [0x03, 0xE8] + Array("bye".utf8)),
            WebSocketFrameEncoderTestFrames.serverFrame(0x1, Array("frag".utf8), fin: false) + WebSocketFrameEncoderTestFrames.serverFrame(0x0, Array("ment".utf8)),
        ]
        var outcomes = (messages: 0, errors: 0)
        for _ in 0..<3000 {
            var parser = WebSocketMessageParser(maximumMessage: 4096)
            var bytes = samples[Int(random.next() % UInt64(samples.count))]
            for _ in 0..<Int(random.next() % 4) {
                let index = Int(random.next() % UInt64(bytes.count))
                bytes[index] = UInt8(truncatingIfNeeded: random.next())
            }
            if random.next() % 3 == 0 { bytes += (0..<Int(random.next() % 64)).map { _ in UInt8(truncatingIfNeeded: random.next()) } }
            var offset = 0
            feeding: while offset < bytes.count {
                let piece = min(bytes.count - offset, 1 + Int(random.next() % 9))
                parser.feed(Array(bytes[offset..<(offset + piece)]))
                offset += piece
                while true {
                    do {
                        guard try parser.next() != nil else { break }
                        outcomes.messages += 1
                    } catch {
                        outcomes.errors += 1
                        break feeding
                    }
                }
                #expect(parser.pendingBytes <= 4096 + 14 + 64 + 16)
            }
        }
        // Both kinds of outcome happened: the fuzz reached the parser's checks and its happy path.
        #expect(outcomes.messages > 100)
        #expect(outcomes.errors > 100)
    }
}

/// Server frames (unmasked) for the parser's fuzz.
enum WebSocketFrameEncoderTestFrames {
    static func serverFrame(_ opcode: UInt8, _ payload: [UInt8], fin: Bool = true) -> [UInt8] {
        var bytes: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        if payload.count < 126 { bytes.append(UInt8(payload.count)) } else { bytes += [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)] }
        return bytes + payload
    }
}
