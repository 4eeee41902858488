import KraklRTC
import KraklRoom

extension IceServer {
    /// `stun:IP[:port]` as a transport address (default port 3478, RFC 7064); nil for TURN or a host name.
    public var stunAddress: TransportAddress? {
        guard let parts, parts.scheme == "stun", let ip = IPAddress(parts.host) else { return nil }
        return TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478))
    }

    /// `turn:IP[:port][?transport=udp|tcp]` or `turns:IP[:port]` with its username and credential as
    /// a TURN server (default port 3478, 5349 for turns:, RFC 7065); nil for a host name or missing credentials.
    public var turnServer: TurnServer? {
        guard unusableReason == nil, let parts, parts.scheme != "stun", let ip = IPAddress(parts.host),
              let username, let credential else { return nil }
        return TurnServer(address: TransportAddress(ip: ip, port: parts.defaultedPort), username: username, password: credential,
                          transport: parts.turnTransport, tlsName: parts.host)
    }

    /// Why this agent cannot use the server whatever its name resolves to; nil when it can.
    public var unusableReason: String? {
        guard let parts else { return "not a stun:/turn:/turns: URL (RFC 7064/7065)" }
        switch parts.scheme {
        case "stun":
            return nil
        case "turns" where parts.transport == "udp":
            return "turns: over UDP would be DTLS to the TURN server, which this agent does not speak; use turns: (TLS over TCP) or turn:"
        default:
            guard username != nil, credential != nil else { return "a TURN server needs a user name and credential" }
            return nil
        }
    }

    /// The host name to resolve, or nil when the URL already holds an address (or is unusable).
    var hostNameToResolve: String? {
        guard unusableReason == nil, let parts, IPAddress(parts.host) == nil else { return nil }
        return parts.host
    }
}

/// ICE servers as the publisher takes them: names resolved, one entry per address.
public struct ResolvedIceServers: Sendable {
    public var stunServers: [TransportAddress] = []
    public var turnServers: [TurnServer] = []
    /// One sentence per server left out (its URL, never its credential, and why).
    public var problems: [String] = []

    /// Resolves every server's host name (all at once, at most `timeout` in all; A and AAAA), then
    /// makes one STUN address or TURN server per address found: the ICE agent tries all of them
    /// (those of a family without a local address are dropped there).
    public static func resolve(_ servers: [IceServer], timeout: Duration = .seconds(2)) -> ResolvedIceServers {
        let names = HostNameResolver.resolve(servers.compactMap(\.hostNameToResolve), timeout: timeout)
        var resolved = ResolvedIceServers()
        for server in servers {
            if let reason = server.unusableReason {
                resolved.problems.append("ICE server \(server.url): \(reason)")
                continue
            }
            guard let parts = server.parts else { continue }
            let addresses: [IPAddress]
            if let ip = IPAddress(parts.host) {
                addresses = [ip]
            } else {
                switch names[parts.host] {
                case .success(let found): addresses = found
                case .failure(let failure): resolved.problems.append("ICE server \(server.url): \(failure)"); continue
                case nil: continue
                }
            }
            let port = parts.defaultedPort
            for ip in addresses {
                let address = TransportAddress(ip: ip, port: port)
                if parts.scheme == "stun" {
                    if !resolved.stunServers.contains(address) { resolved.stunServers.append(address) }
                } else if let username = server.username, let credential = server.credential {
                    // For turns: the certificate must be for the URL's name, whichever address it led to.
                    let turn = TurnServer(address: address, username: username, password: credential,
                                          transport: parts.turnTransport, tlsName: parts.host)
                    if !resolved.turnServers.contains(turn) { resolved.turnServers.append(turn) }
                }
            }
        }
        return resolved
    }
}

extension IceServerURL.Parts {
    /// The port, or the default: 3478 for stun: and turn:, 5349 for turns: (RFC 7064/7065).
    var defaultedPort: UInt16 { UInt16(port ?? (scheme == "turns" ? 5349 : 3478)) }

    /// How a TURN server of this URL is reached: turns: is TLS over TCP.
    var turnTransport: TurnTransport {
        if scheme == "turns" { return .tls }
        return transport == "tcp" ? .tcp : .udp
    }
}
