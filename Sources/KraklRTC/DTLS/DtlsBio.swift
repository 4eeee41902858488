import COpenSSL

/// Memory-BIO plumbing for a DTLS connection that never owns a socket.
enum DtlsBio {
    /// Splits the byte stream OpenSSL wrote (whole DTLS records back to back:
    /// a memory BIO loses the datagram boundaries) into records and packs
    /// them into datagrams of at most `mtu` bytes, in order. Several records
    /// per datagram is allowed (RFC 6347 §4.1.1) and saves packets; a record
    /// is never split. Bytes that do not parse as records (never expected)
    /// go out as they are rather than be lost.
    static func datagrams(from stream: [UInt8], mtu: Int) -> [[UInt8]] {
        var records: [ArraySlice<UInt8>] = []
        var offset = 0
        while offset < stream.count {
            let headerLength = 13
            guard stream.count - offset >= headerLength else { records.append(stream[offset...]); break }
            let length = Int(stream[offset + 11]) << 8 | Int(stream[offset + 12])
            let end = offset + headerLength + length
            guard end <= stream.count else { records.append(stream[offset...]); break }
            records.append(stream[offset..<end])
            offset = end
        }
        var datagrams: [[UInt8]] = []
        var current: [UInt8] = []
        for record in records {
            if !current.isEmpty && current.count + record.count > mtu {
                datagrams.append(current)
                current = []
            }
            current.append(contentsOf: record)
        }
        if !current.isEmpty { datagrams.append(current) }
        return datagrams
    }
}
