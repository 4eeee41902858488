/// The SDP words the offer and answer share: codecs, feedback, header
/// extensions, directions and DTLS roles (RFC 8866 syntax, RFC 8829 usage).

/// One `a=rtcp-fb` value (RFC 4585 §4.2): a type and an optional parameter, e.g. "nack" "pli".
public struct RtcpFeedback: Hashable, Sendable, CustomStringConvertible {
    public var type: String
    public var parameter: String?

    public init(_ type: String, _ parameter: String? = nil) {
        self.type = type.lowercased()
        self.parameter = parameter?.lowercased()
    }

    /// Generic NACK: the receiver asks for lost packets (RFC 4585 §6.2.1).
    public static let nack = RtcpFeedback("nack")
    /// Picture loss indication: the receiver asks for a keyframe (RFC 4585 §6.3.1).
    public static let pli = RtcpFeedback("nack", "pli")
    /// Full intra request (RFC 5104 §4.3.1).
    public static let fir = RtcpFeedback("ccm", "fir")
    /// Receiver-estimated maximum bitrate (draft-alvestrand-rmcat-remb).
    public static let remb = RtcpFeedback("goog-remb")
    /// Transport-wide congestion control feedback (draft-holmer-rmcat-transport-wide-cc-extensions-01).
    public static let transportCC = RtcpFeedback("transport-cc")

    /// What the offer asks for, in the order browsers write it.
    public static let offered: [RtcpFeedback] = [.remb, .transportCC, .fir, .nack, .pli]

    public var description: String { parameter.map { "\(type) \($0)" } ?? type }
}

/// Media direction attributes (RFC 8866 §6.7).
public enum MediaDirection: String, Sendable {
    case sendrecv, sendonly, recvonly, inactive

    /// True when the side that wrote it will accept media.
    public var receives: Bool { self == .sendrecv || self == .recvonly }
}

/// The DTLS role attribute `a=setup` (RFC 4145 §4, RFC 8842 §5).
public enum DtlsSetup: String, Sendable {
    case active, passive, actpass, holdconn
}
