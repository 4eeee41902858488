/// A TURN ChannelData message (RFC 8656 §12.4): a 4-byte header (channel number, data length)
/// and the application datagram, the cheap framing for a peer once a channel is bound to it.
/// Its first byte is 0x40-0x4F, which is how it is told from STUN, DTLS and RTP (RFC 7983 §7).
public struct ChannelData: Equatable, Sendable {
    /// Channel numbers a client may bind (RFC 8656 §12); 0x5000-0xFFFF are reserved.
    public static let channelRange: ClosedRange<UInt16> = 0x4000...0x4FFF
    static let headerSize = 4

    public var channel: UInt16
    public var data: [UInt8]

    public init(channel: UInt16, data: [UInt8]) {
        precondition(Self.channelRange.contains(channel), "a TURN channel is 0x4000-0x4FFF")
        precondition(data.count <= 0xFFFF, "ChannelData carries at most 65535 bytes")
        self.channel = channel
        self.data = data
    }

    /// True when the first byte places the datagram in the ChannelData range (RFC 7983: 64-79).
    public static func looksLikeChannelData(_ datagram: [UInt8]) -> Bool {
        datagram.count >= headerSize && datagram[0] & 0xF0 == 0x40
    }

    /// The wire form. Over UDP no padding is needed; over a stream (TCP, TLS) the message is
    /// padded to a multiple of 4 so the next one starts aligned (§12.5).
    public func encoded(padded: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(Self.headerSize + data.count + 3)
        out.appendBE16(channel)
        out.appendBE16(UInt16(data.count))
        out += data
        if padded { out += [UInt8](repeating: 0, count: paddedTo4(data.count) - data.count) }
        return out
    }

    /// Reads a datagram; nil when it is shorter than its length field says, or the channel is
    /// outside 0x4000-0x4FFF (§12.5: such messages are silently discarded). Bytes after the data
    /// are padding and ignored.
    public init?(parsing datagram: [UInt8]) {
        guard datagram.count >= Self.headerSize else { return nil }
        let channel = datagram.be16(at: 0)
        let length = Int(datagram.be16(at: 2))
        guard Self.channelRange.contains(channel), length <= datagram.count - Self.headerSize else { return nil }
        self.channel = channel
        data = Array(datagram[Self.headerSize..<(Self.headerSize + length)])
    }
}
