import KraklBase
import KraklHost
import Foundation
import Glibc
import KraklRTC
import Testing

/// What the process holds, from /proc: open descriptors, threads, and the network threads of publishers.
enum RtcProcessCensus {
    static func openFiles() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0 }
    static func threads() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0 }

    /// Thread ids of this process whose name is `name` (the publisher's loop thread is "krakl-rtc";
    /// a new thread takes its name when it starts running).
    static func threads(named name: String) -> Set<Int> {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return Set(tasks.compactMap { task in
            guard let comm = try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8),
                  comm.trimmingCharacters(in: .whitespacesAndNewlines) == name else { return nil }
            return Int(task)
        })
    }

    /// Local ports of the UDP sockets this process holds (IPv4 and IPv6): /proc/net/udp{,6} lists
    /// the namespace's sockets, so only those whose inode is one of /proc/self/fd's `socket:[N]`
    /// count (another process's socket on a port we just freed is not ours left open).
    static func udpPorts() -> Set<UInt16> {
        let folder = "/proc/self/fd"
        let inodes = Set(((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).compactMap { fd -> Substring? in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: folder + "/" + fd),
                  target.hasPrefix("socket:["), target.hasSuffix("]") else { return nil }
            return Substring(target.dropFirst("socket:[".count).dropLast())
        })
        var ports = Set<UInt16>()
        for table in ["/proc/net/udp", "/proc/net/udp6"] {
            guard let text = try? String(contentsOfFile: table, encoding: .utf8) else { continue }
            for line in text.split(separator: "\n").dropFirst() {
                // "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …", the
                // local address as HEXIP:HEXPORT.
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                guard fields.count > 9, inodes.contains(fields[9]),
                      let port = fields[1].split(separator: ":").last.flatMap({ UInt16($0, radix: 16) }) else { continue }
                ports.insert(port)
            }
        }
        return ports
    }

    /// Polls (bounded: `seconds`, 10 ms steps) until `done` holds.
    static func wait(seconds: Double, until done: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if done() { return true }
            usleep(10_000)
        }
        return done()
    }
}

/// RTCP BYE as RFC 3550 §6.6 lays it out, built by hand (not by RtcpWriter): V=2, P=0, SC, PT=203,
/// length in 32-bit words minus one, the SSRCs, then an optional reason (length octet + text) padded
/// with zeros to a 32-bit boundary.
func rtcHandBuiltBye(ssrcs: [UInt32], reason: [UInt8]?) -> [UInt8] {
    var body: [UInt8] = []
    for ssrc in ssrcs { body += [UInt8(ssrc >> 24), UInt8(ssrc >> 16 & 0xff), UInt8(ssrc >> 8 & 0xff), UInt8(ssrc & 0xff)] }
    if let reason {
        body.append(UInt8(reason.count))
        body += reason
        while body.count % 4 != 0 { body.append(0) }
    }
    let words = (4 + body.count) / 4 - 1
    return [0x80 | UInt8(ssrcs.count), 203, UInt8(words >> 8), UInt8(words & 0xff)] + body
}

@Suite(.serialized, .tags(.unit)) struct RTCPublisherLifecycleTests {
    static func loopbackConfiguration() -> PublisherConfiguration {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])
        return configuration
    }

    /// The offerer gathers from `init` on, so a relay can fail before its owner has set `onEvent`
    /// (SharingSession sets it on the next line; a loaded CI run was descheduled in between). That
    /// failure must still reach the handler when it is set, not be lost to a connect time-out.
    @Test func anEventBeforeTheHandlerIsSetIsDeliveredWhenItIs() throws {
        var configuration = Self.loopbackConfiguration()
        configuration.relayOnly = true
        configuration.turnCAFile = "/nonexistent/ca.pem"
        configuration.turnServers = [TurnServer(address: TransportAddress(ip: IPAddress("127.0.0.1")!, port: 5349), username: "u",
                                                password: "p", transport: .tls, tlsName: "127.0.0.1")]
        let publisher = try Publisher(configuration: configuration)
        defer { publisher.close() }
        let deadline = MonotonicClock.milliseconds() + 10_000
        while publisher.stats.state != "failed" && MonotonicClock.milliseconds() < deadline { usleep(5_000) }
        try #require(publisher.stats.state == "failed", "the relay-only publisher did not fail: \(publisher.stats.state)")
        let log = RtcCallbackLog()
        publisher.onEvent = { log.event($0) }
        var failure: String?
        while failure == nil && MonotonicClock.milliseconds() < deadline + 5_000 {
            failure = log.events.compactMap { if case .failed(let reason) = $0 { return reason } else { return nil } }.first
            if failure == nil { usleep(5_000) }
        }
        print("failed before the handler was set, delivered after: \(failure ?? "nothing")")
        #expect(failure?.contains("/nonexistent/ca.pem") == true, "the failure never reached the handler: \(log.events)")
    }

    /// A peer that, like Chromium, sends its ClientHello as soon as its first ICE check succeeds, and
    /// the answer reaches the publisher 1 s later. The publisher answers the peer's checks without
    /// the answer, keeps the ClientHello and replays it when the answer comes, so DTLS completes
    /// at once instead of at the peer's next retransmission. From the answer on, the peer's DTLS
    /// retransmission timer is off, so the handshake can only complete from the kept ClientHello:
    /// without the replay it never does (judged by outcome, not by how soon; the connect time is printed).
    /// `candidates: false` is Chromium's answer: no candidates, so the path is the peer-reflexive
    /// candidate learned from the early check, which must survive until the answer.
    @Test(arguments: [true, false])
    func clientHelloBeforeTheAnswerIsReplayed(candidates: Bool) throws {
        let publisher = try Publisher(configuration: Self.loopbackConfiguration())
        defer { publisher.close() }
        let log = RtcCallbackLog()
        publisher.onEvent = { log.event($0) }
        let peer = try RtcLoopbackPeer(setup: "active")
        peer.startsDtlsOnFirstSuccess = true
        let offer = publisher.offer
        try peer.start(offer: offer)

        // The peer's check is answered by a publisher that has no answer yet, and its ClientHello leaves.
        #expect(peer.pump(seconds: 5) { $0.dtlsStartedAt != nil }, "the peer's checks were never answered")
        let helloAt = try #require(peer.dtlsStartedAt)
        peer.pump(seconds: max(0, 1.0 - Double(MonotonicClock.nanoseconds() - helloAt) / 1e9))
        let kept = publisher.stats.earlyDtlsDatagrams
        #expect(kept >= 1, "the early ClientHello was not kept")
        #expect(peer.ice.checkList.pairs.contains { $0.state == .succeeded }, "the peer's check did not succeed before the answer")

        var answer = peer.answer(to: offer)
        if !candidates {
            answer = answer.split(separator: "\r\n").filter { !$0.hasPrefix("a=candidate") }.joined(separator: "\r\n") + "\r\n"
        }
        let answerLag = Double(MonotonicClock.nanoseconds() - helloAt) / 1e6
        peer.retransmitsDtls = false
        _ = try publisher.setAnswer(answer)
        // A hang guard (10 s): with the replay, the handshake is one local round trip.
        #expect(peer.pump(seconds: 10) { _ in log.connected },
                "not connected without a peer retransmission (the kept ClientHello was not replayed): \(log.events) \(peer.dtlsEvents)")
        let connectMs = try #require(log.events.compactMap { if case .connected(let ms) = $0 { return ms } else { return nil } }.first)
        print("early ClientHello (answer candidates: \(candidates)): answer \(String(format: "%.0f", answerLag)) ms after the ClientHello, "
              + "\(kept) datagram(s) kept, connected \(String(format: "%.1f", connectMs)) ms after the answer")

        // And media flows over the pair ICE selected (with candidates: false, the peer-reflexive one).
        #expect(peer.pump(seconds: 5) { _ in publisher.stats.selectedPair != nil }, "no ICE pair selected")
        publisher.send(frame: [UInt8](repeating: 0x5a, count: 1000), keyframe: true, captureNanoseconds: MonotonicClock.nanoseconds(),
                       width: 640, height: 360)
        #expect(peer.pump(seconds: 5) { $0.rtp.contains { $0.ssrc == offer.ssrc } }, "no media after the early handshake")
    }

    /// Before the answer, only a ClientHello from a source that has passed an ICE check (our
    /// credentials) is kept, once: not a stranger's, not another record type, not a repeat.
    @Test func onlyTheFirstClientHelloOfAnAuthenticatedSourceIsKept() throws {
        let publisher = try Publisher(configuration: Self.loopbackConfiguration())
        defer { publisher.close() }
        let offer = publisher.offer
        let target = try #require(offer.candidates.first?.transportAddress)
        let certificate = try Certificate()
        let hello = try DtlsTransport(role: .client, certificate: certificate, expectedFingerprint: certificate.fingerprint).start().datagrams
        let otherHello = try DtlsTransport(role: .client, certificate: certificate, expectedFingerprint: certificate.fingerprint).start().datagrams
        #expect(hello.count == 1)
        let socket = try UdpSocket(bindTo: IPAddress("127.0.0.1")!)
        var buffer = [UInt8](repeating: 0, count: 2048)

        /// A binding request with our credentials (`valid`) or a wrong password, and the class of the
        /// publisher's response. The publisher reads one socket in order, so the response also says that
        /// everything sent before it has been handled.
        func check(valid: Bool) -> StunClass? {
            let request = StunMessage.bindingRequest(username: "\(offer.iceUfrag):peer", priority: 1, controlling: false, tieBreaker: 1)
            socket.send(request.encoded(integrityKey: StunMessage.shortTermKey(password: valid ? offer.icePwd : "wrong-password-0123456"),
                                        fingerprint: true), to: target)
            for _ in 0..<50 {
                var descriptor = pollfd(fd: socket.fd, events: Int16(POLLIN), revents: 0)
                guard poll(&descriptor, 1, 100) > 0 else { continue }
                guard let (bytes, _) = socket.receive(&buffer), let response = try? StunMessage(parsing: bytes),
                      response.transactionID == request.transactionID else { continue }
                return response.messageClass
            }
            return nil
        }

        // A stranger (no check passed yet): its ClientHello is not kept.
        for datagram in hello { socket.send(datagram, to: target) }
        #expect(check(valid: false) == .errorResponse)
        #expect(publisher.stats.earlyDtlsDatagrams == 0, "a ClientHello from a source that passed no ICE check was kept")

        // After a check with our credentials: application data is not kept, the ClientHello is, once.
        #expect(check(valid: true) == .successResponse, "a check before the answer was not answered")
        socket.send([23, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0], to: target)
        for datagram in hello { socket.send(datagram, to: target) }
        for datagram in hello + otherHello { socket.send(datagram, to: target) }  // a repeat, then another ClientHello
        #expect(check(valid: false) == .errorResponse)
        #expect(publisher.stats.earlyDtlsDatagrams == 1, "kept \(publisher.stats.earlyDtlsDatagrams) datagrams, expected the one ClientHello")
    }

    /// A ClientHello split into two fragments in two datagrams (RFC 6347 §4.2.3) before the answer:
    /// both are kept, and once the answer comes OpenSSL reassembles them and answers with its flight.
    @Test func aFragmentedEarlyClientHelloIsKeptWhole() throws {
        let publisher = try Publisher(configuration: Self.loopbackConfiguration())
        defer { publisher.close() }
        let offer = publisher.offer
        let target = try #require(offer.candidates.first?.transportAddress)
        let certificate = try Certificate()
        let hello = try #require(try DtlsTransport(role: .client, certificate: certificate,
                                                   expectedFingerprint: certificate.fingerprint).start().datagrams.first)
        // One record: 13-byte record header, 12-byte handshake header, body.
        try #require(hello.count > 25 && hello[0] == 22 && hello[13] == 1)
        let body = Array(hello[25...])
        let half = body.count / 2
        func fragment(_ part: ArraySlice<UInt8>, offset: Int, recordSequence: UInt8) -> [UInt8] {
            var handshake = Array(hello[13..<19])  // msg_type, length, message_seq
            handshake += [UInt8(offset >> 16), UInt8(offset >> 8 & 0xff), UInt8(offset & 0xff)]
            handshake += [UInt8(part.count >> 16), UInt8(part.count >> 8 & 0xff), UInt8(part.count & 0xff)] + part
            var record = Array(hello[0..<11])
            record[10] = recordSequence
            return record + [UInt8(handshake.count >> 8), UInt8(handshake.count & 0xff)] + handshake
        }
        let socket = try UdpSocket(bindTo: IPAddress("127.0.0.1")!)
        var buffer = [UInt8](repeating: 0, count: 4096)
        func receive(_ accept: ([UInt8]) -> Bool) -> [UInt8]? {
            for _ in 0..<50 {
                var descriptor = pollfd(fd: socket.fd, events: Int16(POLLIN), revents: 0)
                guard poll(&descriptor, 1, 100) > 0, let (bytes, _) = socket.receive(&buffer) else { continue }
                if accept(bytes) { return bytes }
            }
            return nil
        }
        let request = StunMessage.bindingRequest(username: "\(offer.iceUfrag):peer", priority: 1, controlling: false, tieBreaker: 1)
        socket.send(request.encoded(integrityKey: StunMessage.shortTermKey(password: offer.icePwd), fingerprint: true), to: target)
        #expect(receive { StunMessage.looksLikeStun($0) } != nil, "the check before the answer was not answered")
        socket.send(fragment(body[..<half], offset: 0, recordSequence: 0), to: target)
        socket.send(fragment(body[half...], offset: half, recordSequence: 1), to: target)
        #expect(RtcProcessCensus.wait(seconds: 2) { publisher.stats.earlyDtlsDatagrams == 2 },
                "kept \(publisher.stats.earlyDtlsDatagrams) of the 2 fragments")

        // The answer (a peer whose only job here is to write it): our DTLS server answers the replayed fragments.
        let answerer = try RtcLoopbackPeer(setup: "active")
        _ = try publisher.setAnswer(answerer.answer(to: offer))
        let serverHello = receive { DtlsTransport.isDtls($0) }
        #expect(serverHello.map { $0[0] == 22 && $0[13] == 2 } == true, "no ServerHello after the answer")
    }

    /// RFC 3550 §6.6 packets built by hand read back as BYE with their SSRCs and reason.
    @Test func byeIsParsedWithItsReason() throws {
        // One SSRC, no reason: 8 bytes, length field 1.
        let plain = rtcHandBuiltBye(ssrcs: [0x1234_5678], reason: nil)
        #expect(plain == [0x81, 203, 0, 1, 0x12, 0x34, 0x56, 0x78])
        #expect(try RtcpPacket.parseCompound(plain) == [.bye(ssrcs: [0x1234_5678], reason: nil)])
        // Two SSRCs and a 10-byte reason: 1 + 10 bytes padded to 12; 4 + 8 + 12 = 24 bytes, length field 5.
        let withReason = rtcHandBuiltBye(ssrcs: [1, 0xffff_fffe], reason: Array("Host ended".utf8))
        #expect(withReason.count == 24 && withReason[3] == 5)
        let receiverReport: [UInt8] = [0x80, 201, 0, 1, 0, 0, 0, 7]  // an empty RR first, as a compound starts
        #expect(try RtcpPacket.parseCompound(receiverReport + withReason)
                == [.receiverReport(ssrc: 7, reports: []), .bye(ssrcs: [1, 0xffff_fffe], reason: "Host ended")])
        // A reason length that runs past the packet is an error, not a read past the end.
        var lying = rtcHandBuiltBye(ssrcs: [1], reason: Array("abc".utf8))
        lying[8] = 200
        #expect(throws: RtcpError.self) { try RtcpPacket.parseCompound(lying) }
        // SC = 0 (a BYE with no SSRC) is well formed.
        #expect(try RtcpPacket.parseCompound([0x80, 203, 0, 0]) == [.bye(ssrcs: [], reason: nil)])
    }

    /// The peer's BYE (its own SSRC, as a receive-only peer's is) ends the session with the reason,
    /// control characters removed; nothing else is reported after it.
    @Test func peerByeEndsTheSession() throws {
        let session = try RtcLoopbackSession()
        defer { session.publisher.close() }
        #expect(session.connect(), "not connected: \(session.log.events)")
        try session.peer.sendRtcp([RtcpWriter.receiverReport(ssrc: 7, reports: []),
                                   rtcHandBuiltBye(ssrcs: [7], reason: Array("room destroyed\n".utf8))])
        let ended = RtcProcessCensus.wait(seconds: 2) { session.log.events.contains(.remoteBye(reason: "room destroyed")) }
        #expect(ended, "no remoteBye: \(session.log.events)")
        #expect(session.publisher.stats.state == "closed")
        // A second BYE and a close_notify after it are not reported again.
        try session.peer.sendRtcp([rtcHandBuiltBye(ssrcs: [7], reason: nil)])
        session.peer.pump(seconds: 0.3)
        #expect(session.log.events.filter { if case .remoteBye = $0 { return true } else { return false } }.count == 1)
    }

    /// close() from several threads at once, again afterwards, and from the network thread inside
    /// an event handler: every call returns promptly, and the sockets and the thread are gone when it does.
    @Test func closeIsIdempotentBoundedAndFreesItsResources() throws {
        let session = try RtcLoopbackSession()
        #expect(session.connect(), "not connected: \(session.log.events)")
        let publisher = session.publisher
        let ports = Set(publisher.offer.candidates.map(\.port))
        #expect(ports.isSubset(of: RtcProcessCensus.udpPorts()))
        let started = Date()
        DispatchQueue.concurrentPerform(iterations: 4) { _ in publisher.close() }
        let elapsed = Date().timeIntervalSince(started)
        print("close() from 4 threads at once: \(String(format: "%.1f", elapsed * 1000)) ms")
        // A hang guard (10 s, far above the milliseconds it takes; printed above): the outcome below is judged.
        #expect(elapsed < 10, "close() took \(elapsed) s")
        #expect(session.peer.pump(seconds: 3) { $0.dtlsEvents.contains(.remoteClosed) }, "no close_notify from close()")
        // The publisher object still exists; its sockets do not.
        #expect(RtcProcessCensus.wait(seconds: 2) { ports.isDisjoint(with: RtcProcessCensus.udpPorts()) }, "sockets still open after close()")
        publisher.close()
        #expect(publisher.stats.state == "closed")

        // From the network thread: an onEvent handler that closes on connect.
        let before = RtcProcessCensus.threads(named: "krakl-rtc")
        let inner = try Publisher(configuration: Self.loopbackConfiguration())
        var loopThreads = Set<Int>()
        #expect(RtcProcessCensus.wait(seconds: 2) {
            loopThreads = RtcProcessCensus.threads(named: "krakl-rtc").subtracting(before)
            return !loopThreads.isEmpty
        }, "no krakl-rtc thread seen for the publisher")
        let returned = RtcCallbackLog()
        inner.onEvent = { [unowned inner] event in
            returned.event(event)
            if case .connected = event {
                inner.close()
                returned.keyframe()  // counts "close() returned on the network thread"
            }
        }
        let peer = try RtcLoopbackPeer(setup: "active")
        try peer.start(offer: inner.offer)
        _ = try inner.setAnswer(peer.answer(to: inner.offer))
        #expect(peer.pump(seconds: 10) { _ in returned.keyframes == 1 }, "close() inside the handler did not return: \(returned.events)")
        #expect(RtcProcessCensus.wait(seconds: 2) { RtcProcessCensus.threads(named: "krakl-rtc").isDisjoint(with: loopThreads) },
                "the network thread outlived close() from its own handler")
        inner.close()  // from another thread afterwards: returns at once
    }

    /// 50 publishers opened and closed in one process: their sockets and threads go each time, and
    /// the process's descriptor and thread counts come back to where they started.
    @Test func fiftyPublishersLeaveNothingBehind() throws {
        // One first, so that what the process keeps for good (OpenSSL's and libsrtp's state) is in the baseline.
        try Publisher(configuration: Self.loopbackConfiguration()).close()
        let baselineFiles = RtcProcessCensus.openFiles(), baselineThreads = RtcProcessCensus.threads()
        var ports = Set<UInt16>()
        var loopThreads = Set<Int>()
        for _ in 0..<50 {
            let before = RtcProcessCensus.threads(named: "krakl-rtc")
            let publisher = try Publisher(configuration: Self.loopbackConfiguration())
            var mine = Set<Int>()
            let seen = RtcProcessCensus.wait(seconds: 2) {
                mine = RtcProcessCensus.threads(named: "krakl-rtc").subtracting(before)
                return !mine.isEmpty
            }
            #expect(seen, "no krakl-rtc thread seen for a new publisher")
            loopThreads.formUnion(mine)
            let own = publisher.offer.candidates.map(\.port)
            #expect(!own.isEmpty, "a publisher without a socket")
            ports.formUnion(own)
            publisher.close()
        }
        // Not "50 distinct ports": a closed socket's ephemeral port may be handed out again (a full run here saw
        // 49 of 50; ~4 % of runs by the birthday bound over Linux's 28,232 ephemeral ports).
        print("50 publishers: \(ports.count) distinct ports, \(loopThreads.count) network threads")
        // Exact checks, immune to other suites running at the same time: these publishers' sockets and threads.
        #expect(RtcProcessCensus.wait(seconds: 5) { ports.isDisjoint(with: RtcProcessCensus.udpPorts()) },
                "sockets left open: \(ports.intersection(RtcProcessCensus.udpPorts()).count)")
        #expect(RtcProcessCensus.wait(seconds: 5) { RtcProcessCensus.threads(named: "krakl-rtc").isDisjoint(with: loopThreads) },
                "network threads left running")
        // The whole process's counts are printed, not judged: in a full run other suites open and close
        // hundreds of descriptors meanwhile (a fresh-clone CI run saw 991 -> 1042 while every publisher's
        // own sockets and thread were gone). SharingSessionTests judges whole-process counts over 50
        // sessions in a test process of its own (InNamespace), where nothing else runs.
        _ = RtcProcessCensus.wait(seconds: 5) {
            RtcProcessCensus.openFiles() <= baselineFiles && RtcProcessCensus.threads() <= baselineThreads
        }
        print("50 publishers opened and closed: fds \(baselineFiles) -> \(RtcProcessCensus.openFiles()), "
              + "threads \(baselineThreads) -> \(RtcProcessCensus.threads())")
    }

    /// KraklRTC.prepare() does the one-time set-up; after it, nothing on the join path pays for it.
    /// Prints the times (a first call in a fresh process shows the one-time cost); asserts no timing.
    /// `KraklRTC.prepare()` (libsrtp's init, a first certificate and DTLS context, done before a
    /// join) may be called again, and a publisher made after it connects. What it saves the join
    /// is printed for the record; krakl-bench room's ICE+DTLS time is where it is measured.
    @Test func prepareMayBeCalledAgainAndAPublisherConnectsAfterIt() throws {
        func milliseconds(_ body: () throws -> Void) rethrows -> Double {
            let start = MonotonicClock.nanoseconds()
            try body()
            return Double(MonotonicClock.nanoseconds() - start) / 1e6
        }
        let first = try milliseconds { try KraklRTC.prepare() }
        let second = try milliseconds { try KraklRTC.prepare() }
        let certificate = try milliseconds { _ = try Certificate() }
        let session = try RtcLoopbackSession()
        defer { session.publisher.close() }
        #expect(session.connect(), "not connected: \(session.log.events)")
        print(String(format: "KraklRTC.prepare(): %.1f ms, again %.3f ms; a certificate after it %.2f ms; connect %.1f ms after the answer",
                     first, second, certificate, session.publisher.stats.connectMilliseconds ?? -1))
    }
}
