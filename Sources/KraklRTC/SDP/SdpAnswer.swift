import KraklBase

/// Why an answer cannot be used. Each message says what the answer lacked and
/// what a working answer contains, so a room driver can log it as is.
public enum SdpError: Error, Equatable, CustomStringConvertible {
    case malformedLine(number: Int, text: String, reason: String)
    case noVideoSection
    case videoRejected
    case missingIceCredentials(String)
    case badIceCredentials(String)
    case missingFingerprint
    case badFingerprint(String)
    case badSetup(String)
    case noCommonCodec(answered: [String])
    case notReceiving(MediaDirection)
    case badCandidate(String, String)
    /// A remote offer we cannot answer with video (the reason says what it lacked).
    case noUsableVideo(String)
    case offerNotAnswerable(String)

    /// One printable line: the peer's text quoted in these messages (a line, a value, a candidate)
    /// may hold control characters, shown escaped (`\n`, `\x01`) so the message stays one log line.
    public var description: String { Self.printable(words) }

    /// At most `limit` characters of the peer's text, escaped first (so the cut is of what is shown).
    static func excerpt(_ text: some StringProtocol, _ limit: Int) -> String { String(printable(String(text.prefix(limit * 4))).prefix(limit)) }

    static func printable(_ text: String) -> String {
        var line = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": line += "\\n"
            case "\r": line += "\\r"
            case "\t": line += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F || (0x80..<0xA0).contains(scalar.value):
                line += (scalar.value < 0x10 ? "\\x0" : "\\x") + String(scalar.value, radix: 16, uppercase: true)
            default: line.unicodeScalars.append(scalar)
            }
        }
        return line
    }

    private var words: String {
        switch self {
        case .malformedLine(let n, let text, let reason):
            return "SDP answer line \(n) \"\(Self.excerpt(text, 80))\" is malformed: \(reason)"
        case .noVideoSection:
            return "SDP answer has no m=video section: the peer did not answer our video offer"
        case .videoRejected:
            return "SDP answer rejected the video section (port 0): the peer will not receive our video"
        case .missingIceCredentials(let which):
            return "SDP answer has no a=\(which) (at media or session level): ICE cannot authenticate checks without it"
        case .badIceCredentials(let why):
            return "SDP answer's ICE credentials are invalid: \(why)"
        case .missingFingerprint:
            return "SDP answer has no a=fingerprint: DTLS cannot verify the peer, refusing to connect"
        case .badFingerprint(let value):
            return "SDP answer's a=fingerprint \"\(value)\" is not \"<hash> XX:XX:...\" with a known hash of matching length"
        case .badSetup(let value):
            return "SDP answer's a=setup:\(value) is not usable: an answer must say active or passive (RFC 8842 §5.3)"
        case .noCommonCodec(let answered):
            return "SDP answer accepts none of our codecs (VP8, VP9) as offered; it lists: \(answered.isEmpty ? "nothing" : answered.joined(separator: ", "))"
        case .notReceiving(let direction):
            return "SDP answer says a=\(direction.rawValue) for our send-only video: the peer will not receive it"
        case .badCandidate(let line, let why):
            return "SDP candidate \"\(Self.excerpt(line, 100))\" is malformed: \(why)"
        case .noUsableVideo(let why):
            return "SDP offer has no video we can send: \(why)"
        case .offerNotAnswerable(let why):
            return "SDP offer cannot be answered: \(why)"
        }
    }

    /// An a=candidate value read by ICE, its failure as SDP's.
    static func candidate(_ text: String) throws(SdpError) -> IceCandidate {
        do throws(IceCandidateError) { return try IceCandidate(parsing: text) } catch { throw .badCandidate(error.text, error.why) }
    }
}

/// What the answer accepted, read from its video m-section (and session-level attributes it inherits).
public struct SdpAnswer: Sendable {
    /// The codec to send: the first one in the answer's format list that we offered.
    public var codec: VideoCodec
    public var payloadType: UInt8
    /// The rtx payload type bound to `payloadType` by `apt=`; nil means no retransmission stream.
    public var rtxPayloadType: UInt8?
    /// The answer's fmtp parameters for the chosen codec.
    public var parameters: [String: String]
    /// Feedback kept for the chosen codec (plus any `a=rtcp-fb:*` lines).
    public var feedback: Set<RtcpFeedback>
    /// Header extension ids the answer kept; send only these.
    public var extensions: [RtpHeaderExtensionKind: UInt8]
    public var iceUfrag: String
    public var icePwd: String
    /// `a=ice-lite`: the peer never checks; we must be the controlling side (RFC 8445 §6.1.1).
    public var iceLite: Bool
    public var iceOptions: [String]
    public var candidates: [IceCandidate]
    public var endOfCandidates: Bool
    /// The fingerprint DTLS must verify (sha-256 when several are given), and all given ones.
    public var fingerprint: CertificateFingerprint
    public var fingerprints: [CertificateFingerprint]
    /// The peer's DTLS role: active means we are the DTLS server.
    public var setup: DtlsSetup
    public var direction: MediaDirection
    public var mid: String?
    public var rtcpMux: Bool
    public var rtcpReducedSize: Bool
    /// The `c=` address and m= port, a candidate of last resort for peers that list none.
    public var connectionAddress: String?
    public var port: UInt16

    public func accepts(_ feedback: RtcpFeedback) -> Bool { self.feedback.contains(feedback) }

    /// Reads an answer. Pass the offer it answers so codecs and extensions are checked against
    /// what we proposed (a payload type we did not offer is not used).
    public init(parsing text: String, offer: SdpVideoOffer? = nil) throws(SdpError) {
        let document = try SdpDocument(text)
        guard let video = document.media.first(where: { $0.kind == "video" }) else { throw .noVideoSection }
        guard video.port != 0 else { throw .videoRejected }
        port = video.port
        func value(_ name: String) -> String? { video.value(name) ?? document.session.value(name) }

        // ICE (RFC 8839 §5.4): ufrag 4-256 ice-chars, pwd 22-256.
        (iceUfrag, icePwd) = try SdpIceCredentials.read(value)
        iceLite = document.session.has("ice-lite")
        iceOptions = (value("ice-options") ?? "").split(separator: " ").map(String.init)

        // DTLS (RFC 8122 §5, RFC 8842 §5).
        (fingerprints, fingerprint) = try SdpFingerprints.read(video, session: document.session)
        let setupText = value("setup") ?? "active" // RFC 4145 §4: absent means active
        guard let setup = DtlsSetup(rawValue: setupText), setup == .active || setup == .passive else {
            throw .badSetup(setupText)
        }
        self.setup = setup

        direction = MediaDirection.allAttributes.first { video.has($0.rawValue) } ?? MediaDirection.allAttributes.first { document.session.has($0.rawValue) } ?? .sendrecv
        guard direction.receives else { throw .notReceiving(direction) }
        mid = video.value("mid")
        rtcpMux = video.has("rtcp-mux")
        rtcpReducedSize = video.has("rtcp-rsize")
        connectionAddress = video.connection ?? document.session.connection

        let chosen = try Self.chooseCodec(video, offered: offer?.codecs)
        codec = chosen.codec
        payloadType = chosen.payloadType
        parameters = chosen.parameters
        rtxPayloadType = chosen.rtxPayloadType
        feedback = video.feedback(for: chosen.payloadType)
        extensions = Self.keptExtensions(video, offer: offer)

        candidates = try video.values("candidate").map(SdpError.candidate)
        endOfCandidates = video.has("end-of-candidates") || document.session.has("end-of-candidates")
    }

    /// The codec the answer accepted: the first in its format list that we offered (any we send,
    /// without an offer to check against), with its fmtp parameters and the rtx type bound to it.
    private static func chooseCodec(_ video: SdpMediaSection, offered: [SdpVideoOffer.Codec]?) throws(SdpError)
        -> (codec: VideoCodec, payloadType: UInt8, parameters: [String: String], rtxPayloadType: UInt8?) {
        // Codecs: a=rtpmap gives names; formats without one are static types we never offer.
        var names: [UInt8: String] = [:]
        var fmtp: [UInt8: [String: String]] = [:]
        for (pt, rest) in video.byPayloadType("rtpmap") {
            names[pt] = rest.split(separator: "/").first.map { $0.uppercased() }
        }
        for (pt, rest) in video.byPayloadType("fmtp") {
            fmtp[pt] = SdpMediaSection.fmtp(rest)
        }
        var chosen: (VideoCodec, UInt8)?
        for pt in video.formats {
            guard let name = names[pt], let codec = VideoCodec(sdpName: name) else { continue }
            if let offered, !offered.contains(where: { $0.payloadType == pt && $0.codec == codec }) { continue }
            // VP9 profiles other than 0 need 4:4:4 or high bit depth input we never produce.
            if codec == .vp9, let profile = fmtp[pt]?["profile-id"], profile != "0" { continue }
            chosen = (codec, pt)
            break
        }
        guard let (codec, pt) = chosen else {
            throw .noCommonCodec(answered: video.formats.map { p in names[p].map { "\($0)/\(p)" } ?? "\(p)" })
        }
        let rtx = video.formats.first { p in
            names[p] == "RTX" && fmtp[p]?["apt"] == String(pt)
                && (offered == nil || offered!.contains { $0.rtxPayloadType == p })
        }
        return (codec, pt, fmtp[pt] ?? [:], rtx)
    }

    /// The header extensions the answer kept (of those we offered, when we know the offer).
    private static func keptExtensions(_ video: SdpMediaSection, offer: SdpVideoOffer?) -> [RtpHeaderExtensionKind: UInt8] {
        var extensions: [RtpHeaderExtensionKind: UInt8] = [:]
        for (id, kind) in video.headerExtensions {
            if let offer, !offer.extensions.contains(where: { $0.kind == kind }) { continue }
            extensions[kind] = id
        }
        return extensions
    }

    /// Digest lengths by SDP hash name (RFC 8122 §5, IANA hash function textual names).
    static let digestLength: [String: Int] = ["sha-1": 20, "sha-224": 28, "sha-256": 32, "sha-384": 48, "sha-512": 64, "md5": 16]
}

extension MediaDirection {
    static let allAttributes: [MediaDirection] = [.sendrecv, .sendonly, .recvonly, .inactive]
}

extension Character {
    /// RFC 8839 §5.4 ice-char: ALPHA / DIGIT / "+" / "/".
    var isIceChar: Bool { isASCII && (isLetter || isNumber || self == "+" || self == "/") }
}

/// An SDP text split into the session part and its m-sections; only the
/// syntax (RFC 8866 §5: `<type>=<value>` lines) is checked here.
struct SdpDocument {
    var session = SdpMediaSection(kind: "", port: 0, formats: [])
    var media: [SdpMediaSection] = []

    init(_ text: String) throws(SdpError) {
        var sawVersion = false
        for (index, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let line = raw
            if line.trimmingSpaces.isEmpty { continue }
            let number = index + 1
            let chars = Array(line.prefix(2))
            guard chars.count == 2, chars[1] == "=", chars[0].isASCII, chars[0].isLetter else {
                throw .malformedLine(number: number, text: String(line), reason: "SDP lines are <letter>=<value>")
            }
            let value = String(line.dropFirst(2))
            switch chars[0] {
            case "v":
                guard value == "0" else { throw .malformedLine(number: number, text: String(line), reason: "only v=0 exists") }
                sawVersion = true
            case "m":
                let f = value.split(separator: " ", omittingEmptySubsequences: true)
                guard f.count >= 3, let portText = f[1].split(separator: "/").first, let port = UInt16(portText) else {
                    throw .malformedLine(number: number, text: String(line), reason: "m= needs <media> <port> <proto> <fmt>...")
                }
                var section = SdpMediaSection(kind: String(f[0]), port: port, formats: f.dropFirst(3).compactMap { UInt8($0) })
                section.proto = String(f[2])
                section.rawFormats = f.dropFirst(3).map(String.init)
                media.append(section)
            case "a":
                let parts = value.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                let name = String(parts[0]).lowercased()
                let attribute = (name, parts.count > 1 ? String(parts[1].trimmingSpaces) : nil)
                if media.isEmpty { session.attributes.append(attribute) } else { media[media.count - 1].attributes.append(attribute) }
            case "c":
                let f = value.split(separator: " ")
                let address = f.count == 3 ? String(f[2].split(separator: "/")[0]) : nil
                if media.isEmpty { session.connection = address } else { media[media.count - 1].connection = address }
            default:
                break
            }
        }
        guard sawVersion else { throw .malformedLine(number: 1, text: String(text.prefix(40)), reason: "an SDP starts with v=0") }
    }
}

/// One m-section (or the session level): its m= line and attributes in order.
struct SdpMediaSection {
    var kind: String
    var port: UInt16
    var formats: [UInt8]
    /// The m= line's transport and format tokens as written (a data channel's are not numbers).
    var proto = ""
    var rawFormats: [String] = []
    var connection: String?
    var attributes: [(name: String, value: String?)] = []

    init(kind: String, port: UInt16, formats: [UInt8]) {
        self.kind = kind
        self.port = port
        self.formats = formats
    }

    func has(_ name: String) -> Bool { attributes.contains { $0.name == name } }
    func value(_ name: String) -> String? { attributes.first { $0.name == name }?.value }
    func values(_ name: String) -> [String] { attributes.filter { $0.name == name }.compactMap(\.value) }

    /// `a=<name>:<pt> <rest>` lines keyed by payload type.
    func byPayloadType(_ name: String) -> [(UInt8, String)] {
        values(name).map(Self.splitFirstWord).compactMap { key, rest in UInt8(key).map { ($0, rest) } }
    }

    static func splitFirstWord(_ s: String) -> (String, String) {
        let parts = s.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        return (parts.first.map(String.init) ?? "", parts.count > 1 ? String(parts[1].trimmingSpaces) : "")
    }

    /// An a=fmtp value's `key=value;…` parameters, keys lowercased.
    static func fmtp(_ text: String) -> [String: String] {
        var parameters: [String: String] = [:]
        for pair in text.split(separator: ";") {
            let kv = pair.split(separator: "=", maxSplits: 1).map { String($0.trimmingSpaces) }
            if let k = kv.first, !k.isEmpty { parameters[k.lowercased()] = kv.count > 1 ? kv[1] : "" }
        }
        return parameters
    }

    /// The a=rtcp-fb feedback listed for payload type `pt` (and for all, `*`).
    func feedback(for pt: UInt8) -> Set<RtcpFeedback> {
        var feedback = Set<RtcpFeedback>()
        for (key, rest) in values("rtcp-fb").map(Self.splitFirstWord) where key == String(pt) || key == "*" {
            let words = rest.split(separator: " ", omittingEmptySubsequences: true)
            if let type = words.first { feedback.insert(RtcpFeedback(String(type), words.count > 1 ? String(words[1]) : nil)) }
        }
        return feedback
    }

    /// The a=extmap lines we can write, in order: a kind we know, on a one-byte id.
    var headerExtensions: [(id: UInt8, kind: RtpHeaderExtensionKind)] {
        values("extmap").map(Self.splitFirstWord).compactMap { idText, rest in
            // "1/recvonly uri" carries a direction after the id (RFC 8285 §8).
            let idPart = idText.split(separator: "/").first.map(String.init) ?? idText
            let uri = rest.split(separator: " ").first.map(String.init) ?? ""
            guard let id = UInt8(idPart), let kind = RtpHeaderExtensionKind(rawValue: uri) else { return nil }
            guard (1...14).contains(id) else { return nil } // two-byte ids need the two-byte form, which we do not send
            return (id, kind)
        }
    }
}

/// The peer's certificate fingerprints (RFC 8122 §5), from a media section or the session level, each
/// a known hash of matching length; the one DTLS must verify is sha-256 when several are given.
enum SdpFingerprints {
    /// - Parameter limit: at most this many characters of a bad value are quoted in the error.
    static func read(_ media: SdpMediaSection, session: SdpMediaSection, quoting limit: Int = .max) throws(SdpError)
        -> (all: [CertificateFingerprint], verified: CertificateFingerprint) {
        let values = media.values("fingerprint").isEmpty ? session.values("fingerprint") : media.values("fingerprint")
        guard !values.isEmpty else { throw .missingFingerprint }
        var fingerprints: [CertificateFingerprint] = []
        for text in values {
            guard let f = CertificateFingerprint(sdp: text), let expected = SdpAnswer.digestLength[f.algorithm], expected == f.bytes.count else {
                throw .badFingerprint(String(text.prefix(limit)))
            }
            fingerprints.append(f)
        }
        return (fingerprints, fingerprints.first { $0.algorithm == "sha-256" } ?? fingerprints[0])
    }
}

/// The peer's ICE credentials (RFC 8839 §5.4: ufrag 4-256 ice-chars, pwd 22-256), from a media
/// section or the session level; the same rule for answers we read and offers we answer.
enum SdpIceCredentials {
    static func read(_ value: (String) -> String?) throws(SdpError) -> (ufrag: String, pwd: String) {
        guard let ufrag = value("ice-ufrag") else { throw .missingIceCredentials("ice-ufrag") }
        guard let pwd = value("ice-pwd") else { throw .missingIceCredentials("ice-pwd") }
        guard (4...256).contains(ufrag.count), ufrag.allSatisfy(\.isIceChar) else {
            throw .badIceCredentials("ice-ufrag \"\(ufrag.prefix(40))\" must be 4-256 characters of A-Z a-z 0-9 + /")
        }
        guard (22...256).contains(pwd.count), pwd.allSatisfy(\.isIceChar) else {
            throw .badIceCredentials("ice-pwd must be 22-256 characters of A-Z a-z 0-9 + / (it has \(pwd.count))")
        }
        return (ufrag, pwd)
    }
}

extension VideoSendParameters {
    /// The stream's parameters as our offer's answer set them (SDP reads them; RTP needs nothing of SDP).
    public init(answer: SdpAnswer, offerMid: String) {
        self.init(codec: answer.codec, payloadType: answer.payloadType, rtxPayloadType: answer.rtxPayloadType,
                  extensions: answer.extensions, mid: answer.mid ?? offerMid)
    }
}
