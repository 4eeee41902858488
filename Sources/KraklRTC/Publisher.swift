import KraklCore
import Foundation
import Glibc

/// How a publisher gathers, paces and adapts.
public struct PublisherConfiguration: Sendable {
    /// Which interface addresses become host candidates.
    public var addresses = IceAddressPolicy()
    /// STUN servers for server-reflexive candidates (none: nothing leaves the host unasked).
    public var stunServers: [TransportAddress] = []
    public var codecs: [SdpVideoOffer.Codec] = [.vp8, .vp9]
    /// Encoder bitrate bounds and start, bits per second.
    public var minimumBitrate = 150_000.0
    public var maximumBitrate = 4_000_000.0
    public var startBitrate = 2_500_000.0
    /// Pacing rate = this × the target bitrate.
    public var pacingFactor = 2.5
    public var maximumPayloadSize = 1200
    /// Encoded frames that may wait for the network thread.
    public var frameQueueCapacity = 8
    public var pacerCapacity = 2048
    public var historyCapacity = 2048
    /// Keyframe requests reach the encoder at most this often.
    public var keyframeRequestInterval: UInt64 = 300_000_000
    /// A NACK asking for more packets than this gets a keyframe instead of retransmissions.
    public var nackBurstLimit = 64
    public var senderReportInterval: UInt64 = 1_000_000_000
    /// Loss protection for small frames: until the first receiver report says the path loses nothing,
    /// and while the receiver has reported loss (a NACK, or a receiver report with loss) within
    /// `protectionHold`, every packet of a frame of at most `protectedFramePackets` packets is sent
    /// again `protectionDelay` later (on RTX when negotiated),
    /// and a second time after twice that while the last receiver report said `secondCopyLoss` or more.
    /// Repetition is what forward error correction amounts to for a frame of one packet; it costs
    /// little (such frames are small: typing, a cursor). It matters for receivers that ask for a lost
    /// packet only once: aiortc re-asks only when it sees a new gap, and with one packet a frame it then
    /// releases one frame per arriving packet, so a lost NACK or retransmission stalled it until the
    /// next loss and left a backlog that never drained (measured at 5 % loss: 88–94 % of typing frames
    /// decoded, freezes to 1.2 s). With one copy a packet lost with its copy and its NACK or
    /// retransmission still stalled aiortc in about one session of ten (0.9–1.9 s); at 5 % loss a
    /// second copy makes that ~1 in 10 000 packets' worth rarer. The copies wait longer than a frame
    /// interval on purpose: the next frame's packet then still reaches the receiver first, so a lost
    /// packet still shows as a gap and the NACK (which lists every packet still missing) stays the fast
    /// path; an immediate copy hid those gaps. 0 packets turns it off.
    public var protectedFramePackets = 2
    public var protectionDelay: UInt64 = 50_000_000
    public var secondCopyLoss = 0.02
    public var protectionHold: UInt64 = 10_000_000_000
    public var ice = IceConfiguration()
    public var cname: String?
    /// Candidates may trickle after the offer even without STUN servers now (a WHIP server may name
    /// STUN servers in its answer's `Link` headers): the offer then leaves out `a=end-of-candidates`.
    public var trickleLater = false
    /// Who publishes (the join code's identity): the offer's `s=` line and its msid stream id carry it,
    /// which is how a WHIP server learns the tile's label. Nil: "-" and "krakl-screen".
    public var label: String?

    public init() {}
}

/// What the publisher tells its owner, on the network thread.
public enum PublisherEvent: Equatable, Sendable {
    /// ICE and DTLS are up and SRTP keys are in place; media flows. Milliseconds since the answer.
    case connected(milliseconds: Double)
    /// Consent expired (RFC 7675) or the selected path died: the session is over.
    case connectionLost(String)
    /// The peer sent DTLS close_notify ("remote ended").
    case remoteClosed
    /// The peer sent RTCP BYE (RFC 3550 §6.6): the session is over. Some SFUs and WHIP servers end a
    /// session this way instead of close_notify. `reason` is the peer's text, control characters removed.
    case remoteBye(reason: String?)
    /// ICE found no path, DTLS failed (wrong fingerprint, no SRTP profile, timeout), or SRTP could not start.
    case failed(String)
    /// A server-reflexive candidate to trickle to the peer.
    case localCandidate(IceCandidate)
}

/// A send-only WebRTC video publisher: ICE → DTLS → SRTP → RTP with pacing,
/// RTCP feedback (NACK, PLI/FIR, REMB, transport-wide-cc, receiver reports)
/// and a send-side bandwidth estimate, on its own network thread.
///
/// Use:
/// 1. `init` gathers host candidates, binds sockets and writes `offerSDP`.
/// 2. Set `onEvent`, `onKeyframeRequest`, `onBitrate` (before the answer).
/// 3. `setAnswer(_:)` with the peer's SDP; ICE checks start at once.
/// 4. From any thread, `send(frame:…)` each encoded frame; it never blocks.
/// 5. `close()` sends BYE and close_notify, closes the sockets and stops the thread.
///
/// `KraklRTC.prepare()` at start-up keeps the process's one-time set-up off the first join.
public final class Publisher: @unchecked Sendable {
    public let configuration: PublisherConfiguration
    public let certificate: Certificate
    public let ssrc: UInt32
    public let rtxSSRC: UInt32
    public let cname: String

    /// Called on the network thread. Set before `setAnswer` to see every event; any thread may set it.
    public var onEvent: ((PublisherEvent) -> Void)? {
        get { stateLock.lock(); defer { stateLock.unlock() }; return eventHandler }
        set { stateLock.lock(); eventHandler = newValue; stateLock.unlock() }
    }
    /// The encoder should make the next frame a keyframe (rate-limited). Network thread; must not block.
    public var onKeyframeRequest: (() -> Void)? {
        get { stateLock.lock(); defer { stateLock.unlock() }; return keyframeHandler }
        set { stateLock.lock(); keyframeHandler = newValue; stateLock.unlock() }
    }
    /// The encoder's new target bitrate in bits per second. Network thread; must not block.
    public var onBitrate: ((Int) -> Void)? {
        get { stateLock.lock(); defer { stateLock.unlock() }; return bitrateHandler }
        set { stateLock.lock(); bitrateHandler = newValue; stateLock.unlock() }
    }
    private var eventHandler: ((PublisherEvent) -> Void)?
    private var keyframeHandler: (() -> Void)?
    private var bitrateHandler: ((Int) -> Void)?

    private let loop: EventLoop
    private let sockets: [UdpSocket]
    private let ice: IceAgent
    private let stateLock = NSLock()
    /// `close()`'s progress; guarded by `closeCondition`.
    private enum Closing { case open, closing, closed }
    private var closing = Closing.open
    private let closeCondition = NSCondition()
    private var currentOffer: SdpVideoOffer
    private var statistics = RtcStats()

    // Frame queue: any thread in, network thread out.
    private struct QueuedFrame { var data: [UInt8]; var keyframe: Bool; var captureNs: UInt64; var width: Int; var height: Int }
    private var frames: [QueuedFrame] = []
    private var frameQueueOverflowed = false
    private var negotiated: SdpAnswer?

    // Network thread only.
    private var answerAt: UInt64 = 0
    private var dtls: DtlsTransport?
    private var dtlsPeer: (base: TransportAddress, remote: TransportAddress)?
    /// The peer's ClientHello if it comes before the answer (nil once DTLS exists).
    private var earlyFlight: DtlsEarlyFlight? = DtlsEarlyFlight()
    private var srtpOut: SrtpSession?
    private var srtpIn: SrtpSession?
    private var sender: RtpVideoSender?
    private var rtx: RtxPacketizer?
    private var history: RtpSendHistory
    private var pacer: Pacer
    private var estimator: BandwidthEstimator
    private var lastReportedBitrate: Double?
    private var media = false
    private var finished = false
    private var transportSequence: UInt16 = 0
    private var sentTimes: [(sequence: UInt16, sendNs: UInt64, size: Int)?]
    private var lastKeyframeRequest: UInt64?
    private var deferredKeyframeAt: UInt64?
    private var lastFirSequence: UInt8?
    /// The last packet of the newest keyframe while it waits in the pacer, and when such a packet last left.
    private var keyframeTailSequence: UInt16?
    private var lastKeyframeSentNs: UInt64?
    /// Which small frames' packets to send again, and when (loss protection).
    private var protection: LossProtection
    private var nextSenderReportAt: UInt64?
    private var mediaPacketCount: UInt32 = 0
    private var mediaOctetCount: UInt32 = 0
    private var scheduled: (id: EventLoop.TimerID, at: UInt64)?
    private var receiveBuffer = [UInt8](repeating: 0, count: 65_536)

    /// Gathers host candidates (binding one UDP socket per address), makes the
    /// session's certificate and the offer, and starts the network thread.
    public init(configuration: PublisherConfiguration = PublisherConfiguration()) throws {
        self.configuration = configuration
        let addresses = IceHostAddresses.gather(configuration.addresses)
        guard !addresses.isEmpty else {
            throw NetworkError.noAddresses(configuration.addresses.allowed.map { "none of \($0.map { "\($0)" }.joined(separator: ", ")) is on an interface that is up" }
                                           ?? "no interface that is up has an address the policy admits (loopback needs includeLoopback)")
        }
        sockets = try addresses.map { try UdpSocket(bindTo: $0) }
        certificate = try Certificate()
        var random = SystemRandomNumberGenerator()
        ssrc = UInt32.random(in: 1...UInt32.max, using: &random)
        var second = UInt32.random(in: 1...UInt32.max, using: &random)
        while second == ssrc { second = UInt32.random(in: 1...UInt32.max, using: &random) }
        rtxSSRC = second
        cname = configuration.cname ?? "krakl-" + (0..<8).map { _ in "\(UInt8.random(in: 0...9, using: &random))" }.joined()
        ice = IceAgent(bases: sockets.map(\.localAddress), controlling: true, stunServers: configuration.stunServers,
                       configuration: configuration.ice)
        let stream = configuration.label.map(SdpVideoOffer.streamID(from:)) ?? "krakl-screen"
        var offer = SdpVideoOffer(sessionID: UInt64.random(in: 1...(UInt64(1) << 62), using: &random), iceUfrag: ice.local.ufrag,
                                  icePwd: ice.local.pwd, fingerprint: certificate.fingerprint, streamID: stream,
                                  trackID: "screen", ssrc: ssrc, rtxSSRC: rtxSSRC, cname: cname)
        offer.codecs = configuration.codecs
        if let label = configuration.label { offer.sessionName = label }
        offer.candidates = ice.localCandidates
        offer.trickle = !configuration.stunServers.isEmpty || configuration.trickleLater
        offer.endOfCandidates = !offer.trickle
        currentOffer = offer
        history = RtpSendHistory(capacity: configuration.historyCapacity)
        pacer = Pacer(rate: configuration.startBitrate * configuration.pacingFactor, capacity: configuration.pacerCapacity)
        protection = LossProtection(configuration: configuration)
        estimator = BandwidthEstimator(minimum: configuration.minimumBitrate, maximum: configuration.maximumBitrate,
                                       start: configuration.startBitrate)
        sentTimes = Array(repeating: nil, count: 8192)
        loop = try EventLoop(name: "krakl-rtc")
        statistics.targetBitrate = estimator.target
        loop.start()
        loop.post { [self] in
            for socket in sockets { loop.watch(fd: socket.fd) { [unowned self] in self.readSocket(socket) } }
            ice.startGathering(now: MonotonicClock.nanoseconds())
            service()
        }
    }

    deinit {
        loop.stop(timeout: 2)
    }

    /// The offer as it stands (after `restartIce`, the restarted one).
    public var offer: SdpVideoOffer { stateLock.lock(); defer { stateLock.unlock() }; return currentOffer }
    public var offerSDP: String { offer.sdp }

    /// What the answer accepted (codec, extensions, feedback), once `setAnswer` succeeded.
    public var answer: SdpAnswer? { stateLock.lock(); defer { stateLock.unlock() }; return negotiated }

    /// A copy of the current numbers; any thread.
    public var stats: RtcStats { stateLock.lock(); defer { stateLock.unlock() }; return statistics }

    private func updateStats(_ change: (inout RtcStats) -> Void) {
        stateLock.lock()
        change(&statistics)
        stateLock.unlock()
    }

    // MARK: - Signalling (any thread)

    /// Parses the peer's answer and starts ICE; the DTLS role follows its a=setup.
    /// A second answer after `restartIce()` only renews ICE. Throws SdpError for an unusable answer.
    @discardableResult
    public func setAnswer(_ sdp: String) throws -> SdpAnswer {
        let parsed = try SdpAnswer(parsing: sdp, offer: offer)
        setAnswer(parsed)
        return parsed
    }

    public func setAnswer(_ answer: SdpAnswer) {
        let now = MonotonicClock.nanoseconds()
        stateLock.lock()
        let first = negotiated == nil
        negotiated = answer
        if first {
            statistics.codec = answer.codec.sdpName
            statistics.state = "checking"
            statistics.dtlsRole = answer.setup == .active ? "server" : "client"
        }
        stateLock.unlock()
        loop.post { [self] in
            if first { answerAt = now; begin(answer, now: now) }
            var candidates = answer.candidates
            // A peer that lists no candidate still has its c= address and m= port (RFC 8839 §4.2.1.2 fallback).
            if candidates.isEmpty, let address = answer.connectionAddress, address != "0.0.0.0", answer.port > 9 {
                candidates.append(IceCandidate(foundation: "cline", priority: IceCandidate.priority(kind: .host), address: address,
                                               port: answer.port, kind: .host))
            }
            ice.setRemote(credentials: IceCredentials(ufrag: answer.iceUfrag, pwd: answer.icePwd), candidates: candidates, now: MonotonicClock.nanoseconds())
            service()
        }
    }

    /// STUN servers learned after the offer (e.g. from the answer's WHIP `Link` headers): their
    /// server-reflexive candidates come as `.localCandidate` events, for the room driver to trickle.
    public func addStunServers(_ servers: [TransportAddress]) {
        guard !servers.isEmpty else { return }
        loop.post { [self] in
            ice.addStunServers(servers, now: MonotonicClock.nanoseconds())
            service()
        }
    }

    /// A candidate the peer trickled.
    public func addRemoteCandidate(_ candidate: IceCandidate) {
        loop.post { [self] in
            ice.addRemoteCandidate(candidate, now: MonotonicClock.nanoseconds())
            service()
        }
    }

    /// ICE restart (RFC 8445 §9): new credentials; returns the new offer for the peer. Media keeps
    /// flowing on the current pair until the answer to this offer (`setAnswer`) nominates a new one.
    public func restartIce() -> String {
        let credentials = IceCredentials.random()
        stateLock.lock()
        currentOffer.iceUfrag = credentials.ufrag
        currentOffer.icePwd = credentials.pwd
        currentOffer.sessionVersion += 1
        let sdp = currentOffer.sdp
        stateLock.unlock()
        loop.post { [self] in
            ice.restart(credentials: credentials, now: MonotonicClock.nanoseconds())
            service()
        }
        return sdp
    }

    /// Sends RTCP BYE and DTLS close_notify, closes the sockets and stops the network thread.
    ///
    /// Bounded (at most ~4 s, when the network thread is stuck in a handler; milliseconds
    /// otherwise) and idempotent: a second call returns once the first has finished. From the
    /// network thread (an `onEvent` handler) it does the same without waiting: the thread ends
    /// after the current handler. Events stop with it. The event loop's wake-up pipe is freed
    /// with the publisher.
    public func close() {
        let onLoop = loop.isLoopThread
        closeCondition.lock()
        switch closing {
        case .closed:
            closeCondition.unlock()
            return
        case .closing:
            // Another thread is closing: wait for it (bounded), unless we are the thread it waits on.
            let deadline = Date().addingTimeInterval(5)
            while !onLoop, closing != .closed, closeCondition.wait(until: deadline) {}
            closeCondition.unlock()
            return
        case .open:
            closing = .closing
            closeCondition.unlock()
        }
        if onLoop {
            shutDown()
            loop.stop()
        } else {
            let done = DispatchSemaphore(value: 0)
            loop.post { [self] in
                shutDown()
                done.signal()
            }
            // The posted work runs before the loop stops, even when it comes late.
            _ = done.wait(timeout: .now() + 2)
            loop.stop(timeout: 2)
        }
        closeCondition.lock()
        closing = .closed
        closeCondition.broadcast()
        closeCondition.unlock()
    }

    /// Network thread: says goodbye to the peer and lets go of the sockets.
    private func shutDown() {
        if !finished, let srtpOut, let pair = ice.selected {
            if let bye = try? srtpOut.protect(rtcp: RtcpWriter.compound([RtcpWriter.bye(ssrcs: [ssrc])])) {
                socket(for: pair.localBase)?.send(bye, to: pair.remoteAddress)
            }
        }
        if let dtls { sendDtls(dtls.close()) }
        finished = true
        media = false
        if let scheduled { loop.cancel(scheduled.id) }
        scheduled = nil
        earlyFlight = nil
        for socket in sockets {
            loop.unwatch(fd: socket.fd)
            socket.close()
        }
        _ = takeQueuedFrames()
        updateStats { if $0.state == "connected" || $0.state == "checking" || $0.state == "new" { $0.state = "closed" } }
    }

    // MARK: - Frames (any thread, never blocks)

    /// Hands one encoded frame to the network thread. When `frameQueueCapacity` frames already wait,
    /// the oldest non-key frame is dropped and a keyframe is requested.
    public func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {
        stateLock.lock()
        frames.append(QueuedFrame(data: frame, keyframe: keyframe, captureNs: captureNanoseconds, width: width, height: height))
        var overflow = false
        if frames.count > configuration.frameQueueCapacity {
            let victim = frames.firstIndex { !$0.keyframe } ?? 0
            frames.remove(at: victim)
            statistics.framesDropped += 1
            overflow = true
        }
        let wakeNeeded = frames.count == 1 || overflow
        if overflow { frameQueueOverflowed = true }
        stateLock.unlock()
        if wakeNeeded { loop.post { [self] in takeFrames() } }
    }

    // MARK: - Network thread

    private func begin(_ answer: SdpAnswer, now: UInt64) {
        var sender = RtpVideoSender(codec: answer.codec, ssrc: ssrc, payloadType: answer.payloadType,
                                    maxPayloadSize: configuration.maximumPayloadSize)
        if let id = answer.extensions[.mid] { sender.mid = (id, answer.mid ?? currentOfferMid) }
        self.sender = sender
        if let rtxType = answer.rtxPayloadType { rtx = RtxPacketizer(ssrc: rtxSSRC, payloadType: rtxType) }
        let role: DtlsRole = answer.setup == .active ? .server : .client
        defer { earlyFlight = nil }
        do {
            dtls = try DtlsTransport(role: role, certificate: certificate, expectedFingerprint: answer.fingerprint)
        } catch {
            fail("DTLS set-up failed: \(error)")
            return
        }
        // The peer's ClientHello that came before this answer: no need to wait for its retransmission.
        if let dtls, role == .server, let flight = earlyFlight, let source = flight.source {
            dtlsPeer = source
            for datagram in flight.datagrams { handleDtls(dtls.receive(datagram)) }
        }
    }

    /// Before the answer: keeps the peer's first ClientHello, from a source that passed an ICE check.
    private func keepEarlyDtls(_ datagram: [UInt8], from: TransportAddress, base: TransportAddress) {
        guard earlyFlight != nil, ice.heardEarlyCheck(from: from, base: base) else { return }
        if earlyFlight!.keep(datagram, from: from, base: base) { updateStats { $0.earlyDtlsDatagrams += 1 } }
    }

    private var currentOfferMid: String { stateLock.lock(); defer { stateLock.unlock() }; return currentOffer.mid }

    private func socket(for base: TransportAddress) -> UdpSocket? { sockets.first { $0.localAddress == base } }

    private func readSocket(_ socket: UdpSocket) {
        // A handler may close the publisher (close() from onEvent): stop reading then.
        for _ in 0..<256 where !socket.isClosed {
            guard let (bytes, from) = socket.receive(&receiveBuffer) else { break }
            // Per datagram: handlers below run service(), which moves the clock on.
            let now = MonotonicClock.nanoseconds()
            guard let first = bytes.first else { continue }
            switch first {
            case 0...3:
                ice.receive(bytes, from: from, base: socket.localAddress, now: now)
            case 20...63:
                guard !finished else { continue }
                guard let dtls else {
                    keepEarlyDtls(bytes, from: from, base: socket.localAddress)
                    continue
                }
                if dtlsPeer == nil || ice.selected == nil { dtlsPeer = (socket.localAddress, from) }
                handleDtls(dtls.receive(bytes))
            case 128...191:
                if RtcpPacket.looksLikeRtcp(bytes), let srtpIn, let plain = srtpIn.unprotect(srtcp: bytes) {
                    handleRtcp(plain, now: now)
                }
            default:
                continue  // RFC 7983: anything else is dropped
            }
        }
        service()
    }

    /// Runs what is due (ICE, DTLS retransmission, pacing, reports) and arms one timer for the next thing.
    private func service() {
        guard !finished else { return }
        var now = MonotonicClock.nanoseconds()
        if let due = ice.nextDeadline, due <= now { ice.tick(now: now) }
        flushIce()
        if let dtls, let timeout = dtls.timeout, timeout <= 0 { handleDtls(dtls.onTimer()) }
        if let due = deferredKeyframeAt, due <= now {
            deferredKeyframeAt = nil
            requestKeyframe(now: now)
        }
        if media, let due = nextSenderReportAt, due <= now {
            sendSenderReport(now: now)
            nextSenderReportAt = now + configuration.senderReportInterval
        }
        queueDueCopies(now: now)
        pump(now: now)
        guard !finished else { return }

        now = MonotonicClock.nanoseconds()
        var next: UInt64?
        func consider(_ t: UInt64?) { if let t { next = min(next ?? t, t) } }
        consider(ice.nextDeadline)
        if let timeout = dtls?.timeout { consider(now + UInt64(max(timeout, 0) * 1e9)) }
        consider(deferredKeyframeAt)
        if media { consider(nextSenderReportAt); consider(pacer.nextSendTime(now: now)); consider(protection.nextDue) }
        guard let deadline = next else { return }
        if let scheduled, scheduled.at <= deadline { return }
        if let scheduled { loop.cancel(scheduled.id) }
        let id = loop.schedule(at: deadline) { [unowned self] in
            self.scheduled = nil
            self.service()
        }
        scheduled = (id, deadline)
    }

    private func flushIce() {
        let (transmits, events) = ice.drain()
        for transmit in transmits { socket(for: transmit.localBase)?.send(transmit.bytes, to: transmit.to) }
        for event in events {
            switch event {
            case .selected(let pair):
                updateStats { $0.selectedPair = pair.description; $0.iceChecksSent = ice.checksSent }
                dtlsPeer = (pair.localBase, pair.remoteAddress)
                if let dtls, dtls.state == .new, dtls.role == .client { handleDtls(dtls.start()) }
            case .localCandidate(let candidate):
                onEvent?(.localCandidate(candidate))
            case .consentExpired:
                lose("ICE consent expired: no answer to consent checks for \(configuration.ice.consentTimeout / 1_000_000_000) s (RFC 7675)")
            case .failed(let reason):
                fail(reason)
            }
        }
        if !events.isEmpty || ice.consentResponses > 0 {
            updateStats {
                $0.iceChecksSent = ice.checksSent
                $0.iceRequestsReceived = ice.requestsReceived
                $0.consentResponses = ice.consentResponses
            }
        }
    }

    private func sendDtls(_ output: DtlsOutput) {
        guard let peer = ice.selected.map({ ($0.localBase, $0.remoteAddress) }) ?? dtlsPeer else { return }
        for datagram in output.datagrams { socket(for: peer.0)?.send(datagram, to: peer.1) }
    }

    private func handleDtls(_ output: DtlsOutput) {
        sendDtls(output)
        for event in output.events {
            switch event {
            case .connected(let keys):
                do {
                    srtpOut = try SrtpSession(sending: keys)
                    srtpIn = try SrtpSession(receiving: keys)
                } catch {
                    fail("SRTP set-up failed: \(error)")
                    return
                }
                let ms = Double(MonotonicClock.nanoseconds() - answerAt) / 1e6
                media = true
                nextSenderReportAt = MonotonicClock.nanoseconds() + configuration.senderReportInterval / 2
                updateStats {
                    $0.state = "connected"
                    $0.connectMilliseconds = ms
                    $0.srtpProfile = keys.profile.opensslName
                }
                onEvent?(.connected(milliseconds: ms))
                // Whatever was encoded before is useless to the receiver: start with a keyframe.
                _ = takeQueuedFrames()
                reportBitrate(force: true, now: MonotonicClock.nanoseconds())
                requestKeyframe(now: MonotonicClock.nanoseconds())
            case .remoteClosed:
                endByPeer(.remoteClosed)
            case .failed(let error):
                fail(error.description)
            case .applicationData:
                break
            }
        }
    }

    /// The peer ended the session (close_notify or BYE): reported once.
    private func endByPeer(_ event: PublisherEvent) {
        guard !finished else { return }
        media = false
        finished = true
        updateStats { $0.state = "closed" }
        onEvent?(event)
    }

    private func fail(_ reason: String) {
        guard !finished else { return }
        finished = true
        media = false
        updateStats { $0.state = "failed" }
        onEvent?(.failed(reason))
    }

    private func lose(_ reason: String) {
        guard !finished else { return }
        finished = true
        media = false
        updateStats { $0.state = "lost" }
        onEvent?(.connectionLost(reason))
    }

    private func takeQueuedFrames() -> [QueuedFrame] {
        stateLock.lock()
        defer { stateLock.unlock() }
        let taken = frames
        frames.removeAll(keepingCapacity: true)
        if !media { statistics.framesDropped += taken.count }
        return taken
    }

    private func takeFrames() {
        let now = MonotonicClock.nanoseconds()
        stateLock.lock()
        let overflowed = frameQueueOverflowed
        frameQueueOverflowed = false
        stateLock.unlock()
        let taken = takeQueuedFrames()
        guard media, var sender else { return }
        if overflowed { requestKeyframe(now: now) }
        var framesSent = 0, keyframes = 0, dropped = 0
        for frame in taken {
            let packets = sender.packets(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.captureNs,
                                         width: frame.width, height: frame.height)
            dropped += pacer.enqueue(packets, kind: .media, now: now)
            protection.frameQueued(packets.lazy.map(\.sequenceNumber), now: now)  // no array per frame
            framesSent += 1
            if frame.keyframe {
                keyframes += 1
                keyframeTailSequence = packets.last?.sequenceNumber
            }
        }
        self.sender = sender
        updateStats {
            $0.framesSent += framesSent
            $0.keyframesSent += keyframes
            $0.pacerDroppedPackets += dropped
        }
        if dropped > 0 {
            keyframeTailSequence = nil  // it may have been among the dropped; never wait on a packet that will not leave
            requestKeyframe(now: now)
        }
        service()
    }

    /// Sends what the pacer lets out now.
    private func pump(now: UInt64) {
        guard media, let pair = ice.selected, let socket = socket(for: pair.localBase), let srtpOut, let answer = negotiatedAnswer else { return }
        var packets = 0, bytes = 0, payload = 0, resent = 0, resentBytes = 0, redundant = 0, redundantBytes = 0, failures = 0
        var waitedNs: UInt64 = 0
        for _ in 0..<512 {
            guard let item = pacer.pop(now: now) else { break }
            var packet = item.packet
            let sendNs = MonotonicClock.nanoseconds()
            if let id = answer.extensions[.absSendTime] {
                packet.setExtension(.absSendTime(id: id, nanoseconds: sendNs))
            }
            if let id = answer.extensions[.transportWideSequence] {
                packet.setExtension(.transportSequence(id: id, transportSequence))
                sentTimes[Int(transportSequence) & (sentTimes.count - 1)] = (transportSequence, sendNs, item.size)
                transportSequence &+= 1
            }
            let plain = packet.serialized()
            guard let protected = try? srtpOut.protect(rtp: plain) else { failures += 1; continue }
            if !socket.send(protected, to: pair.remoteAddress) { failures += 1 }
            packets += 1
            bytes += plain.count
            if item.kind == .media {
                if packet.sequenceNumber == keyframeTailSequence {
                    keyframeTailSequence = nil
                    lastKeyframeSentNs = sendNs
                }
                history.store(packet, sentNanoseconds: sendNs)
                protection.packetSent(packet.sequenceNumber, at: sendNs)
                waitedNs += sendNs &- min(sendNs, item.enqueuedNs)
                payload += packet.payload.count
                mediaPacketCount &+= 1
                mediaOctetCount &+= UInt32(truncatingIfNeeded: packet.payload.count)
            } else if item.kind == .retransmission {
                resent += 1
                resentBytes += plain.count
            } else {
                redundant += 1
                redundantBytes += plain.count
            }
        }
        guard packets > 0 || failures > 0 else { return }
        updateStats {
            $0.packetsSent += packets
            $0.bytesSent += bytes
            $0.payloadBytesSent += payload
            $0.retransmittedPackets += resent
            $0.retransmittedBytes += resentBytes
            $0.redundantPackets += redundant
            $0.redundantBytes += redundantBytes
            $0.socketSendFailures += failures
            $0.totalPacketSendDelay += Double(waitedNs) / 1e9
        }
    }

    private var negotiatedAnswer: SdpAnswer? { stateLock.lock(); defer { stateLock.unlock() }; return negotiated }

    private func sendSenderReport(now: UInt64) {
        guard let srtpOut, let pair = ice.selected, let sender, mediaPacketCount > 0 else { return }
        var clock = sender.clock
        let rtpTimestamp = clock.timestamp(captureNanoseconds: now)
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        let ntp = NtpTime.from(unixNanoseconds: UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec))
        let report = RtcpSenderReport(ssrc: ssrc, ntpTime: ntp, rtpTimestamp: rtpTimestamp, packetCount: mediaPacketCount,
                                      octetCount: mediaOctetCount)
        let compound = RtcpWriter.compound([RtcpWriter.senderReport(report), RtcpWriter.sourceDescription(ssrc: ssrc, cname: cname)])
        guard let protected = try? srtpOut.protect(rtcp: compound) else { return }
        socket(for: pair.localBase)?.send(protected, to: pair.remoteAddress)
        updateStats { $0.senderReportsSent += 1 }
    }

    /// A PLI, FIR or outage-sized NACK. Ignored while a keyframe is still in the pacer or less than an
    /// RTT (+50 ms) has passed since one left: the request most likely crossed it on the way. Without
    /// this, a congested link answers every PLI with another large keyframe and stays congested.
    private func receiverWantsKeyframe(now: UInt64) {
        if keyframeTailSequence != nil {
            updateStats { $0.keyframeRequestsSuppressed += 1 }
            return
        }
        let rttNs = UInt64((stats.roundTripMilliseconds ?? 0) * 1e6)
        if let sent = lastKeyframeSentNs, now < sent + rttNs + 50_000_000 {
            updateStats { $0.keyframeRequestsSuppressed += 1 }
            return
        }
        requestKeyframe(now: now)
    }

    private func requestKeyframe(now: UInt64) {
        if let last = lastKeyframeRequest, now < last + configuration.keyframeRequestInterval {
            // Coalesce: one request when the interval is over.
            if deferredKeyframeAt == nil { deferredKeyframeAt = last + configuration.keyframeRequestInterval }
            return
        }
        lastKeyframeRequest = now
        updateStats { $0.keyframeRequests += 1 }
        onKeyframeRequest?()
    }

    // MARK: RTCP in

    private func handleRtcp(_ datagram: [UInt8], now: UInt64) {
        guard let packets = try? RtcpPacket.parseCompound(datagram) else { return }
        var bitrateInput = false
        var bye: String??
        for packet in packets {
            switch packet {
            case .bye(_, let reason):
                // Any BYE from the peer ends the session: a receive-only peer's names its own SSRC,
                // and the peer's SRTCP key vouches that it came from the peer.
                bye = .some(reason)
            case .receiverReport(_, let reports):
                handleReports(reports, now: now)
                bitrateInput = true
            case .senderReport(let report):
                handleReports(report.reports, now: now)
                bitrateInput = true
            case .pictureLossIndication(_, let mediaSSRC) where mediaSSRC == ssrc || mediaSSRC == 0:
                updateStats { $0.plisReceived += 1 }
                receiverWantsKeyframe(now: now)
            case .fullIntraRequest(_, let entries):
                for entry in entries where entry.ssrc == ssrc {
                    updateStats { $0.firsReceived += 1 }
                    // A repeated sequence number is a retransmitted request, not a new one (RFC 5104 §4.3.1.1).
                    if entry.sequenceNumber != lastFirSequence {
                        lastFirSequence = entry.sequenceNumber
                        receiverWantsKeyframe(now: now)
                    }
                }
            case .nack(_, let mediaSSRC, let lost) where mediaSSRC == ssrc:
                retransmit(lost, now: now)
            case .remb(_, let bitrate, _):
                estimator.onRemb(bitsPerSecond: Double(min(bitrate, UInt64(1e12))))
                updateStats { $0.rembBitrate = Double(min(bitrate, UInt64(1e12))) }
                bitrateInput = true
            case .transportFeedback(let feedback):
                var samples: [BandwidthSample] = []
                for entry in feedback.packets {
                    guard let sent = sentTimes[Int(entry.sequenceNumber) & (sentTimes.count - 1)], sent.sequence == entry.sequenceNumber else { continue }
                    samples.append(BandwidthSample(sendNs: sent.sendNs, arrivalUs: entry.arrivalMicroseconds, size: sent.size))
                }
                estimator.onTransportFeedback(samples, now: now)
                updateStats { $0.transportFeedbacks += 1 }
                bitrateInput = true
            default:
                break
            }
        }
        if bitrateInput { reportBitrate(force: false, now: now) }
        if let bye {
            endByPeer(.remoteBye(reason: bye.map(Publisher.printable)))
            return
        }
        service()
    }

    /// The peer's words without control characters (they end up in logs and terminals).
    static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter { !CharacterSet.controlCharacters.contains($0) }))
    }

    private func handleReports(_ reports: [RtcpReportBlock], now: UInt64) {
        for block in reports where block.ssrc == ssrc {
            var wall = timespec()
            clock_gettime(CLOCK_REALTIME, &wall)
            let arrival = NtpTime.compact(NtpTime.from(unixNanoseconds: UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec)))
            let rtt = block.roundTripSeconds(arrivalCompactNtp: arrival)
            estimator.onLossReport(fractionLost: block.lossFraction, now: now)
            protection.receiverReport(lossFraction: block.lossFraction, now: now)
            updateStats {
                $0.receiverReports += 1
                if let rtt { $0.roundTripMilliseconds = rtt * 1000 }
                $0.fractionLost = block.lossFraction
                $0.cumulativeLost = Int(block.cumulativeLost)
                $0.jitterMilliseconds = Double(block.jitter) / 90
            }
        }
    }

    /// Moves the copies whose time has come into the pacer (they leave with the retransmissions).
    private func queueDueCopies(now: UInt64) {
        var copies: [RtpPacket] = []
        for sequence in protection.takeDue(now: now) {
            // Read, not taken: a copy does not count as a retransmission, so a NACK that crosses it is
            // still answered (seen with aiortc: the copy and the packet both lost, the NACK sent 3 ms
            // after the copy left was ignored as "resent less than an RTT ago", and aiortc, which asks
            // only once per gap, stalled 370 ms).
            guard let original = history.entry(sequenceNumber: sequence)?.packet else { continue }
            if rtx != nil { copies.append(rtx!.wrap(original)) } else { copies.append(original) }
        }
        if !copies.isEmpty { pacer.enqueue(copies, kind: .redundant, now: now) }
    }

    private func retransmit(_ sequences: [UInt16], now: UInt64) {
        protection.lossSeen(now: now)
        updateStats {
            $0.nacksReceived += 1
            $0.nackedPackets += sequences.count
        }
        // A receiver asking for this much lost an outage's worth: resending it would arrive as a
        // stale burst behind live video (and resets some receivers' jitter buffers to the past).
        // A keyframe repairs the picture in one frame (libwebrtc receivers make the same choice).
        if sequences.count > configuration.nackBurstLimit {
            receiverWantsKeyframe(now: now)
            return
        }
        var queued: [RtpPacket] = []
        let rttNs = UInt64((stats.roundTripMilliseconds ?? 20) * 1e6)
        for sequence in sequences {
            guard let entry = history.entry(sequenceNumber: sequence) else { continue }
            // Resent too often, or resent less than an RTT ago. No age limit: a receiver that re-asks only
            // when it sees the next gap (aiortc) may ask seconds later and waits for exactly this packet;
            // an outage's backlog is handled above (a keyframe instead).
            if entry.retransmissions >= 8 { continue }
            if entry.retransmissions > 0 && now &- entry.sentNanoseconds < max(rttNs * 3 / 2, 20_000_000) { continue }
            guard let original = history.takeForRetransmission(sequenceNumber: sequence, nowNanoseconds: now) else { continue }
            if rtx != nil { queued.append(rtx!.wrap(original)) } else { queued.append(original) }
        }
        if !queued.isEmpty { pacer.enqueue(queued, kind: .retransmission, now: now) }
    }

    private func reportBitrate(force: Bool, now: UInt64) {
        let target = estimator.target
        pacer.setRate(target * configuration.pacingFactor, now: now)
        let changed = lastReportedBitrate.map { abs(target - $0) / $0 > 0.05 } ?? true
        updateStats {
            $0.targetBitrate = target
            $0.lossBasedBitrate = estimator.lossBased
            $0.delayBasedBitrate = estimator.delayBased
            $0.ackedBitrate = estimator.ackedBitrate
        }
        guard force || changed else { return }
        lastReportedBitrate = target
        updateStats { $0.bitrateUpdates += 1 }
        onBitrate?(Int(target))
    }
}
