import FoundationEssentials
import Glibc
import KraklBase

/// A join code: what a conference page shows as a QR code so the agent can
/// join its room. docs/join-codes.md is the specification; in short:
///
///     krakl:v=1;k=janus;u=http://127.0.0.1:8088/janus;r=1234;t=<JWT>;ice=stun:stun.example.org
///
/// Printable ASCII only (QR readers such as zbar guess the character set of
/// anything else), at most 4096 bytes, `name=value` fields after `krakl:`
/// separated by `;`, the version first. Values escape `%`, `;`, `,`, `=`
/// and anything outside 0x21-0x7E as `%XX` (UTF-8 bytes), so URLs and
/// JWTs stay as they are and the code stays short.
///
/// Parsing checks the code's own structure; the token is checked by
/// `AccessToken` and the pairing of both by `Invitation`.
public struct JoinCode: Equatable, Sendable, CustomStringConvertible, CustomReflectable {
    /// The signalling protocol the agent speaks to the room server.
    public enum Service: String, Equatable, Sendable {
        /// WHIP (RFC 9725): `url` is the WHIP endpoint.
        case whip
        /// Janus VideoRoom over Janus's HTTP API: `url` is its base (`http://host:8088/janus`).
        case janus
        /// Twilio Programmable Video: `url` is the signaling WebSocket (`wss://global.vss.twilio.com/signaling`
        /// when the code gives none).
        case twilio

        /// The name status lines use.
        public var displayName: String {
            switch self {
            case .whip: return "WHIP"
            case .janus: return "Janus VideoRoom"
            case .twilio: return "Twilio Video"
            }
        }
    }

    /// The only version this agent reads and writes.
    public static let currentVersion = 1
    /// Longer codes are refused before anything else is looked at.
    public static let maximumLength = 4096
    /// `r` longer than this (in Unicode scalars) is refused.
    public static let maximumRoomLength = 256

    public let version: Int
    public var service: Service
    /// The service URL: absolute, http or https.
    public var url: URL
    /// The access token (a JWT), verbatim. A credential: see `AccessToken`.
    public var token: String
    /// `r`: the room (Janus VideoRoom room id, digits or a string name).
    public var room: String?
    /// `ice`: STUN/TURN servers for the agent's ICE, in the code's order.
    public var iceServers: [IceServer]
    /// `xo=1`: the token may follow a WHIP redirect to another origin (scheme, host, port). Off by
    /// default: a redirect must not hand the credential to a server the page did not name.
    public var tokenAcrossOrigins = false
    /// The code named no URL (a Twilio code without `u=`, or a bare Twilio access token): `url` is
    /// Twilio's global signaling endpoint, which `--twilio-url` may replace.
    public var urlIsDefault = false

    /// A code to serialize with `text`. Values are not checked here; a code
    /// made from invalid values serializes to text that does not parse.
    public init(service: Service, url: URL, token: String, room: String? = nil, iceServers: [IceServer] = []) {
        self.version = Self.currentVersion
        self.service = service
        self.url = url
        self.token = token
        self.room = room
        self.iceServers = iceServers
    }

    /// Parses a join code. White space around it (a pasted code with its
    /// newline) is ignored; everything else must follow the format.
    /// Unknown fields are ignored, so later versions can add optional ones.
    public init(parsing input: String) throws(JoinCodeError) {
        let text = input.trimmingWhitespace()
        guard !text.isEmpty else { throw .malformedCode(.empty) }
        guard text.utf8.count <= Self.maximumLength else { throw .malformedCode(.tooLong(bytes: text.utf8.count)) }
        let firstOdd = text.unicodeScalars.firstIndex { !Self.isCodeCharacter($0.value) }
        // Case-insensitive like any URI scheme; some QR apps upper-case it. Judged before the
        // characters: text that is no code at all ("hello world") is told so, not where its space is.
        guard text.utf8.count >= Self.prefix.utf8.count, text.prefix(Self.prefix.count).lowercased() == Self.prefix else {
            // A QR that holds just a Twilio access token (what a Twilio page shows): a Twilio code.
            if firstOdd == nil, Self.looksLikeJWT(text) {
                self = JoinCode(service: .twilio, url: Self.twilioDefaultURL, token: text)
                urlIsDefault = true
                return
            }
            throw .malformedCode(.notAJoinCode)
        }
        if let bad = firstOdd {
            throw .malformedCode(.notPrintableASCII(position: text.unicodeScalars.distance(from: text.unicodeScalars.startIndex, to: bad) + 1))
        }
        let (version, single, ice) = try Self.readFields(text.dropFirst(Self.prefix.count))

        func required(_ name: String) throws(JoinCodeError) -> String {
            guard let raw = single[name], !raw.isEmpty else { throw .malformedCode(.missingField(name)) }
            return try Self.decode(raw, field: name)
        }
        let kind = try required("k")
        guard let service = Service(rawValue: kind.lowercased()) else { throw .malformedCode(.unknownService(JoinCodeError.clip(kind))) }
        // A Twilio code may leave out its signalling URL (Twilio's own is the default); others may not.
        let defaulted = service == .twilio && (single["u"] ?? "").isEmpty
        let url = if defaulted { Self.twilioDefaultURL }
            else if service == .twilio { try Self.signalingURL(try Self.decode(single["u"]!, field: "u")) }
            else { try Self.serviceURL(try required("u")) }
        let token = try required("t")
        var room: String?
        if let raw = single["r"] {
            let value = try Self.decode(raw, field: "r")
            if let reason = Self.roomProblem(value) { throw .malformedCode(.badRoom(reason)) }
            room = value
        }
        var acrossOrigins = false
        if let raw = single["xo"] {
            guard raw == "0" || raw == "1" else { throw .malformedCode(.badFlag("xo")) }
            acrossOrigins = raw == "1"
        }
        var servers: [IceServer] = []
        for (index, raw) in ice.enumerated() {
            servers.append(try Self.iceServer(raw, index: index + 1))
        }

        self.version = version
        self.service = service
        self.url = url
        self.token = token
        self.room = room
        self.iceServers = servers
        self.tokenAcrossOrigins = acrossOrigins
        self.urlIsDefault = defaulted
    }

    /// The fields after the prefix: the version (first, and judged before any other field: a newer
    /// version may change what the others mean), the single-valued fields by name (each at most
    /// once), and the `ice` fields in order. Empty fields (a trailing ';') are harmless and skipped;
    /// unknown ones are ignored.
    private static func readFields(_ body: Substring) throws(JoinCodeError) -> (version: Int, single: [String: Substring], ice: [Substring]) {
        let fields = body.split(separator: ";")
        guard let first = fields.first, first.hasPrefix("v=") else { throw .malformedCode(.versionNotFirst) }
        let versionText = first.dropFirst(2)
        guard (1...9).contains(versionText.count), versionText.allSatisfy(\.isASCIIDigit), let version = Int(versionText), version >= 1 else {
            throw .malformedCode(.badVersion)
        }
        guard version == Self.currentVersion else { throw .unsupportedVersion(version) }

        var single: [String: Substring] = ["v": versionText]
        var ice: [Substring] = []
        for field in fields.dropFirst() {
            guard let equals = field.firstIndex(of: "=") else { throw .malformedCode(.fieldWithoutValue(JoinCodeError.clip(String(field)))) }
            let name = String(field[..<equals]), value = field[field.index(after: equals)...]
            switch name {
            case "ice":
                ice.append(value)
            case "v", "k", "u", "t", "r", "xo":
                guard single[name] == nil else { throw .malformedCode(.duplicateField(name)) }
                single[name] = value
            default:
                continue
            }
        }
        return (version, single, ice)
    }

    /// The join code a `krakl:` link carries (docs/join-codes.md, "As a link"), for `JoinCode` to
    /// judge. A browser may hand the link over percent-encoded as a whole (`krakl:v%3D1%3Bk%3D…`).
    /// A code's own text always starts `krakl:v=`, so a link that starts `krakl:v%3D` (any case) is
    /// decoded exactly once, which also turns a value's escaped escapes (`%253B`) back into the
    /// code's own (`%3B`); any other text is the code as it is. Text that does not decode is left
    /// as it is too, and refused by the parser in its own words.
    public static func text(ofLink link: String) -> String {
        let text = link.trimmingWhitespace()
        guard text.lowercased().hasPrefix(prefix + "v%3d") else { return text }
        return (try? decode(Substring(text), field: "link")) ?? text
    }

    /// Twilio's global signaling endpoint (twilio-video.js's default).
    public static let twilioDefaultURL = URL(string: "wss://global.vss.twilio.com/signaling")!

    /// Three base64url parts whose header decodes to a JSON object: a JWT (judged in full by `AccessToken`).
    public static func looksLikeJWT(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, text.hasPrefix("eyJ"), let header = Base64URL.decode(parts[0]) else { return false }
        return header.first == UInt8(ascii: "{")
    }

    /// A Twilio signaling URL: `wss://`, or `ws://` for a loopback address only (a test server):
    /// the token must never cross a network in the clear.
    public static func signalingURL(_ value: String) throws(JoinCodeError) -> URL {
        func bad(_ reason: String) -> JoinCodeError { .malformedCode(.badURL(reason)) }
        guard value.unicodeScalars.allSatisfy({ isCodeCharacter($0.value) }), let components = URLComponents(string: value),
              let url = components.url else {
            throw bad("\(JoinCodeError.quoted(value)) is not a URL")
        }
        guard let scheme = components.scheme?.lowercased(), scheme == "ws" || scheme == "wss" else {
            throw bad("must be a wss:// URL for a Twilio code (ws:// only for a loopback test server)")
        }
        guard let host = components.host, !host.isEmpty else { throw bad("has no host") }
        guard components.user == nil, components.password == nil else { throw bad("must not contain a user name or password") }
        if scheme == "ws" {
            let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
            guard bare == "localhost" || bare == "::1" || bare.hasPrefix("127.") && IPLiteral.bytes(bare) != nil else {
                throw bad("is ws:// (unencrypted) to \(bare): only loopback addresses may be reached without TLS; use wss://")
            }
        }
        return url
    }

    /// The code as text, fields in the order v, k, u, r, t, ice. Parsing it
    /// gives back an equal code.
    public var text: String { serialized(display: false) }

    /// The code's text, or with `display` the form for messages: token
    /// shortened, no URL query, no ICE credentials.
    private func serialized(display: Bool) -> String {
        let shownURL = display ? Invitation.withoutSecrets(url) : url.absoluteString
        var fields = ["v=\(version)", "k=\(service.rawValue)"]
        if !urlIsDefault { fields.append("u=" + Self.encode(shownURL)) }
        if let room { fields.append("r=" + Self.encode(room)) }
        fields.append("t=" + (display ? String(token.prefix(8)) + "…" : Self.encode(token)))
        if tokenAcrossOrigins { fields.append("xo=1") }
        for server in iceServers {
            var value = Self.encode(server.url)
            if !display && (server.username != nil || server.credential != nil) {
                value += "," + Self.encode(server.username ?? "") + "," + Self.encode(server.credential ?? "")
            }
            fields.append("ice=" + value)
        }
        return Self.prefix + fields.joined(separator: ";")
    }

    /// The code without its secrets (not a usable code): the token
    /// shortened, no URL query, no ICE credentials. The form for messages
    /// and logs; `dump()` shows no more.
    public var description: String { serialized(display: true) }

    public var customMirror: Mirror {
        Mirror(self, children: ["service": service, "url": url, "token": String(token.prefix(8)) + "…", "room": room as Any,
                                "iceServers": iceServers])
    }

    static let prefix = "krakl:"

    /// What a required field is for, for the message that it is missing.
    static func fieldPurpose(_ name: String) -> String {
        switch name {
        case "k": return "the service kind, whip, janus or twilio"
        case "u": return "the room server's URL"
        case "t": return "the access token"
        default: return "see docs/join-codes.md"
        }
    }

    private static func isCodeCharacter(_ value: UInt32) -> Bool { (0x21...0x7E).contains(value) }

    /// Bytes that `encode` escapes besides those outside 0x21-0x7E: the
    /// escape itself and the three separators.
    private static let reserved: Set<UInt8> = Set("%;,=".utf8)

    static func encode(_ value: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(value.utf8.count)
        for byte in value.utf8 {
            if isCodeCharacter(UInt32(byte)) && !reserved.contains(byte) {
                bytes.append(byte)
            } else {
                bytes += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 15)]]
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Undoes `encode`. A raw `=` or `,` (where it is not a separator) is
    /// taken as itself: the escape is required of writers, not of readers.
    static func decode(_ raw: Substring, field: String) throws(JoinCodeError) -> String {
        guard raw.contains("%") else { return String(raw) }
        var bytes: [UInt8] = []
        var iterator = raw.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else { bytes.append(byte); continue }
            guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                throw .malformedCode(.badPercentEncoding(field: field))
            }
            bytes.append(high << 4 | low)
        }
        guard let text = String(validating: bytes, as: UTF8.self) else { throw .malformedCode(.badPercentEncoding(field: field)) }
        return text
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    private static func serviceURL(_ value: String) throws(JoinCodeError) -> URL {
        func bad(_ reason: String) -> JoinCodeError { .malformedCode(.badURL(reason)) }
        guard value.unicodeScalars.allSatisfy({ isCodeCharacter($0.value) }) else {
            throw bad("has characters outside printable ASCII (write an international host name in punycode)")
        }
        guard let components = URLComponents(string: value), let url = components.url else {
            throw bad("\(JoinCodeError.quoted(value)) is not a URL")
        }
        guard let scheme = components.scheme?.lowercased(), scheme == "http" || scheme == "https" else {
            throw bad("must be an absolute http:// or https:// URL")
        }
        guard let host = components.host, !host.isEmpty else { throw bad("has no host") }
        // Credentials inside a URL would show wherever the URL is shown.
        guard components.user == nil, components.password == nil else { throw bad("must not contain a user name or password") }
        return url
    }

    private static func roomProblem(_ room: String) -> String? {
        if room.isEmpty { return "is empty (leave r= out if the token names the room)" }
        if room.unicodeScalars.count > maximumRoomLength {
            return "is \(room.unicodeScalars.count) characters long, more than the \(maximumRoomLength) allowed"
        }
        if room.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) { return "has a control character" }
        return nil
    }

    /// `URL[,username,credential]`, each part escaped on its own so a comma
    /// in a credential is `%2C`.
    private static func iceServer(_ raw: Substring, index: Int) throws(JoinCodeError) -> IceServer {
        func bad(_ reason: String) -> JoinCodeError { .malformedCode(.badIceServer(index: index, reason: reason)) }
        let parts = raw.split(separator: ",", omittingEmptySubsequences: false)
        guard parts.count == 1 || parts.count == 3 else {
            throw bad("write ice=URL or ice=URL,username,credential (escape a ',' inside a value as %2C)")
        }
        var values: [String] = []
        for part in parts { values.append(try decode(part, field: "ice")) }
        let url = values[0]
        guard url.unicodeScalars.allSatisfy({ isCodeCharacter($0.value) }) else { throw bad("its URL has characters outside printable ASCII") }
        if let problem = IceServerURL.problem(url) { throw bad(problem) }
        guard values.count == 3 else {
            guard url.lowercased().hasPrefix("stun:") else { throw bad("a TURN server needs a username and a credential") }
            return IceServer(url: url)
        }
        guard !values[1].isEmpty, !values[2].isEmpty else { throw bad("empty username or credential") }
        return IceServer(url: url, username: values[1], credential: values[2])
    }
}
