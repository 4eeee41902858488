import KraklBase
import Glibc

/// A TURN server and the long-term credentials for it (RFC 8656 §9.2). Time-limited REST
/// credentials (coturn's `use-auth-secret`: "expiry:user" and an HMAC password) are given as is.
public struct TurnServer: Equatable, Sendable, CustomStringConvertible {
    public var address: TransportAddress
    public var username: String
    public var password: String
    /// How we reach the server; what it relays to peers is UDP either way (RFC 8656 §3.1).
    public var transport: TurnTransport
    /// TLS only: the name (or IP address) of the `turns:` URL, which the server's certificate must
    /// be for (SNI and host name check); the address alone when nil.
    public var tlsName: String?

    public init(address: TransportAddress, username: String, password: String, transport: TurnTransport = .udp, tlsName: String? = nil) {
        self.address = address
        self.username = username
        self.password = password
        self.transport = transport
        self.tlsName = transport == .tls ? (tlsName ?? "\(address.ip)") : nil
    }

    /// The server and user, never the password.
    public var description: String {
        switch transport {
        case .udp: return "turn:\(address) (user \"\(username)\")"
        case .tcp: return "turn:\(address)?transport=tcp (user \"\(username)\")"
        case .tls: return "turns:\(tlsName ?? "") at \(address) (user \"\(username)\")"
        }
    }
}

extension TurnServer {
    /// The expiry time (Unix seconds) a TURN REST API user name carries ("EXPIRY:USER", coturn's
    /// default, or "USER:EXPIRY"), if it has one.
    static func restExpiry(_ username: String) -> Int? {
        let fields = username.split(separator: ":", omittingEmptySubsequences: false)
        guard fields.count >= 2 else { return nil }
        // 10 digits: a Unix time of this era, not a user name that is a small number.
        for field in [fields.first!, fields.last!] where field.count == 10 && field.utf8.allSatisfy({ (0x30...0x39).contains($0) }) {
            if let value = Int(field) { return value }
        }
        return nil
    }
}

/// UDP datagrams, or a TCP connection (plain, or TLS for `turns:`) carrying STUN and padded
/// ChannelData (`TurnStreamFramer`).
public enum TurnTransport: String, Sendable {
    case udp, tcp, tls

    /// A byte stream (TCP or TLS): no retransmission, ChannelData padded to 4 bytes.
    public var isStream: Bool { self != .udp }
}

/// Why a TURN allocation (or a permission on it) failed; each says what to check.
public enum TurnError: Error, Equatable, Sendable, CustomStringConvertible {
    /// 401 to a request that carried our credentials.
    case unauthorized(server: String)
    /// 401 to a time-limited (TURN REST API) credential whose expiry time has passed.
    case credentialExpired(server: String, secondsAgo: Int)
    /// 401 without the REALM and NONCE a long-term credential exchange needs.
    case noChallenge(server: String)
    /// 486 Allocation Quota Reached.
    case quotaReached(server: String)
    /// 437 Allocation Mismatch: the server has another allocation on this 5-tuple, or lost ours.
    case allocationMismatch(server: String)
    /// 438 answered every nonce we were given.
    case staleNonceLoop(server: String)
    /// Any other error response.
    case rejected(server: String, code: Int, reason: String)
    /// No response after all retransmissions (UDP), or within the same time on a connection (TCP, TLS).
    case timeout(server: String, request: String, seconds: Double, transport: TurnTransport)
    /// A success response without XOR-RELAYED-ADDRESS.
    case noRelayedAddress(server: String)
    /// The TCP or TLS connection to the server failed or closed (TURN over TCP or TLS), or its UDP
    /// port is unreachable (ICMP, TURN over UDP); `over` is "UDP", "TCP" or "TLS".
    case connectionFailed(server: String, over: String, reason: String)
    /// `turns:`: the server's certificate is not trusted, or not for the server's name.
    case untrustedCertificate(server: String, reason: String)

    /// When the server would not have us at all, which no retry mends: our credentials or its certificate.
    public var refusal: RelayRefusal? {
        switch self {
        case .unauthorized, .credentialExpired: return .credentials
        case .untrustedCertificate: return .certificate
        default: return nil
        }
    }

    public var description: String {
        switch self {
        case .unauthorized(let s): return "TURN server \(s) refused the credentials (401 after authenticating): check the username and password, or renew an expired time-limited credential"
        case .credentialExpired(let s, let ago):
            return "TURN server \(s) refused the time-limited credential: it expired \(ago) s ago (its user name says so); get a fresh one from the room service"
        case .noChallenge(let s): return "TURN server \(s) answered 401 without REALM and NONCE; it does not offer long-term credentials"
        case .quotaReached(let s): return "TURN server \(s) refused the allocation: quota reached (486); too many allocations for this user"
        case .allocationMismatch(let s): return "TURN server \(s) reports an allocation mismatch (437): the allocation is gone or another one holds this address"
        case .staleNonceLoop(let s): return "TURN server \(s) kept answering 438 Stale Nonce; giving up"
        case .rejected(let s, let code, let reason): return "TURN server \(s) answered \(code) \(reason)"
        case .timeout(let s, let request, let seconds, let transport):
            let why: String
            switch transport {
            case .udp: why = "unreachable, or UDP to it is blocked"
            case .tcp: why = "over TCP: connecting or the server stalled"
            case .tls: why = "over TLS: connecting, the TLS handshake or the server stalled"
            }
            return "TURN server \(s) did not answer \(request) within \(String(cFormat: "%.1f", seconds)) s (\(why))"
        case .noRelayedAddress(let s): return "TURN server \(s) accepted the allocation but gave no XOR-RELAYED-ADDRESS"
        case .connectionFailed(let s, let over, let reason): return "TURN server \(s) over \(over): \(reason)"
        case .untrustedCertificate(let s, let reason): return "TURN server \(s) over TLS: \(reason)"
        }
    }
}

/// Why a TURN server would not carry us, when no retry mends it: the person has to act (new
/// credentials, a CA file), so a session that ends for it says so with a status of its own.
public enum RelayRefusal: String, Equatable, Sendable {
    /// 401 to our credentials, or a time-limited credential that expired.
    case credentials
    /// `turns:`: the server's certificate is not trusted or not for its name.
    case certificate
}

/// Timing and bounds of a TURN client.
public struct TurnConfiguration: Sendable {
    /// First retransmission timeout of a request; doubles up to `maximumRto` (RFC 8489 §6.2.1).
    public var initialRto: Duration = .milliseconds(250)
    public var maximumRto: Duration = .seconds(2)
    /// Transmissions of one request before it times out (0.25+0.5+1+2+2+2 s ≈ 8 s with the defaults).
    public var maximumTransmissions = 6
    /// The allocation lifetime to ask for (RFC 8656 §7.2: the server may shorten it); sent in whole seconds.
    public var requestedLifetime: Duration = .seconds(600)
    /// Permissions last 300 s and channel bindings 600 s (RFC 8656 §9, §12); renewed this long before.
    public var renewalMargin: Duration = .seconds(60)
    /// 438 retries allowed in a row for one request.
    public var maximumStaleNonceRetries = 3
    /// Peers one allocation talks to (ICE pairs per remote address); further ones are refused.
    public var maximumPeers = 64
    /// Datagrams held per peer while its permission is being installed; older ones go first.
    public var maximumQueuedPerPeer = 16

    public init() {}
}

/// What a TURN client reports.
public enum TurnEvent: Equatable, Sendable {
    /// The allocation exists: `relayed` is our address on the server, `mapped` the server-reflexive one.
    case allocated(relayed: TransportAddress, mapped: TransportAddress?)
    /// The allocation failed or was lost; nothing more is relayed.
    case failed(TurnError)
    /// A permission for a peer could not be installed; datagrams to it are dropped.
    case permissionFailed(peer: IPAddress, TurnError)
    /// A channel is bound: data to `peer` now uses ChannelData.
    case channelBound(peer: TransportAddress, channel: UInt16)
    /// The deallocation (Refresh, lifetime 0) was answered or gave up.
    case closed
}

/// TURN methods (RFC 8656 §17).
enum TurnMethod {
    static let allocate: UInt16 = 0x003
    static let refresh: UInt16 = 0x004
    static let send: UInt16 = 0x006
    static let data: UInt16 = 0x007
    static let createPermission: UInt16 = 0x008
    static let channelBind: UInt16 = 0x009
}

/// A TURN client (RFC 8656) for one allocation, over UDP: Allocate with long-term credentials
/// (401 → realm and nonce → retry; 438 → the new nonce), permissions and channel bindings for the
/// peers it is asked to reach, Send indications until a channel is bound and ChannelData after,
/// Refresh before every expiry, and Refresh with lifetime 0 on close.
///
/// Like `IceAgent` it owns no socket and no clock: the owner passes the time, feeds it the
/// datagrams that came from the server (`receive`), sends what `drain()` returns to the server,
/// and calls `tick` when `nextDeadline` passes. One thread at a time.
public final class TurnClient {
    public enum State: Equatable, Sendable { case idle, allocating, allocated, deallocating, closed, failed(TurnError) }

    public let server: TurnServer
    public let configuration: TurnConfiguration
    public private(set) var state: State = .idle
    public private(set) var relayedAddress: TransportAddress?
    public private(set) var mappedAddress: TransportAddress?
    /// Seconds the server granted in its last Allocate or Refresh answer.
    public private(set) var lifetime: UInt32 = 0
    /// Counters for stats and tests.
    public private(set) var requestsSent = 0
    public private(set) var datagramsRelayed = 0

    private var realm: [UInt8]?
    private var nonce: [UInt8]?
    private var key: [UInt8]?
    private var refreshAt: UInt64?

    private enum Kind: Equatable {
        case allocate, refresh(lifetime: UInt32), createPermission(IPAddress), channelBind(TransportAddress, UInt16)
        var name: String {
            switch self {
            case .allocate: return "Allocate"
            case .refresh(let l): return l == 0 ? "Refresh (deallocate)" : "Refresh"
            case .createPermission: return "CreatePermission"
            case .channelBind: return "ChannelBind"
            }
        }
    }

    private struct Transaction {
        var kind: Kind
        var bytes: [UInt8]
        var authenticated: Bool
        var staleRetries: Int
        var transmissions = 1
        var rto: UInt64
        var nextRetransmit: UInt64
        var firstSent: UInt64
    }

    private struct Permission {
        var installed = false
        var pending = false
        var refreshAt: UInt64 = 0
        var queue: [(peer: TransportAddress, data: [UInt8])] = []
    }

    private struct Channel {
        var number: UInt16
        var bound = false
        var pending = false
        var refreshAt: UInt64 = 0
    }

    private var transactions: [[UInt8]: Transaction] = [:]
    private var permissions: [IPAddress: Permission] = [:]
    private var channels: [TransportAddress: Channel] = [:]
    private var peersByChannel: [UInt16: TransportAddress] = [:]
    private var nextChannel: UInt16 = ChannelData.channelRange.lowerBound
    private var outgoing: [[UInt8]] = []
    private var events: [TurnEvent] = []

    public init(server: TurnServer, configuration: TurnConfiguration = TurnConfiguration()) {
        self.server = server
        self.configuration = configuration
    }

    /// The address, and for TLS the name the certificate is checked against.
    private var serverName: String {
        guard server.transport == .tls, let name = server.tlsName, IPAddress(name) == nil else { return "\(server.address)" }
        return "\(name) (\(server.address))"
    }

    /// Sends the first Allocate (unauthenticated: the server's 401 brings realm and nonce).
    public func start(now: UInt64) {
        guard state == .idle else { return }
        state = .allocating
        request(.allocate, now: now)
    }

    /// Everything to send to the server and to report since the last call.
    public func drain() -> (datagrams: [[UInt8]], events: [TurnEvent]) {
        defer { outgoing.removeAll(keepingCapacity: true); events.removeAll(keepingCapacity: true) }
        return (outgoing, events)
    }

    public var isAllocated: Bool { state == .allocated }

    /// When `tick` must run next, or nil.
    public var nextDeadline: UInt64? {
        var deadline: UInt64?
        func consider(_ t: UInt64?) { if let t { deadline = min(deadline ?? t, t) } }
        for transaction in transactions.values { consider(transaction.nextRetransmit) }
        guard state == .allocated else { return deadline }
        consider(refreshAt)
        for permission in permissions.values where permission.installed && !permission.pending { consider(permission.refreshAt) }
        for channel in channels.values where channel.bound && !channel.pending { consider(channel.refreshAt) }
        return deadline
    }

    /// Retransmissions and timeouts, then the refreshes that are due.
    public func tick(now: UInt64) {
        for (id, transaction) in transactions where transaction.nextRetransmit <= now {
            if transaction.transmissions >= configuration.maximumTransmissions {
                transactions[id] = nil
                let seconds = Double(now - transaction.firstSent) / 1e9
                fail(transaction.kind, .timeout(server: serverName, request: transaction.kind.name, seconds: seconds,
                                                 transport: server.transport))
                continue
            }
            var next = transaction
            next.transmissions += 1
            next.rto = min(next.rto * 2, configuration.maximumRto.inNanoseconds)
            next.nextRetransmit = now + next.rto
            transactions[id] = next
            // A stream delivers or breaks: no retransmission (RFC 8489 §6.2.2), same time limit.
            if !server.transport.isStream { outgoing.append(next.bytes) }
        }
        guard state == .allocated else { return }
        if let due = refreshAt, due <= now {
            refreshAt = nil
            request(.refresh(lifetime: requestedLifetimeSeconds), now: now)
        }
        for (ip, permission) in permissions where permission.installed && !permission.pending && permission.refreshAt <= now {
            permissions[ip]?.pending = true
            request(.createPermission(ip), now: now)
        }
        for (peer, channel) in channels where channel.bound && !channel.pending && channel.refreshAt <= now {
            channels[peer]?.pending = true
            request(.channelBind(peer, channel.number), now: now)
        }
    }

    /// Deallocates (Refresh with lifetime 0). Nothing is relayed afterwards.
    public func close(now: UInt64) {
        switch state {
        case .allocated:
            transactions.removeAll()
            state = .deallocating
            request(.refresh(lifetime: 0), now: now)
        case .idle, .allocating:
            transactions.removeAll()
            state = .closed
        case .deallocating, .closed, .failed:
            break
        }
        permissions.removeAll()
        channels.removeAll()
        peersByChannel.removeAll()
    }

    // MARK: - Peers

    /// Asks for a permission (and then a channel) for `peer`, unless it has one or one is on its way.
    /// False when the peer limit is reached or there is no allocation.
    @discardableResult
    public func permit(_ peer: TransportAddress, now: UInt64) -> Bool {
        guard state == .allocated || state == .allocating else { return false }
        if permissions[peer.ip] == nil {
            guard permissions.count < configuration.maximumPeers else { return false }
            permissions[peer.ip] = Permission()
        }
        if state == .allocated, !(permissions[peer.ip]!.installed || permissions[peer.ip]!.pending) {
            permissions[peer.ip]!.pending = true
            request(.createPermission(peer.ip), now: now)
        }
        if channels[peer] == nil, nextChannel <= ChannelData.channelRange.upperBound, channels.count < configuration.maximumPeers {
            channels[peer] = Channel(number: nextChannel)
            peersByChannel[nextChannel] = peer
            nextChannel += 1
        }
        if permissions[peer.ip]!.installed { bindChannel(peer, now: now) }
        return true
    }

    /// The datagram that carries `data` to `peer` through the server: ChannelData once a channel is
    /// bound, else a Send indication. nil when the permission is still being installed (the data is
    /// queued and goes out with a later `drain()`) or the allocation is not usable.
    public func wrap(_ data: [UInt8], to peer: TransportAddress, now: UInt64) -> [UInt8]? {
        guard state == .allocated, data.count <= 0xFFFF else { return nil }
        if let channel = channels[peer], channel.bound { return ChannelData(channel: channel.number, data: data).encoded(padded: server.transport.isStream) }
        if let permission = permissions[peer.ip], permission.installed { return sendIndication(data, to: peer) }
        guard permit(peer, now: now) || permissions[peer.ip] != nil else { return nil }
        if permissions[peer.ip] != nil {
            permissions[peer.ip]!.queue.append((peer, data))
            if permissions[peer.ip]!.queue.count > configuration.maximumQueuedPerPeer { permissions[peer.ip]!.queue.removeFirst() }
        }
        return nil
    }

    private func sendIndication(_ data: [UInt8], to peer: TransportAddress) -> [UInt8] {
        StunMessage(method: TurnMethod.send, class: .indication, transactionID: StunMessage.randomTransactionID(),
                    attributes: [.xorPeerAddress(peer), .data(data)]).encoded()
    }

    private func bindChannel(_ peer: TransportAddress, now: UInt64) {
        guard let channel = channels[peer], !channel.bound, !channel.pending else { return }
        channels[peer]!.pending = true
        request(.channelBind(peer, channel.number), now: now)
    }

    // MARK: - Receiving

    /// Handles a datagram from the server. Returns the peer's datagram it carried (a Data
    /// indication or ChannelData); nil for responses and anything malformed, which is dropped.
    public func receive(_ datagram: [UInt8], now: UInt64) -> (peer: TransportAddress, data: [UInt8])? {
        if ChannelData.looksLikeChannelData(datagram) {
            guard state == .allocated, let message = ChannelData(parsing: datagram),
                  let peer = peersByChannel[message.channel], channels[peer]?.bound == true else { return nil }
            datagramsRelayed += 1
            return (peer, message.data)
        }
        guard StunMessage.looksLikeStun(datagram), let message = try? StunMessage(parsing: datagram) else { return nil }
        switch message.messageClass {
        case .indication:
            guard state == .allocated, message.method == TurnMethod.data,
                  case .xorPeerAddress(let peer)? = message.attribute(StunAttribute.Code.xorPeerAddress),
                  case .data(let data)? = message.attribute(StunAttribute.Code.data) else { return nil }
            datagramsRelayed += 1
            return (peer, data)
        case .successResponse, .errorResponse:
            handleResponse(message, now: now)
            return nil
        case .request:
            return nil
        }
    }

    private func handleResponse(_ response: StunMessage, now: UInt64) {
        guard let transaction = transactions[response.transactionID], response.method == method(of: transaction.kind) else { return }
        if response.messageClass == .successResponse {
            // A success to an authenticated request must carry our key's MESSAGE-INTEGRITY: anyone can forge the rest.
            if transaction.authenticated, let key, (try? response.validateIntegrity(key: key)) == nil { return }
            transactions[response.transactionID] = nil
            succeeded(transaction.kind, response, now: now)
            return
        }
        transactions[response.transactionID] = nil
        let code = response.errorCode?.code ?? 0
        let newRealm = response.attribute(StunAttribute.Code.realm).flatMap(Self.rawValue)
        let newNonce = response.attribute(StunAttribute.Code.nonce).flatMap(Self.rawValue)
        switch code {
        case 401 where !transaction.authenticated:
            guard let newRealm, let newNonce else { return fail(transaction.kind, .noChallenge(server: serverName)) }
            setChallenge(realm: newRealm, nonce: newNonce)
            request(transaction.kind, now: now, staleRetries: transaction.staleRetries)
        case 401:
            if let expiry = TurnServer.restExpiry(server.username), expiry < Int(time(nil)) {
                return fail(transaction.kind, .credentialExpired(server: serverName, secondsAgo: Int(time(nil)) - expiry))
            }
            fail(transaction.kind, .unauthorized(server: serverName))
        case 438:
            guard let newNonce, transaction.staleRetries < configuration.maximumStaleNonceRetries else {
                return fail(transaction.kind, .staleNonceLoop(server: serverName))
            }
            setChallenge(realm: newRealm ?? realm ?? [], nonce: newNonce)
            request(transaction.kind, now: now, staleRetries: transaction.staleRetries + 1)
        case 486:
            fail(transaction.kind, .quotaReached(server: serverName))
        case 437:
            fail(transaction.kind, .allocationMismatch(server: serverName))
        default:
            fail(transaction.kind, .rejected(server: serverName, code: code, reason: response.errorCode?.reason ?? "(no ERROR-CODE)"))
        }
    }

    private func setChallenge(realm newRealm: [UInt8], nonce newNonce: [UInt8]) {
        if realm != newRealm || key == nil {
            realm = newRealm
            key = StunMessage.longTermKey(username: server.username, realm: String(decoding: newRealm, as: UTF8.self),
                                          password: server.password)
        }
        nonce = newNonce
    }

    private static func rawValue(_ attribute: StunAttribute) -> [UInt8]? {
        if case .other(_, let value) = attribute, value.count <= 763 { return value }  // RFC 8489 §14.9-10 bounds
        return nil
    }

    private func succeeded(_ kind: Kind, _ response: StunMessage, now: UInt64) {
        switch kind {
        case .allocate:
            guard state == .allocating else { return }
            guard case .xorRelayedAddress(let relayed)? = response.attribute(StunAttribute.Code.xorRelayedAddress) else {
                return fail(kind, .noRelayedAddress(server: serverName))
            }
            relayedAddress = relayed
            mappedAddress = response.xorMappedAddress
            state = .allocated
            scheduleRefresh(response, now: now)
            events.append(.allocated(relayed: relayed, mapped: mappedAddress))
            // Peers asked for while allocating.
            for ip in permissions.keys where !permissions[ip]!.pending {
                permissions[ip]!.pending = true
                request(.createPermission(ip), now: now)
            }
        case .refresh(let asked):
            if asked == 0 || state == .deallocating {
                state = .closed
                events.append(.closed)
            } else {
                scheduleRefresh(response, now: now)
            }
        case .createPermission(let ip):
            guard permissions[ip] != nil else { return }
            permissions[ip]!.installed = true
            permissions[ip]!.pending = false
            permissions[ip]!.refreshAt = now + Self.seconds(300) - min(configuration.renewalMargin.inNanoseconds, Self.seconds(150))
            let queued = permissions[ip]!.queue
            permissions[ip]!.queue.removeAll()
            for (peer, data) in queued { outgoing.append(sendIndication(data, to: peer)) }
            for peer in channels.keys where peer.ip == ip { bindChannel(peer, now: now) }
        case .channelBind(let peer, let number):
            guard channels[peer]?.number == number else { return }
            let wasBound = channels[peer]!.bound
            channels[peer]!.bound = true
            channels[peer]!.pending = false
            channels[peer]!.refreshAt = now + Self.seconds(600) - min(configuration.renewalMargin.inNanoseconds, Self.seconds(300))
            if !wasBound { events.append(.channelBound(peer: peer, channel: number)) }
        }
    }

    /// Refreshes a minute before the granted lifetime ends, or halfway through a short one.
    private func scheduleRefresh(_ response: StunMessage, now: UInt64) {
        if case .lifetime(let seconds)? = response.attribute(StunAttribute.Code.lifetime) { lifetime = seconds } else if lifetime == 0 {
            lifetime = requestedLifetimeSeconds
        }
        let total = Self.seconds(UInt64(lifetime))
        refreshAt = now + (total > 2 * configuration.renewalMargin.inNanoseconds ? total - configuration.renewalMargin.inNanoseconds : total / 2)
    }

    private static func seconds(_ s: UInt64) -> UInt64 { s * 1_000_000_000 }

    /// `requestedLifetime` as the LIFETIME attribute carries it: whole seconds.
    private var requestedLifetimeSeconds: UInt32 { UInt32(clamping: configuration.requestedLifetime.components.seconds) }

    /// The stream to the server (TURN over TCP or TLS) failed or closed, or (over UDP) the server's
    /// port is unreachable (ICMP): the allocation is lost with it.
    public func connectionFailed(_ reason: String, untrustedCertificate: Bool = false) {
        switch state {
        // Idle too: a connection can break before gathering starts the allocation, which then never could.
        case .idle, .allocating, .allocated:
            let error = untrustedCertificate
                ? TurnError.untrustedCertificate(server: serverName, reason: reason)
                : TurnError.connectionFailed(server: serverName, over: server.transport.rawValue.uppercased(), reason: reason)
            state = .failed(error)
            transactions.removeAll()
            events.append(.failed(error))
        case .deallocating:
            state = .closed
            transactions.removeAll()
            events.append(.closed)
        default:
            break
        }
    }

    private func fail(_ kind: Kind, _ error: TurnError) {
        switch kind {
        case .allocate:
            guard state == .allocating else { return }
            state = .failed(error)
            events.append(.failed(error))
        case .refresh(let asked):
            if asked == 0 || state == .deallocating {
                state = .closed
                events.append(.closed)
            } else if state == .allocated {
                // The allocation is gone (437) or cannot be kept: nothing more is relayed.
                state = .failed(error)
                transactions.removeAll()
                events.append(.failed(error))
            }
        case .createPermission, .channelBind:
            // Unanswered through every retransmission while the allocation stands: the server is
            // gone (or cut off), and with it everything relayed; not waiting for consent (30 s).
            if case .timeout = error, state == .allocated {
                state = .failed(error)
                transactions.removeAll()
                events.append(.failed(error))
                return
            }
            failPeer(kind, error)
        }
    }

    private func failPeer(_ kind: Kind, _ error: TurnError) {
        switch kind {
        case .allocate, .refresh:
            break
        case .createPermission(let ip):
            guard let permission = permissions[ip] else { return }
            if permission.installed {
                permissions[ip]!.pending = false  // keeps working until it expires; retried at the next refresh time
                permissions[ip]!.refreshAt = permission.refreshAt + configuration.renewalMargin.inNanoseconds / 4
            } else {
                permissions[ip] = nil
                for (peer, channel) in channels where peer.ip == ip {
                    channels[peer] = nil
                    peersByChannel[channel.number] = nil
                }
                events.append(.permissionFailed(peer: ip, error))
            }
        case .channelBind(let peer, _):
            // Send indications keep working without a channel.
            channels[peer]?.pending = false
            if channels[peer]?.bound == false, let number = channels[peer]?.number {
                channels[peer] = nil
                peersByChannel[number] = nil
            }
        }
    }

    // MARK: - Requests

    private func method(of kind: Kind) -> UInt16 {
        switch kind {
        case .allocate: return TurnMethod.allocate
        case .refresh: return TurnMethod.refresh
        case .createPermission: return TurnMethod.createPermission
        case .channelBind: return TurnMethod.channelBind
        }
    }

    private func request(_ kind: Kind, now: UInt64, staleRetries: Int = 0) {
        var attributes: [StunAttribute]
        switch kind {
        case .allocate:
            attributes = [.requestedTransport(17), .lifetime(requestedLifetimeSeconds)]
        case .refresh(let seconds):
            attributes = [.lifetime(seconds)]
        case .createPermission(let ip):
            attributes = [.xorPeerAddress(TransportAddress(ip: ip, port: 0))]
        case .channelBind(let peer, let number):
            attributes = [.channelNumber(number), .xorPeerAddress(peer)]
        }
        let authenticated = key != nil && nonce != nil
        if authenticated, let realm, let nonce {
            attributes += [.username(server.username), .other(type: StunAttribute.Code.realm, value: realm),
                           .other(type: StunAttribute.Code.nonce, value: nonce)]
        }
        let message = StunMessage(method: method(of: kind), class: .request, transactionID: StunMessage.randomTransactionID(),
                                  attributes: attributes)
        let bytes = message.encoded(integrityKey: authenticated ? key : nil, fingerprint: true)
        transactions[message.transactionID] = Transaction(kind: kind, bytes: bytes, authenticated: authenticated, staleRetries: staleRetries,
                                                          rto: configuration.initialRto.inNanoseconds, nextRetransmit: now + configuration.initialRto.inNanoseconds,
                                                          firstSent: now)
        requestsSent += 1
        outgoing.append(bytes)
    }
}
