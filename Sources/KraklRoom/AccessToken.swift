import FoundationEssentials
import KraklBase
import Glibc

/// A room access token: a JWT shaped like a Twilio Video access token
/// (header `{"typ":"JWT","alg":"HS256","cty":"twilio-fpa;v=1"}`, claims
/// `grants.identity`, `grants.video.room`, `exp`, …).
///
/// The agent reads the token but does not verify its signature: it has no
/// key, and the room server verifies. Parsing checks the structure so a
/// broken or foreign token is refused here with a clear message instead of
/// as an opaque 401 from the server.
///
/// The token is a credential: `description` and `dump()` show only
/// `shortened`; use `compact` for the `Authorization` header and nothing else.
public struct AccessToken: Equatable, Sendable, CustomStringConvertible, CustomReflectable {
    /// The header's content type for Twilio-style access tokens.
    public static let contentType = "twilio-fpa;v=1"
    /// Longer tokens are refused: a join code is at most 4096 bytes anyway.
    public static let maximumLength = 4096
    /// `grants.identity` longer than this (in Unicode scalars) is refused.
    public static let maximumIdentityLength = 256

    /// The whole token (`header.claims.signature`). A credential: never print or log it.
    public let compact: String
    /// The header's `alg` (the server checks it; the agent only refuses `none`).
    public let algorithm: String
    /// `jti`, `iss`, `sub`: the token's id, issuer (for Twilio the API key) and subject (the account).
    public let id: String?
    public let issuer: String?
    public let subject: String?
    /// `iat`, `nbf`, `exp`.
    public let issuedAt: Date?
    public let notBefore: Date?
    public let expiry: Date
    /// `grants.identity`: the name the agent shows in the room.
    public let identity: String
    /// `grants.video.room`; nil when the video grant allows any room.
    public let room: String?

    /// Reads the token's header and claims. Throws `.malformedToken` with
    /// what is wrong; never puts the token into the error.
    public init(parsing text: String) throws(JoinCodeError) {
        func fail(_ problem: JoinCodeError.TokenProblem) -> JoinCodeError { .malformedToken(problem) }
        guard text.utf8.count <= Self.maximumLength else { throw fail(.tooLong(bytes: text.utf8.count)) }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw fail(.notThreeParts(count: parts.count)) }
        var decoded: [Data] = []
        for (index, part) in parts.enumerated() {
            guard let data = Base64URL.decode(part) else { throw fail(.badBase64URL(part: index + 1)) }
            decoded.append(data)
        }

        guard let headerText = String(validating: decoded[0], as: UTF8.self), let header = JSONText.parse(headerText) as? [String: Any] else {
            throw fail(.headerNotJSON)
        }
        let typ = header["typ"] as? String, cty = header["cty"] as? String
        guard typ?.uppercased() == "JWT" else { throw fail(.wrongType(typ.map { JoinCodeError.clip($0, limit: 32) })) }
        guard cty == Self.contentType else { throw fail(.wrongContentType(cty.map { JoinCodeError.clip($0, limit: 32) })) }
        guard let alg = header["alg"] as? String, !alg.isEmpty, alg.lowercased() != "none", !decoded[2].isEmpty else {
            throw fail(.unsigned)
        }

        let claims: Claims
        do {
            claims = try JSONDecoder().decode(Claims.self, from: decoded[1])
        } catch let DecodingError.typeMismatch(type, context) {
            let name = context.codingPath.map(\.stringValue).joined(separator: ".")
            guard !name.isEmpty else { throw fail(.claimsNotJSON) }
            throw fail(.badClaim(name: name, reason: type == String.self ? "is not a string" : type == Double.self ? "is not a number" : "is not an object"))
        } catch {
            throw fail(.claimsNotJSON)
        }

        guard let identity = claims.grants?.identity, !identity.trimmingSpaces().isEmpty else { throw fail(.noIdentity) }
        if let reason = Self.identityProblem(identity) { throw fail(.badIdentity(reason)) }
        guard let exp = claims.exp else { throw fail(.noExpiry) }
        guard let video = claims.grants?.video else { throw fail(.noVideoGrant) }
        if let room = video.room, room.isEmpty {
            throw fail(.badClaim(name: "grants.video.room", reason: "is empty (leave it out to allow any room)"))
        }

        self.compact = text
        self.algorithm = alg
        self.id = claims.jti
        self.issuer = claims.iss
        self.subject = claims.sub
        self.issuedAt = try Self.date(claims.iat, "iat")
        self.notBefore = try Self.date(claims.nbf, "nbf")
        self.expiry = try Self.date(exp, "exp")!
        self.identity = identity
        self.room = video.room
    }

    /// Refuses a token that has expired or is not valid yet, allowing
    /// `skew` seconds of difference between this clock and the issuer's.
    public func checkTimes(now: Date, skew: Duration = .seconds(60)) throws(JoinCodeError) {
        if expiry.addingTimeInterval(skew.inSeconds) < now { throw .tokenExpired(expiry: expiry, now: now, skew: skew) }
        if let notBefore, notBefore.addingTimeInterval(-skew.inSeconds) > now { throw .tokenNotYetValid(notBefore: notBefore, now: now, skew: skew) }
    }

    /// The first 8 characters and "…": the only form of a token that may
    /// appear in a message or a log. (A JWT's first characters are its
    /// header, which is not secret.)
    public var shortened: String { String(compact.prefix(8)) + "…" }

    public var description: String { shortened }

    public var customMirror: Mirror {
        Mirror(self, children: ["token": shortened, "identity": identity, "room": room as Any, "expiry": expiry])
    }

    public static func == (a: AccessToken, b: AccessToken) -> Bool { a.compact == b.compact }

    /// Why `identity` cannot be shown as a name in a room, or nil. Line
    /// breaks would split status lines and logs; bidirectional overrides
    /// would let a name display as something else.
    static func identityProblem(_ identity: String) -> String? {
        if identity.unicodeScalars.count > maximumIdentityLength {
            return "is \(identity.unicodeScalars.count) characters long, more than the \(maximumIdentityLength) allowed"
        }
        for scalar in identity.unicodeScalars {
            switch scalar.properties.generalCategory {
            case .control, .lineSeparator, .paragraphSeparator:
                return "has a control character or line break"
            default:
                if (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value) {
                    return "has a bidirectional override character"
                }
            }
        }
        return nil
    }

    /// A NumericDate (RFC 7519 §2: seconds since 1970, maybe fractional),
    /// refused outside years 1970-9999 where it can only be a mistake
    /// (milliseconds instead of seconds, for one).
    private static func date(_ seconds: Double?, _ name: String) throws(JoinCodeError) -> Date? {
        guard let seconds else { return nil }
        guard seconds.isFinite, (0...253_402_300_799).contains(seconds) else {
            throw .malformedToken(.badClaim(name: name, reason: "is not a time in seconds since 1970 between years 1970 and 9999"))
        }
        return Date(timeIntervalSince1970: seconds)
    }

    private struct Claims: Decodable {
        var jti: String?, iss: String?, sub: String?
        var iat: Double?, nbf: Double?, exp: Double?
        var grants: Grants?
    }
    private struct Grants: Decodable {
        var identity: String?
        var video: Video?
    }
    private struct Video: Decodable {
        var room: String?
    }
}
