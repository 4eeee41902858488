/// One ICE candidate as SDP and trickle carry it (RFC 8839 §5.1):
/// `candidate:<foundation> <component> <transport> <priority> <address> <port> typ <type> [raddr <a> rport <p>] [<name> <value>]...`
public struct IceCandidate: Hashable, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable { case host, srflx, prflx, relay }

    public var foundation: String
    public var component: Int
    /// Lower-case transport, "udp" or "tcp".
    public var transport: String
    public var priority: UInt32
    /// An IP literal, or an mDNS name such as "9b36eaac-….local" (browsers hide host addresses that way).
    public var address: String
    public var port: UInt16
    public var kind: Kind
    public var relatedAddress: String?
    public var relatedPort: UInt16?
    /// Extension pairs kept in order (tcptype, generation, ufrag, network-id, ...).
    public var extensions: [(name: String, value: String)]

    public init(foundation: String, component: Int = 1, transport: String = "udp", priority: UInt32, address: String, port: UInt16,
                kind: Kind, relatedAddress: String? = nil, relatedPort: UInt16? = nil, extensions: [(name: String, value: String)] = []) {
        self.foundation = foundation
        self.component = component
        self.transport = transport.lowercased()
        self.priority = priority
        self.address = address
        self.port = port
        self.kind = kind
        self.relatedAddress = relatedAddress
        self.relatedPort = relatedPort
        self.extensions = extensions
    }

    public static func == (a: IceCandidate, b: IceCandidate) -> Bool { a.sdpValue == b.sdpValue }
    public func hash(into hasher: inout Hasher) { hasher.combine(sdpValue) }

    /// The address as an IP, when it is one (nil for mDNS names).
    public var ip: IPAddress? { IPAddress(address) }

    /// The transport address, when the address is an IP literal.
    public var transportAddress: TransportAddress? { ip.map { TransportAddress(ip: $0, port: port) } }

    /// Parses an `a=candidate:` value or a trickled `candidate:` string (with or without the prefix).
    public init(parsing text: String) throws(IceCandidateError) {
        var body = Substring(text.trimmingSpaces)
        if body.hasPrefix("a=") { body = body.dropFirst(2) }
        if body.hasPrefix("candidate:") { body = body.dropFirst("candidate:".count) }
        let f = body.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        func bad(_ why: String) -> IceCandidateError { IceCandidateError(text: text, why: why) }
        guard f.count >= 8 else { throw bad("needs at least 8 fields, has \(f.count)") }
        guard let component = Int(f[1]), (1...256).contains(component) else { throw bad("component \"\(f[1])\" is not 1-256") }
        guard let priority = UInt32(f[3]) else { throw bad("priority \"\(f[3])\" is not a 32-bit number") }
        guard let port = UInt16(f[5]) else { throw bad("port \"\(f[5])\" is not 0-65535") }
        guard f[6] == "typ", let kind = Kind(rawValue: f[7].lowercased()) else { throw bad("no \"typ host|srflx|prflx|relay\"") }
        guard !f[0].isEmpty, f[0].count <= 32 else { throw bad("foundation must be 1-32 characters") }
        self.init(foundation: f[0], component: component, transport: f[2], priority: priority, address: f[4], port: port, kind: kind)
        var i = 8
        while i + 1 < f.count {
            switch f[i] {
            case "raddr": relatedAddress = f[i + 1]
            case "rport":
                guard let p = UInt16(f[i + 1]) else { throw bad("rport \"\(f[i + 1])\" is not a port") }
                relatedPort = p
            default: extensions.append((f[i], f[i + 1]))
            }
            i += 2
        }
        guard i == f.count else { throw bad("extension \"\(f[i])\" has no value") }
    }

    /// The value after `a=` (and the `candidate` string of a trickle message).
    public var sdpValue: String {
        var s = "candidate:\(foundation) \(component) \(transport) \(priority) \(address) \(port) typ \(kind.rawValue)"
        if let relatedAddress { s += " raddr \(relatedAddress)" }
        if let relatedPort { s += " rport \(relatedPort)" }
        for e in extensions { s += " \(e.name) \(e.value)" }
        return s
    }

    public var description: String { sdpValue }

    /// The RFC 8445 §5.1.2.1 priority: (2^24)·type preference + (2^8)·local preference + (256 − component).
    public static func priority(kind: Kind, localPreference: UInt16 = 65535, component: Int = 1) -> UInt32 {
        let typePreference: UInt32
        switch kind {
        case .host: typePreference = 126
        case .prflx: typePreference = 110
        case .srflx: typePreference = 100
        case .relay: typePreference = 0
        }
        return typePreference << 24 | UInt32(localPreference) << 8 | UInt32(256 - component)
    }
}

extension StringProtocol {
    var trimmingSpaces: Substring {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" || c == "\r" || c == "\n" { s.removeFirst() }
        while let c = s.last, c == " " || c == "\t" || c == "\r" || c == "\n" { s.removeLast() }
        return s
    }
}

/// A candidate that cannot be read (RFC 8839 §5.1): ICE's own error, so that ICE needs nothing of
/// SDP; an SDP parser reports it as `SdpError.badCandidate`.
public struct IceCandidateError: Error, Equatable, CustomStringConvertible {
    public let text: String
    public let why: String

    public var description: String { "ICE candidate \"\(text.prefix(100))\" is malformed: \(why)" }
}
