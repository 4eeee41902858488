import KraklBase
import COpenSSL

/// A fresh ECDSA P-256 key and a self-signed X.509 certificate for one
/// WebRTC session. Nothing signs it: the peer trusts it only because its
/// fingerprint travels in the SDP over the signalling channel (RFC 8827),
/// so a new key per session costs nothing and links no sessions together.
public final class Certificate {
    /// Owned; freed in deinit. Internal so the DTLS transport can load them into its SSL_CTX.
    let key: OpaquePointer
    let x509: OpaquePointer
    /// sha-256 of the DER certificate, for `a=fingerprint`.
    public let fingerprint: CertificateFingerprint
    /// The random subject CN, "krakl-" + 16 hex digits.
    public let commonName: String

    /// Generates the key (EVP_PKEY_generate over "EC"/"P-256") and the
    /// certificate (X509_sign with SHA-256; random 64-bit serial; valid from
    /// one day ago, for peers with a clock behind ours, to `validDays` ahead).
    public init(validDays: Int = 30) throws(DtlsError) {
        OpenSSLErrors.clear()
        var random = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&random, Int32(random.count)) == 1 else {
            throw DtlsError.setup(OpenSSLErrors.describe("RAND_bytes failed"))
        }
        let commonName = "krakl-" + random[0..<8].map(Certificate.hexByte).joined()
        guard let key = Certificate.generateKey() else {
            throw DtlsError.setup(OpenSSLErrors.describe("cannot generate an ECDSA P-256 key"))
        }
        guard let x509 = X509_new() else {
            EVP_PKEY_free(key)
            throw DtlsError.setup(OpenSSLErrors.describe("X509_new failed"))
        }
        do throws(DtlsError) {
            try Certificate.fill(x509, key: key, commonName: commonName, serial: Array(random[8..<16]), validDays: validDays)
            fingerprint = try Certificate.sha256(of: x509)
        } catch {
            X509_free(x509)
            EVP_PKEY_free(key)
            throw error
        }
        self.key = key
        self.x509 = x509
        self.commonName = commonName
    }

    deinit {
        X509_free(x509)
        EVP_PKEY_free(key)
    }

    /// The certificate in PEM, for logs or for handing to external tools.
    public var pem: String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard PEM_write_bio_X509(bio, x509) == 1 else { return "" }
        return MemoryBio.readAll(bio).map { String(decoding: $0, as: UTF8.self) } ?? ""
    }

    /// The sha-256 fingerprint of a DER-encoded certificate (X509_digest).
    static func sha256(of x509: OpaquePointer) throws(DtlsError) -> CertificateFingerprint {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        guard X509_digest(x509, EVP_sha256(), &digest, &length) == 1 else {
            throw DtlsError.setup(OpenSSLErrors.describe("X509_digest failed"))
        }
        return CertificateFingerprint(algorithm: "sha-256", bytes: Array(digest[0..<Int(length)]))
    }

    /// Two lower-case hex digits. A private helper, not a String extension:
    /// a module-wide `String.init` overload would change how `String.init` resolves elsewhere.
    private static func hexByte(_ byte: UInt8) -> String {
        let text = String(byte, radix: 16)
        return text.count == 1 ? "0" + text : text
    }

    private static func generateKey() -> OpaquePointer? {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else { return nil }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_keygen_init(context) == 1, EVP_PKEY_CTX_set_group_name(context, "P-256") == 1 else { return nil }
        var key: OpaquePointer?
        guard EVP_PKEY_generate(context, &key) == 1 else { return nil }
        return key
    }

    private static func fill(_ x509: OpaquePointer, key: OpaquePointer, commonName: String, serial: [UInt8], validDays: Int) throws(DtlsError) {
        func check(_ ok: Bool, _ what: String) throws(DtlsError) {
            if !ok { throw DtlsError.setup(OpenSSLErrors.describe("certificate: \(what) failed")) }
        }
        try check(X509_set_version(x509, 2) == 1, "X509_set_version")  // 2 = X.509 v3
        // Clear the top bit: a serial must be a positive INTEGER.
        var positive = serial
        positive[0] &= 0x7f
        guard let number = BN_bin2bn(positive, Int32(positive.count), nil) else { try check(false, "BN_bin2bn"); return }
        defer { BN_free(number) }
        try check(BN_to_ASN1_INTEGER(number, X509_get_serialNumber(x509)) != nil, "serial number")
        try check(X509_gmtime_adj(X509_getm_notBefore(x509), -86_400) != nil, "notBefore")
        try check(X509_gmtime_adj(X509_getm_notAfter(x509), validDays * 86_400) != nil, "notAfter")
        guard let name = X509_get_subject_name(x509) else { try check(false, "X509_get_subject_name"); return }
        try check(X509_NAME_add_entry_by_txt(name, "CN", krakl_mbstring_asc(), commonName, -1, -1, 0) == 1, "subject CN")
        try check(X509_set_issuer_name(x509, name) == 1, "issuer")
        try check(X509_set_pubkey(x509, key) == 1, "X509_set_pubkey")
        try check(X509_sign(x509, key, EVP_sha256()) > 0, "X509_sign")
    }
}
