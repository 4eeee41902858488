/// The video codecs the agent encodes (libvpx) and packetizes (RTP): one
/// type for the encoder, the recording formats and SDP.
public enum VideoCodec: String, Sendable, CaseIterable {
    /// Raw values are what a person types (`--codec vp8`).
    case vp8, vp9

    /// The RTP encoding name in SDP `a=rtpmap` (RFC 7741, RFC 9628).
    public var sdpName: String { self == .vp8 ? "VP8" : "VP9" }

    /// From an `a=rtpmap` encoding name; SDP compares them case-insensitively (RFC 4855 §3).
    public init?(sdpName: String) {
        switch sdpName.uppercased() {
        case "VP8": self = .vp8
        case "VP9": self = .vp9
        default: return nil
        }
    }

    /// The WebM (Matroska) CodecID.
    public var webmCodecID: String { self == .vp8 ? "V_VP8" : "V_VP9" }
    /// The IVF header's fourcc.
    public var fourcc: String { self == .vp8 ? "VP80" : "VP90" }
}
