/// A transport-wide congestion control feedback packet
/// (draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1), expanded into
/// one entry per reported transport sequence number: lost, or received at a
/// time. The time base is the receiver's (reference time × 64 ms plus the
/// running sum of 250 µs deltas), so only differences between arrivals mean
/// anything to the bandwidth estimator.
public struct TransportWideFeedback: Equatable, Sendable {
    public struct Packet: Equatable, Sendable {
        public var sequenceNumber: UInt16
        /// Arrival time in microseconds in the receiver's time base; nil when not received.
        public var arrivalMicroseconds: Int64?
        public var received: Bool { arrivalMicroseconds != nil }
    }

    public var senderSSRC: UInt32
    public var mediaSSRC: UInt32
    public var baseSequenceNumber: UInt16
    /// 24-bit signed, in units of 64 ms.
    public var referenceTime: Int32
    /// Counts feedback packets, so the sender can tell a lost feedback packet from a gap.
    public var feedbackCount: UInt8
    public var packets: [Packet]

    public var referenceMicroseconds: Int64 { Int64(referenceTime) * 64_000 }

    /// Parses a whole RTCP packet (header included, padding already removed or left at the end).
    public init(parsing p: [UInt8]) throws(RtcpError) {
        guard p.count >= 20 else { throw RtcpError.truncated("transport-cc feedback needs 20 bytes, has \(p.count)") }
        senderSSRC = p.be32(at: 4)
        mediaSSRC = p.be32(at: 8)
        baseSequenceNumber = p.be16(at: 12)
        let statusCount = Int(p.be16(at: 14))
        referenceTime = Int32(bitPattern: p.be24(at: 16) << 8) >> 8
        feedbackCount = p[19]

        // Status symbols: 0 not received, 1 small delta (1 byte), 2 large or negative delta (2 bytes).
        var symbols: [UInt8] = []
        symbols.reserveCapacity(statusCount)
        var at = 20
        while symbols.count < statusCount {
            guard at + 2 <= p.count else {
                throw RtcpError.badFeedback("packet chunks end after \(symbols.count) of \(statusCount) statuses")
            }
            let chunk = p.be16(at: at)
            at += 2
            if chunk & 0x8000 == 0 {
                // Run length chunk: T=0, 2-bit symbol, 13-bit run.
                let symbol = UInt8((chunk >> 13) & 0x3), run = Int(chunk & 0x1FFF)
                symbols += repeatElement(symbol, count: min(run, statusCount - symbols.count))
            } else if chunk & 0x4000 == 0 {
                // Status vector chunk, 14 one-bit symbols: received (small delta) or not.
                for bit in (0..<14).reversed() where symbols.count < statusCount {
                    symbols.append(UInt8((chunk >> bit) & 1))
                }
            } else {
                // Status vector chunk, 7 two-bit symbols.
                for pair in (0..<7).reversed() where symbols.count < statusCount {
                    symbols.append(UInt8((chunk >> (2 * pair)) & 0x3))
                }
            }
        }
        if let reserved = symbols.firstIndex(of: 3) {
            throw RtcpError.badFeedback("status symbol 3 (reserved) for sequence \(baseSequenceNumber &+ UInt16(reserved))")
        }

        // Receive deltas follow in order of received packets; times are absolute in 250 µs steps.
        var time = Int64(referenceTime) * 64_000
        var packets: [Packet] = []
        packets.reserveCapacity(statusCount)
        for (i, symbol) in symbols.enumerated() {
            let sequence = baseSequenceNumber &+ UInt16(truncatingIfNeeded: i)
            switch symbol {
            case 1:
                guard at + 1 <= p.count else { throw RtcpError.badFeedback("receive deltas end at sequence \(sequence)") }
                time += Int64(p[at]) * 250
                at += 1
                packets.append(Packet(sequenceNumber: sequence, arrivalMicroseconds: time))
            case 2:
                guard at + 2 <= p.count else { throw RtcpError.badFeedback("receive deltas end at sequence \(sequence)") }
                time += Int64(Int16(bitPattern: p.be16(at: at))) * 250
                at += 2
                packets.append(Packet(sequenceNumber: sequence, arrivalMicroseconds: time))
            default:
                packets.append(Packet(sequenceNumber: sequence, arrivalMicroseconds: nil))
            }
        }
        self.packets = packets
    }
}
