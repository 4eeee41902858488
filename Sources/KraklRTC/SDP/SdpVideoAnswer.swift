import KraklBase

/// A remote offer, read for answering it with our one send-only video stream: a browser's or a WHEP
/// player's recvonly offer, usually with audio and video and sometimes a data channel.
///
/// With `SdpVideoOffer` (our offers) and `SdpAnswer` (answers to them) this completes the session
/// description model: all three share `SdpDocument`'s syntax checks, and `SdpVideoAnswer` writes
/// what is read here back as an answer. Only the first video section that receives, with a codec we
/// have, is used; every other section is listed so the answer can reject it in place (RFC 8829
/// §5.3.1: an answer has the offer's m-sections in the offer's order).
public struct SdpRemoteOffer: Sendable {
    /// One m-section of the offer, as the answer must echo it.
    public struct Section: Sendable, Equatable {
        public var kind: String
        public var proto: String
        public var formats: [String]
        public var mid: String?
        /// The `a=rtpmap` value of the first format, echoed in the rejection (aiortc reads codecs even from a
        /// rejected section and fails without one).
        public var rtpmap: String?
    }

    public var sections: [Section]
    /// Index in `sections` of the video section we answer.
    public var videoIndex: Int
    /// The offer's BUNDLE group (mids), empty when it has none.
    public var bundle: [String]

    public var codec: VideoCodec
    /// The payload type the offer gave our codec: the answer and every RTP packet use it.
    public var payloadType: UInt8
    /// The offer's rtx type for `payloadType` (`apt=`), if it offered one.
    public var rtxPayloadType: UInt8?
    /// The codec's fmtp line as offered (VP9's profile-id), echoed in the answer.
    public var parameters: String?
    /// Feedback the offer asks for that we serve, in our order.
    public var feedback: [RtcpFeedback]
    /// Header extensions the offer proposes that we write, with the offer's ids.
    public var extensions: [RtpHeaderExtensionKind: UInt8]
    public var mid: String
    public var iceUfrag: String
    public var icePwd: String
    public var iceLite: Bool
    public var candidates: [IceCandidate]
    public var fingerprint: CertificateFingerprint
    /// The offerer's `a=setup` (actpass from browsers).
    public var setup: DtlsSetup
    public var rtcpReducedSize: Bool
    public var connectionAddress: String?
    public var port: UInt16

    /// Reads an offer.
    /// - Parameter codecs: what we can send, most preferred first (VP8, then VP9); the offer's order
    ///   does not matter, since the encoder is ours.
    /// - Throws: `SdpError` for malformed SDP, missing ICE or DTLS parameters, or no video section that
    ///   receives one of `codecs` over `UDP/TLS/RTP/SAVPF` with rtcp-mux.
    public init(parsing text: String, codecs: [VideoCodec] = [.vp8, .vp9]) throws(SdpError) {
        let document = try SdpDocument(text)
        sections = try Self.sections(of: document)
        bundle = document.session.values("group").first { $0.hasPrefix("BUNDLE") }
            .map { $0.split(separator: " ").dropFirst().map(String.init) } ?? []

        let chosen = try Self.chooseVideo(document, codecs: codecs)
        let video = document.media[chosen.index]
        videoIndex = chosen.index
        codec = chosen.codec
        payloadType = chosen.pt
        func value(_ name: String) -> String? { video.value(name) ?? document.session.value(name) }
        // Answers must carry a mid when the offer has one (RFC 8843); an offer without mids gets "0".
        mid = video.value("mid") ?? "0"

        let fmtps = video.byPayloadType("fmtp")
        parameters = fmtps.first { $0.0 == chosen.pt }?.1
        rtxPayloadType = video.formats.first { p in
            video.byPayloadType("rtpmap").contains { $0.0 == p && $0.1.lowercased().hasPrefix("rtx/") }
                && fmtps.contains { $0.0 == p && SdpMediaSection.fmtp($0.1)["apt"] == String(chosen.pt) }
        }
        let offeredFeedback = video.feedback(for: chosen.pt)
        var extensions: [RtpHeaderExtensionKind: UInt8] = [:]
        for (id, kind) in video.headerExtensions where !extensions.values.contains(id) {
            extensions[kind] = id
        }
        self.extensions = extensions
        // transport-cc feedback without its sequence extension would be feedback about nothing.
        feedback = RtcpFeedback.offered.filter { offeredFeedback.contains($0) && ($0 != .transportCC || extensions[.transportWideSequence] != nil) }

        // ICE (RFC 8839 §5.4) and DTLS (RFC 8122, RFC 8842), as for answers.
        (iceUfrag, icePwd) = try SdpIceCredentials.read(value)
        iceLite = document.session.has("ice-lite")
        fingerprint = try SdpFingerprints.read(video, session: document.session, quoting: 200).verified
        let setupText = value("setup") ?? "active"  // RFC 4145 §4: absent means active
        guard let setup = DtlsSetup(rawValue: setupText), setup != .holdconn else { throw .badSetup(String(setupText.prefix(40))) }
        self.setup = setup
        rtcpReducedSize = video.has("rtcp-rsize")
        connectionAddress = video.connection ?? document.session.connection
        port = video.port
        candidates = try video.values("candidate").prefix(64).map(SdpError.candidate)
    }

    /// Every m-section as the answer must echo it: only token characters are echoed, and mids must be
    /// tokens and unique.
    private static func sections(of document: SdpDocument) throws(SdpError) -> [Section] {
        guard !document.media.isEmpty else { throw .noUsableVideo("it has no m= section at all") }
        guard document.media.count <= 64 else { throw .offerNotAnswerable("\(document.media.count) m-sections (at most 64)") }
        var sections: [Section] = []
        for media in document.media {
            let mid = media.value("mid")
            if let mid, !SdpRemoteOffer.isToken(mid) {
                throw .offerNotAnswerable("a=mid:\(mid.prefix(40)) is not 1-32 token characters (RFC 8843 §4)")
            }
            let formats = media.rawFormats.filter { SdpRemoteOffer.isToken($0) }
            let rtpmap = formats.first.flatMap { first in media.values("rtpmap").first { $0.hasPrefix(first + " ") } }
            sections.append(Section(kind: SdpRemoteOffer.isToken(media.kind) ? media.kind : "unknown",
                                    proto: SdpRemoteOffer.isToken(media.proto, slash: true) ? media.proto : "UDP/TLS/RTP/SAVPF",
                                    formats: formats, mid: mid,
                                    rtpmap: rtpmap.flatMap { SdpVideoOffer.oneLine($0) == $0 && $0.count <= 64 ? $0 : nil }))
        }
        let mids = sections.compactMap(\.mid)
        guard Set(mids).count == mids.count else { throw .offerNotAnswerable("two m-sections share a mid") }
        return sections
    }

    /// The first video section that can carry our stream; when none can, the error says why each could not.
    private static func chooseVideo(_ document: SdpDocument, codecs: [VideoCodec]) throws(SdpError) -> (index: Int, codec: VideoCodec, pt: UInt8) {
        var reasons: [String] = []
        for (index, media) in document.media.enumerated() where media.kind == "video" {
            let direction = MediaDirection.allAttributes.first { media.has($0.rawValue) }
                ?? MediaDirection.allAttributes.first { document.session.has($0.rawValue) } ?? .sendrecv
            guard media.port != 0 else { reasons.append("video section \(index) is disabled (port 0)"); continue }
            guard direction.receives else { reasons.append("video section \(index) is a=\(direction.rawValue): the peer does not receive"); continue }
            guard media.proto == "UDP/TLS/RTP/SAVPF" else { reasons.append("video section \(index) uses \(media.proto.prefix(40)), not UDP/TLS/RTP/SAVPF"); continue }
            guard media.has("rtcp-mux") else { reasons.append("video section \(index) lacks a=rtcp-mux (RFC 8829 requires it)"); continue }
            guard let found = codec(in: media, codecs: codecs) else {
                reasons.append("video section \(index) offers none of \(codecs.map(\.sdpName).joined(separator: ", "))")
                continue
            }
            return (index, found.0, found.1)
        }
        throw .noUsableVideo(reasons.isEmpty ? "it has no m=video section (an offer to view must ask for video, recvonly)"
                                             : reasons.joined(separator: "; "))
    }

    /// The first of `codecs` (ours, most preferred first) that the section offers, with its payload type.
    private static func codec(in media: SdpMediaSection, codecs: [VideoCodec]) -> (VideoCodec, UInt8)? {
        var names: [UInt8: VideoCodec] = [:]
        for (pt, rest) in media.byPayloadType("rtpmap") {
            if let name = rest.split(separator: "/").first, let codec = VideoCodec(sdpName: name.uppercased()) { names[pt] = codec }
        }
        for codec in codecs {
            for pt in media.formats where names[pt] == codec {
                // VP9 profiles other than 0 need 4:4:4 or high bit depth input we never produce.
                if codec == .vp9, let fmtp = media.byPayloadType("fmtp").first(where: { $0.0 == pt })?.1,
                   let profile = SdpMediaSection.fmtp(fmtp)["profile-id"], profile != "0" { continue }
                return (codec, pt)
            }
        }
        return nil
    }

    /// RFC 8866 token characters (plus "/" for a proto), 1-32 of them: safe to echo into our answer.
    static func isToken(_ text: String, slash: Bool = false) -> Bool {
        (1...32).contains(text.count) && text.unicodeScalars.allSatisfy { c in
            c.isASCII && (c.properties.isAlphabetic || ("0"..."9").contains(c) || "!#$%&'*+-.^_`{|}~".unicodeScalars.contains(c) || (slash && c == "/"))
        }
    }
}

/// Our answer to a `SdpRemoteOffer`: the chosen video section send-only with our SSRCs, fingerprint,
/// ICE credentials and candidates; every other section rejected in place (port 0, RFC 8829 §5.3.1)
/// and left out of the BUNDLE group (RFC 8843 §7.3.3), so the peer's audio and data channel are
/// declined rather than misunderstood.
public struct SdpVideoAnswer: Sendable {
    public var offer: SdpRemoteOffer
    public var sessionID: UInt64
    public var sessionName = "-"
    public var iceUfrag: String
    public var icePwd: String
    /// Write `a=ice-lite`: we answer checks and never send any.
    public var iceLite = false
    public var fingerprint: CertificateFingerprint
    /// Our DTLS role, from the offer's (`setup(answering:)`).
    public var setup: DtlsSetup
    public var streamID: String
    public var trackID: String
    public var ssrc: UInt32
    /// Announced (with `a=ssrc-group:FID`) only when the offer had rtx for our codec.
    public var rtxSSRC: UInt32?
    public var cname: String
    /// Gathered before answering (no trickle from us: the answer carries all, then end-of-candidates).
    public var candidates: [IceCandidate] = []

    public init(offer: SdpRemoteOffer, sessionID: UInt64, iceUfrag: String, icePwd: String, fingerprint: CertificateFingerprint,
                streamID: String, trackID: String, ssrc: UInt32, rtxSSRC: UInt32?, cname: String) {
        self.offer = offer
        self.sessionID = sessionID
        self.iceUfrag = iceUfrag
        self.icePwd = icePwd
        self.fingerprint = fingerprint
        self.setup = Self.setup(answering: offer.setup)
        self.streamID = streamID
        self.trackID = trackID
        self.ssrc = ssrc
        self.rtxSSRC = offer.rtxPayloadType == nil ? nil : rtxSSRC
        self.cname = cname
    }

    /// RFC 8842 §5.3: to actpass (and to active) we answer passive, i.e. we are the DTLS server, so a
    /// browser's ClientHello right after its first check succeeds meets a server; to passive, active.
    public static func setup(answering offered: DtlsSetup) -> DtlsSetup { offered == .passive ? .active : .passive }

    /// The answer text, CRLF line ends.
    public var sdp: String {
        var l: [String] = [
            "v=0",
            "o=- \(sessionID) 2 IN IP4 127.0.0.1",
            "s=\(SdpVideoOffer.oneLine(sessionName))",
            "t=0 0",
        ]
        if iceLite { l.append("a=ice-lite") }
        if offer.bundle.contains(offer.mid) { l.append("a=group:BUNDLE \(offer.mid)") }
        l.append("a=msid-semantic: WMS \(streamID)")
        for (index, section) in offer.sections.enumerated() {
            guard index == offer.videoIndex else {
                // Rejected: same media and proto, port 0, one of the offer's formats (the line needs one), the mid
                // kept. Our credentials and fingerprint too, as Chromium's answers have them: some stacks (aiortc)
                // refuse an answer with any m-section lacking them (or rtcp-mux on an RTP one), port 0 or not.
                l.append("m=\(section.kind) 0 \(section.proto) \(section.formats.first ?? "0")")
                l += ["c=IN IP4 0.0.0.0", "a=ice-ufrag:\(iceUfrag)", "a=ice-pwd:\(icePwd)", "a=fingerprint:\(fingerprint.sdpValue)",
                      "a=setup:\(setup.rawValue)"]
                if let mid = section.mid { l.append("a=mid:\(mid)") }
                if section.proto.contains("RTP") { l += ["a=inactive", "a=rtcp-mux"] + (section.rtpmap.map { ["a=rtpmap:\($0)"] } ?? []) }
                continue
            }
            let pt = offer.payloadType
            l.append("m=video 9 UDP/TLS/RTP/SAVPF \(pt)" + (offer.rtxPayloadType.map { " \($0)" } ?? ""))
            l += ["c=IN IP4 0.0.0.0", "a=rtcp:9 IN IP4 0.0.0.0", "a=ice-ufrag:\(iceUfrag)", "a=ice-pwd:\(icePwd)",
                  "a=fingerprint:\(fingerprint.sdpValue)", "a=setup:\(setup.rawValue)", "a=mid:\(offer.mid)"]
            for kind in RtpHeaderExtensionKind.allCases {
                if let id = offer.extensions[kind] { l.append("a=extmap:\(id) \(kind.uri)") }
            }
            l += ["a=sendonly", "a=msid:\(streamID) \(trackID)", "a=rtcp-mux"]
            if offer.rtcpReducedSize { l.append("a=rtcp-rsize") }
            l.append("a=rtpmap:\(pt) \(offer.codec.sdpName)/90000")
            l += offer.feedback.map { "a=rtcp-fb:\(pt) \($0)" }
            if let p = offer.parameters, SdpVideoOffer.oneLine(p) == p { l.append("a=fmtp:\(pt) \(p)") }
            if let rtx = offer.rtxPayloadType { l += ["a=rtpmap:\(rtx) rtx/90000", "a=fmtp:\(rtx) apt=\(pt)"] }
            if let rtxSSRC { l.append("a=ssrc-group:FID \(ssrc) \(rtxSSRC)") }
            for s in [ssrc] + (rtxSSRC.map { [$0] } ?? []) {
                l += ["a=ssrc:\(s) cname:\(cname)", "a=ssrc:\(s) msid:\(streamID) \(trackID)"]
            }
            l += candidates.map { "a=\($0.sdpValue)" }
            l.append("a=end-of-candidates")
        }
        return l.joined(separator: "\r\n") + "\r\n"
    }
}
