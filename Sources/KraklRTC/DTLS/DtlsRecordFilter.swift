/// Checks each datagram's DTLS records before OpenSSL sees them, and drops
/// what can never be legitimate (RFC 6347 §4.1.2.7: invalid records are
/// silently discarded).
///
/// Why this exists: OpenSSL 3.0 discards most bad DTLS records quietly, but
/// not all. A record in the current epoch that is shorter than the AEAD
/// explicit nonce plus tag (24 bytes for AES-GCM, 16 for ChaCha20-Poly1305)
/// makes its AEAD set-up fail, and OpenSSL answers with a fatal
/// internal_error alert and an empty error queue (SSL_get_error says
/// SSL_ERROR_SYSCALL): one spoofed packet ended the session. A mutated
/// datagram gets there easily: a record whose length field was cut, or an
/// epoch-0 ChangeCipherSpec (1 byte) or ServerHelloDone (12 bytes) with its
/// epoch bit flipped to 1.
struct DtlsRecordFilter {
    static let headerLength = 13
    /// DTLS 1.2 on the wire (RFC 6347 §4.1: {254, 253}).
    static let dtls12: UInt16 = 0xfefd
    /// The largest record body OpenSSL reads (2^14 + 2048, RFC 5246 §6.2.3).
    static let maximumLength = 16_384 + 2_048

    enum Verdict: Equatable {
        case pass
        /// Not the epoch this phase reads (an old handshake record after connecting, or a future epoch).
        case wrongEpoch
        /// Shorter than the negotiated AEAD's nonce plus tag, or longer than any record.
        case badLength
        /// Not DTLS 1.2, or a content type DTLS 1.2 does not carry.
        case unexpected
    }

    struct Header: Equatable {
        let contentType: UInt8
        let version: UInt16
        let epoch: UInt16
        let sequence: UInt64  // 48 bits
        let length: Int
        /// Offset of the record in the datagram.
        let offset: Int
        var end: Int { offset + DtlsRecordFilter.headerLength + length }
    }

    /// Splits a datagram into record headers; nil unless the records cover it exactly.
    static func headers(_ datagram: [UInt8]) -> [Header]? {
        var headers: [Header] = []
        var offset = 0
        // Bounded: every record takes at least 13 bytes.
        while offset < datagram.count {
            guard datagram.count - offset >= headerLength else { return nil }
            let d = datagram
            var sequence: UInt64 = 0
            for index in offset + 5..<offset + 11 { sequence = sequence << 8 | UInt64(d[index]) }
            let header = Header(contentType: d[offset], version: UInt16(d[offset + 1]) << 8 | UInt16(d[offset + 2]),
                                epoch: UInt16(d[offset + 3]) << 8 | UInt16(d[offset + 4]), sequence: sequence,
                                length: Int(d[offset + 11]) << 8 | Int(d[offset + 12]), offset: offset)
            guard header.end <= datagram.count else { return nil }
            headers.append(header)
            offset = header.end
        }
        return headers.isEmpty ? nil : headers
    }

    /// What the transport knows when a datagram arrives.
    struct Phase {
        /// True once the handshake finished: only epoch 1 is read from then on
        /// (WebRTC never renegotiates, and we refuse it).
        var connected: Bool
        /// The smallest protected record the negotiated cipher can produce
        /// (explicit nonce + tag), or nil while no cipher is chosen yet.
        var minimumProtectedLength: Int?
    }

    /// The verdict for one record.
    static func verdict(_ header: Header, _ phase: Phase) -> Verdict {
        // 20 change_cipher_spec, 21 alert, 22 handshake, 23 application_data.
        guard (20...23).contains(header.contentType) else { return .unexpected }
        if phase.connected {
            // Epoch 0 after the handshake is a stale (or forged) handshake
            // record; OpenSSL ignores it too. A client's retransmitted final
            // flight still reaches a connected server: its Finished, the part
            // OpenSSL answers, is in epoch 1.
            guard header.epoch == 1 else { return .wrongEpoch }
            guard header.version == dtls12 else { return .unexpected }
        } else {
            // A ClientHello may carry the DTLS 1.0 record version (RFC 6347 §4.1).
            guard header.version >> 8 == 0xfe else { return .unexpected }
            guard header.epoch <= 1 else { return .wrongEpoch }
        }
        guard header.length <= maximumLength else { return .badLength }
        if header.epoch >= 1 {
            // Before a cipher is chosen no peer can have protected anything.
            guard let minimum = phase.minimumProtectedLength else { return .wrongEpoch }
            guard header.length >= minimum else { return .badLength }
        }
        return .pass
    }
}
