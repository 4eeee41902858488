import KraklBase
import FoundationEssentials
import Glibc

/// Which side of ICE (and of the offer/answer) a transport is.
public enum PeerRole: Sendable, Equatable {
    /// We wrote the offer: the controlling ICE agent (a WHIP client, a Janus publisher).
    case offerer
    /// We answer a remote offer with full ICE: the controlled agent, checking too (works behind NAT).
    case answerer
    /// We answer as an ICE-lite server on host candidates (`a=ice-lite`): we answer checks and never
    /// send any; the peer (a browser) does all the checking and nominating.
    case answererLite

    var iceControlling: Bool { self == .offerer }
    var iceLite: Bool { self == .answererLite }
}

/// What the transport tells the media side, on the network thread.
protocol PeerTransportDelegate: AnyObject {
    /// Runs the media's due work (after ICE and DTLS had theirs).
    func transportService(now: UInt64)
    /// When the media side needs `transportService` next.
    func transportNextDeadline(now: UInt64) -> UInt64?
    /// SRTP keys are in place: media may flow.
    func transportConnected(milliseconds: Double)
    /// A decrypted RTCP compound packet.
    func transportReceivedRtcp(_ plain: [UInt8], now: UInt64)
    /// The session is over (failed, consent lost, close_notify, BYE): reported once.
    func transportEnded(_ event: PublisherEvent)
    /// A server-reflexive candidate to trickle.
    func transportLocalCandidate(_ candidate: IceCandidate)
}

/// The network half of a peer connection: one UDP socket per host address, ICE (the sans-I/O
/// `IceAgent`, in the role given), DTLS (with the peer's early ClientHello kept), SRTP both ways,
/// and RFC 7983 demultiplexing of what arrives. Everything runs on the event loop passed in, which
/// may be shared by several transports (a server with several viewers); the transport never stops it.
///
/// Split out of the publisher so the same transport serves the offering publisher (WHIP, Janus) and
/// the answering one (a viewer's WHEP offer), in either ICE role.
final class PeerTransport {
    let role: PeerRole
    let configuration: PublisherConfiguration
    let loop: EventLoop
    let sockets: [UdpSocket]
    let ice: IceAgent
    let certificate: Certificate
    weak var delegate: PeerTransportDelegate?
    private let stats: RtcStatsCell

    // Network thread only: each entry point above the sockets checks it (`loop.preconditionInLoop()`).
    private(set) var finished = false
    private var remoteSetAt: UInt64 = 0
    private(set) var dtls: DtlsTransport?
    private var dtlsPeer: (base: TransportAddress, remote: TransportAddress)?
    /// The peer's ClientHello if it comes before the answer (nil once DTLS exists).
    private var earlyFlight: DtlsEarlyFlight? = DtlsEarlyFlight()
    private var srtpOut: SrtpSession?
    private var srtpIn: SrtpSession?
    private var scheduled: (id: EventLoop.TimerID, at: UInt64)?
    private var receiveBuffer = [UInt8](repeating: 0, count: 65_536)
    /// TCP connections to TURN servers reached over TCP, by server address: what the ICE agent
    /// sends to such an address goes down the stream instead of a UDP socket.
    private var turnStreams: [TransportAddress: TurnStreamConnection] = [:]
    /// For `turns:` servers, made with the first one (it loads the trusted certificates).
    private var turnTlsContext: TLSClientContext?

    /// Gathers host candidates (binding one UDP socket per address) and makes the session's certificate.
    /// Nothing runs until `start()`.
    init(role: PeerRole, configuration: PublisherConfiguration, loop: EventLoop, stats: RtcStatsCell) throws {
        self.role = role
        self.configuration = configuration
        self.loop = loop
        self.stats = stats
        let addresses = IceHostAddresses.gather(configuration.addresses)
        guard !addresses.isEmpty else {
            throw NetworkError.noAddresses(configuration.addresses.allowed.map { "none of \($0.map { "\($0)" }.joined(separator: ", ")) is on an interface that is up" }
                                           ?? "no network interface that is up has an address to send media from (loopback addresses are "
                                              + "left out: give one with --address IP, e.g. --address 127.0.0.2 in a test namespace)")
        }
        // Error reports on: an ICMP port unreachable from a TURN server is how its death shows at once.
        sockets = try addresses.map { try UdpSocket(bindTo: $0, reportsErrors: true) }
        certificate = try Certificate()
        ice = IceAgent(bases: sockets.map(\.localAddress), controlling: role.iceControlling, stunServers: configuration.stunServers,
                       configuration: configuration.ice, lite: role.iceLite, turnServers: configuration.turnServers,
                       relayOnly: configuration.relayOnly, relaysMayFollow: configuration.trickleLater)
    }

    /// Network thread: watches the sockets and starts gathering.
    func start() {
        loop.preconditionInLoop()
        for socket in sockets { loop.watch(fd: socket.fd) { [weak self] in self?.readSocket(socket) } }
        openTurnStreams(configuration.turnServers)
        ice.startGathering(now: MonotonicClock.nanoseconds())
        service()
    }

    /// Network thread: the peer's ICE credentials and candidates, its certificate fingerprint, and
    /// our DTLS role. The first call sets up DTLS; later ones (an ICE restart's answer) only renew ICE.
    func setRemote(credentials: IceCredentials, candidates: [IceCandidate], connectionAddress: String?, port: UInt16,
                   fingerprint: CertificateFingerprint, dtlsRole: DtlsRole, first: Bool, now: UInt64) {
        loop.preconditionInLoop()
        if first { remoteSetAt = now; beginDtls(role: dtlsRole, fingerprint: fingerprint) }
        var candidates = candidates
        // A peer that lists no candidate still has its c= address and m= port (RFC 8839 §4.2.1.2 fallback).
        if candidates.isEmpty, let address = connectionAddress, address != "0.0.0.0", port > 9 {
            candidates.append(IceCandidate(foundation: "cline", priority: IceCandidate.priority(kind: .host), address: address,
                                           port: port, kind: .host))
        }
        ice.setRemote(credentials: credentials, candidates: candidates, now: MonotonicClock.nanoseconds())
    }

    /// Network thread: the peer restarted ICE (its new offer's credentials and candidates, e.g. a WHEP
    /// PATCH); we answer with `local`. Only ICE starts over: DTLS, its keys and SRTP stay, and media
    /// stays on the selected pair until the new generation nominates one (RFC 8445 §9, RFC 8842 §4.4).
    func restartIce(local: IceCredentials, remote: IceCredentials, candidates: [IceCandidate], now: UInt64) {
        loop.preconditionInLoop()
        guard !finished else { return }
        ice.restart(credentials: local, now: now)
        ice.setRemote(credentials: remote, candidates: candidates, now: now)
        stats.update { $0.iceRestarts += 1 }
        service()
    }

    private func beginDtls(role: DtlsRole, fingerprint: CertificateFingerprint) {
        defer { earlyFlight = nil }
        do {
            dtls = try DtlsTransport(role: role, certificate: certificate, expectedFingerprint: fingerprint)
        } catch {
            end(.failed("DTLS set-up failed: \(error)"), state: "failed")
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
        if earlyFlight!.keep(datagram, from: from, base: base) { stats.update { $0.earlyDtlsDatagrams += 1 } }
    }

    /// The session ends (reported once to the delegate); `state` is the stats' final state.
    func end(_ event: PublisherEvent, state: String) {
        guard !finished else { return }
        finished = true
        stats.update { $0.state = state }
        delegate?.transportEnded(event)
    }

    // MARK: Sending

    /// True when media can leave: a selected pair and SRTP keys.
    var pathReady: Bool { ice.selected != nil && srtpOut != nil }

    /// Protects and sends one RTP (or, with `rtcp`, RTCP) packet on the selected pair.
    func transmit(_ plain: [UInt8], rtcp: Bool) -> VideoSendStream.TransmitResult {
        guard let pair = ice.selected, let srtpOut else { return .protectFailed }
        guard let protected = try? (rtcp ? srtpOut.protect(rtcp: plain) : srtpOut.protect(rtp: plain)) else { return .protectFailed }
        return send(protected, base: pair.localBase, to: pair.remoteAddress) ? .sent : .sendFailed
    }

    /// Sends from a host socket, or through the TURN server when `base` is a relayed address.
    private func send(_ bytes: [UInt8], base: TransportAddress, to: TransportAddress) -> Bool {
        if socket(for: base) != nil { return sendFromHost(bytes, base: base, to: to) }
        guard let wrapped = ice.relayWrap(bytes, relayBase: base, to: to, now: MonotonicClock.nanoseconds()) else { return false }
        return sendFromHost(wrapped.bytes, base: wrapped.localBase, to: wrapped.to, overStream: wrapped.overStream)
    }

    /// From a host socket, or down the TCP connection when `to` is a TURN server reached over TCP.
    @discardableResult
    private func sendFromHost(_ bytes: [UInt8], base: TransportAddress, to: TransportAddress, overStream: Bool = false) -> Bool {
        if overStream {
            guard let stream = turnStreams[to] else { return false }
            let queued = stream.write(bytes)
            if stream.isConnected, stream.hasQueued { watchWritable(stream) }
            if reportIfFailed(stream) { loop.post { [weak self] in self?.service() } }
            return queued
        }
        return socket(for: base)?.send(bytes, to: to) ?? false
    }

    // MARK: TURN over TCP

    /// Network thread: starts a TCP connection to each TURN server reached over TCP or TLS.
    func openTurnStreams(_ servers: [TurnServer]) {
        loop.preconditionInLoop()
        for server in servers where server.transport.isStream && turnStreams[server.address] == nil {
            var tls: (context: TLSClientContext, name: String)?
            if server.transport == .tls {
                do throws(TLSSetupError) {
                    let context: TLSClientContext
                    if let made = turnTlsContext { context = made } else { context = try TLSClientContext(caFile: configuration.turnCAFile) }
                    turnTlsContext = context
                    tls = (context, server.tlsName ?? "\(server.address.ip)")
                } catch {
                    // Unusable trusted certificates: this relay fails at once, saying why.
                    failRelaySoon(server.address, reason: error.description)
                    continue
                }
            }
            let stream: TurnStreamConnection
            do {
                stream = try TurnStreamConnection(server: server.address, tls: tls)
            } catch {
                // connect() can fail at once (refused on loopback): that relay fails now, saying why.
                let reason = if case .socket(let text) = error { text } else { "\(error)" }
                failRelaySoon(server.address, reason: reason)
                continue
            }
            let fd = stream.fd
            stream.onClose = { [weak self] in self?.loop.unwatch(fd: fd) }
            turnStreams[server.address] = stream
            loop.watch(fd: fd) { [weak self] in self?.readTurnStream(stream) }
            if !stream.isConnected || stream.hasQueued { watchWritable(stream) }
        }
    }

    /// Fails the relay on `server` on the loop's next turn (after gathering has started its allocation).
    private func failRelaySoon(_ server: TransportAddress, reason: String) {
        loop.post { [weak self] in
            guard let self, !self.finished else { return }
            self.ice.relayConnectionFailed(server: server, reason: reason)
            self.service()
        }
    }

    private func watchWritable(_ stream: TurnStreamConnection) {
        loop.watchWritable(fd: stream.fd) { [weak self, weak stream] in
            guard let self, let stream, !stream.isClosed else { return }
            if stream.isConnected || stream.finishConnecting() {
                stream.flush()
                if stream.hasQueued { self.watchWritable(stream) }
            }
            if self.reportIfFailed(stream) { self.service() }
        }
    }

    /// Tells the agent once that a stream broke (its relay fails then); true when it did now.
    private func reportIfFailed(_ stream: TurnStreamConnection) -> Bool {
        guard let failure = stream.failure, turnStreams[stream.server] === stream, !finished else { return false }
        turnStreams[stream.server] = nil
        ice.relayConnectionFailed(server: stream.server, reason: failure, untrustedCertificate: stream.certificateUntrusted)
        return true
    }

    private func readTurnStream(_ stream: TurnStreamConnection) {
        let messages = stream.readMessages()
        // The agent pairs each TURN server with a host base of its family: that is where it "arrived".
        if let base = sockets.map(\.localAddress).first(where: { ice.isRelayServer(stream.server, base: $0, overStream: true) }) {
            for message in messages where !finished {
                let now = MonotonicClock.nanoseconds()
                if let relayed = ice.receiveFromRelayServer(message, from: stream.server, base: base, overStream: true, now: now) {
                    demultiplex(relayed.data, from: relayed.peer, base: relayed.relayBase, now: now)
                }
            }
        }
        if stream.isConnected, stream.hasQueued { watchWritable(stream) }
        _ = reportIfFailed(stream)
        service()
    }

    /// Network thread: says goodbye to the peer (the RTCP `bye` if media was up, then DTLS
    /// close_notify) and lets go of the sockets. The loop keeps running (it may be shared).
    func shutDown(bye: [UInt8]?) {
        loop.preconditionInLoop()
        if !finished, let bye, srtpOut != nil, ice.selected != nil { _ = transmit(bye, rtcp: true) }
        if let dtls { sendDtls(dtls.close()) }
        // Deallocate relays: one Refresh (lifetime 0) each, not waited for.
        ice.closeRelays(now: MonotonicClock.nanoseconds())
        for transmit in ice.drain().transmits { sendFromHost(transmit.bytes, base: transmit.localBase, to: transmit.to, overStream: transmit.overStream) }
        // The deallocation goes out if the send buffer has room; nothing waits for the rest.
        for stream in turnStreams.values { stream.close() }
        turnStreams.removeAll()
        finished = true
        if let scheduled { loop.cancel(scheduled.id) }
        scheduled = nil
        earlyFlight = nil
        for socket in sockets {
            loop.unwatch(fd: socket.fd)
            socket.close()
        }
    }

    // MARK: Receiving

    private func socket(for base: TransportAddress) -> UdpSocket? { sockets.first { $0.localAddress == base } }

    private func readSocket(_ socket: UdpSocket) {
        readErrors(socket)
        // A handler may close the publisher (close() from onEvent): stop reading then.
        for _ in 0..<256 where !socket.isClosed {
            guard let (bytes, from) = socket.receive(&receiveBuffer) else { break }
            // Per datagram: handlers below run service(), which moves the clock on.
            let now = MonotonicClock.nanoseconds()
            if ice.isRelayServer(from, base: socket.localAddress) {
                // TURN responses, and what peers sent to our relayed address (STUN is handled inside).
                if let relayed = ice.receiveFromRelayServer(bytes, from: from, base: socket.localAddress, now: now) {
                    demultiplex(relayed.data, from: relayed.peer, base: relayed.relayBase, now: now)
                }
                continue
            }
            demultiplex(bytes, from: from, base: socket.localAddress, now: now)
        }
        service()
    }

    /// Drains the ICMP errors the socket queued (they keep it polling ready): a TURN server over
    /// UDP whose port is unreachable has stopped, and its relay fails now rather than when consent
    /// expires. Errors from peers' addresses are left to ICE's own checks and consent.
    private func readErrors(_ socket: UdpSocket) {
        for _ in 0..<64 where !socket.isClosed && !finished {
            guard let report = socket.receiveError() else { break }
            guard report.code == ECONNREFUSED, ice.isRelayServer(report.destination, base: socket.localAddress) else { continue }
            ice.relayServerUnreachable(server: report.destination, base: socket.localAddress,
                                       reason: "port unreachable (ICMP): the server stopped or is not running")
        }
    }

    /// RFC 7983 by the first byte: STUN to ICE, DTLS, SRTCP; the rest is dropped.
    private func demultiplex(_ bytes: [UInt8], from: TransportAddress, base: TransportAddress, now: UInt64) {
            guard let first = bytes.first else { return }
            switch first {
            case 0...3:
                ice.receive(bytes, from: from, base: base, now: now)
            case 20...63:
                guard !finished else { return }
                guard let dtls else {
                    keepEarlyDtls(bytes, from: from, base: base)
                    return
                }
                if dtlsPeer == nil || ice.selected == nil { dtlsPeer = (base, from) }
                handleDtls(dtls.receive(bytes))
            case 128...191:
                if RtcpPacket.looksLikeRtcp(bytes), let srtpIn, let plain = srtpIn.unprotect(srtcp: bytes) {
                    delegate?.transportReceivedRtcp(plain, now: now)
                }
            default:
                return  // RFC 7983: anything else is dropped
            }
    }

    // MARK: Timers

    /// Runs what is due (ICE, DTLS retransmission, then the media's work) and arms one timer for the next thing.
    func service() {
        guard !finished else { return }
        var now = MonotonicClock.nanoseconds()
        if let due = ice.nextDeadline, due <= now { ice.tick(now: now) }
        flushIce()
        if let dtls, let timeout = dtls.timeout, timeout <= 0 { handleDtls(dtls.onTimer()) }
        guard !finished else { return }
        delegate?.transportService(now: now)
        guard !finished else { return }

        now = MonotonicClock.nanoseconds()
        var next: UInt64?
        func consider(_ t: UInt64?) { if let t { next = min(next ?? t, t) } }
        consider(ice.nextDeadline)
        if let timeout = dtls?.timeout { consider(now + UInt64(max(timeout, 0) * 1e9)) }
        consider(delegate?.transportNextDeadline(now: now))
        guard let deadline = next else { return }
        if let scheduled, scheduled.at <= deadline { return }
        if let scheduled { loop.cancel(scheduled.id) }
        let id = loop.schedule(at: deadline) { [weak self] in
            guard let self else { return }
            self.scheduled = nil
            self.service()
        }
        scheduled = (id, deadline)
    }

    private func flushIce() {
        let (transmits, events) = ice.drain()
        for transmit in transmits { sendFromHost(transmit.bytes, base: transmit.localBase, to: transmit.to, overStream: transmit.overStream) }
        for event in events {
            switch event {
            case .selected(let pair):
                stats.update {
                    $0.selectedPair = pair.description
                    $0.selectedPairTypes = "\(pair.local.kind.rawValue)/\(pair.local.transport) -> \(pair.remote.kind.rawValue)"
                    let relayProtocol = pair.local.kind == .relay ? ice.relayProtocol(forBase: pair.localBase) : nil
                    $0.selectedRelayProtocol = relayProtocol
                    $0.selectedPath = "\(pair.local.kind.rawValue)/\(relayProtocol ?? pair.local.transport) -> \(pair.remote.kind.rawValue)"
                    $0.iceChecksSent = ice.checksSent
                }
                dtlsPeer = (pair.localBase, pair.remoteAddress)
                if let dtls, dtls.state == .new, dtls.role == .client { handleDtls(dtls.start()) }
            case .localCandidate(let candidate):
                delegate?.transportLocalCandidate(candidate)
            case .relayFailed(let reason):
                stats.update {
                    $0.relayErrors.append(reason)
                    $0.relayRefusal = ice.relayRefusal
                }
            case .consentExpired:
                let seconds = configuration.ice.consentTimeout.inNanoseconds / 1_000_000_000
                // An ICE-lite side asks nothing: what stopped is the peer's checking (a closed tab, a lost path).
                end(.connectionLost(role.iceLite ? "ICE consent expired: no consent check from the peer for \(seconds) s (RFC 7675)"
                                                 : "ICE consent expired: no answer to consent checks for \(seconds) s (RFC 7675)"),
                    state: "lost")
            case .selectedRelayLost(let reason):
                end(.connectionLost("the relay carrying the session is gone: \(reason)"), state: "lost")
            case .failed(let reason):
                // A relay that refused us is what the person must mend, whatever else was tried.
                if let refusal = ice.relayRefusal { end(.relayRefused(refusal, reason), state: "failed") } else { end(.failed(reason), state: "failed") }
            }
        }
        if !events.isEmpty || ice.consentResponses > 0 {
            stats.update {
                $0.iceChecksSent = ice.checksSent
                $0.iceRequestsReceived = ice.requestsReceived
                $0.consentResponses = ice.consentResponses
            }
        }
    }

    private func sendDtls(_ output: DtlsOutput) {
        guard let peer = ice.selected.map({ ($0.localBase, $0.remoteAddress) }) ?? dtlsPeer else { return }
        for datagram in output.datagrams { _ = send(datagram, base: peer.0, to: peer.1) }
    }

    private func handleDtls(_ output: DtlsOutput) {
        sendDtls(output)
        for event in output.events {
            switch event {
            case .connected(let keys):
                stats.update { $0.dtlsHandshakes += 1 }
                do {
                    srtpOut = try SrtpSession(sending: keys)
                    srtpIn = try SrtpSession(receiving: keys)
                } catch {
                    end(.failed("SRTP set-up failed: \(error)"), state: "failed")
                    return
                }
                let ms = Double(MonotonicClock.nanoseconds() - remoteSetAt) / 1e6
                stats.update {
                    $0.state = "connected"
                    $0.connectMilliseconds = ms
                    $0.srtpProfile = keys.profile.opensslName
                }
                delegate?.transportConnected(milliseconds: ms)
            case .remoteClosed:
                end(.remoteClosed, state: "closed")
            case .failed(let error):
                end(.failed(error.description), state: "failed")
            case .applicationData:
                break
            }
        }
    }
}
