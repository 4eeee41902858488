import KraklBase
import COpenSSL

/// Which end of the DTLS handshake we are. In WebRTC it follows the SDP
/// `a=setup` exchange: an answer with `setup:active` makes the answerer the
/// client and us the server; `setup:passive` makes us the client.
public enum DtlsRole: Sendable {
    case client, server
}

/// What happened while handling input, for the caller to act on.
public enum DtlsEvent: Equatable, Sendable {
    /// The handshake finished and the peer's certificate matched: start SRTP with these keys.
    case connected(DtlsSrtpKeys)
    /// The peer sent close_notify ("remote ended"); we answered with ours.
    case remoteClosed
    /// The connection is dead; nothing more will be sent or accepted.
    case failed(DtlsError)
    /// Application data over DTLS (WebRTC data channels would use it; the publisher does not).
    case applicationData([UInt8])
}

/// Datagrams to send to the peer (in order) and events, from one call.
public struct DtlsOutput: Sendable {
    public var datagrams: [[UInt8]] = []
    public var events: [DtlsEvent] = []
}

/// A DTLS 1.2 connection for DTLS-SRTP (RFC 5764) that owns no socket: the
/// caller hands in each received datagram and sends what comes out, so ICE
/// can own the socket and demultiplex STUN, DTLS and SRTP on it (RFC 7983).
///
/// Driving it from an event loop:
/// - `start()` once (a client's first flight; nothing for a server);
/// - `receive(_:)` for every datagram whose first byte is 20...63 (`isDtls`);
/// - when `nextDeadline` passes (re-read it after every call), `onTimer()`
///   to retransmit a lost flight;
/// - `close()` to send close_notify.
/// Every call returns datagrams to send and events. Not thread-safe: one
/// thread (the network loop) at a time.
public final class DtlsTransport {
    public enum State: Equatable, Sendable {
        case new, handshaking, connected, closed
        case failed(DtlsError)
    }

    /// What was dropped instead of being allowed to disturb the connection.
    /// On the network every one of these is routine noise or an attack; none is an error.
    public struct Counters: Equatable, Sendable {
        /// Datagrams handed to `receive` while handshaking or connected.
        public var datagramsReceived = 0
        /// Datagrams whose records do not cover them exactly (a length field
        /// lies, or bytes trail): dropped whole.
        public var malformedDatagrams = 0
        /// Records of an epoch not read now: epoch-0 handshake records after
        /// connecting (retransmissions, forgeries), any epoch above 1, or
        /// protected records before a cipher was chosen.
        public var wrongEpochRecords = 0
        /// Protected records shorter than the cipher's explicit nonce + tag
        /// (OpenSSL 3.0 would end the connection on them), or longer than any record.
        public var badLengthRecords = 0
        /// Records of a version other than DTLS 1.2 or a content type outside 20...23.
        public var unexpectedRecords = 0
        /// Well-formed epoch-1 records OpenSSL discarded after connecting:
        /// authentication failed, or the sequence number was replayed
        /// (OpenSSL drops both silently and does not say which).
        public var discardedRecords = 0

        public init() {}
    }

    public let role: DtlsRole
    /// The SDP answer's `a=fingerprint`; the peer's certificate must hash to it.
    public let expectedFingerprint: CertificateFingerprint
    /// Largest datagram handed out, in bytes (UDP payload).
    public let mtu: Int
    public private(set) var state: State = .new
    /// Set once connected.
    public private(set) var keys: DtlsSrtpKeys?
    /// The fingerprint of the certificate the peer presented, once it has.
    public private(set) var remoteFingerprint: CertificateFingerprint?
    /// Drops since creation.
    public private(set) var counters = Counters()

    private let certificate: Certificate  // kept alive: the SSL_CTX refers to its key
    private let context: OpaquePointer
    private let ssl: OpaquePointer
    private let readBio: OpaquePointer
    private let writeBio: OpaquePointer
    /// Set by the verify callback; reported instead of OpenSSL's generic "certificate verify failed".
    private var verifyFailure: DtlsError?
    /// Alert records OpenSSL accepted (authenticated), counted by the message callback.
    fileprivate var alertsRead = 0

    /// Builds the SSL_CTX (DTLS 1.2 only, our certificate, peer certificate
    /// required, use_srtp with `profiles` in preference order) and an SSL
    /// over two memory BIOs.
    public init(role: DtlsRole, certificate: Certificate, expectedFingerprint: CertificateFingerprint,
                mtu: Int = 1200, profiles: [SrtpProfile] = SrtpProfile.offered) throws(DtlsError) {
        precondition(mtu >= 256 && mtu <= 65_507, "DTLS MTU out of range")
        precondition(!profiles.isEmpty, "at least one SRTP profile")
        self.role = role
        self.certificate = certificate
        self.expectedFingerprint = expectedFingerprint
        self.mtu = mtu
        OpenSSLErrors.clear()
        guard let context = SSL_CTX_new(DTLS_method()) else {
            throw DtlsError.setup(OpenSSLErrors.describe("SSL_CTX_new"))
        }
        func fail(_ what: String) -> DtlsError {
            let error = DtlsError.setup(OpenSSLErrors.describe(what))
            return error
        }
        guard krakl_ssl_ctx_set_dtls12_only(context) == 1,
              SSL_CTX_use_certificate(context, certificate.x509) == 1,
              SSL_CTX_use_PrivateKey(context, certificate.key) == 1,
              SSL_CTX_check_private_key(context) == 1,
              // ECDHE only (forward secrecy), AEAD only; ECDSA for our key, RSA
              // too for peers that use it. RFC 8827 §6.5 makes every WebRTC
              // endpoint support ECDHE-ECDSA-AES128-GCM-SHA256. No CBC suites:
              // OpenSSL 3.0 negotiates encrypt-then-MAC for them, and then any
              // record with a bad MAC (anyone can forge one) is a fatal
              // bad_record_mac instead of a silent drop.
              SSL_CTX_set_cipher_list(context, DtlsTransport.cipherList) == 1,
              // Returns 0 on success, unlike its neighbours.
              SSL_CTX_set_tlsext_use_srtp(context, profiles.map(\.opensslName).joined(separator: ":")) == 0
        else {
            let error = fail("SSL_CTX configuration")
            SSL_CTX_free(context)
            throw error
        }
        // WebRTC never renegotiates; refusing it removes a way for stray
        // handshake records to disturb a running connection.
        _ = SSL_CTX_set_options(context, krakl_ssl_op_no_query_mtu() | krakl_ssl_op_no_renegotiation())
        // Self-signed certificates never chain to a CA: the callback judges the
        // fingerprint instead; FAIL_IF_NO_PEER_CERT makes a server demand one.
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, dtlsVerifyCallback)
        guard let ssl = SSL_new(context) else {
            let error = fail("SSL_new")
            SSL_CTX_free(context)
            throw error
        }
        guard let readBio = BIO_new(BIO_s_mem()), let writeBio = BIO_new(BIO_s_mem()) else {
            let error = fail("BIO_new")
            SSL_free(ssl)
            SSL_CTX_free(context)
            throw error
        }
        // An empty read BIO means "no datagram yet", not end of file.
        _ = krakl_bio_set_mem_eof_return(readBio, -1)
        SSL_set_bio(ssl, readBio, writeBio)  // the SSL owns both BIOs now
        self.context = context
        self.ssl = ssl
        self.readBio = readBio
        self.writeBio = writeBio
        _ = krakl_ssl_set_mtu(ssl, mtu)
        _ = krakl_dtls_set_link_mtu(ssl, mtu)
        DTLS_set_timer_cb(ssl, dtlsTimerCallback)
        SSL_set_msg_callback(ssl, dtlsMessageCallback)
        SSL_set_ex_data(ssl, 0, Unmanaged.passUnretained(self).toOpaque())
        if role == .client { SSL_set_connect_state(ssl) } else { SSL_set_accept_state(ssl) }
    }

    deinit {
        SSL_set_ex_data(ssl, 0, nil)
        SSL_free(ssl)
        SSL_CTX_free(context)
    }

    /// True for datagrams that belong to DTLS by their first byte (RFC 7983 §7: 20...63).
    public static func isDtls(_ datagram: [UInt8]) -> Bool {
        guard let first = datagram.first else { return false }
        return (20...63).contains(first)
    }

    /// Begins the handshake: a client's ClientHello comes out; a server waits for one.
    public func start() -> DtlsOutput {
        guard state == .new else { return DtlsOutput() }
        state = .handshaking
        var output = DtlsOutput()
        if role == .client { advance(&output) }
        return output
    }

    /// The cipher suites offered, in preference order (OpenSSL names).
    public static let cipherList = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305"

    /// Handles one received datagram. A server that was not started starts here.
    /// Records that cannot be legitimate are dropped and counted before
    /// OpenSSL sees them (see `DtlsRecordFilter`); a datagram that is only
    /// noise produces nothing.
    public func receive(_ datagram: [UInt8]) -> DtlsOutput {
        var output = DtlsOutput()
        if state == .new { state = .handshaking }
        guard state == .handshaking || state == .connected, !datagram.isEmpty else { return output }
        counters.datagramsReceived += 1
        guard let headers = DtlsRecordFilter.headers(datagram) else {
            counters.malformedDatagrams += 1
            return output
        }
        let connected = state == .connected
        let phase = DtlsRecordFilter.Phase(connected: connected, minimumProtectedLength: minimumProtectedLength)
        var kept: [UInt8] = []
        var keptRecords = 0, keptHandshakeRecords = 0
        for header in headers {
            switch DtlsRecordFilter.verdict(header, phase) {
            case .pass:
                kept += datagram[header.offset..<header.end]
                keptRecords += 1
                if header.contentType == 22 { keptHandshakeRecords += 1 }
            case .wrongEpoch: counters.wrongEpochRecords += 1
            case .badLength: counters.badLengthRecords += 1
            case .unexpected: counters.unexpectedRecords += 1
            }
        }
        guard !kept.isEmpty else { return output }
        // One datagram at a time: leftovers must never merge with the next datagram.
        _ = MemoryBio.readAll(readBio)
        let written = kept.withUnsafeBytes { BIO_write(readBio, $0.baseAddress, Int32($0.count)) }
        guard written == kept.count else { return output }
        let alertsBefore = alertsRead
        advance(&output)
        if connected {
            // Every epoch-1 record that got through produced application
            // data, an alert, or (a retransmitted Finished) an answer; the rest
            // OpenSSL discarded.
            let data = output.events.filter { if case .applicationData = $0 { return true } else { return false } }.count
            let answered = output.datagrams.isEmpty ? 0 : keptHandshakeRecords
            counters.discardedRecords += max(0, keptRecords - data - (alertsRead - alertsBefore) - answered)
        }
        return output
    }

    /// The explicit nonce + tag of the negotiated (or pending) AEAD suite:
    /// the shortest record it can protect. nil while no suite is chosen.
    private var minimumProtectedLength: Int? {
        guard let cipher = SSL_get_current_cipher(ssl) ?? SSL_get_pending_cipher(ssl) else { return nil }
        return DtlsTransport.minimumProtectedLength(cipherNid: SSL_CIPHER_get_cipher_nid(cipher))
    }

    /// RFC 5288 (GCM: 8-byte explicit nonce, 16-byte tag), RFC 7905
    /// (ChaCha20-Poly1305: implicit nonce, 16-byte tag). nil for anything
    /// else, which `cipherList` never offers.
    static func minimumProtectedLength(cipherNid: Int32) -> Int? {
        switch cipherNid {
        case NID_aes_128_gcm, NID_aes_256_gcm: return 8 + 16
        case NID_chacha20_poly1305: return 16
        default: return nil
        }
    }

    /// Seconds until `onTimer()` is due (0: now), or nil while no flight awaits an answer.
    public var timeout: Double? {
        guard state == .handshaking else { return nil }
        var remaining = timeval()
        guard krakl_dtls_get_timeout(ssl, &remaining) == 1 else { return nil }
        return Double(remaining.tv_sec) + Double(remaining.tv_usec) / 1_000_000
    }

    /// When `onTimer()` is due, or nil. OpenSSL keeps the timer; this is it on the continuous clock.
    public var nextDeadline: ContinuousClock.Instant? {
        timeout.map { ContinuousClock.now + .microseconds(Int64($0 * 1_000_000)) }
    }

    /// Retransmits the last flight when its timer ran out (DTLSv1_handle_timeout);
    /// fails the connection with `.timedOut` once OpenSSL gives up.
    public func onTimer() -> DtlsOutput {
        var output = DtlsOutput()
        guard state == .handshaking else { return output }
        OpenSSLErrors.clear()
        if krakl_dtls_handle_timeout(ssl) < 0 {
            OpenSSLErrors.clear()
            flush(&output)
            fail(.timedOut, &output)
            return output
        }
        flush(&output)
        return output
    }

    /// Sends close_notify (SSL_shutdown) and stops. Safe to call in any state.
    public func close() -> DtlsOutput {
        var output = DtlsOutput()
        guard state == .handshaking || state == .connected else { return output }
        OpenSSLErrors.clear()
        _ = SSL_shutdown(ssl)
        OpenSSLErrors.clear()
        flush(&output)
        state = .closed
        return output
    }

    /// Sends application data (not used by the publisher; here for data channels and tests).
    public func send(_ data: [UInt8]) -> DtlsOutput {
        var output = DtlsOutput()
        guard state == .connected, !data.isEmpty else { return output }
        OpenSSLErrors.clear()
        let written = data.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32($0.count)) }
        if written <= 0 { handleError(Int32(written), &output) }
        flush(&output)
        return output
    }

    // MARK: - Driving OpenSSL

    /// Runs the handshake as far as the input allows, then reads whatever
    /// records follow it (close_notify, data), then collects what to send.
    private func advance(_ output: inout DtlsOutput) {
        OpenSSLErrors.clear()
        if state == .handshaking {
            let result = SSL_do_handshake(ssl)
            if result == 1 {
                finishHandshake(&output)
            } else {
                handleError(result, &output)
            }
        }
        if state == .connected { readRecords(&output) }
        flush(&output)
    }

    private func finishHandshake(_ output: inout DtlsOutput) {
        // The verify callback already checked the certificate; this re-checks
        // the one the session ended up with, so no path skips the comparison.
        guard let peer = SSL_get1_peer_certificate(ssl) else { return fail(.noPeerCertificate, &output) }
        defer { X509_free(peer) }
        guard let received = try? Certificate.sha256(of: peer) else { return fail(.noPeerCertificate, &output) }
        remoteFingerprint = received
        guard received == expectedFingerprint else {
            return fail(.fingerprintMismatch(expected: expectedFingerprint, received: received), &output)
        }
        // Only AEAD suites are offered; the record filter relies on it.
        guard let cipher = SSL_get_current_cipher(ssl),
              DtlsTransport.minimumProtectedLength(cipherNid: SSL_CIPHER_get_cipher_nid(cipher)) != nil else {
            return fail(.handshake("the peer chose a cipher suite that is not AES-GCM or ChaCha20-Poly1305"), &output)
        }
        guard let selected = SSL_get_selected_srtp_profile(ssl),
              let profile = SrtpProfile(rawValue: UInt16(truncatingIfNeeded: selected.pointee.id)) else {
            return fail(.noSrtpProfile, &output)
        }
        let label = "EXTRACTOR-dtls_srtp"
        var material = [UInt8](repeating: 0, count: profile.keyingMaterialLength)
        guard SSL_export_keying_material(ssl, &material, material.count, label, label.utf8.count, nil, 0, 0) == 1 else {
            return fail(.handshake(OpenSSLErrors.describe("exporting SRTP keying material")), &output)
        }
        let keys = DtlsSrtpKeys(profile: profile, keyingMaterial: material, weAreClient: role == .client)
        self.keys = keys
        state = .connected
        output.events.append(.connected(keys))
    }

    /// Reads application records until OpenSSL wants more input. Bounded:
    /// one datagram holds at most a few records.
    private func readRecords(_ output: inout DtlsOutput) {
        var buffer = [UInt8](repeating: 0, count: 16_384)
        for _ in 0..<64 {
            let read = buffer.withUnsafeMutableBytes { SSL_read(ssl, $0.baseAddress, Int32($0.count)) }
            if read > 0 {
                output.events.append(.applicationData(Array(buffer[0..<Int(read)])))
                continue
            }
            handleError(read, &output)
            return
        }
    }

    /// Sorts a non-positive OpenSSL result into "wait for input", "peer closed" or failure.
    private func handleError(_ result: Int32, _ output: inout DtlsOutput) {
        let code = SSL_get_error(ssl, result)
        switch code {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            OpenSSLErrors.clear()
        case SSL_ERROR_ZERO_RETURN:
            // close_notify: answer with ours (TLS 1.2 §7.2.1) and stop.
            OpenSSLErrors.clear()
            _ = SSL_shutdown(ssl)
            OpenSSLErrors.clear()
            state = .closed
            output.events.append(.remoteClosed)
        default:
            let detail = OpenSSLErrors.drain() ?? (code == SSL_ERROR_SYSCALL ? "record layer gave up (SSL_ERROR_SYSCALL, no OpenSSL error queued)" : "SSL error \(code)")
            fail(verifyFailure ?? (state == .connected ? .connection(detail) : .handshake(detail)), &output)
        }
    }

    private func fail(_ error: DtlsError, _ output: inout DtlsOutput) {
        state = .failed(error)
        output.events.append(.failed(error))
    }

    /// Moves what OpenSSL wrote (flights, alerts, close_notify) into datagrams.
    private func flush(_ output: inout DtlsOutput) {
        guard let stream = MemoryBio.readAll(writeBio) else { return }
        output.datagrams += DtlsBio.datagrams(from: stream, mtu: mtu)
    }

    /// Called by the verify callback for the peer's leaf certificate.
    fileprivate func verifyPeer(_ x509: OpaquePointer) -> Bool {
        guard let received = try? Certificate.sha256(of: x509) else {
            verifyFailure = .noPeerCertificate
            return false
        }
        remoteFingerprint = received
        if received != expectedFingerprint {
            verifyFailure = .fingerprintMismatch(expected: expectedFingerprint, received: received)
            return false
        }
        return true
    }
}

/// Accepts any chain whose leaf hashes to the expected fingerprint; CA
/// trust does not apply to WebRTC's self-signed certificates.
private let dtlsVerifyCallback: @convention(c) (Int32, OpaquePointer?) -> Int32 = { _, store in
    guard let store else { return 0 }
    // Only the leaf (depth 0) is the peer; a chain above it carries no meaning here.
    guard X509_STORE_CTX_get_error_depth(store) == 0 else { return 1 }
    guard let certificate = X509_STORE_CTX_get_current_cert(store),
          let ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()),
          let owner = SSL_get_ex_data(OpaquePointer(ssl), 0) else { return 0 }
    let transport = Unmanaged<DtlsTransport>.fromOpaque(owner).takeUnretainedValue()
    if transport.verifyPeer(certificate) { return 1 }
    // Maps to a bad_certificate alert, which tells the peer what is wrong
    // (the default for a failed verify is unknown_ca, which misleads).
    X509_STORE_CTX_set_error(store, X509_V_ERR_CERT_REJECTED)
    return 0
}

/// Counts alert records OpenSSL accepted (they passed authentication), so
/// `receive` can tell what OpenSSL silently discarded.
private let dtlsMessageCallback: @convention(c) (Int32, Int32, Int32, UnsafeRawPointer?, Int, OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { writing, _, contentType, _, _, ssl, _ in
    guard writing == 0, contentType == 21, let ssl, let owner = SSL_get_ex_data(ssl, 0) else { return }
    Unmanaged<DtlsTransport>.fromOpaque(owner).takeUnretainedValue().alertsRead += 1
}

/// Retransmission back-off: 250 ms first, doubling to at most 4 s. OpenSSL's
/// own starts at 1 s, which alone would exceed a 300 ms connect target after one lost flight.
private let dtlsTimerCallback: @convention(c) (OpaquePointer?, UInt32) -> UInt32 = { _, previous in
    previous == 0 ? 250_000 : min(previous * 2, 4_000_000)
}
