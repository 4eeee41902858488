import KraklBase

/// The offerer (WHIP, Janus): our offer, the peer's answer, and the ICE restarts we start.
extension Publisher {
    /// The offerer: gathers host candidates (binding one UDP socket per address), makes the
    /// session's certificate and the offer, and starts the network thread.
    /// - Throws: `NetworkError` when no address can be bound (or the network thread cannot be made),
    ///   `DtlsError` when the certificate cannot be made.
    public convenience init(configuration: PublisherConfiguration = PublisherConfiguration()) throws {
        try self.init(role: .offerer, configuration: configuration, loop: nil)
        start()
    }

    // MARK: - Signalling (any thread)

    /// Parses the peer's answer and starts ICE; the DTLS role follows its a=setup.
    /// A second answer after `restartIce()` only renews ICE. Throws SdpError for an unusable answer.
    @discardableResult
    public func setAnswer(_ sdp: String) throws(SdpError) -> SdpAnswer {
        let parsed = try SdpAnswer(parsing: sdp, offer: offer)
        setAnswer(parsed)
        return parsed
    }

    public func setAnswer(_ answer: SdpAnswer) {
        precondition(role == .offerer, "setAnswer is for the offering publisher; an answering one has its remote offer already")
        let now = MonotonicClock.nanoseconds()
        let (first, offerMid) = state.withLock {
            let first = $0.negotiated == nil
            $0.negotiated = answer
            return (first, $0.offer.mid)
        }
        if !first { updateStats { $0.iceRestarts += 1 } }
        if first {
            updateStats {
                $0.codec = answer.codec.sdpName
                $0.state = "checking"
                $0.dtlsRole = answer.setup == .active ? "server" : "client"
            }
        }
        loop.post { [self] in
            if first { net.stream = makeStream(VideoSendParameters(answer: answer, offerMid: offerMid)) }
            transport.setRemote(credentials: IceCredentials(ufrag: answer.iceUfrag, pwd: answer.icePwd), candidates: answer.candidates,
                                connectionAddress: answer.connectionAddress, port: answer.port, fingerprint: answer.fingerprint,
                                dtlsRole: answer.setup == .active ? .server : .client, first: first, now: now)
            transport.service()
        }
    }

    /// STUN servers learned after the offer (e.g. from the answer's WHIP `Link` headers): their
    /// server-reflexive candidates come as `.localCandidate` events, for the room driver to trickle.
    public func addStunServers(_ servers: [TransportAddress]) {
        guard !servers.isEmpty else { return }
        loop.post { [self] in
            transport.ice.addStunServers(servers, now: MonotonicClock.nanoseconds())
            transport.service()
        }
    }

    /// Calls `handler` once, on the network thread, when no candidate is being gathered any more
    /// (every STUN request for a server-reflexive candidate and every TURN allocation answered or
    /// given up), at once when none is: the moment to tell the room "no more candidates". Call it
    /// after `addStunServers`/`addTurnServers`, so their gathering counts.
    public func whenGatheringEnds(_ handler: @escaping @Sendable () -> Void) {
        loop.post { [self] in
            net.gatheringWaiters.append(handler)
            transport.service()
        }
    }

    /// TURN servers learned after the offer (a WHIP server's `Link` headers): their relay
    /// candidates come as `.localCandidate` events, for the room driver to trickle.
    public func addTurnServers(_ servers: [TurnServer]) {
        guard !servers.isEmpty else { return }
        loop.post { [self] in
            transport.openTurnStreams(servers)
            transport.ice.addTurnServers(servers, now: MonotonicClock.nanoseconds())
            transport.service()
        }
    }

    /// ICE restart (RFC 8445 §9): new credentials; returns the new offer for the peer. Media keeps
    /// flowing on the current pair until the answer to this offer (`setAnswer`) nominates a new one.
    /// Offerer only (an answerer restarts when the peer asks: `restartIce(remote:candidates:)`).
    public func restartIce() -> String {
        precondition(role == .offerer, "restartIce is for the offering publisher")
        let credentials = IceCredentials.random()
        let sdp = state.withLock {
            $0.offer.renew(credentials)
            return $0.offer.sdp
        }
        loop.post { [self] in
            transport.ice.restart(credentials: credentials, now: MonotonicClock.nanoseconds())
            transport.service()
        }
        return sdp
    }
}

extension SdpVideoOffer {
    /// An ICE restart's offer: new credentials, the next session version.
    mutating func renew(_ credentials: IceCredentials) {
        iceUfrag = credentials.ufrag
        icePwd = credentials.pwd
        sessionVersion += 1
    }
}
