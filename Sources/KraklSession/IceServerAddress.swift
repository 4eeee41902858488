import KraklRTC
import KraklRoom

extension IceServer {
    /// `stun:IP[:port]` as a transport address (default port 3478); nil for TURN or a host name.
    public var stunAddress: TransportAddress? {
        guard url.lowercased().hasPrefix("stun:") else { return nil }
        var rest = url.dropFirst(5)
        var port: UInt16 = 3478
        var host = rest
        if rest.hasPrefix("["), let close = rest.firstIndex(of: "]") {
            host = rest[rest.index(after: rest.startIndex)..<close]
            rest = rest[rest.index(after: close)...]
            if rest.hasPrefix(":") { guard let p = UInt16(rest.dropFirst()) else { return nil }; port = p }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            guard let p = UInt16(rest[rest.index(after: colon)...]) else { return nil }
            port = p
        }
        guard let ip = IPAddress(String(host)) else { return nil }
        return TransportAddress(ip: ip, port: port)
    }
}
