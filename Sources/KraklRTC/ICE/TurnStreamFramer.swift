/// TURN over a stream (TCP or TLS to the server, RFC 8656 §3.1): the bytes carry STUN messages
/// and ChannelData back to back, each a whole number of 4-byte words (STUN always is; ChannelData
/// is padded, §12.5). This cuts the stream into those messages, sans-I/O: feed it what `read`
/// returned, take the complete messages. The first two bits of each message say its kind (00
/// STUN, 01 ChannelData); anything else means the stream lost its framing and must be closed.
public struct TurnStreamFramer: Sendable {
    /// Why the stream cannot be read further (the connection is then closed).
    public enum Failure: Error, Equatable, Sendable, CustomStringConvertible {
        /// A message started with a byte that is neither STUN nor ChannelData.
        case notTurn(firstByte: UInt8)

        public var description: String {
            switch self {
            case .notTurn(let byte):
                return "the stream lost its framing (a message began with 0x\(String(byte, radix: 16)), neither STUN nor ChannelData)"
            }
        }
    }

    private var buffer: [UInt8] = []
    private var start = 0

    public init() {}

    /// Bytes not yet part of a whole message (at most one message's worth, ≤ 65 539 + padding).
    public var pendingCount: Int { buffer.count - start }

    /// Appends `bytes` and returns every message now complete (ChannelData without its padding).
    /// After a failure the framer stays failed: every later call throws the same.
    public mutating func feed(_ bytes: some Collection<UInt8>) throws(Failure) -> [[UInt8]] {
        buffer.append(contentsOf: bytes)
        var messages: [[UInt8]] = []
        while buffer.count - start >= 4 {
            let first = buffer[start]
            let declared = Int(buffer[start + 2]) << 8 | Int(buffer[start + 3])
            let length: Int, wire: Int
            switch first >> 6 {
            case 0: length = 20 + declared; wire = length
            case 1: length = 4 + declared; wire = paddedTo4(length)
            default: throw .notTurn(firstByte: first)
            }
            guard buffer.count - start >= wire else { break }
            messages.append(Array(buffer[start..<(start + length)]))
            start += wire
        }
        // Compact once the consumed prefix is large, so the buffer never grows without bound.
        if start > 0, start == buffer.count || start >= 65_536 {
            buffer.removeFirst(start)
            start = 0
        }
        return messages
    }
}
