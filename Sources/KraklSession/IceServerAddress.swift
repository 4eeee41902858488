import KraklRTC
import KraklRoom

extension IceServer {
    /// `stun:IP[:port]` as a transport address (default port 3478, RFC 7064); nil for TURN or a host name.
    public var stunAddress: TransportAddress? {
        guard let parts, parts.scheme == "stun", let ip = IPAddress(parts.host) else { return nil }
        return TransportAddress(ip: ip, port: UInt16(parts.port ?? 3478))
    }
}
