import FoundationEssentials
import Glibc

/// The peer's first ClientHello when it arrives before the answer has told us
/// our DTLS role and the peer's fingerprint, kept to be replayed into DTLS then.
///
/// Why: an answerer that is the DTLS client (`setup:active`: Chromium, Janus)
/// may start its handshake as soon as its first ICE check succeeds, and our
/// offer already gave it our candidates, so its ClientHello can beat the HTTP
/// answer to us. Dropped, the handshake waits for the peer's retransmission
/// (measured with Chromium 156: +50 ms with the answer 20 ms late, +576 ms
/// with it 1 s late). libwebrtc keeps that record for the same reason.
///
/// Bounded: one source (the first that sends a ClientHello, and only one that
/// has passed an authenticated ICE check: the caller checks that), one
/// ClientHello message (its fragments may span several records and
/// datagrams), at most `maximumDatagrams` datagrams and `maximumBytes` bytes.
/// Once the message is complete, retransmissions are not kept: OpenSSL would
/// only answer them with its flight again.
struct DtlsEarlyFlight {
    static let maximumBytes = 4_096
    static let maximumDatagrams = 8
    /// RFC 6347 §4.2.2: msg_type 1 is client_hello; a handshake header is 12 bytes.
    static let clientHello: UInt8 = 1
    static let handshakeHeaderLength = 12

    private(set) var datagrams: [[UInt8]] = []
    /// Where the ClientHello came from: our socket's address and the peer's.
    private(set) var source: (base: TransportAddress, remote: TransportAddress)?
    private var bytes = 0
    private var messageSequence: UInt16?
    private var messageLength: Int?
    /// Offsets of the body bytes here (at most `maximumBytes` of them, so a plain set).
    private var covered = Set<Int>()

    /// True once every byte of the ClientHello body is here.
    var isComplete: Bool {
        guard let messageLength else { return false }
        return covered.count == messageLength
    }

    /// Keeps `datagram` when it carries a new part of the first ClientHello from the first
    /// source, within the bounds; returns whether it was kept.
    mutating func keep(_ datagram: [UInt8], from remote: TransportAddress, base: TransportAddress) -> Bool {
        if let source, source.remote != remote || source.base != base { return false }
        guard !isComplete, datagrams.count < Self.maximumDatagrams, bytes + datagram.count <= Self.maximumBytes,
              let fragments = Self.clientHelloFragments(datagram) else { return false }
        var sequence = messageSequence, length = messageLength
        var added = Set<Int>()
        for fragment in fragments {
            guard sequence == nil || sequence == fragment.sequence, length == nil || length == fragment.length,
                  fragment.offset + fragment.count <= fragment.length else { return false }
            sequence = fragment.sequence
            length = fragment.length
            added.formUnion(fragment.offset..<(fragment.offset + fragment.count))
        }
        // Nothing new: a retransmitted fragment.
        guard !added.subtracting(covered).isEmpty else { return false }
        messageSequence = sequence
        messageLength = length
        covered.formUnion(added)
        source = (base, remote)
        datagrams.append(datagram)
        bytes += datagram.count
        return true
    }

    struct Fragment: Equatable {
        var sequence: UInt16
        var length: Int
        var offset: Int
        var count: Int
    }

    /// The ClientHello fragments of a datagram whose every record is an epoch-0 handshake record
    /// holding only ClientHello fragments; nil for anything else.
    static func clientHelloFragments(_ datagram: [UInt8]) -> [Fragment]? {
        guard let headers = DtlsRecordFilter.headers(datagram) else { return nil }
        var fragments: [Fragment] = []
        for header in headers {
            // 22 handshake; a ClientHello may carry the DTLS 1.0 record version (RFC 6347 §4.1).
            guard header.contentType == 22, header.epoch == 0, header.version >> 8 == 0xfe else { return nil }
            var at = header.offset + DtlsRecordFilter.headerLength
            guard at < header.end else { return nil }
            // Bounded: every fragment takes at least its 12-byte header.
            while at < header.end {
                guard header.end - at >= handshakeHeaderLength, datagram[at] == clientHello else { return nil }
                let d = datagram
                let length = Int(d[at + 1]) << 16 | Int(d[at + 2]) << 8 | Int(d[at + 3])
                let sequence = UInt16(d[at + 4]) << 8 | UInt16(d[at + 5])
                let offset = Int(d[at + 6]) << 16 | Int(d[at + 7]) << 8 | Int(d[at + 8])
                let count = Int(d[at + 9]) << 16 | Int(d[at + 10]) << 8 | Int(d[at + 11])
                guard header.end - at - handshakeHeaderLength >= count else { return nil }
                fragments.append(Fragment(sequence: sequence, length: length, offset: offset, count: count))
                at += handshakeHeaderLength + count
            }
        }
        return fragments
    }
}
