import KraklBase

/// A send-only video offer with one bundled m-section, in the shape browsers
/// write (RFC 8829 §5.2), so SFUs written against Chrome's offers accept it.
public struct SdpVideoOffer: Sendable {
    /// One codec the offer proposes, with its retransmission payload type (RFC 4588).
    public struct Codec: Sendable, Equatable {
        public var codec: VideoCodec
        public var payloadType: UInt8
        public var rtxPayloadType: UInt8?
        /// The `a=fmtp` parameters, e.g. "profile-id=0" for VP9 (RFC 9628 §6).
        public var parameters: String?

        public init(codec: VideoCodec, payloadType: UInt8, rtxPayloadType: UInt8?, parameters: String? = nil) {
            self.codec = codec
            self.payloadType = payloadType
            self.rtxPayloadType = rtxPayloadType
            self.parameters = parameters
        }

        public static let vp8 = Codec(codec: .vp8, payloadType: 96, rtxPayloadType: 97)
        public static let vp9 = Codec(codec: .vp9, payloadType: 98, rtxPayloadType: 99, parameters: "profile-id=0")
    }

    public var sessionID: UInt64
    public var sessionVersion: UInt64 = 2
    public var iceUfrag: String
    public var icePwd: String
    /// Advertise `a=ice-options:trickle`: candidates may follow the offer.
    public var trickle: Bool = true
    public var fingerprint: CertificateFingerprint
    /// Offers must say actpass (RFC 8842 §5.2); kept a parameter for the receiving role later.
    public var setup: DtlsSetup = .actpass
    public var direction: MediaDirection = .sendonly
    public var mid: String = "0"
    /// The `s=` line: who publishes, for servers that show it (RFC 8866 §5.3 allows any text; "-" when none).
    public var sessionName: String = "-"
    public var streamID: String
    public var trackID: String
    public var ssrc: UInt32
    /// The SSRC retransmissions use; announced with `a=ssrc-group:FID` so receivers can pair them.
    public var rtxSSRC: UInt32?
    public var cname: String
    public var codecs: [Codec] = [.vp8, .vp9]
    public var feedback: [RtcpFeedback] = RtcpFeedback.offered
    /// Header extensions and their one-byte ids (1-14).
    public var extensions: [(kind: RtpHeaderExtensionKind, id: UInt8)] = [(.mid, 1), (.absSendTime, 2), (.transportWideSequence, 3)]
    /// Candidates known when the offer is written; the rest trickle.
    public var candidates: [IceCandidate] = []
    /// Write `a=end-of-candidates` (gathering finished before the offer went out).
    public var endOfCandidates: Bool = false

    public init(sessionID: UInt64, iceUfrag: String, icePwd: String, fingerprint: CertificateFingerprint,
                streamID: String, trackID: String, ssrc: UInt32, rtxSSRC: UInt32?, cname: String) {
        self.sessionID = sessionID
        self.iceUfrag = iceUfrag
        self.icePwd = icePwd
        self.fingerprint = fingerprint
        self.streamID = streamID
        self.trackID = trackID
        self.ssrc = ssrc
        self.rtxSSRC = rtxSSRC
        self.cname = cname
    }

    /// `text` without line breaks or other control characters, at most 128 characters; "-" when empty.
    static func oneLine(_ text: String) -> String {
        let kept = String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(128).map(Character.init))
        return kept.isEmpty ? "-" : kept
    }

    /// A media stream id from a person's label: msid ids are 1-64 token characters (RFC 8830 §2,
    /// RFC 4566 token), so anything else becomes "-" ("Ada's screen" → "Ada-s-screen").
    public static func streamID(from label: String) -> String {
        let allowed = Set("!#$%&'*+-.^_`{|}~".unicodeScalars).subtracting(["'"])
        let id = String(label.unicodeScalars.prefix(64).map { c -> Character in
            (c.isASCII && (c.properties.isAlphabetic || ("0"..."9").contains(c) || allowed.contains(c))) ? Character(c) : "-"
        })
        return id.isEmpty ? "krakl-screen" : id
    }

    /// The offer text, CRLF line ends.
    public var sdp: String {
        var l: [String] = [
            "v=0",
            "o=- \(sessionID) \(sessionVersion) IN IP4 127.0.0.1",
            "s=\(Self.oneLine(sessionName))",
            "t=0 0",
            "a=group:BUNDLE \(mid)",
            "a=msid-semantic: WMS \(streamID)",
            "m=video 9 UDP/TLS/RTP/SAVPF " + codecs.flatMap { [$0.payloadType] + ($0.rtxPayloadType.map { [$0] } ?? []) }.map { "\($0)" }.joined(separator: " "),
            "c=IN IP4 0.0.0.0",
            "a=rtcp:9 IN IP4 0.0.0.0",
            "a=ice-ufrag:\(iceUfrag)",
            "a=ice-pwd:\(icePwd)",
        ]
        if trickle { l.append("a=ice-options:trickle") }
        l += ["a=fingerprint:\(fingerprint.sdpValue)", "a=setup:\(setup.rawValue)", "a=mid:\(mid)"]
        l += extensions.map { "a=extmap:\($0.id) \($0.kind.uri)" }
        l += ["a=\(direction.rawValue)", "a=msid:\(streamID) \(trackID)", "a=rtcp-mux", "a=rtcp-rsize"]
        for c in codecs {
            l.append("a=rtpmap:\(c.payloadType) \(c.codec.sdpName)/90000")
            l += feedback.map { "a=rtcp-fb:\(c.payloadType) \($0)" }
            if let p = c.parameters { l.append("a=fmtp:\(c.payloadType) \(p)") }
            if let rtx = c.rtxPayloadType {
                l += ["a=rtpmap:\(rtx) rtx/90000", "a=fmtp:\(rtx) apt=\(c.payloadType)"]
            }
        }
        if let rtxSSRC { l.append("a=ssrc-group:FID \(ssrc) \(rtxSSRC)") }
        for s in [ssrc] + (rtxSSRC.map { [$0] } ?? []) {
            l += ["a=ssrc:\(s) cname:\(cname)", "a=ssrc:\(s) msid:\(streamID) \(trackID)"]
        }
        l += candidates.map { "a=\($0.sdpValue)" }
        if endOfCandidates { l.append("a=end-of-candidates") }
        return l.joined(separator: "\r\n") + "\r\n"
    }
}
