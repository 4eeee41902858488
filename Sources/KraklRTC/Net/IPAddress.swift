import Glibc
import KraklBase

/// An IPv4 or IPv6 address as raw network-order bytes (4 or 16 of them).
public enum IPAddress: Hashable, Sendable, CustomStringConvertible {
    case v4([UInt8])
    case v6([UInt8])

    /// Parses dotted IPv4 or RFC 4291 IPv6 text (`inet_pton`); nil for anything else (hostnames, mDNS names).
    public init?(_ text: String) {
        guard let bytes = IPLiteral.bytes(text) else { return nil }
        self = bytes.count == 4 ? .v4(bytes) : .v6(bytes)
    }

    public var bytes: [UInt8] {
        switch self { case .v4(let b), .v6(let b): return b }
    }

    public var isIPv6: Bool { if case .v6 = self { return true } else { return false } }

    public var description: String {
        switch self {
        case .v4(let b):
            return b.map { "\($0)" }.joined(separator: ".")
        case .v6(let b):
            var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
            var raw = in6_addr()
            withUnsafeMutableBytes(of: &raw) { $0.copyBytes(from: b.prefix(16)) }
            guard inet_ntop(AF_INET6, &raw, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
            return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
    }
}

/// An address and UDP/TCP port: what STUN reports and ICE candidates carry.
public struct TransportAddress: Hashable, Sendable, CustomStringConvertible {
    public var ip: IPAddress
    public var port: UInt16

    public init(ip: IPAddress, port: UInt16) {
        self.ip = ip
        self.port = port
    }

    public var description: String {
        ip.isIPv6 ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }
}
