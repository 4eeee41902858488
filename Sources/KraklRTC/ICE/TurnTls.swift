import COpenSSL
import KraklBase

/// One TLS client session that owns no socket: ciphertext from the server is fed in, ciphertext
/// for the server is taken out (memory BIOs, as for DTLS), so the connection keeps its own
/// non-blocking socket I/O (MSG_NOSIGNAL: a reset connection is an error, never SIGPIPE).
final class TurnTlsSession {
    private let ssl: OpaquePointer
    private let incoming: OpaquePointer
    private let outgoing: OpaquePointer
    private let name: String
    private(set) var handshakeDone = false

    /// SSL_new with memory BIOs, SNI (names only, RFC 6066 §3) and the name or IP address checked
    /// against the certificate (SSL_set1_host / X509_VERIFY_PARAM_set1_ip_asc).
    init(context: TLSClientContext, name: String) throws(NetworkError) {
        guard let ssl = SSL_new(context.context) else { throw .socket("TURN over TLS: SSL_new failed") }
        guard let incoming = BIO_new(BIO_s_mem()), let outgoing = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw .socket("TURN over TLS: BIO_new failed")
        }
        // An empty incoming BIO means "wait for more", not end of stream.
        _ = krakl_bio_set_mem_eof_return(incoming, -1)
        SSL_set_bio(ssl, incoming, outgoing)  // the SSL owns both BIOs from here
        self.ssl = ssl
        self.incoming = incoming
        self.outgoing = outgoing
        self.name = name
        TLSClientContext.expect(ssl, server: name)
        SSL_set_connect_state(ssl)
    }

    deinit { SSL_free(ssl) }

    /// Moves the handshake on (SSL_connect); nil while it goes on or once done, else why it failed
    /// (an untrusted certificate, a name it is not for, no common protocol version) and whether the
    /// certificate was the reason.
    func handshake() -> (reason: String, untrustedCertificate: Bool)? {
        guard !handshakeDone else { return nil }
        ERR_clear_error()
        let result = SSL_connect(ssl)
        if result == 1 {
            handshakeDone = true
            return nil
        }
        let error = SSL_get_error(ssl, result)
        if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE { return nil }
        let verify = SSL_get_verify_result(ssl)
        if verify != X509_V_OK {
            return ("the server's certificate is not trusted for \(name): \(String(cString: X509_verify_cert_error_string(verify)))", true)
        }
        return ("the TLS handshake with \(name) failed: \(Self.openSSLError())", false)
    }

    /// Ciphertext the server sent.
    func feed(_ bytes: ArraySlice<UInt8>) {
        _ = bytes.withUnsafeBytes { BIO_write(incoming, $0.baseAddress, Int32($0.count)) }
    }

    /// Plaintext to send (after the handshake): encrypted into `takeOutgoing()`; false on failure.
    func seal(_ plain: [UInt8]) -> Bool {
        var offset = 0
        while offset < plain.count {
            ERR_clear_error()
            let n = plain[offset...].withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32(min($0.count, 16_384))) }
            guard n > 0 else { return false }
            offset += Int(n)
        }
        return true
    }

    /// Plaintext from what was fed; `closed` when the server sent close_notify, `failure` on a broken stream.
    func open(into buffer: inout [UInt8]) -> (plain: [UInt8], closed: Bool, failure: String?) {
        var plain: [UInt8] = []
        for _ in 0..<256 {
            ERR_clear_error()
            let n = buffer.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
            if n > 0 { plain += buffer[0..<Int(n)]; continue }
            let error = SSL_get_error(ssl, n)
            if error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE { return (plain, false, nil) }
            if error == SSL_ERROR_ZERO_RETURN { return (plain, true, nil) }
            return (plain, false, "TLS reading failed: \(Self.openSSLError())")
        }
        return (plain, false, nil)
    }

    /// Ciphertext OpenSSL wrote (handshake, records, alerts), for the socket.
    func takeOutgoing() -> [UInt8] { MemoryBio.readAll(outgoing) ?? [] }

    /// close_notify into `takeOutgoing()` (not waiting for the server's).
    func shutDown() {
        guard handshakeDone else { return }
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
    }

    private static func openSSLError() -> String { OpenSSLErrors.drain() ?? "no OpenSSL error" }
}
