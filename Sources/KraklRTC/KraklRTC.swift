import COpenSSL
import CSrtp
/// KraklRTC: the agent's own send-only WebRTC stack (issue #6).
/// SDP, ICE/STUN, DTLS-SRTP (OpenSSL + libsrtp2), RTP/RTCP, pacing and
/// bandwidth estimation. Debian 12 packages no WebRTC library, so it lives here.
public enum KraklRTC {
    /// Does the stack's one-time process set-up now, so that the first join does not pay for it:
    /// libsrtp's `srtp_init` (its crypto self-tests: 24–30 ms measured here, otherwise inside the
    /// first DTLS connect) and OpenSSL's first use (provider, EC group and DTLS method set-up:
    /// the first certificate costs ~2.6 ms against ~0.3 ms for later ones), by making and dropping
    /// one certificate and one DTLS context.
    ///
    /// Call it once at start-up, off the join path. Optional (everything also happens lazily on
    /// first use), idempotent, and safe from any thread; later calls return at once.
    /// - Throws: `SrtpError.setup` when libsrtp cannot initialise, `DtlsError.setup` when OpenSSL
    ///   cannot make a key or a DTLS context: the agent cannot publish at all then.
    public static func prepare() throws {
        try preparation.get()
    }

    /// Run once, thread-safely: a global's lazy initialiser.
    private static let preparation: Result<Void, Error> = Result(catching: {
        try SrtpLibrary.initialise()
        let certificate = try Certificate()
        _ = try DtlsTransport(role: .server, certificate: certificate, expectedFingerprint: certificate.fingerprint)
    })
}
