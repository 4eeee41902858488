import KraklBase
import KraklHost
import Foundation
import Glibc
import KraklRTC
import Testing

/// A receiving peer built from our own parts (a controlled IceAgent, a
/// DtlsTransport in the role the answer gives it, SRTP), on 127.0.0.1 in
/// this process. It exists to drive the publisher's RTCP handling with
/// feedback aiortc never sends (FIR, RR with LSR, REMB on demand, NACK
/// for a chosen packet) and to check the DTLS client role, which aiortc
/// (always setup:active) never gives the publisher.
final class RtcLoopbackPeer {
    let socket: UdpSocket
    let ice: IceAgent
    let certificate: Certificate
    let setup: String
    private(set) var dtls: DtlsTransport?
    private(set) var srtpIn: SrtpSession?
    private(set) var srtpOut: SrtpSession?
    private(set) var peer: TransportAddress?
    private(set) var rtp: [RtpPacket] = []
    /// When each of `rtp` arrived (monotonic ns), index for index.
    private(set) var rtpArrivals: [UInt64] = []
    private(set) var senderReports: [(report: RtcpSenderReport, arrival: UInt64)] = []
    private(set) var dtlsEvents: [DtlsEvent] = []
    /// How often the peer's ICE agent reported a selected pair (again after a restart).
    private(set) var selections = 0
    /// Like Chromium: a DTLS client starts its handshake as soon as one of its checks succeeds,
    /// without waiting to be nominated (and so possibly before the publisher has the answer).
    var startsDtlsOnFirstSuccess = false
    /// When the DTLS client sent its ClientHello (monotonic ns).
    private(set) var dtlsStartedAt: UInt64?
    /// Whether the peer's DTLS retransmission timer runs. Off, the peer sends each flight once, so
    /// a handshake that completes did so without waiting for (or being rescued by) a retransmission.
    var retransmitsDtls = true
    private var buffer = [UInt8](repeating: 0, count: 65_536)

    init(setup: String, address: String = "127.0.0.1") throws {
        socket = try UdpSocket(bindTo: IPAddress(address)!)
        ice = IceAgent(bases: [socket.localAddress], controlling: false)
        certificate = try Certificate()
        self.setup = setup
    }

    /// An answer shaped like a browser's: VP8 + rtx, mid and transport-cc (no abs-send-time), all feedback.
    func answer(to offer: SdpVideoOffer) -> String {
        [
            "v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "t=0 0", "a=group:BUNDLE 0",
            "m=video 9 UDP/TLS/RTP/SAVPF 96 97", socket.localAddress.ip.isIPv6 ? "c=IN IP6 ::1" : "c=IN IP4 127.0.0.1",
            "a=ice-ufrag:\(ice.local.ufrag)", "a=ice-pwd:\(ice.local.pwd)",
            "a=fingerprint:\(certificate.fingerprint.sdpValue)", "a=setup:\(setup)", "a=mid:0",
            "a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid",
            "a=extmap:3 http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01",
            "a=recvonly", "a=rtcp-mux", "a=rtcp-rsize",
            "a=rtpmap:96 VP8/90000", "a=rtcp-fb:96 goog-remb", "a=rtcp-fb:96 transport-cc", "a=rtcp-fb:96 ccm fir",
            "a=rtcp-fb:96 nack", "a=rtcp-fb:96 nack pli", "a=rtpmap:97 rtx/90000", "a=fmtp:97 apt=96",
            "a=candidate:1 1 udp 2130706431 \(socket.localAddress.ip) \(socket.localAddress.port) typ host", "a=end-of-candidates",
        ].joined(separator: "\r\n") + "\r\n"
    }

    func start(offer: SdpVideoOffer) throws {
        dtls = try DtlsTransport(role: setup == "active" ? .client : .server, certificate: certificate,
                                 expectedFingerprint: offer.fingerprint)
        ice.setRemote(credentials: IceCredentials(ufrag: offer.iceUfrag, pwd: offer.icePwd), candidates: offer.candidates,
                      now: MonotonicClock.nanoseconds())
    }

    private func send(_ datagrams: [[UInt8]]) {
        guard let peer else { return }
        for datagram in datagrams { socket.send(datagram, to: peer) }
    }

    private func handle(_ output: DtlsOutput) {
        send(output.datagrams)
        dtlsEvents += output.events
        for case .connected(let keys) in output.events {
            srtpIn = try? SrtpSession(receiving: keys)
            srtpOut = try? SrtpSession(sending: keys)
        }
    }

    private func startDtls(_ dtls: DtlsTransport) {
        dtlsStartedAt = MonotonicClock.nanoseconds()
        handle(dtls.start())
    }

    func sendRtcp(_ packets: [[UInt8]]) throws {
        let srtcp = try #require(srtpOut, "no SRTP yet").protect(rtcp: RtcpWriter.compound(packets))
        send([srtcp])
    }

    /// Runs the peer's side until `done` or `seconds` pass (bounded turns).
    @discardableResult
    func pump(seconds: Double, until done: (RtcLoopbackPeer) -> Bool = { _ in false }) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        for _ in 0..<1_000_000 {
            if done(self) { return true }
            if Date() >= deadline { break }
            let now = MonotonicClock.nanoseconds()
            if let due = ice.nextDeadline, due <= now { ice.tick(now: now) }
            let (transmits, events) = ice.drain()
            for t in transmits { socket.send(t.bytes, to: t.to) }
            for case .selected(let pair) in events {
                selections += 1
                peer = pair.remoteAddress
                if let dtls, dtls.role == .client, dtls.state == .new { startDtls(dtls) }
            }
            if startsDtlsOnFirstSuccess, let dtls, dtls.role == .client, dtls.state == .new,
               let pair = ice.checkList.pairs.first(where: { $0.state == .succeeded }) {
                peer = pair.remoteAddress
                startDtls(dtls)
            }
            if retransmitsDtls, let dtls, let timeout = dtls.timeout, timeout <= 0 { handle(dtls.onTimer()) }
            var descriptor = pollfd(fd: socket.fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&descriptor, 1, 5)
            while let (bytes, from) = socket.receive(&buffer) {
                guard let first = bytes.first else { continue }
                let arrival = MonotonicClock.nanoseconds()
                switch first {
                case 0...3: ice.receive(bytes, from: from, base: socket.localAddress, now: arrival)
                case 20...63:
                    if peer == nil { peer = from }
                    if let dtls { handle(dtls.receive(bytes)) }
                case 128...191:
                    guard let srtpIn else { continue }
                    if RtcpPacket.looksLikeRtcp(bytes) {
                        guard let plain = srtpIn.unprotect(srtcp: bytes), let packets = try? RtcpPacket.parseCompound(plain) else { continue }
                        for case .senderReport(let report) in packets { senderReports.append((report, arrival)) }
                    } else if let plain = srtpIn.unprotect(srtp: bytes), let packet = try? RtpPacket(parsing: plain) {
                        rtp.append(packet)
                        rtpArrivals.append(arrival)
                    }
                default: break
                }
            }
        }
        return done(self)
    }
}

/// A publisher on 127.0.0.1 with a loopback peer that has answered (the peer is the DTLS client).
struct RtcLoopbackSession {
    let configuration: PublisherConfiguration
    let publisher: Publisher
    let peer: RtcLoopbackPeer
    let log = RtcCallbackLog()
    let offer: SdpVideoOffer

    init() throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])
        self.configuration = configuration
        publisher = try Publisher(configuration: configuration)
        let log = self.log
        publisher.onEvent = { log.event($0) }
        peer = try RtcLoopbackPeer(setup: "active")
        offer = publisher.offer
        try peer.start(offer: offer)
        _ = try publisher.setAnswer(peer.answer(to: offer))
    }

    /// Runs the peer until the publisher reports connected (bounded).
    func connect() -> Bool { peer.pump(seconds: 10) { _ in log.connected } }
}

/// Counts the publisher's callbacks (they arrive on its network thread).
final class RtcCallbackLog: @unchecked Sendable {
    private let lock = NSLock()
    private var _keyframes = 0
    private var _bitrates: [Int] = []
    private var _events: [PublisherEvent] = []
    var keyframes: Int { lock.lock(); defer { lock.unlock() }; return _keyframes }
    var bitrates: [Int] { lock.lock(); defer { lock.unlock() }; return _bitrates }
    var events: [PublisherEvent] { lock.lock(); defer { lock.unlock() }; return _events }
    func keyframe() { lock.lock(); _keyframes += 1; lock.unlock() }
    func bitrate(_ value: Int) { lock.lock(); _bitrates.append(value); lock.unlock() }
    func event(_ value: PublisherEvent) { lock.lock(); _events.append(value); lock.unlock() }
    var connected: Bool { events.contains { if case .connected = $0 { return true } else { return false } } }
}

@Suite(.serialized, .tags(.unit)) struct RTCPublisherLoopbackTests {
    /// "active": the peer is the DTLS client (we serve); "passive": we are the client.
    @Test(arguments: ["active", "passive"])
    func feedbackReachesTheEncoderAndRetransmissionsUseRtx(setup: String) throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])
        configuration.startBitrate = 1_000_000
        let publisher = try Publisher(configuration: configuration)
        defer { publisher.close() }
        let log = RtcCallbackLog()
        publisher.onEvent = { log.event($0) }
        publisher.onKeyframeRequest = { log.keyframe() }
        publisher.onBitrate = { log.bitrate($0) }
        let peer = try RtcLoopbackPeer(setup: setup)
        let offer = publisher.offer
        #expect(offer.candidates.map(\.address) == ["127.0.0.1"], "only the allowed address is gathered")
        try peer.start(offer: offer)
        let answer = try publisher.setAnswer(peer.answer(to: offer))
        #expect(answer.extensions[.absSendTime] == nil && answer.extensions[.transportWideSequence] == 3)

        #expect(peer.pump(seconds: 10) { _ in log.connected }, "not connected: \(log.events) \(peer.dtlsEvents)")
        let stats = publisher.stats
        #expect(stats.dtlsRole == (setup == "active" ? "server" : "client"))
        print("loopback, peer setup:\(setup): connected in \(stats.connectMilliseconds ?? -1) ms")
        #expect(log.keyframes == 1, "connecting asks the encoder for a keyframe once")

        // Three frames of 3000 bytes: three packets each, marker on each frame's last.
        let frame = [UInt8](repeating: 0x5a, count: 3000)
        for i in 0..<3 {
            publisher.send(frame: frame, keyframe: i == 0, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        }
        #expect(peer.pump(seconds: 5) { $0.rtp.count >= 9 }, "only \(peer.rtp.count) RTP packets arrived")
        let media = peer.rtp.filter { $0.ssrc == offer.ssrc }
        #expect(media.count == 9)
        #expect(media.map(\.marker) == [false, false, true, false, false, true, false, false, true])
        #expect(media.allSatisfy { $0.payloadType == 96 && $0.extensionData(id: 1) == Array("0".utf8) })
        #expect(media.allSatisfy { $0.extensionData(id: 3)?.count == 2 }, "transport-wide sequence missing")
        #expect(media.allSatisfy { $0.extensionData(id: 2) == nil }, "abs-send-time sent though the answer dropped it")
        let twcc = media.compactMap { $0.extensionData(id: 3) }.map { UInt16($0[0]) << 8 | UInt16($0[1]) }
        #expect(zip(twcc, twcc.dropFirst()).allSatisfy { $1 == $0 &+ 1 }, "transport-wide sequence not consecutive: \(twcc)")

        // NACK for the second packet: it comes back as RTX (own SSRC, PT 97, OSN first).
        let lost = media[1].sequenceNumber
        try peer.sendRtcp([RtcpWriter.nack(senderSSRC: 7, mediaSSRC: offer.ssrc, lost: [lost])])
        #expect(peer.pump(seconds: 5) { $0.rtp.contains { $0.ssrc == offer.rtxSSRC } }, "no RTX after a NACK")
        let rtx = try #require(peer.rtp.first { $0.ssrc == offer.rtxSSRC })
        #expect(rtx.payloadType == 97)
        let (osn, payload) = try RtxPacketizer.unwrap(rtx)
        #expect(osn == lost && payload == media[1].payload)

        // PLI ×3 at once: one request now, one more when the 300 ms interval ends, not three.
        peer.pump(seconds: 0.35)
        let before = log.keyframes
        for _ in 0..<3 { try peer.sendRtcp([RtcpWriter.pictureLossIndication(senderSSRC: 7, mediaSSRC: offer.ssrc)]) }
        // The second (held for the interval) is waited for, then one interval more shows no third.
        #expect(peer.pump(seconds: 5) { _ in log.keyframes - before >= 2 }, "three PLIs gave \(log.keyframes - before) keyframe requests")
        peer.pump(seconds: 0.35)
        #expect(log.keyframes - before == 2, "three PLIs gave \(log.keyframes - before) keyframe requests")
        // FIR: a repeated sequence number is the same request.
        let firs = log.keyframes
        // RFC 5104 §4.3.1: PSFB FMT 4, length 4 words, sender SSRC, media SSRC 0, FCI: SSRC + sequence + 3 reserved.
        let s = offer.ssrc
        let fir: [UInt8] = [0x84, 206, 0, 4, 0, 0, 0, 7, 0, 0, 0, 0,
                            UInt8(s >> 24), UInt8((s >> 16) & 0xff), UInt8((s >> 8) & 0xff), UInt8(s & 0xff), 9, 0, 0, 0]
        #expect(try RtcpPacket.parseCompound(fir).count == 1)
        try peer.sendRtcp([fir])
        try peer.sendRtcp([fir])
        peer.pump(seconds: 0.8)
        #expect(log.keyframes - firs == 1, "a repeated FIR must not ask twice")

        // A receiver report answering our latest SR gives an RTT; its loss fraction shows in stats.
        #expect(peer.pump(seconds: 3) { !$0.senderReports.isEmpty }, "no sender report in 3 s")
        let (sr, arrival) = try #require(peer.senderReports.last)
        let held = MonotonicClock.nanoseconds() - arrival
        let block = RtcpReportBlock(ssrc: offer.ssrc, fractionLost: 64, cumulativeLost: 3, extendedHighestSequence: UInt32(lost) + 20,
                                    jitter: 90, lastSenderReport: NtpTime.compact(sr.ntpTime),
                                    delaySinceLastSenderReport: UInt32(held * 65536 / 1_000_000_000))
        try peer.sendRtcp([RtcpWriter.receiverReport(ssrc: 7, reports: [block])])
        // REMB far below the start rate: the encoder is told a lower target.
        try peer.sendRtcp([RtcpWriter.remb(senderSSRC: 7, bitrate: 300_000, ssrcs: [offer.ssrc])])
        peer.pump(seconds: 10) { _ in publisher.stats.rembBitrate != nil && publisher.stats.roundTripMilliseconds != nil }
        let after = publisher.stats
        // The RTT cannot exceed what the test saw: from the SR's send time (its NTP stamp) to now, less the
        // delay the report declares (DLSR). Judged against that exchange, not a fixed budget, so a slow
        // machine cannot fail it; a wrong LSR/DLSR unit or sign would (1 ms covers 16.16 rounding).
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        let nowCompact = NtpTime.compact(NtpTime.from(unixNanoseconds: UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec)))
        let exchangeMs = Double(nowCompact &- block.lastSenderReport &- block.delaySinceLastSenderReport) / 65536 * 1000
        let rtt = try #require(after.roundTripMilliseconds, "no RTT from the receiver report")
        #expect(rtt >= 0 && rtt <= exchangeMs + 1, "RTT \(rtt) ms, but SR to now less DLSR was \(exchangeMs) ms")
        #expect(after.fractionLost == 0.25 && after.cumulativeLost == 3)
        #expect(log.bitrates.last.map { $0 <= 300_000 } == true, "REMB 300 kbit/s did not lower the target: \(log.bitrates)")
        // One NACKed packet, resent twice (retransmissionCopies).
        #expect(after.nacksReceived == 1 && after.retransmittedPackets == 2 && after.plisReceived == 3 && after.firsReceived == 2)
        #expect(after.framesSent == 3 && after.keyframesSent == 1)

        // close(): BYE and close_notify reach the peer.
        publisher.close()
        #expect(peer.pump(seconds: 3) { $0.dtlsEvents.contains(.remoteClosed) }, "no close_notify from close()")
    }

    /// Loss protection: a one-packet frame's packet comes again on RTX after the protection delay before the
    /// first receiver report (loss unknown) and once a report shows loss (twice from 2 % loss on), not after a
    /// clean report; a three-packet frame's packets never.
    @Test func smallFramesAreSentAgainOnceTheReceiverReportsLoss() throws {
        let session = try RtcLoopbackSession()
        defer { session.publisher.close() }
        let (publisher, peer, offer, log, configuration) = (session.publisher, session.peer, session.offer, session.log, session.configuration)
        #expect(session.connect(), "not connected: \(log.events) \(peer.dtlsEvents)")
        let delay = configuration.protectionDelay.inNanoseconds
        func media() -> [RtpPacket] { peer.rtp.filter { $0.ssrc == offer.ssrc } }
        func copies(of sequence: UInt16) -> [UInt64] {
            zip(peer.rtp, peer.rtpArrivals).compactMap { packet, arrival in
                packet.ssrc == offer.rtxSSRC && (try? RtxPacketizer.unwrap(packet))?.0 == sequence ? arrival : nil
            }
        }
        func report(fractionLost: UInt8) throws {
            let block = RtcpReportBlock(ssrc: offer.ssrc, fractionLost: fractionLost, cumulativeLost: 1,
                                        extendedHighestSequence: UInt32(media().last?.sequenceNumber ?? 0), jitter: 0,
                                        lastSenderReport: 0, delaySinceLastSenderReport: 0)
            try peer.sendRtcp([RtcpWriter.receiverReport(ssrc: 7, reports: [block])])
            let expected = Double(fractionLost) / 256
            #expect(peer.pump(seconds: 2) { _ in publisher.stats.fractionLost == expected }, "the receiver report was not taken")
        }
        let small = [UInt8](repeating: 0x33, count: 400), large = [UInt8](repeating: 0x44, count: 3000)

        // Before any receiver report the loss is unknown: a small frame is protected (one copy).
        publisher.send(frame: small, keyframe: true, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media().count == 1 })
        let first = media()[0].sequenceNumber
        #expect(peer.pump(seconds: 3) { _ in copies(of: first).count == 1 }, "no copy before the first receiver report")

        // A clean report: the next small frame goes once.
        try report(fractionLost: 0)
        publisher.send(frame: small, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media().count == 2 })
        peer.pump(seconds: Double(4 * delay) / 1e9)
        #expect(copies(of: media()[1].sequenceNumber).isEmpty, "a copy sent after the receiver reported a clean path")

        // Light loss (1/256): one copy of a small frame's packet, none of a large frame's.
        try report(fractionLost: 1)
        let handedOver = MonotonicClock.nanoseconds()
        publisher.send(frame: small, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        publisher.send(frame: large, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media().count == 6 })
        let second = media()[2].sequenceNumber
        #expect(peer.pump(seconds: 3) { _ in !copies(of: second).isEmpty }, "no copy of a one-packet frame after loss was reported")
        peer.pump(seconds: Double(4 * delay) / 1e9)
        let firstCopies = copies(of: second)
        #expect(firstCopies.count == 1, "\(firstCopies.count) copies at 0.4 % loss")
        // Timed from the hand-over, not from the original's arrival: a busy machine can delay reading the original.
        if let copy = firstCopies.first {
            #expect(copy >= handedOver + delay, "the copy came \(Double(copy - handedOver) / 1e6) ms after the frame was handed over")
        }
        for packet in media()[3...] { #expect(copies(of: packet.sequenceNumber).isEmpty, "a three-packet frame was copied") }
        let rtxPayload = try #require(peer.rtp.first { $0.ssrc == offer.rtxSSRC }.map { try RtxPacketizer.unwrap($0).1 })
        #expect(rtxPayload == media()[0].payload)

        // Heavier loss (64/256): two copies.
        try report(fractionLost: 64)
        publisher.send(frame: small, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media().count == 7 })
        let seventh = media()[6].sequenceNumber
        #expect(peer.pump(seconds: 3) { _ in copies(of: seventh).count == 2 }, "\(copies(of: seventh).count) copies at 25 % loss")
        // The peer can see a packet before the publisher's thread has counted it: wait for the count (bounded).
        peer.pump(seconds: 2) { _ in publisher.stats.redundantPackets >= 4 }
        let stats = publisher.stats
        #expect(stats.redundantPackets == 4 && stats.retransmittedPackets == 0,
                "copies \(stats.redundantPackets), retransmissions \(stats.retransmittedPackets)")
    }

    /// ICE restart through the publisher's API: a new offer with new credentials, the peer's new answer, a new
    /// nomination; media keeps flowing on the old pair meanwhile and after it, on the same DTLS session.
    @Test func iceRestartRenewsCredentialsAndMediaKeepsFlowing() throws {
        let session = try RtcLoopbackSession()
        defer { session.publisher.close() }
        let (publisher, peer, offer, log) = (session.publisher, session.peer, session.offer, session.log)
        #expect(session.connect(), "not connected: \(log.events) \(peer.dtlsEvents)")
        func media() -> Int { peer.rtp.filter { $0.ssrc == offer.ssrc }.count }
        let frame = [UInt8](repeating: 0x21, count: 500)
        publisher.send(frame: frame, keyframe: true, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media() == 1 })
        let selectionsBefore = peer.selections, checksBefore = publisher.stats.iceChecksSent

        let restartedSdp = publisher.restartIce()
        let restarted = publisher.offer
        #expect(restarted.iceUfrag != offer.iceUfrag && restarted.icePwd != offer.icePwd, "the restart kept the old credentials")
        #expect(restartedSdp.contains("a=ice-ufrag:\(restarted.iceUfrag)") && restarted.fingerprint == offer.fingerprint)
        // Before the answer, media still goes over the old pair.
        publisher.send(frame: frame, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media() == 2 }, "media stopped while the restart waited for its answer")

        peer.ice.restart(credentials: .random(), now: MonotonicClock.nanoseconds())
        peer.ice.setRemote(credentials: IceCredentials(ufrag: restarted.iceUfrag, pwd: restarted.icePwd), candidates: restarted.candidates,
                           now: MonotonicClock.nanoseconds())
        _ = try publisher.setAnswer(peer.answer(to: restarted))
        #expect(peer.pump(seconds: 10) { $0.selections > selectionsBefore }, "no new nomination after the restart's answer")
        #expect(peer.pump(seconds: 2) { _ in publisher.stats.iceChecksSent > checksBefore }, "no checks with the new credentials")
        publisher.send(frame: frame, keyframe: false, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 3) { _ in media() == 3 }, "media stopped after the restart")
        #expect(!log.events.contains { if case .connectionLost = $0 { return true } else { return false } })
        #expect(peer.dtlsEvents.filter { if case .connected = $0 { return true } else { return false } }.count == 1,
                "the restart renegotiated DTLS")
    }

    @Test func connectsOverIPv6AndLearnsServerReflexiveCandidates() throws {
        guard !IceHostAddresses.gather(IceAddressPolicy(allowed: [IPAddress("::1")!])).isEmpty else {
            skipTest("no ::1 here (IPv6 disabled on lo)")
            return
        }
        // A STUN server of the test's own on ::1 answers binding requests with the source address.
        let server = try UdpSocket(bindTo: IPAddress("::1")!)
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("::1")!])
        configuration.stunServers = [server.localAddress]
        let publisher = try Publisher(configuration: configuration)
        defer { publisher.close() }
        let log = RtcCallbackLog()
        publisher.onEvent = { log.event($0) }
        let offer = publisher.offer
        #expect(offer.candidates.map(\.address) == ["::1"])
        #expect(offer.trickle && !offer.endOfCandidates, "with a STUN server, candidates trickle")
        var buffer = [UInt8](repeating: 0, count: 2048)
        var answered = 0
        let deadline = Date().addingTimeInterval(5)
        while answered == 0, Date() < deadline {
            var descriptor = pollfd(fd: server.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 50) > 0, let (bytes, from) = server.receive(&buffer),
                  let request = try? StunMessage(parsing: bytes), request.messageClass == .request else { continue }
            let mapped = TransportAddress(ip: IPAddress("2001:db8::7")!, port: 40000)  // as if behind a NAT
            server.send(StunMessage.bindingSuccess(to: request, mappedAddress: mapped).encoded(fingerprint: true), to: from)
            answered += 1
        }
        #expect(answered == 1)
        let learned = { log.events.compactMap { event -> IceCandidate? in if case .localCandidate(let c) = event { return c } else { return nil } } }
        let until = Date().addingTimeInterval(5)
        while learned().isEmpty, Date() < until { usleep(10_000) }
        let srflx = try #require(learned().first, "no server-reflexive candidate: \(log.events)")
        #expect(srflx.kind == .srflx && srflx.address == "2001:db8::7" && srflx.port == 40000)
        #expect(srflx.relatedAddress == "::1" && srflx.relatedPort == offer.candidates[0].port)

        // And media over IPv6 to a peer on ::1.
        let peer = try RtcLoopbackPeer(setup: "active", address: "::1")
        try peer.start(offer: offer)
        try publisher.setAnswer(peer.answer(to: offer))
        #expect(peer.pump(seconds: 10) { _ in log.connected }, "not connected over IPv6: \(log.events)")
        publisher.send(frame: [UInt8](repeating: 7, count: 2000), keyframe: true, captureNanoseconds: MonotonicClock.nanoseconds(), width: 640, height: 360)
        #expect(peer.pump(seconds: 5) { $0.rtp.count >= 2 }, "no RTP over IPv6")
        #expect(publisher.stats.selectedPair?.contains("[::1]") == true, "pair: \(publisher.stats.selectedPair ?? "none")")
    }

    @Test func noAllowedAddressIsAClearError() {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("192.0.2.200")!])
        let error = #expect(throws: NetworkError.self) { _ = try Publisher(configuration: configuration) }
        let text = error.map { "\($0)" } ?? ""
        #expect(text.contains("192.0.2.200") && text.contains("no local address"), "unclear error: \(text)")
    }

    @Test func framesBeforeConnectingAreDroppedWithoutBlocking() throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])
        configuration.frameQueueCapacity = 4
        let publisher = try Publisher(configuration: configuration)
        defer { publisher.close() }
        let start = MonotonicClock.nanoseconds()
        // Inter frames only: with no keyframe before them none can start the chain a connection would
        // send first (EarlyFrames), so every one is dropped.
        for _ in 0..<1000 {
            publisher.send(frame: [UInt8](repeating: 1, count: 5000), keyframe: false, captureNanoseconds: start, width: 640, height: 360)
        }
        let elapsedMs = Double(MonotonicClock.nanoseconds() - start) / 1e6
        #expect(elapsedMs < 20_000, "a hang guard (send never blocks on a missing connection): 1000 frames took \(elapsedMs) ms to hand over")
        // The network thread drains what it gets; nothing is sent without a connection.
        var deadline = Date().addingTimeInterval(5)
        while publisher.stats.framesDropped < 1000, Date() < deadline { usleep(10_000) }
        #expect(publisher.stats.framesDropped == 1000)
        // With keyframes among them, at most one chain of EarlyFrames' 60 frames is kept for the connection.
        for i in 0..<1000 {
            publisher.send(frame: [UInt8](repeating: 1, count: 5000), keyframe: i % 100 == 0, captureNanoseconds: start, width: 640, height: 360)
        }
        deadline = Date().addingTimeInterval(5)
        while publisher.stats.framesDropped < 2000 - EarlyFrames().maximumFrames - 1, Date() < deadline { usleep(10_000) }
        #expect(publisher.stats.framesDropped >= 2000 - EarlyFrames().maximumFrames - 1, "\(publisher.stats.framesDropped) dropped")
        #expect(publisher.stats.packetsSent == 0)
    }
}
