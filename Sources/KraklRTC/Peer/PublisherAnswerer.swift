import KraklBase
import Dispatch
import FoundationEssentials
import Glibc

/// Why an answering publisher could not be made.
public enum PublisherError: Error, CustomStringConvertible {
    /// The remote offer is malformed or has no video section we can send: say so to the peer (HTTP 400).
    case offer(SdpError)
    /// Our side could not be set up: no address to bind (`NetworkError`), no certificate (`DtlsError`).
    case transport(any Error)

    public var description: String {
        switch self {
        case .offer(let error): return error.description
        case .transport(let error): return "\(error)"
        }
    }
}

/// The answerer (a WHEP viewer's offer): our answer, and the ICE restarts the peer starts.
extension Publisher {
    /// The answerer: reads a remote offer (e.g. a browser's or a WHEP player's recvonly offer with
    /// audio, video and a data channel), accepts its first video section with a codec of
    /// `configuration.codecs` (VP8 preferred, else VP9), rejects every other section (port 0, RFC 8829
    /// §5.3.1) and writes `answerSDP`: send-only video, our candidates, `a=setup:passive` unless the
    /// offer insists on being passive. Nothing is sent until `start()`.
    /// - Parameters:
    ///   - iceLite: answer as an ICE-lite server (`a=ice-lite`; answers checks, never sends any): right
    ///     for a server reached on its host candidates. False: full ICE as the controlled agent.
    ///   - loop: a network loop to share with other peers (the caller starts and stops it); nil: one of its own.
    /// - Throws: `.offer` when the offer is malformed or has no video section we can send, and
    ///   `.transport` when no address can be bound.
    public convenience init(answering offer: String, configuration: PublisherConfiguration = PublisherConfiguration(), iceLite: Bool = true,
                            loop: EventLoop? = nil) throws(PublisherError) {
        var remote: SdpRemoteOffer
        do throws(SdpError) {
            remote = try SdpRemoteOffer(parsing: offer, codecs: configuration.codecs.map(\.codec))
        } catch {
            throw .offer(error)
        }
        if configuration.playoutDelay == nil { remote.extensions[.playoutDelay] = nil }
        guard !(iceLite && remote.iceLite) else { throw .offer(.offerNotAnswerable("both sides are ICE-lite: one side must run full ICE (RFC 8445 §6.1.1)")) }
        do {
            try self.init(role: iceLite ? .answererLite : .answerer, configuration: configuration, loop: loop, answering: remote)
        } catch {
            throw .transport(error)
        }
    }

    /// Our answer to `remote`, with our side's parameters as `offer` has them; `offer` becomes our side
    /// in offer form for its readers (never sent).
    static func answer(_ remote: SdpRemoteOffer, ourSide offer: inout SdpVideoOffer, iceLite: Bool, label: String?) -> String {
        var answer = SdpVideoAnswer(offer: remote, sessionID: offer.sessionID, iceUfrag: offer.iceUfrag, icePwd: offer.icePwd,
                                    fingerprint: offer.fingerprint, streamID: offer.streamID, trackID: offer.trackID, ssrc: offer.ssrc,
                                    rtxSSRC: remote.rtxPayloadType == nil ? nil : offer.rtxSSRC, cname: offer.cname)
        answer.iceLite = iceLite
        answer.candidates = offer.candidates
        if let label { answer.sessionName = label }
        offer.setup = answer.setup
        offer.mid = remote.mid
        offer.trickle = false
        return answer.sdp
    }

    /// The answer's numbers, before anything runs.
    func answererReady(_ remote: SdpRemoteOffer) {
        let setup = SdpVideoAnswer.setup(answering: remote.setup)
        updateStats {
            $0.codec = remote.codec.sdpName
            $0.state = "checking"
            $0.dtlsRole = setup == .active ? "client" : "server"
        }
    }

    /// Network thread, from `start()`: the send stream, and the peer's offer to ICE and DTLS.
    func startAnswering(_ remote: SdpRemoteOffer, now: UInt64) {
        net.stream = makeStream(VideoSendParameters(codec: remote.codec, payloadType: remote.payloadType,
                                                    rtxPayloadType: remote.rtxPayloadType, extensions: remote.extensions, mid: remote.mid))
        // Our setup answers theirs: passive (the usual answer to actpass) makes us the DTLS server.
        let dtlsRole: DtlsRole = SdpVideoAnswer.setup(answering: remote.setup) == .active ? .client : .server
        transport.setRemote(credentials: IceCredentials(ufrag: remote.iceUfrag, pwd: remote.icePwd), candidates: remote.candidates,
                            connectionAddress: remote.connectionAddress, port: remote.port, fingerprint: remote.fingerprint,
                            dtlsRole: dtlsRole, first: true, now: now)
        transport.service()
    }

    /// Answerer: the peer restarted ICE (RFC 8445 §9): `remote` and `candidates` are its new offer's
    /// (a WHEP PATCH's sdpfrag, RFC 9725 §4.3.2). Makes our new credentials and returns them with our
    /// candidates, for the answer fragment. Only ICE starts over: DTLS (no new handshake), SRTP and the
    /// send stream go on, and media stays on the selected pair until the peer's new checks nominate one;
    /// then the old generation's checks are refused.
    ///
    /// Returns once the network thread has the new credentials (bounded, 2 s), so checks the peer sends
    /// as soon as it reads our answer find them in place. Nil when the peer is closed or not started.
    public func restartIce(remote: IceCredentials, candidates: [IceCandidate]) -> (credentials: IceCredentials, candidates: [IceCandidate])? {
        precondition(role != .offerer, "restartIce(remote:candidates:) is for an answering publisher; the offerer calls restartIce()")
        guard state.withLock({ $0.started && $0.closing == .open }) else { return nil }
        let credentials = IceCredentials.random()
        state.withLock { $0.offer.renew(credentials) }
        let result = Guarded<[IceCandidate]?>(nil)
        let work = { [self] in
            guard !transport.finished else { return }
            transport.restartIce(local: credentials, remote: remote, candidates: candidates, now: MonotonicClock.nanoseconds())
            let candidates = transport.ice.localCandidates
            result.withLock { $0 = candidates }
        }
        if loop.isLoopThread {
            work()
        } else {
            let done = DispatchSemaphore(value: 0)
            loop.post { work(); done.signal() }
            guard done.wait(timeout: .now() + 2) == .success else { return nil }
        }
        guard let candidates = result.withLock({ $0 }) else { return nil }
        return (credentials, candidates)
    }
}
