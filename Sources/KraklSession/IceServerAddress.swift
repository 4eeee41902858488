import KraklRTC
import KraklRoom

extension IceServer {
    /// `stun:IP[:port]` as a transport address (default port 3478, RFC 7064); nil for TURN or a host name.
    public var stunAddress: TransportAddress? {
        guard let parts, parts.scheme == "stun", let ip = IPAddress(parts.host) else { return nil }
        return TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478))
    }

    /// `turn:IP[:port][?transport=udp]` with its username and credential as a TURN server over UDP
    /// (default port 3478, RFC 7065); nil for `turns:`, TCP, a host name, or missing credentials.
    public var turnServer: TurnServer? {
        guard let parts, parts.scheme == "turn", parts.transport == nil || parts.transport == "udp",
              let ip = IPAddress(parts.host), let username, let credential else { return nil }
        return TurnServer(address: TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478)), username: username, password: credential)
    }
}
