import FoundationEssentials
import Glibc
import KraklBase

/// An HTTP proxy that signalling goes through (`http://[user:password@]host[:port]`). Only plain
/// HTTP proxies: no `https://` proxy (TLS to the proxy itself) and no SOCKS.
public struct HTTPProxy: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    /// From the proxy URL's user part, percent-decoded; sent as `Proxy-Authorization: Basic`.
    public var username: String?
    public var password: String?

    public init(host: String, port: Int, username: String? = nil, password: String? = nil) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
    }

    /// Reads a proxy setting's value the way curl does: a URL, or a bare `host[:port]` taken as
    /// `http://`; port 1080 when none is given. `variable` names the setting in errors.
    public static func parse(_ text: String, variable: String) throws(RoomError) -> HTTPProxy {
        let trimmed = text.trimmingSpaces()
        // Never echo the value: it may hold a password.
        func bad(_ why: String) -> RoomError { .proxyFailed(proxy: "proxy in \(variable)", message: why) }
        let full = trimmed.contains("://") ? trimmed : "http://" + trimmed
        guard let parts = URLComponents(string: full), let scheme = parts.scheme?.lowercased() else {
            throw bad("it is not a proxy URL (give http://host:port)")
        }
        switch scheme {
        case "http": break
        case "socks", "socks4", "socks4a", "socks5", "socks5h":
            throw bad("it names a SOCKS proxy; only HTTP proxies (http://host:port) are supported")
        case "https":
            throw bad("it names an https:// proxy (TLS to the proxy); only http:// proxies are supported (https sites still go through them, by CONNECT)")
        default:
            throw bad("it has the scheme \(scheme.prefix(12)); only http:// proxies are supported")
        }
        guard var host = parts.percentEncodedHost, !host.isEmpty else { throw bad("it names no proxy host") }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        let port = parts.port ?? 1080
        guard (1...65535).contains(port) else { throw bad("its port \(port) is out of range") }
        return HTTPProxy(host: host, port: port, username: parts.user.flatMap { $0.isEmpty ? nil : $0 }, password: parts.password)
    }

    /// `Proxy-Authorization` value, when the URL carried a user.
    var authorization: String? {
        guard let username else { return nil }
        return "Basic " + Data("\(username):\(password ?? "")".utf8).base64EncodedString()
    }

    /// "proxy 10.0.0.1:3128 (user alice)": never the password.
    public var description: String {
        let address = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        return "proxy \(address)" + (username.map { " (user \($0))" } ?? "")
    }
}

/// Which proxy, if any, a request goes through: from `https_proxy`/`HTTPS_PROXY` for https URLs,
/// `http_proxy`/`HTTP_PROXY` for http URLs, `all_proxy`/`ALL_PROXY` for either when its own is
/// unset, except for hosts `no_proxy`/`NO_PROXY` lists. Lower case wins over upper case (as in
/// curl). docs/rooms.md says what works.
public struct ProxySettings: Sendable, Equatable {
    public var https: HTTPProxy?
    public var http: HTTPProxy?
    public var noProxy: NoProxyList

    public init(https: HTTPProxy? = nil, http: HTTPProxy? = nil, noProxy: NoProxyList = NoProxyList("")) {
        self.https = https
        self.http = http
        self.noProxy = noProxy
    }

    /// No proxy at all.
    public static let direct = ProxySettings()

    /// The settings in `environment`. A malformed or unsupported value is an error (a request would
    /// otherwise go out directly from a network that only allows the proxy, and fail obscurely).
    public static func from(environment: [String: String]) throws(RoomError) -> ProxySettings {
        func value(_ names: String...) -> (name: String, value: String)? {
            for name in names { if let v = environment[name], !v.trimmingSpaces().isEmpty { return (name, v) } }
            return nil
        }
        func proxy(_ found: (name: String, value: String)?) throws(RoomError) -> HTTPProxy? {
            guard let found else { return nil }
            return try HTTPProxy.parse(found.value, variable: found.name)
        }
        let all = value("all_proxy", "ALL_PROXY")
        return ProxySettings(https: try proxy(value("https_proxy", "HTTPS_PROXY") ?? all),
                             http: try proxy(value("http_proxy", "HTTP_PROXY") ?? all),
                             noProxy: NoProxyList(value("no_proxy", "NO_PROXY")?.value ?? ""))
    }

    /// The proxy for `url`, or nil to connect directly.
    public func proxy(for url: URL) -> HTTPProxy? {
        guard let host = url.host else { return nil }
        let secure = url.scheme?.lowercased() == "https"
        guard let proxy = secure ? https : http else { return nil }
        let port = url.port ?? (secure ? 443 : 80)
        return noProxy.matches(host: host, port: port) ? nil : proxy
    }
}

/// A `NO_PROXY` list: comma- (or space-) separated entries, each one of
/// - `*`: every host (no proxy at all);
/// - a host name, with or without a leading dot: that name and every name under it
///   (`example.com` and `.example.com` both match example.com and www.example.com, not
///   myexample.com), compared without case;
/// - an IP address (IPv6 without brackets, or in them): that address, compared as an address;
/// - an IP address with `/bits` (CIDR): every address in that network;
/// - any of these with `:port` (IPv6 in brackets then): only requests to that port.
/// Entries that are none of these are ignored. Loopback is not special: it goes through the proxy
/// unless listed, as in curl.
public struct NoProxyList: Sendable, Equatable {
    enum Entry: Equatable, Sendable {
        case everything
        case name(String, port: Int?)
        case network(IPNetwork, port: Int?)
    }

    let entries: [Entry]

    public init(_ text: String) {
        var entries: [Entry] = []
        for raw in text.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\t" }) {
            let item = String(raw)
            if item == "*" { entries.append(.everything); continue }
            if let entry = Self.entry(item) { entries.append(entry) }
        }
        self.entries = entries
    }

    private static func entry(_ item: String) -> Entry? {
        var body = item
        var port: Int?
        if body.hasPrefix("[") {
            // [v6]:port or [v6] or [v6/bits]
            guard let close = body.firstIndex(of: "]") else { return nil }
            let rest = body[body.index(after: close)...]
            if rest.hasPrefix(":") { guard let p = Int(rest.dropFirst()), (1...65535).contains(p) else { return nil }; port = p } else if !rest.isEmpty { return nil }
            body = String(body[body.index(after: body.startIndex)..<close])
        } else if body.filter({ $0 == ":" }).count == 1, let colon = body.firstIndex(of: ":") {
            // name:port or v4:port (an IPv6 address has two colons or more)
            guard let p = Int(body[body.index(after: colon)...]), (1...65535).contains(p) else { return nil }
            port = p
            body = String(body[..<colon])
        }
        if let network = IPNetwork(body) { return .network(network, port: port) }
        var name = body.lowercased()
        while name.hasPrefix(".") { name.removeFirst() }
        while name.hasSuffix(".") { name.removeLast() }
        guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_" }) else { return nil }
        return .name(name, port: port)
    }

    /// True when a request to `host:port` goes out directly. `host` as in a URL (IPv6 in brackets or not).
    public func matches(host: String, port: Int) -> Bool {
        var bare = host.lowercased()
        if bare.hasPrefix("[") && bare.hasSuffix("]") { bare = String(bare.dropFirst().dropLast()) }
        while bare.hasSuffix(".") { bare.removeLast() }
        let address = IPLiteral.bytes(bare)
        for entry in entries {
            switch entry {
            case .everything:
                return true
            case .name(let name, let only):
                guard only == nil || only == port, address == nil else { continue }
                if bare == name || bare.hasSuffix("." + name) { return true }
            case .network(let network, let only):
                guard only == nil || only == port, let address else { continue }
                if network.contains(address) { return true }
            }
        }
        return false
    }
}

/// An IP address and a prefix length: `10.0.0.0/8`, `::1` (/128), `192.168.1.7` (/32).
struct IPNetwork: Equatable, Sendable {
    let bytes: [UInt8]
    let bits: Int

    init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let address = IPLiteral.bytes(String(parts[0])) else { return nil }
        bytes = address
        if parts.count == 2 {
            guard let n = Int(parts[1]), (0...(bytes.count * 8)).contains(n) else { return nil }
            bits = n
        } else {
            bits = bytes.count * 8
        }
    }

    func contains(_ other: [UInt8]) -> Bool {
        guard other.count == bytes.count else { return false }
        var left = bits
        for i in 0..<bytes.count where left > 0 {
            let take = min(8, left)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - take))
            if bytes[i] & mask != other[i] & mask { return false }
            left -= take
        }
        return true
    }
}
