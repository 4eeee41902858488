/// Why a DTLS transport could not be set up or why its handshake failed.
/// Each case reads as a message a person can act on.
public enum DtlsError: Error, Equatable, Sendable, CustomStringConvertible {
    /// OpenSSL refused to build the context, key or certificate.
    case setup(String)
    /// The handshake failed: a fatal alert from the peer, a malformed flight, no shared cipher.
    case handshake(String)
    /// A connected session broke: a fatal alert or a record OpenSSL could not get past.
    case connection(String)
    /// The peer's certificate is not the one the SDP answer announced: someone else is on the path.
    case fingerprintMismatch(expected: CertificateFingerprint, received: CertificateFingerprint)
    /// The peer finished a handshake without a certificate.
    case noPeerCertificate
    /// The peer agreed to none of the SRTP profiles we offered (use_srtp, RFC 5764).
    case noSrtpProfile
    /// Retransmissions ran out before the peer answered.
    case timedOut

    public var description: String {
        switch self {
        case .setup(let text): return "DTLS set-up failed: \(text)"
        case .handshake(let text): return "DTLS handshake failed: \(text)"
        case .connection(let text): return "DTLS connection failed: \(text)"
        case .fingerprintMismatch(let expected, let received):
            return "DTLS peer certificate fingerprint \(received.short) does not match the SDP answer's \(expected.short); closing"
        case .noPeerCertificate: return "DTLS peer sent no certificate"
        case .noSrtpProfile: return "DTLS peer negotiated no SRTP profile (use_srtp)"
        case .timedOut: return "DTLS handshake timed out: no answer from the peer after every retransmission"
        }
    }
}
