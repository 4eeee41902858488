import FoundationEssentials
import Glibc

/// A join code that has been read and judged usable: its token has the
/// right shape and is valid now, and the room to join is settled. What the
/// sharing session needs to join, in one value.
public struct Invitation: Equatable, Sendable, CustomStringConvertible, CustomReflectable {
    public let code: JoinCode
    public let token: AccessToken
    /// The name to show in the room (the token's `grants.identity`).
    public var identity: String { token.identity }
    /// The room to join: the token's room when it names one, else the
    /// code's `r`. Nil only for WHIP, whose endpoint URL is the room.
    public let room: String?

    /// Reads a join code as the person gave it: parses the code and its
    /// token, refuses a token that is expired or not yet valid at `now`
    /// (allowing `skew` seconds either way), and settles the room.
    public static func read(_ text: String, now: Date, skew: Duration = .seconds(60)) throws(JoinCodeError) -> Invitation {
        try Invitation(code: try JoinCode(parsing: text), now: now, skew: skew)
    }

    /// Judges a parsed code as `read` does.
    public init(code: JoinCode, now: Date, skew: Duration = .seconds(60)) throws(JoinCodeError) {
        let token = try AccessToken(parsing: code.token)
        try token.checkTimes(now: now, skew: skew)
        switch (code.room, token.room) {
        case let (codeRoom?, tokenRoom?) where codeRoom != tokenRoom:
            throw .roomMismatch(codeRoom: codeRoom, tokenRoom: tokenRoom)
        case (nil, nil) where code.service == .janus:
            throw .noRoom
        default:
            room = token.room ?? code.room
        }
        self.code = code
        self.token = token
    }

    /// One line without secrets: `Janus VideoRoom https://h/janus, room "7", as "Ada" (token eyJ0eXAi…)`.
    public var description: String {
        "\(code.service.displayName) \(Self.withoutSecrets(code.url))" + (room.map { ", room \"\($0)\"" } ?? "")
            + ", as \"\(identity)\" (token \(token.shortened))"
    }

    public var customMirror: Mirror {
        Mirror(self, children: ["code": code, "identity": identity, "room": room as Any, "token": token])
    }

    /// What the code will do, for `--scan-only` and `krakl-agent code`:
    /// service, URL (without query, which may carry secrets), room,
    /// identity, expiry, ICE servers (without credentials) and the
    /// shortened token, one `name: value` line each.
    public var summary: String { summary(now: Date()) }

    /// `summary` with the expiry's distance measured from `now`.
    public func summary(now: Date) -> String {
        let left = token.expiry.timeIntervalSince(now)
        let expiry = LocalTime.format(token.expiry)
            + (left >= 0 ? " (in \(LocalTime.span(left)))" : " (\(LocalTime.span(left)) ago)")
        var lines = [
            ("service", code.service.displayName),
            ("url", Self.withoutSecrets(code.url)),
            ("room", room ?? (code.service == .twilio ? "(none named: the server decides)" : "(set by the WHIP endpoint)")),
            ("identity", identity),
            ("expires", expiry),
        ]
        if !code.iceServers.isEmpty {
            lines.append(("ice", code.iceServers.map { $0.url + ($0.username == nil ? "" : " (with credentials)") }.joined(separator: ", ")))
        }
        lines.append(("token", token.shortened))
        return lines.map { "\($0.0 + ":")\(String(repeating: " ", count: 9 - $0.0.count))\($0.1)" }.joined(separator: "\n")
    }

    /// The URL without query, fragment or user info.
    static func withoutSecrets(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "(unprintable URL)" }
        components.query = nil
        components.fragment = nil
        components.user = nil
        components.password = nil
        return components.string ?? "(unprintable URL)"
    }
}
