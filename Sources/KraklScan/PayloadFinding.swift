import FoundationEssentials
import Glibc
import KraklRoom

/// What one QR payload turned out to be. Nothing here ever opens, runs or
/// follows a payload; `message` shows at most a clipped, printable-ASCII
/// preview of one that is not a join code, and never more than the first 8
/// characters of a token.
public enum PayloadFinding: Equatable, Sendable, CustomStringConvertible {
    /// A join code that can be used now.
    case joinCode(Invitation)
    /// A well-formed join code whose token has expired (a fresh code may
    /// appear: a scan goes on).
    case expired(JoinCodeError)
    /// Starts with `krakl:` (or is a JWT) but cannot be used: malformed, a bad token, a
    /// token not valid yet, a room mismatch.
    case unusableJoinCode(JoinCodeError)
    /// Printable text that is not a join code (a URL, say): `preview` is its
    /// first `previewLength` characters.
    case notAJoinCode(preview: String)
    /// Refused before being read as text: too long, not ASCII, or with
    /// control characters (which could drive a terminal it is printed on).
    case rejected(PayloadRejection)

    /// Characters of a foreign payload shown.
    public static let previewLength = 24

    /// Judges one payload as zbar returned it.
    public static func classify(_ payload: [UInt8], now: Date, skew: Duration = .seconds(60)) -> PayloadFinding {
        // A trailing newline (or a space) is how many generators end text; the code format trims it too.
        let isBlank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        let start = payload.firstIndex { !isBlank($0) } ?? payload.endIndex
        let end = payload.lastIndex { !isBlank($0) }.map { $0 + 1 } ?? start
        let bytes = payload[start..<max(start, end)]
        guard bytes.count <= JoinCode.maximumLength else { return .rejected(.tooLong(bytes: bytes.count)) }
        if let index = bytes.firstIndex(where: { $0 >= 0x80 }) { return .rejected(.notASCII(position: index - start + 1)) }
        if let index = bytes.firstIndex(where: { $0 < 0x20 || $0 == 0x7F }) { return .rejected(.controlCharacter(position: index - start + 1)) }
        let text = String(decoding: bytes, as: UTF8.self)
        // A QR holding only a Twilio access token (what a Twilio conference page shows) is a Twilio code.
        guard text.lowercased().hasPrefix("krakl:") || JoinCode.looksLikeJWT(text) else {
            return .notAJoinCode(preview: text.count > previewLength ? String(text.prefix(previewLength)) + "…" : text)
        }
        do throws(JoinCodeError) {
            return .joinCode(try Invitation.read(text, now: now, skew: skew))
        } catch {
            if case .tokenExpired = error { return .expired(error) }
            return .unusableJoinCode(error)
        }
    }

    /// One line for the person scanning.
    public var description: String {
        switch self {
        case .joinCode(let invitation): return "found a join code: \(invitation)"
        case .expired(let error): return "found a join code that has expired: \(error.description)"
        case .unusableJoinCode(let error): return "found a join code that cannot be used: \(error.description)"
        case .notAJoinCode(let preview): return "found a QR code that is not a krakl join code: \(preview)"
        case .rejected(let rejection): return "found a QR code that is not a krakl join code and was not read: \(rejection)"
        }
    }
}

/// Why a payload was refused before being read as text.
public enum PayloadRejection: Equatable, Sendable, CustomStringConvertible {
    /// More than `JoinCode.maximumLength` bytes.
    case tooLong(bytes: Int)
    /// A byte ≥ 0x80 at `position` (from 1).
    case notASCII(position: Int)
    /// A byte below 0x20 or 0x7F at `position` (from 1), inside the text.
    case controlCharacter(position: Int)

    public var description: String {
        switch self {
        case .tooLong(let bytes): return "it holds \(bytes) bytes, more than the \(JoinCode.maximumLength) a join code may have"
        case .notASCII(let position): return "byte \(position) is not ASCII (a join code is printable ASCII only)"
        case .controlCharacter(let position): return "byte \(position) is a control character (a join code is printable ASCII only)"
        }
    }
}
