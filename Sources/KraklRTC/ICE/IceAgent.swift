import KraklBase
/// ICE credentials of one side (RFC 8445 §5.3).
public struct IceCredentials: Equatable, Sendable {
    public var ufrag: String
    public var pwd: String

    public init(ufrag: String, pwd: String) {
        self.ufrag = ufrag
        self.pwd = pwd
    }

    /// From the RFC 8839 §5.4 alphabet: 4 ufrag and 24 pwd characters (≥ 22 required).
    public static func random() -> IceCredentials {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        func random(_ n: Int) -> String { String((0..<n).map { _ in alphabet.randomElement()! }) }
        return IceCredentials(ufrag: random(4), pwd: random(24))
    }
}

/// Timing of the agent; the defaults follow RFC 8445 and RFC 7675.
public struct IceConfiguration: Sendable {
    /// Pacing of new checks, Ta (§14.2: 50 ms).
    public var checkInterval: Duration = .milliseconds(50)
    /// First retransmission timeout of a check; doubles each time (RFC 8489 §6.2.1).
    public var initialRto: Duration = .milliseconds(200)
    public var maximumRto: Duration = .milliseconds(1600)
    /// Transmissions of one check before its pair fails (Rc = 7).
    public var maximumTransmissions = 7
    /// Controlling side: how long after the first success to wait for better pairs before nominating.
    public var nominationWait: Duration = .milliseconds(150)
    /// RFC 7675 §5.1: a consent check every 5 s, randomized ±20 %.
    public var consentInterval: Duration = .seconds(5)
    /// RFC 7675 §5.1: consent expires 30 s after the last response.
    public var consentTimeout: Duration = .seconds(30)
    /// Give up when no pair is selected this long after the remote description arrived.
    public var connectTimeout: Duration = .seconds(15)

    public init() {}
}

/// What the agent asks its owner to do or know.
public enum IceEvent: Equatable, Sendable {
    /// A pair was nominated: media and DTLS go over it from now on (again after a restart).
    case selected(IceCandidatePair)
    /// A server-reflexive candidate was learned from a STUN server, or a relay candidate from a
    /// TURN server: signal it (trickle).
    case localCandidate(IceCandidate)
    /// A TURN server gave no allocation (or lost it); ICE goes on with the other candidates.
    case relayFailed(String)
    /// RFC 7675: no consent response for the consent timeout; nothing more may be sent.
    case consentExpired
    /// The TURN allocation the selected pair is relayed through is gone (its TCP or TLS connection
    /// broke, the server died): nothing can be sent on that pair any more.
    case selectedRelayLost(String)
    case failed(String)
}

/// A datagram to send from the socket bound to `localBase`.
public struct IceTransmit: Equatable, Sendable {
    public var localBase: TransportAddress
    public var to: TransportAddress
    public var bytes: [UInt8]
    /// For a TURN server reached over TCP or TLS: down that connection, not from the UDP socket
    /// (a server may take both at one address, e.g. turn:x and turn:x?transport=tcp).
    public var overStream = false
}

/// A full ICE agent (RFC 8445) for one component (rtcp-mux, BUNDLE), as
/// the controlling side by default: host candidates on the given sockets'
/// addresses, optional server-reflexive ones from STUN servers, the check
/// list with Ta pacing, triggered checks, peer-reflexive learning, regular
/// nomination, role-conflict repair (§7.3.1.1) and consent freshness
/// (RFC 7675) on the selected pair.
///
/// With `lite` it is an ICE-lite agent (RFC 8445 §2.5) instead, for a server on host candidates:
/// always controlled, it answers checks and never sends one (nor consent checks); the peer's
/// nominating check (USE-CANDIDATE) selects its pair, and the peer's consent checks on that pair are
/// what keeps consent fresh (RFC 7675 §4: the full peer does the checking).
///
/// It owns no socket and no clock: the owner feeds it STUN datagrams and
/// the time, calls `tick` when `nextDeadline` passes, and sends what
/// `drain()` returns. One thread at a time (the network loop).
public final class IceAgent {
    public enum Phase: Equatable, Sendable { case new, checking, connected, disconnected, failed }

    public let configuration: IceConfiguration
    public private(set) var local: IceCredentials
    public private(set) var remote: IceCredentials?
    public private(set) var controlling: Bool
    /// ICE-lite (see above): answers, never asks.
    public let lite: Bool
    public let tieBreaker: UInt64
    public private(set) var localCandidates: [IceCandidate] = []
    public private(set) var remoteCandidates: [IceCandidate] = []
    public private(set) var checkList: IceCheckList
    public private(set) var selected: IceCandidatePair?
    public private(set) var phase: Phase = .new
    /// Counters for stats and tests.
    public private(set) var checksSent = 0
    public private(set) var requestsReceived = 0
    public private(set) var consentResponses = 0

    private var bases: [TransportAddress]
    /// One host candidate per base, signalled unless `relayOnly`.
    private var hostCandidates: [IceCandidate] = []
    private var stunServers: [TransportAddress]
    /// Only relay candidates are paired and signalled (`iceTransportPolicy: "relay"`).
    public let relayOnly: Bool
    /// Relay-only may get its TURN servers after the offer (`addTurnServers`).
    private let relaysMayFollow: Bool

    /// One TURN allocation per server, on the first base of the server's address family.
    private struct Relay {
        var client: TurnClient
        /// The host socket the client talks to its server from.
        var base: TransportAddress
        var candidate: IceCandidate?
    }
    private var relays: [Relay] = []
    /// What went wrong with each TURN server, for the failure message.
    public private(set) var relayErrors: [String] = []
    /// A TURN server refused our credentials (first) or its certificate was not trusted: why a
    /// session that found no path ends, when it is so.
    public private(set) var relayRefusal: RelayRefusal?
    /// The latest time the owner passed in: `drain()` wraps relayed checks with it.
    private var lastNow: UInt64 = 0

    private struct Transaction {
        enum Kind { case check(IcePairKey, useCandidate: Bool), consent(IcePairKey), serverReflexive(base: TransportAddress, server: TransportAddress) }
        var kind: Kind
        var bytes: [UInt8]
        var localBase: TransportAddress
        var to: TransportAddress
        var transmissions = 1
        var rto: UInt64
        var nextRetransmit: UInt64
        var password: String?
    }

    private var transactions: [[UInt8]: Transaction] = [:]
    private var triggered: [IcePairKey] = []
    private var nextCheckAt: UInt64 = 0
    private var firstSuccessAt: UInt64?
    private var nominating: IcePairKey?
    /// True from the remote description until a pair is selected (again after a restart).
    private var needsNomination = false
    private var remoteSetAt: UInt64?
    private var lastConsentAt: UInt64 = 0
    private var nextConsentAt: UInt64?
    /// Credentials consent checks use: the selected pair's generation survives an ICE restart until a new pair is chosen.
    private var consentCredentials: (local: IceCredentials, remote: IceCredentials)?
    /// Checks that arrived before the answer: answered at once, paired once the remote password is known.
    private var earlyRequests: [(from: TransportAddress, base: TransportAddress, priority: UInt32, useCandidate: Bool)] = []
    /// Distinct sources of early checks kept (a peer has a handful of candidates; more is noise).
    static let maximumEarlyRequests = 32
    private var transmits: [IceTransmit] = []
    private var events: [IceEvent] = []
    private var generator = SystemRandomNumberGenerator()

    /// - Parameters:
    ///   - bases: the bound sockets' addresses; each becomes a host candidate.
    ///   - stunServers: servers to learn server-reflexive candidates from (none by default: no traffic leaves the host unasked).
    ///   - lite: an ICE-lite agent (controlled, host candidates only; `controlling`, `stunServers` and `turnServers` are ignored).
    ///   - turnServers: servers to allocate relay candidates on (RFC 8656).
    ///   - relayOnly: pair and signal relay candidates only; host sockets then only talk to the TURN servers.
    ///   - relaysMayFollow: with `relayOnly` and no TURN server yet, wait for `addTurnServers` (a WHIP
    ///     server names its TURN servers with its answer) instead of failing when gathering starts.
    public init(credentials: IceCredentials = .random(), bases: [TransportAddress], controlling: Bool = true,
                tieBreaker: UInt64 = UInt64.random(in: 0...UInt64.max), stunServers: [TransportAddress] = [],
                configuration: IceConfiguration = IceConfiguration(), lite: Bool = false,
                turnServers: [TurnServer] = [], relayOnly: Bool = false, relaysMayFollow: Bool = false,
                turnConfiguration: TurnConfiguration = TurnConfiguration()) {
        local = credentials
        self.relaysMayFollow = relaysMayFollow
        self.bases = bases
        self.lite = lite
        self.relayOnly = relayOnly && !lite
        let controlling = controlling && !lite
        let stunServers = lite || relayOnly ? [] : stunServers
        self.controlling = controlling
        self.tieBreaker = tieBreaker
        self.stunServers = stunServers
        self.configuration = configuration
        checkList = IceCheckList(controlling: controlling)
        for (index, base) in bases.enumerated() {
            // Local preference: earlier (IPv4 first) bases rank higher.
            let priority = IceCandidate.priority(kind: .host, localPreference: UInt16(65535 - min(index, 1000) * 10))
            hostCandidates.append(IceCandidate(foundation: "\(index + 1)", priority: priority, address: "\(base.ip)",
                                               port: base.port, kind: .host))
        }
        if !self.relayOnly { localCandidates = hostCandidates }
        if !lite {
            for server in turnServers {
                guard let base = bases.first(where: { $0.ip.isIPv6 == server.address.ip.isIPv6 }) else {
                    relayErrors.append("TURN server \(server.address): no local address of its family")
                    continue
                }
                relays.append(Relay(client: TurnClient(server: server, configuration: turnConfiguration), base: base))
            }
        }
    }

    /// Whether a candidate may still come: a STUN request for a server-reflexive candidate, or a
    /// TURN allocation, is still waiting for its answer (or its last retransmission's time-out).
    public var isGathering: Bool {
        transactions.values.contains { if case .serverReflexive = $0.kind { return true } else { return false } }
            || relays.contains { relay in
                switch relay.client.state {
                case .idle, .allocating: return true
                default: return false
                }
            }
    }

    /// Starts gathering server-reflexive candidates (nothing to do without STUN servers).
    public func startGathering(now: UInt64) {
        lastNow = now
        gather(from: stunServers, now: now)
        for relay in relays { relay.client.start(now: now) }
        if relayOnly, relays.isEmpty, !relaysMayFollow { failRelayOnly() }
    }

    /// STUN servers learned after the offer (a WHIP server's `Link` headers): gathers from the ones
    /// not known yet; their candidates arrive as `.localCandidate` events, to trickle.
    public func addStunServers(_ servers: [TransportAddress], now: UInt64) {
        let new = servers.filter { !stunServers.contains($0) }
        stunServers += new
        gather(from: new, now: now)
    }

    private func gather(from servers: [TransportAddress], now: UInt64) {
        for base in bases {
            for server in servers where server.ip.isIPv6 == base.ip.isIPv6 {
                let request = StunMessage(class: .request, transactionID: StunMessage.randomTransactionID())
                let bytes = request.encoded(fingerprint: true)
                transactions[request.transactionID] = Transaction(kind: .serverReflexive(base: base, server: server), bytes: bytes,
                                                                  localBase: base, to: server, rto: 500_000_000,
                                                                  nextRetransmit: now + 500_000_000)
                transmits.append(IceTransmit(localBase: base, to: server, bytes: bytes))
            }
        }
    }

    /// The answer's credentials and candidates; checks begin on the next tick.
    public func setRemote(credentials: IceCredentials, candidates: [IceCandidate], now: UInt64) {
        remote = credentials
        remoteSetAt = now
        needsNomination = true
        if phase == .new { phase = .checking }
        for candidate in candidates { addRemoteCandidate(candidate, now: now) }
        // Checks that came in before the answer: their sources become peer-reflexive candidates.
        for early in earlyRequests {
            learnRemote(from: early.from, base: early.base, priority: early.priority, useCandidate: early.useCandidate, now: now)
        }
        earlyRequests.removeAll()
        nextCheckAt = min(nextCheckAt, now)
    }

    /// A trickled (or answer) candidate. mDNS names, TCP and other components are ignored.
    public func addRemoteCandidate(_ candidate: IceCandidate, now: UInt64) {
        guard candidate.component == 1, candidate.transport == "udp", candidate.transportAddress != nil else { return }
        if !remoteCandidates.contains(where: { $0.transportAddress == candidate.transportAddress }) {
            remoteCandidates.append(candidate)
        }
        if !relayOnly {
            for (index, base) in bases.enumerated() {
                checkList.add(local: hostCandidates[index], localBase: base, remote: candidate)
            }
        }
        for relay in relays {
            guard let local = relay.candidate, let relayed = relay.client.relayedAddress,
                  let key = checkList.add(local: local, localBase: relayed, remote: candidate) else { continue }
            // The server drops what peers send to the relayed address until we permit them (RFC 8656 §9).
            relay.client.permit(key.remote, now: now)
        }
    }

    /// ICE restart (§9): new local credentials. The selected pair keeps carrying media (and
    /// consent checks with the old credentials, ours and the peer's) until the new generation's
    /// checks nominate one; then the old generation is forgotten. The offerer calls it before its
    /// new offer; an answerer (ICE-lite too) when the peer's new offer came, then `setRemote`.
    public func restart(credentials: IceCredentials, now: UInt64) {
        local = credentials
        remote = nil
        remoteCandidates.removeAll()
        checkList.removeAll()
        triggered.removeAll()
        earlyRequests.removeAll()
        transactions = transactions.filter { if case .consent = $0.value.kind { return true } else { return false } }
        firstSuccessAt = nil
        nominating = nil
        remoteSetAt = nil
        if selected == nil { phase = .new }
    }

    /// Everything to send and report since the last call.
    public func drain() -> (transmits: [IceTransmit], events: [IceEvent]) {
        pumpRelays()
        // Checks and answers on a relay candidate travel inside Send indications or ChannelData.
        if !relays.isEmpty {
            transmits = transmits.compactMap { transmit in
                guard let relay = relays.first(where: { $0.client.relayedAddress == transmit.localBase }) else { return transmit }
                return relay.client.wrap(transmit.bytes, to: transmit.to, now: lastNow)
                    .map { IceTransmit(localBase: relay.base, to: relay.client.server.address, bytes: $0,
                                       overStream: relay.client.server.transport.isStream) }
            }
            pumpRelays()
        }
        defer { transmits.removeAll(keepingCapacity: true); events.removeAll(keepingCapacity: true) }
        return (transmits, events)
    }

    // MARK: - TURN relays

    /// Collects what the TURN clients want sent and what they report.
    private func pumpRelays() {
        for index in relays.indices {
            let relay = relays[index]
            let (datagrams, relayEvents) = relay.client.drain()
            for datagram in datagrams { transmits.append(IceTransmit(localBase: relay.base, to: relay.client.server.address, bytes: datagram,
                                                                         overStream: relay.client.server.transport.isStream)) }
            for event in relayEvents {
                switch event {
                case .allocated(let relayed, let mapped):
                    guard phase != .failed else { continue }
                    let candidate = IceCandidate(foundation: "r\(index + 1)",
                                                 priority: IceCandidate.priority(kind: .relay, localPreference: UInt16(65535 - min(index, 1000) * 10)),
                                                 address: "\(relayed.ip)", port: relayed.port, kind: .relay,
                                                 relatedAddress: mapped.map { "\($0.ip)" }, relatedPort: mapped?.port)
                    relays[index].candidate = candidate
                    localCandidates.append(candidate)
                    events.append(.localCandidate(candidate))
                    for remote in remoteCandidates where remote.kind != .prflx { addRemoteCandidate(remote, now: lastNow) }
                case .failed(let error):
                    relayErrors.append(error.description)
                    if let refusal = error.refusal, relayRefusal != .credentials { relayRefusal = refusal }
                    events.append(.relayFailed(error.description))
                    // Not waiting for consent to expire (30 s): the path is known to be gone.
                    if let pair = selected, let relayed = relay.candidate?.transportAddress, pair.localBase == relayed {
                        events.append(.selectedRelayLost(error.description))
                    }
                    if relayOnly, relays.allSatisfy({ if case .failed = $0.client.state { return true } else { return false } }) {
                        failRelayOnly()
                    }
                case .permissionFailed(let peer, let error):
                    relayErrors.append("permission for \(peer): \(error)")
                case .channelBound, .closed:
                    break
                }
            }
        }
        // Events above may have queued more (permissions for the pairs just made).
        for relay in relays {
            let (datagrams, _) = relay.client.drain()
            for datagram in datagrams { transmits.append(IceTransmit(localBase: relay.base, to: relay.client.server.address, bytes: datagram,
                                                                         overStream: relay.client.server.transport.isStream)) }
        }
    }

    /// TURN servers learned after the offer (a WHIP server's `Link` headers): allocates on the new
    /// ones; their relay candidates arrive as `.localCandidate` events, to trickle.
    public func addTurnServers(_ servers: [TurnServer], now: UInt64, configuration turnConfiguration: TurnConfiguration = TurnConfiguration()) {
        guard !lite else { return }
        lastNow = now
        for server in servers where !relays.contains(where: { $0.client.server == server }) {
            guard let base = bases.first(where: { $0.ip.isIPv6 == server.address.ip.isIPv6 }) else { continue }
            let client = TurnClient(server: server, configuration: turnConfiguration)
            relays.append(Relay(client: client, base: base))
            client.start(now: now)
        }
    }

    private func failRelayOnly() {
        guard phase != .failed, selected == nil else { return }
        phase = .failed
        events.append(.failed(relays.isEmpty && relayErrors.isEmpty
            ? "ICE failed: relay-only candidates were asked for but no TURN server is configured"
            : "ICE failed: relay-only candidates were asked for and no TURN server gave an allocation: " + relayErrors.joined(separator: "; ")))
    }

    /// True when `from` is the TURN server the socket bound to `base` talks to: the datagram is
    /// for `receiveFromRelayServer`, whatever its first byte.
    public func isRelayServer(_ from: TransportAddress, base: TransportAddress, overStream: Bool = false) -> Bool {
        relays.contains { $0.base == base && $0.client.server.address == from && $0.client.server.transport.isStream == overStream }
    }

    /// True when `base` is a relayed address (no socket of ours: send through `relayWrap`).
    public func isRelayBase(_ base: TransportAddress) -> Bool {
        relays.contains { $0.client.relayedAddress == base }
    }

    /// A datagram from a TURN server: responses go to its client; a peer's STUN inside a Data
    /// indication or ChannelData is handled here (its base is the relayed address). Anything else
    /// a peer relayed (DTLS, SRTP) is returned for the owner to demultiplex as if it had arrived on
    /// `relayBase` from `peer`.
    public func receiveFromRelayServer(_ datagram: [UInt8], from: TransportAddress, base: TransportAddress, overStream: Bool = false,
                                       now: UInt64) -> (relayBase: TransportAddress, peer: TransportAddress, data: [UInt8])? {
        lastNow = now
        guard let relay = relays.first(where: { $0.base == base && $0.client.server.address == from && $0.client.server.transport.isStream == overStream }),
              let (peer, data) = relay.client.receive(datagram, now: now), let relayed = relay.client.relayedAddress else { return nil }
        if StunMessage.looksLikeStun(data) {
            receive(data, from: peer, base: relayed, now: now)
            return nil
        }
        return (relayed, peer, data)
    }

    /// The datagram to send (from a host socket, to the TURN server) that carries `bytes` from
    /// `relayBase` to `to`; nil when that relay cannot carry it yet (queued) or at all.
    public func relayWrap(_ bytes: [UInt8], relayBase: TransportAddress, to: TransportAddress, now: UInt64) -> IceTransmit? {
        guard let relay = relays.first(where: { $0.client.relayedAddress == relayBase }),
              let wire = relay.client.wrap(bytes, to: to, now: now) else { return nil }
        return IceTransmit(localBase: relay.base, to: relay.client.server.address, bytes: wire, overStream: relay.client.server.transport.isStream)
    }

    /// How the relay whose relayed address is `base` reaches its TURN server ("udp", "tcp", …);
    /// nil when `base` is not a relayed address. What a status shows for a relay pair: the
    /// relayed leg is UDP either way, the leg that leaves this machine is this one.
    public func relayProtocol(forBase base: TransportAddress) -> String? {
        relays.first { $0.client.relayedAddress == base }?.client.server.transport.rawValue
    }

    /// The TCP connection to a TURN server reached over TCP failed: its allocation is lost
    /// (reported on the next `drain()`, like any relay failure).
    public func relayConnectionFailed(server: TransportAddress, reason: String, untrustedCertificate: Bool = false) {
        for relay in relays where relay.client.server.address == server && relay.client.server.transport.isStream {
            relay.client.connectionFailed(reason, untrustedCertificate: untrustedCertificate)
        }
    }

    /// A datagram from `base` to the TURN server `server` (over UDP) came back as unreachable
    /// (ICMP): its allocation is lost (reported on the next `drain()`, like any relay failure).
    public func relayServerUnreachable(server: TransportAddress, base: TransportAddress, reason: String) {
        for relay in relays where relay.base == base && relay.client.server.address == server && !relay.client.server.transport.isStream {
            relay.client.connectionFailed(reason)
        }
    }

    /// Deallocates every TURN allocation (Refresh, lifetime 0); `drain()` then has the requests.
    public func closeRelays(now: UInt64) {
        lastNow = now
        for relay in relays { relay.client.close(now: now) }
    }

    /// The TURN clients' states, for stats and tests.
    public var relayStates: [TurnClient.State] { relays.map(\.client.state) }

    /// When `tick` must run next, or nil when nothing is timed.
    public var nextDeadline: UInt64? {
        guard phase != .failed else { return nil }
        var deadline: UInt64?
        func consider(_ t: UInt64?) { if let t { deadline = min(deadline ?? t, t) } }
        if !lite && remote != nil && phase != .failed && (!triggered.isEmpty || checkList.pairs.contains { $0.state == .waiting || $0.state == .frozen }) {
            consider(nextCheckAt)
        }
        for transaction in transactions.values { consider(transaction.nextRetransmit) }
        for relay in relays { consider(relay.client.nextDeadline) }
        if needsNomination, controlling, nominating == nil, let best = checkList.bestSucceeded, let firstSuccessAt {
            // Nominate at once when no better pair is still possible, else after the wait.
            consider(checkList.higherPriorityPending(than: best.key) ? firstSuccessAt + configuration.nominationWait.inNanoseconds : firstSuccessAt)
        }
        consider(nextConsentAt)
        if selected != nil, phase == .connected || phase == .disconnected { consider(lastConsentAt + configuration.consentTimeout.inNanoseconds) }
        if selected == nil, let remoteSetAt, phase == .checking { consider(remoteSetAt + configuration.connectTimeout.inNanoseconds) }
        return deadline
    }

    /// Runs what is due: the next paced check, retransmissions, nomination, consent.
    public func tick(now: UInt64) {
        guard phase != .failed else { return }
        lastNow = now
        for relay in relays { relay.client.tick(now: now) }
        // Retransmissions (and transactions that ran out).
        for (id, transaction) in transactions where transaction.nextRetransmit <= now {
            let limit: Int
            switch transaction.kind {
            case .check: limit = configuration.maximumTransmissions
            case .consent: limit = 4
            case .serverReflexive: limit = 3
            }
            if transaction.transmissions >= limit {
                transactions[id] = nil
                if case .check(let key, let useCandidate) = transaction.kind {
                    checkList.setState(key, .failed)
                    if useCandidate, nominating == key { nominating = nil }
                }
                continue
            }
            var next = transaction
            next.transmissions += 1
            next.rto = min(next.rto * 2, configuration.maximumRto.inNanoseconds)
            next.nextRetransmit = now + next.rto
            transactions[id] = next
            transmits.append(IceTransmit(localBase: next.localBase, to: next.to, bytes: next.bytes))
        }
        // One new check per Ta: triggered ones first (§6.1.4.2).
        if !lite, remote != nil, now >= nextCheckAt {
            var key: IcePairKey?
            while key == nil, !triggered.isEmpty {
                let candidate = triggered.removeFirst()
                if let pair = checkList[candidate], pair.state != .inProgress { key = candidate }
            }
            if key == nil { key = checkList.nextOrdinaryCheck() }
            if let key, let pair = checkList[key] {
                sendCheck(pair, useCandidate: controlling && nominating == key, now: now)
                nextCheckAt = now + configuration.checkInterval.inNanoseconds
            }
        }
        // Nomination once better pairs had their chance.
        if controlling, nominating == nil, needsNomination, let firstSuccessAt {
            if let best = checkList.bestSucceeded,
               now >= firstSuccessAt + configuration.nominationWait.inNanoseconds || !checkList.higherPriorityPending(than: best.key) {
                nominate(best, now: now)
            }
        }
        // Consent freshness on the selected pair.
        if !lite, let pair = selected, let due = nextConsentAt, now >= due {
            sendConsent(pair, now: now)
            nextConsentAt = now + randomizedConsentInterval()
        }
        if selected != nil, phase == .connected || phase == .disconnected, now > lastConsentAt + configuration.consentTimeout.inNanoseconds {
            phase = .failed
            nextConsentAt = nil
            transactions.removeAll()
            events.append(.consentExpired)
        }
        if selected == nil, phase == .checking, let remoteSetAt, now >= remoteSetAt + configuration.connectTimeout.inNanoseconds {
            phase = .failed
            let tried = checkList.pairs.count
            let turn = relayErrors.isEmpty ? "" : "; TURN: " + relayErrors.joined(separator: "; ")
            events.append(.failed((tried == 0
                ? "ICE failed: the answer gave no usable candidate (IPv4/IPv6 UDP on an address family we have) within \(configuration.connectTimeout.inNanoseconds / 1_000_000_000) s"
                : "ICE failed: none of \(tried) candidate pairs answered a connectivity check within \(configuration.connectTimeout.inNanoseconds / 1_000_000_000) s") + turn))
        }
    }

    /// Consent is being refreshed: seconds since the last consent (or check) response.
    public func secondsSinceConsent(now: UInt64) -> Double { Double(now &- lastConsentAt) / 1e9 }

    // MARK: - Incoming STUN

    /// True when `from` sent an authenticated check to the socket bound to `base` before the
    /// remote description: the only sources known then to hold our credentials.
    func heardEarlyCheck(from: TransportAddress, base: TransportAddress) -> Bool {
        earlyRequests.contains { $0.from == from && $0.base == base }
    }

    /// Handles a datagram that `StunMessage.looksLikeStun` accepted, received on the socket
    /// bound to `base` from `from`. Malformed or unauthenticated messages are dropped.
    public func receive(_ datagram: [UInt8], from: TransportAddress, base: TransportAddress, now: UInt64) {
        lastNow = now
        // Relay-only: the host sockets are not candidates; a check arriving on one is not answered.
        if relayOnly, bases.contains(base) { return }
        guard let message = try? StunMessage(parsing: datagram), message.method == StunMessage.bindingMethod else { return }
        switch message.messageClass {
        case .request: handleRequest(message, from: from, base: base, now: now)
        case .successResponse, .errorResponse: handleResponse(message, from: from, base: base, now: now)
        case .indication: break  // keepalives (binding indications) need no answer
        }
    }

    private func handleRequest(_ request: StunMessage, from: TransportAddress, base: TransportAddress, now: UInt64) {
        guard (try? request.validateFingerprint()) != nil else { return }
        requestsReceived += 1
        let key = StunMessage.shortTermKey(password: local.pwd)
        // §7.3: USERNAME must be "<our ufrag>:<their ufrag>" and MESSAGE-INTEGRITY match our password.
        guard let username = request.username, request.attribute(StunAttribute.Code.messageIntegrity) != nil else {
            return respond(StunMessage.bindingError(to: request, code: 400, reason: "Bad Request"), key: nil, from: from, base: base)
        }
        let parts = username.split(separator: ":", maxSplits: 1)
        if parts.count == 2, parts[0] != local.ufrag, let previous = consentCredentials, previous.local != local,
           parts[0] == previous.local.ufrag {
            return answerPreviousGeneration(request, previous: previous, theirs: String(parts[1]), from: from, base: base, now: now)
        }
        guard parts.count == 2, parts[0] == local.ufrag, (try? request.validateIntegrity(key: key)) != nil else {
            return respond(StunMessage.bindingError(to: request, code: 401, reason: "Unauthorized"), key: nil, from: from, base: base)
        }
        if let remote, parts[1] != remote.ufrag { return }  // another generation's check (§9)
        let unknown = request.unknownComprehensionRequired
        if !unknown.isEmpty {
            return respond(StunMessage.bindingError(to: request, code: 420, reason: "Unknown Attribute", unknown: unknown), key: key, from: from, base: base)
        }
        // §7.3.1.1 role conflict.
        for attribute in request.attributes {
            switch attribute {
            case .iceControlling(let theirs) where controlling:
                if tieBreaker >= theirs {
                    return respond(StunMessage.bindingError(to: request, code: 487, reason: "Role Conflict"), key: key, from: from, base: base)
                }
                switchRole()
            case .iceControlled where lite:
                // A lite agent is controlled whatever the tie-breakers say (§6.1.1): the peer must switch.
                return respond(StunMessage.bindingError(to: request, code: 487, reason: "Role Conflict"), key: key, from: from, base: base)
            case .iceControlled(let theirs) where !controlling:
                if tieBreaker >= theirs { switchRole() } else {
                    return respond(StunMessage.bindingError(to: request, code: 487, reason: "Role Conflict"), key: key, from: from, base: base)
                }
            default: break
            }
        }
        respond(StunMessage.bindingSuccess(to: request, mappedAddress: from), key: key, from: from, base: base)
        let priority = request.priority ?? IceCandidate.priority(kind: .prflx)
        if remote == nil {
            // One entry per source (a peer repeats its checks until the answer), and a bound on sources.
            if let index = earlyRequests.firstIndex(where: { $0.from == from && $0.base == base }) {
                earlyRequests[index].priority = priority
                earlyRequests[index].useCandidate = earlyRequests[index].useCandidate || request.useCandidate
            } else if earlyRequests.count < IceAgent.maximumEarlyRequests {
                earlyRequests.append((from, base, priority, request.useCandidate))
            }
            return
        }
        learnRemote(from: from, base: base, priority: priority, useCandidate: request.useCandidate, now: now)
    }

    /// A check with the credentials we had before an ICE restart, while that generation's pair is still
    /// the selected one: media and consent stay on it until the new generation nominates a pair
    /// (RFC 8445 §9), so it is answered, and on the selected pair it is the peer's consent (RFC 7675 §4:
    /// all an ICE-lite side has). It never pairs or nominates anything: the old check list is gone.
    private func answerPreviousGeneration(_ request: StunMessage, previous: (local: IceCredentials, remote: IceCredentials), theirs: String,
                                          from: TransportAddress, base: TransportAddress, now: UInt64) {
        let key = StunMessage.shortTermKey(password: previous.local.pwd)
        guard (try? request.validateIntegrity(key: key)) != nil else {
            return respond(StunMessage.bindingError(to: request, code: 401, reason: "Unauthorized"), key: nil, from: from, base: base)
        }
        guard theirs == previous.remote.ufrag, request.unknownComprehensionRequired.isEmpty else { return }
        respond(StunMessage.bindingSuccess(to: request, mappedAddress: from), key: key, from: from, base: base)
        if lite, let selected, selected.localBase == base, selected.remoteAddress == from {
            lastConsentAt = now
            if phase == .disconnected { phase = .connected }
        }
    }

    /// The source of a check: a known remote candidate, or a new peer-reflexive one (§7.3.1.3),
    /// then the triggered check on its pair (§7.3.1.4) and USE-CANDIDATE for a controlled agent (§7.3.1.5).
    private func learnRemote(from: TransportAddress, base: TransportAddress, priority: UInt32, useCandidate: Bool, now: UInt64) {
        let localCandidate: IceCandidate
        if let baseIndex = bases.firstIndex(of: base), !relayOnly {
            localCandidate = hostCandidates[baseIndex]
        } else if let relay = relays.first(where: { $0.client.relayedAddress == base }), let candidate = relay.candidate {
            localCandidate = candidate
        } else {
            return
        }
        var remoteCandidate = remoteCandidates.first { $0.transportAddress == from }
        if remoteCandidate == nil {
            let candidate = IceCandidate(foundation: "prflx\(remoteCandidates.count)", priority: priority, address: "\(from.ip)",
                                         port: from.port, kind: .prflx)
            remoteCandidates.append(candidate)
            remoteCandidate = candidate
        }
        guard let key = checkList.add(local: localCandidate, localBase: base, remote: remoteCandidate!),
              let pair = checkList[key] else { return }
        if lite {
            // No checks of our own: the peer's check proves the path, its nomination selects it,
            // and its later checks on the selected pair are consent (RFC 7675 §4).
            // After a restart the new generation's nomination selects again, even the same addresses.
            if useCandidate, selected?.key != key || needsNomination {
                checkList.setState(key, .succeeded)
                select(key, now: now)
            } else if selected?.key == key {
                lastConsentAt = now
                if phase == .disconnected { phase = .connected }
            }
            return
        }
        if useCandidate && !controlling {
            if pair.state == .succeeded { select(key, now: now) } else { checkList.update(key) { $0.nominateOnSuccess = true } }
        }
        switch pair.state {
        case .succeeded, .inProgress: break
        case .frozen, .waiting, .failed:
            checkList.setState(key, .waiting)
            if !triggered.contains(key) { triggered.append(key) }
        }
    }

    private func handleResponse(_ response: StunMessage, from: TransportAddress, base: TransportAddress, now: UInt64) {
        guard let transaction = transactions[response.transactionID] else { return }
        if case .serverReflexive(let serverBase, let server) = transaction.kind {
            guard from == server, let mapped = response.xorMappedAddress, response.messageClass == .successResponse else { return }
            transactions[response.transactionID] = nil
            guard let index = bases.firstIndex(of: serverBase),
                  !localCandidates.contains(where: { $0.kind == .srflx && $0.transportAddress == mapped }) else { return }
            let candidate = IceCandidate(foundation: "s\(index + 1)", priority: IceCandidate.priority(kind: .srflx, localPreference: UInt16(65535 - min(index, 1000) * 10)),
                                         address: "\(mapped.ip)", port: mapped.port, kind: .srflx,
                                         relatedAddress: "\(serverBase.ip)", relatedPort: serverBase.port)
            localCandidates.append(candidate)
            events.append(.localCandidate(candidate))
            return
        }
        // §7.2.5.1: the response must come from where the request went, and authenticate.
        guard let password = transaction.password,
              (try? response.validateIntegrity(key: StunMessage.shortTermKey(password: password))) != nil,
              (try? response.validateFingerprint()) != nil else { return }
        transactions[response.transactionID] = nil
        switch transaction.kind {
        case .consent(let key):
            if response.messageClass == .successResponse, from == key.remote, base == key.localBase {
                lastConsentAt = now
                consentResponses += 1
                if phase == .disconnected { phase = .connected }
            }
        case .check(let key, let useCandidate):
            guard from == key.remote, base == key.localBase else {
                checkList.setState(key, .failed)
                return
            }
            if response.messageClass == .errorResponse {
                if response.errorCode?.code == 487 {
                    // §7.2.5.1: switch roles and check again.
                    switchRole()
                    checkList.setState(key, .waiting)
                    triggered.append(key)
                } else {
                    checkList.setState(key, .failed)
                }
                if useCandidate, nominating == key { nominating = nil }
                return
            }
            checkList.setState(key, .succeeded)
            lastConsentAt = now
            if firstSuccessAt == nil { firstSuccessAt = now }
            let nominateNow = useCandidate && controlling
            let peerNominated = !controlling && (checkList[key]?.nominateOnSuccess ?? false)
            if nominateNow || peerNominated { select(key, now: now) }
        case .serverReflexive:
            break
        }
    }

    // MARK: - Sending

    private func sendCheck(_ pair: IceCandidatePair, useCandidate: Bool, now: UInt64) {
        guard let remote else { return }
        // §7.1.1: PRIORITY is what a peer-reflexive candidate learned from this check would get.
        let priority = IceCandidate.priority(kind: .prflx, localPreference: UInt16(truncatingIfNeeded: pair.local.priority >> 8))
        let request = StunMessage.bindingRequest(username: "\(remote.ufrag):\(local.ufrag)", priority: priority,
                                                 controlling: controlling, tieBreaker: tieBreaker, useCandidate: useCandidate)
        let bytes = request.encoded(integrityKey: StunMessage.shortTermKey(password: remote.pwd), fingerprint: true)
        transactions[request.transactionID] = Transaction(kind: .check(pair.key, useCandidate: useCandidate), bytes: bytes,
                                                          localBase: pair.localBase, to: pair.remoteAddress,
                                                          rto: configuration.initialRto.inNanoseconds, nextRetransmit: now + configuration.initialRto.inNanoseconds,
                                                          password: remote.pwd)
        if pair.state != .succeeded { checkList.setState(pair.key, .inProgress) }
        checksSent += 1
        transmits.append(IceTransmit(localBase: pair.localBase, to: pair.remoteAddress, bytes: bytes))
    }

    private func nominate(_ pair: IceCandidatePair, now: UInt64) {
        nominating = pair.key
        sendCheck(pair, useCandidate: true, now: now)
    }

    private func sendConsent(_ pair: IceCandidatePair, now: UInt64) {
        guard let credentials = consentCredentials else { return }
        let request = StunMessage.bindingRequest(username: "\(credentials.remote.ufrag):\(credentials.local.ufrag)",
                                                 priority: IceCandidate.priority(kind: .prflx), controlling: controlling,
                                                 tieBreaker: tieBreaker)
        let bytes = request.encoded(integrityKey: StunMessage.shortTermKey(password: credentials.remote.pwd), fingerprint: true)
        transactions[request.transactionID] = Transaction(kind: .consent(pair.key), bytes: bytes, localBase: pair.localBase,
                                                          to: pair.remoteAddress, rto: 500_000_000, nextRetransmit: now + 500_000_000,
                                                          password: credentials.remote.pwd)
        transmits.append(IceTransmit(localBase: pair.localBase, to: pair.remoteAddress, bytes: bytes))
    }

    private func select(_ key: IcePairKey, now: UInt64) {
        checkList.update(key) { $0.nominated = true }
        guard let pair = checkList[key], let remote else { return }
        nominating = nil
        // A new pair, a recovered phase, or the end of a nomination round (a restart) is news.
        let changed = selected?.key != key || phase != .connected || needsNomination
        needsNomination = false
        selected = pair
        phase = .connected
        consentCredentials = (local, remote)
        // Consent starts now; the first check follows one interval later.
        lastConsentAt = now
        nextConsentAt = lite ? nil : now + randomizedConsentInterval()
        if changed { events.append(.selected(pair)) }
    }

    private func randomizedConsentInterval() -> UInt64 {
        let base = Double(configuration.consentInterval.inNanoseconds)
        return UInt64(base * Double.random(in: 0.8...1.2, using: &generator))
    }

    private func switchRole() {
        controlling.toggle()
        checkList.setControlling(controlling)
    }

    private func respond(_ message: StunMessage, key: [UInt8]?, from: TransportAddress, base: TransportAddress) {
        transmits.append(IceTransmit(localBase: base, to: from, bytes: message.encoded(integrityKey: key, fingerprint: true)))
    }
}
