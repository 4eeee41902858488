/// A STUN or TURN server (RFC 7064/7065 URL) with optional long-term
/// credentials, as a join code or a WHIP `Link` header gives it.
public struct IceServer: Equatable, Sendable, CustomStringConvertible, CustomReflectable {
    /// `stun:host[:port]`, `turn:host[:port][?transport=udp|tcp]`, `turns:…`.
    public var url: String
    public var username: String?
    public var credential: String?

    public init(url: String, username: String? = nil, credential: String? = nil) {
        self.url = url
        self.username = username
        self.credential = credential
    }

    /// The URL's scheme, host, port and transport (RFC 7064/7065); nil when it is not a STUN/TURN URL.
    public var parts: IceServerURL.Parts? { try? IceServerURL.parse(url).get() }

    /// The URL only: credentials never go into logs.
    public var description: String { url }

    /// Without the credential, for `dump()`.
    public var customMirror: Mirror {
        Mirror(self, children: ["url": url, "username": username as Any, "credential": credential == nil ? "(none)" : "(hidden)"])
    }
}
