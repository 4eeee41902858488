import COpenSSL

/// OpenSSL memory BIOs, which DTLS (records for UDP), `turns:` (TLS records for a TCP socket the
/// connection owns) and certificate PEM text all read out the same way.
enum MemoryBio {
    /// Everything pending in a memory BIO, or nil when it is empty.
    static func readAll(_ bio: OpaquePointer) -> [UInt8]? {
        let pending = Int(BIO_ctrl_pending(bio))
        guard pending > 0 else { return nil }
        var bytes = [UInt8](repeating: 0, count: pending)
        let read = bytes.withUnsafeMutableBytes { BIO_read(bio, $0.baseAddress, Int32(pending)) }
        guard read > 0 else { return nil }
        return Array(bytes[0..<Int(read)])
    }
}
