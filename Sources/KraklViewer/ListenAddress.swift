import FoundationEssentials
import Glibc
import KraklBase

/// Where the viewer listens: an IP literal and a port (`--listen ADDR[:PORT]`).
/// Names are not resolved: the address is chosen deliberately, and whether
/// it is loopback decides whether a token is needed.
public struct ListenAddress: Equatable, Sendable, CustomStringConvertible {
    public static let defaultPort: UInt16 = 8990

    /// The address as inet_pton reads it ("127.0.0.1", "::1", "0.0.0.0").
    public var host: String
    /// 0: any free port (tests).
    public var port: UInt16
    public var isIPv6: Bool { host.contains(":") }

    public init(host: String, port: UInt16 = ListenAddress.defaultPort) {
        self.host = host
        self.port = port
    }

    /// Reads "ADDR", "ADDR:PORT", "[V6]", "[V6]:PORT" or a bare IPv6 literal; nil if it is none.
    public init?(_ text: String, defaultPort: UInt16 = ListenAddress.defaultPort) {
        var host = text, port = defaultPort
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let value = UInt16(rest.dropFirst()) else { return nil }
                port = value
            }
        } else if text.filter({ $0 == ":" }).count == 1, let colon = text.firstIndex(of: ":") {
            host = String(text[..<colon])
            guard let value = UInt16(text[text.index(after: colon)...]) else { return nil }
            port = value
        }
        if host == "localhost" { host = "127.0.0.1" }
        guard ListenAddress.parse(host) != nil else { return nil }
        self.host = host
        self.port = port
    }

    /// 127.0.0.0/8 and ::1 (and ::ffff:127.x): only this machine can connect.
    public var isLoopback: Bool {
        guard let bytes = ListenAddress.parse(host) else { return false }
        if bytes.count == 4 { return bytes[0] == 127 }
        if bytes[0..<15].allSatisfy({ $0 == 0 }) && bytes[15] == 1 { return true }
        return bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF && bytes[12] == 127
    }

    /// "127.0.0.1:8990", "[::1]:8990".
    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// The address's bytes (4 or 16), or nil when it is not an IP literal.
    static func parse(_ host: String) -> [UInt8]? { IPLiteral.bytes(host) }
}
