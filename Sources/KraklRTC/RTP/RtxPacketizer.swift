/// Wraps packets for retransmission on their own stream (RFC 4588 §4): the RTX
/// stream has its own SSRC, payload type and sequence numbers, and the payload
/// starts with the original sequence number (OSN). Receivers that saw the
/// original would otherwise mistake a resend for a duplicate.
public struct RtxPacketizer: Sendable {
    public let ssrc: UInt32
    public let payloadType: UInt8
    public private(set) var sequenceNumber: UInt16

    public init(ssrc: UInt32, payloadType: UInt8, initialSequenceNumber: UInt16 = UInt16.random(in: 0...UInt16.max)) {
        self.ssrc = ssrc
        self.payloadType = payloadType
        self.sequenceNumber = initialSequenceNumber
    }

    /// The RTX packet carrying `original`: same timestamp, marker and header extensions; padding dropped.
    public mutating func wrap(_ original: RtpPacket) -> RtpPacket {
        var payload: [UInt8] = []
        payload.appendBE16(original.sequenceNumber)
        payload += original.payload
        let packet = RtpPacket(marker: original.marker, payloadType: payloadType, sequenceNumber: sequenceNumber,
                               timestamp: original.timestamp, ssrc: ssrc, extensions: original.extensions, payload: payload)
        sequenceNumber &+= 1
        return packet
    }

    /// The original sequence number and payload inside an RTX packet (the receiving side of §4).
    public static func unwrap(_ rtx: RtpPacket) throws(RtpError) -> (originalSequenceNumber: UInt16, payload: [UInt8]) {
        guard rtx.payload.count >= 2 else { throw RtpError.badPayload("RTX payload shorter than its 2-byte OSN") }
        return (rtx.payload.be16(at: 0), Array(rtx.payload.dropFirst(2)))
    }
}
