/// Checks of STUN/TURN server URLs as RFC 7064 and RFC 7065 define them:
///
///     stun:host[:port]
///     turn:host[:port][?transport=udp|tcp]
///     turns:host[:port][?transport=udp|tcp]
///
/// where host is a DNS name, an IPv4 address or a bracketed IPv6 address.
/// `stuns:` is refused: browsers do not implement it, and neither do we.
public enum IceServerURL {
    /// A URL's parts, as checked.
    public struct Parts: Equatable, Sendable {
        /// "stun", "turn" or "turns" (lower case).
        public var scheme: String
        /// A DNS name, a dotted IPv4 address, or an IPv6 address without its brackets.
        public var host: String
        public var port: Int?
        /// "udp" or "tcp" from `?transport=` (TURN only).
        public var transport: String?
    }

    /// Why `url` is not a usable STUN/TURN URL, or nil when it is.
    static func problem(_ url: String) -> String? {
        if case .failure(let reason) = parse(url) { return reason.text }
        return nil
    }

    struct Problem: Error { let text: String }

    /// The parts of a STUN/TURN URL, or why it is not one.
    static func parse(_ url: String) -> Result<Parts, Problem> {
        func fail(_ text: String) -> Result<Parts, Problem> { .failure(Problem(text: text)) }
        guard let colon = url.firstIndex(of: ":") else { return fail("\(JoinCodeError.quoted(url)) is not a stun:, turn: or turns: URL") }
        let scheme = url[..<colon].lowercased()
        guard ["stun", "turn", "turns"].contains(scheme) else {
            return fail("scheme \(JoinCodeError.quoted(scheme)) is not stun:, turn: or turns:")
        }
        var rest = url[url.index(after: colon)...]
        var transport: String?
        if let question = rest.firstIndex(of: "?") {
            let query = rest[rest.index(after: question)...]
            rest = rest[..<question]
            guard scheme != "stun" else { return fail("a stun: URL takes no ?query") }
            guard ["transport=udp", "transport=tcp"].contains(query.lowercased()) else {
                return fail("the only query a turn: URL takes is ?transport=udp or ?transport=tcp")
            }
            transport = String(query.lowercased().dropFirst("transport=".count))
        }
        if rest.hasPrefix("//") { return fail("write \(scheme):host[:port], without \"//\" (RFC 7064/7065)") }

        var host = rest, port: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return fail("IPv6 address without ']'") }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return fail("unexpected text after the IPv6 address") }
                port = after.dropFirst()
            }
            guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }), host.contains(":") else {
                return fail("\(JoinCodeError.quoted(String(host))) is not an IPv6 address")
            }
        } else {
            if let portColon = rest.firstIndex(of: ":") {
                host = rest[..<portColon]
                port = rest[rest.index(after: portColon)...]
            }
            guard isHostName(host) else { return fail("host \(JoinCodeError.quoted(String(host))) is not a DNS name or IPv4 address") }
        }
        var number: Int?
        if let port {
            guard !port.isEmpty, port.count <= 5, port.allSatisfy(\.isASCIIDigit), let n = Int(port), (1...65535).contains(n) else {
                return fail("port \(JoinCodeError.quoted(String(port))) is not a number from 1 to 65535")
            }
            number = n
        }
        return .success(Parts(scheme: scheme, host: String(host), port: number, transport: transport))
    }

    /// A DNS name (labels of letters, digits and inner hyphens, RFC 1123) or
    /// a dotted IPv4 address, which has the same characters.
    private static func isHostName(_ host: Substring) -> Bool {
        guard !host.isEmpty, host.utf8.count <= 253 else { return false }
        let labels = host.hasSuffix(".") ? host.dropLast().split(separator: ".", omittingEmptySubsequences: false)
                                         : host.split(separator: ".", omittingEmptySubsequences: false)
        return labels.allSatisfy { label in
            !label.isEmpty && label.count <= 63 && label.first != "-" && label.last != "-"
                && label.allSatisfy { $0.isASCIIDigit || $0.isASCIILetter || $0 == "-" }
        }
    }
}

extension Character {
    var isASCIIDigit: Bool { isASCII && isNumber }
    var isASCIILetter: Bool { isASCII && isLetter }
}
