import Glibc

/// An IP address literal's network-order bytes: 4 for dotted IPv4, 16 for RFC 4291 IPv6
/// (`inet_pton`); nil for anything else (host names, mDNS names). The one parser behind the
/// ICE addresses, the viewer's listen address and NO_PROXY's networks.
public enum IPLiteral {
    public static func bytes(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }
}
