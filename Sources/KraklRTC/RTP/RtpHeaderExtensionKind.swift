/// The RTP header extensions the publisher can write (RFC 8285 one-byte form).
public enum RtpHeaderExtensionKind: String, Sendable, CaseIterable {
    /// The m-section's mid, so a BUNDLE receiver routes packets before it knows the SSRC (RFC 8843 §15).
    case mid = "urn:ietf:params:rtp-hdrext:sdes:mid"
    /// 24-bit 6.18 fixed-point send time, for receiver-side (REMB) estimation.
    case absSendTime = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"
    /// A 16-bit counter over all packets, for transport-wide-cc feedback.
    case transportWideSequence = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"
    /// The delay the sender asks the receiver to hold frames before rendering (`PlayoutDelay`).
    /// Accepted in an answer only when `PublisherConfiguration.playoutDelay` is set; never offered.
    case playoutDelay = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"

    public var uri: String { rawValue }
}
