import FoundationEssentials
import Glibc

/// Why a join code or its token cannot be used. Each case is a distinct
/// situation the agent maps to its own exit status; `description` is one
/// line the person can act on. No case ever carries the token itself.
public enum JoinCodeError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The text is not a well-formed version 1 join code.
    case malformedCode(CodeProblem)
    /// The code's first field is `v=N` with N > 1: it was made for a newer agent.
    case unsupportedVersion(Int)
    /// The `t` field is not a token the agent can read.
    case malformedToken(TokenProblem)
    /// `exp + skew < now`.
    case tokenExpired(expiry: Date, now: Date, skew: Duration)
    /// `nbf - skew > now`.
    case tokenNotYetValid(notBefore: Date, now: Date, skew: Duration)
    /// The token grants one room and the code names another.
    case roomMismatch(codeRoom: String, tokenRoom: String)
    /// A Janus code whose token allows any room and which names none itself.
    case noRoom

    /// What is wrong with the code's text (not with its token).
    public enum CodeProblem: Equatable, Sendable {
        /// Nothing but white space.
        case empty
        /// More than `JoinCode.maximumLength` bytes after trimming.
        case tooLong(bytes: Int)
        /// A byte outside 0x21-0x7E (a space, a control character, non-ASCII);
        /// `position` counts characters from 1 after trimming.
        case notPrintableASCII(position: Int)
        /// The text does not start with `krakl:`.
        case notAJoinCode
        /// The first field is not `v=…`.
        case versionNotFirst
        /// `v=` is not a positive decimal number.
        case badVersion
        /// A field with no `=` (its first 8 characters).
        case fieldWithoutValue(String)
        /// A single-valued field given twice.
        case duplicateField(String)
        /// A `%` not followed by two hex digits, or escapes that are not UTF-8.
        case badPercentEncoding(field: String)
        /// A required field is absent or empty.
        case missingField(String)
        /// `k` is neither `whip` nor `janus` (its first 8 characters).
        case unknownService(String)
        /// `u` is not an absolute http(s) URL with a host.
        case badURL(String)
        /// `r` is too long or has control characters.
        case badRoom(String)
        /// The n-th `ice` field (from 1) is not `URL[,username,credential]`.
        case badIceServer(index: Int, reason: String)
        /// A 0/1 field with another value.
        case badFlag(String)
    }

    /// What is wrong with the token's structure. Values quoted from the
    /// header are shortened; nothing of the signature is ever quoted.
    public enum TokenProblem: Equatable, Sendable {
        /// Longer than `AccessToken.maximumLength`.
        case tooLong(bytes: Int)
        /// Not `header.payload.signature`.
        case notThreeParts(count: Int)
        /// Part `part` (1 header, 2 claims, 3 signature) is not unpadded base64url.
        case badBase64URL(part: Int)
        /// The header does not decode to a JSON object.
        case headerNotJSON
        /// The claims do not decode to a JSON object.
        case claimsNotJSON
        /// `typ` is not `JWT` (its first 32 characters).
        case wrongType(String?)
        /// `cty` is not `twilio-fpa;v=1` (its first 32 characters).
        case wrongContentType(String?)
        /// `alg` is missing or `none`, or the signature is empty.
        case unsigned
        /// A claim has the wrong JSON type or an impossible value (`grants.video.room` empty, a time out of range).
        case badClaim(name: String, reason: String)
        /// `grants.identity` is missing or blank.
        case noIdentity
        /// `grants.identity` is too long or has control characters.
        case badIdentity(String)
        /// No `exp` claim: a token that never expires is refused.
        case noExpiry
        /// No `grants.video` object: the token does not grant video rooms.
        case noVideoGrant
    }

    public var description: String {
        switch self {
        case .malformedCode(let problem):
            return "not a valid join code: \(problem.text)"
        case .unsupportedVersion(let version):
            return "join code version \(version) is newer than this agent understands (it reads version 1): update krakl-agent"
        case .malformedToken(let problem):
            return "the join code's token is not usable: \(problem.text); ask the conference page for a new code"
        case .tokenExpired(let expiry, let now, let skew):
            return "the join code's token expired at \(LocalTime.format(expiry)) (\(LocalTime.span(now.timeIntervalSince(expiry))) ago, "
                + "beyond the \(Int(skew.inSeconds)) s of clock skew allowed): ask the conference page for a new code"
        case .tokenNotYetValid(let notBefore, let now, let skew):
            return "the join code's token is not valid before \(LocalTime.format(notBefore)) (in \(LocalTime.span(notBefore.timeIntervalSince(now))), "
                + "beyond the \(Int(skew.inSeconds)) s of clock skew allowed): check this computer's clock, or wait"
        case .roomMismatch(let codeRoom, let tokenRoom):
            return "room mismatch: the join code names room \(Self.quoted(codeRoom, limit: 32)) but its token is for room \(Self.quoted(tokenRoom, limit: 32)); ask for a new code"
        case .noRoom:
            return "the join code names no room and its token allows any room: a Janus code needs r=<room id>"
        }
    }
}

extension JoinCodeError.CodeProblem {
    var text: String {
        switch self {
        case .empty: return "it is empty"
        case .tooLong(let bytes): return "it is \(bytes) bytes long, more than the \(JoinCode.maximumLength) allowed"
        case .notPrintableASCII(let position):
            return "character \(position) is not printable ASCII (a join code has no spaces, control or non-ASCII characters)"
        case .notAJoinCode: return "it does not start with \"krakl:\" and is not a Twilio access token"
        case .versionNotFirst: return "its first field must be the version, v=1"
        case .badVersion: return "its version (v=) is not a positive number"
        case .fieldWithoutValue(let name): return "field \"\(name)\" has no '=' (fields are name=value, separated by ';')"
        case .duplicateField(let name): return "field \(name)= appears more than once"
        case .badPercentEncoding(let field): return "field \(field)= has a bad %-escape (% must be followed by two hex digits of UTF-8)"
        case .missingField(let name): return "required field \(name)= is missing (\(JoinCode.fieldPurpose(name)))"
        case .unknownService(let kind): return "k=\"\(kind)\" is not a known service (whip, janus or twilio)"
        case .badURL(let reason): return "u= \(reason)"
        case .badRoom(let reason): return "r= \(reason)"
        case .badIceServer(let index, let reason): return "ice server \(index): \(reason)"
        case .badFlag(let name): return "field \(name)= must be 0 or 1"
        }
    }
}

extension JoinCodeError.TokenProblem {
    var text: String {
        switch self {
        case .tooLong(let bytes): return "it is \(bytes) bytes long, more than the \(AccessToken.maximumLength) allowed"
        case .notThreeParts(let count): return "it has \(count) dot-separated part\(count == 1 ? "" : "s"), a JWT has 3"
        case .badBase64URL(let part): return "part \(part) (\(["header", "claims", "signature"][part - 1])) is not unpadded base64url"
        case .headerNotJSON: return "its header is not a JSON object"
        case .claimsNotJSON: return "its claims are not a JSON object"
        case .wrongType(let typ): return "its header has typ \(typ.map { "\"\($0)\"" } ?? "(none)"), expected \"JWT\""
        case .wrongContentType(let cty): return "its header has cty \(cty.map { "\"\($0)\"" } ?? "(none)"), expected \"\(AccessToken.contentType)\""
        case .unsigned: return "it is not signed (alg none or missing, or an empty signature)"
        case .badClaim(let name, let reason): return "claim \(name) \(reason)"
        case .noIdentity: return "it has no grants.identity (the name shown in the room)"
        case .badIdentity(let reason): return "grants.identity \(reason)"
        case .noExpiry: return "it has no exp (expiry) claim"
        case .noVideoGrant: return "it grants no video room (no grants.video)"
        }
    }
}

extension JoinCodeError {
    /// A value from the input as an error may hold it: at most `limit`
    /// characters and "…", anything but printable ASCII shown as `?`, so a
    /// message stays one line. 8 by default: in a damaged code (a lost `;`)
    /// any value can hold part of the token, and no more than 8 characters
    /// of a token may ever be shown, in a message or in a `dump` of the error.
    static func clip(_ value: String, limit: Int = 8) -> String {
        var shown = String(value.unicodeScalars.prefix(limit).map { (0x20...0x7E).contains($0.value) ? Character($0) : "?" })
        if value.unicodeScalars.count > limit { shown += "…" }
        return shown
    }

    /// `clip` in quotes, or "(none)".
    static func quoted(_ value: String?, limit: Int = 8) -> String {
        value.map { "\"\(clip($0, limit: limit))\"" } ?? "(none)"
    }
}
