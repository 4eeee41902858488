/// The packets sent recently, by sequence number, so a NACK can be answered
/// from memory (RFC 4585 §6.2.1). A fixed ring: storing never allocates after
/// the first lap, and the oldest packet is the one overwritten.
public struct RtpSendHistory: Sendable {
    public struct Entry: Sendable {
        public var packet: RtpPacket
        public var sentNanoseconds: UInt64
        /// How often it was resent; the publisher caps retransmissions per packet.
        public var retransmissions: Int
    }

    private var slots: [Entry?]
    private let mask: Int

    /// `capacity` is rounded up to a power of two (at most 32768, half the sequence space,
    /// so a wrapped sequence number can never find a stale packet).
    public init(capacity: Int = 1024) {
        var size = 1
        while size < min(max(capacity, 1), 32768) { size <<= 1 }
        slots = Array(repeating: nil, count: size)
        mask = size - 1
    }

    public var capacity: Int { slots.count }

    public mutating func store(_ packet: RtpPacket, sentNanoseconds: UInt64) {
        slots[Int(packet.sequenceNumber) & mask] = Entry(packet: packet, sentNanoseconds: sentNanoseconds, retransmissions: 0)
    }

    /// The stored packet with this sequence number, if it is still in the ring.
    public func entry(sequenceNumber: UInt16) -> Entry? {
        guard let e = slots[Int(sequenceNumber) & mask], e.packet.sequenceNumber == sequenceNumber else { return nil }
        return e
    }

    /// Looks a packet up for resending and counts the retransmission.
    public mutating func takeForRetransmission(sequenceNumber: UInt16, nowNanoseconds: UInt64) -> RtpPacket? {
        let i = Int(sequenceNumber) & mask
        guard var e = slots[i], e.packet.sequenceNumber == sequenceNumber else { return nil }
        e.retransmissions += 1
        e.sentNanoseconds = nowNanoseconds
        slots[i] = e
        return e.packet
    }
}
