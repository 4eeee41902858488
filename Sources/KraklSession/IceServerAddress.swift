import KraklRTC
import KraklRoom

extension IceServer {
    /// `stun:IP[:port]` as a transport address (default port 3478, RFC 7064); nil for TURN or a host name.
    public var stunAddress: TransportAddress? {
        guard let parts, parts.scheme == "stun", let ip = IPAddress(parts.host) else { return nil }
        return TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478))
    }

    /// `turn:IP[:port][?transport=udp|tcp]` with its username and credential as a TURN server
    /// (default port 3478, RFC 7065); nil for `turns:`, a host name, or missing credentials.
    public var turnServer: TurnServer? {
        guard unusableReason == nil, let parts, parts.scheme == "turn", let ip = IPAddress(parts.host),
              let username, let credential else { return nil }
        return TurnServer(address: TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478)), username: username, password: credential,
                          transport: parts.transport == "tcp" ? .tcp : .udp)
    }

    /// Why this agent cannot use the server whatever its name resolves to; nil when it can.
    public var unusableReason: String? {
        guard let parts else { return "not a stun:/turn:/turns: URL (RFC 7064/7065)" }
        switch parts.scheme {
        case "stun":
            return nil
        case "turn":
            guard username != nil, credential != nil else { return "a TURN server needs a user name and credential" }
            return nil
        default:
            return "turns: (TURN over TLS) is not supported yet (issue 16)"
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
    public static func resolve(_ servers: [IceServer], timeout: Double = 2) -> ResolvedIceServers {
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
            let port = UInt16(parts.port ?? 3478)
            for ip in addresses {
                let address = TransportAddress(ip: ip, port: port)
                if parts.scheme == "stun" {
                    if !resolved.stunServers.contains(address) { resolved.stunServers.append(address) }
                } else if let username = server.username, let credential = server.credential {
                    let turn = TurnServer(address: address, username: username, password: credential,
                                          transport: parts.transport == "tcp" ? .tcp : .udp)
                    if !resolved.turnServers.contains(turn) { resolved.turnServers.append(turn) }
                }
            }
        }
        return resolved
    }
}
