import KraklBase

/// Turns encoded frames into RTP packets for one video stream: the codec's
/// packetizer, consecutive sequence numbers, the 90 kHz clock, the marker on
/// each frame's last packet, and the mid and playout-delay extensions when the answer kept them.
/// Send-time extensions (abs-send-time, transport-wide sequence) are stamped
/// by whoever sends, with `RtpPacket.setExtension`.
public struct RtpVideoSender: Sendable {
    public enum Packetizer: Sendable {
        case vp8(Vp8Packetizer)
        case vp9(Vp9Packetizer)
    }

    public let ssrc: UInt32
    public let payloadType: UInt8
    public private(set) var sequenceNumber: UInt16
    public private(set) var clock: RtpClock
    public private(set) var packetizer: Packetizer
    /// The mid extension (id, value) to put on every packet, or nil.
    public var mid: (id: UInt8, value: String)?
    /// The playout-delay extension (id, value), or nil. Written on every packet of a keyframe and on the
    /// first packet of every other frame: libwebrtc receivers take a frame's delay from its first packet
    /// and keep it until told otherwise, so a receiver that lost the first packet, or joined late, still
    /// learns it from the next keyframe, at 4 bytes a frame otherwise.
    public var playoutDelay: (id: UInt8, value: PlayoutDelay)?

    public init(codec: VideoCodec, ssrc: UInt32, payloadType: UInt8, maxPayloadSize: Int = 1200,
                initialSequenceNumber: UInt16 = UInt16.random(in: 0...UInt16.max), clock: RtpClock = RtpClock(),
                initialPictureID: UInt16 = UInt16.random(in: 0...0x7FFF)) {
        self.ssrc = ssrc
        self.payloadType = payloadType
        self.sequenceNumber = initialSequenceNumber
        self.clock = clock
        switch codec {
        case .vp8: packetizer = .vp8(Vp8Packetizer(maxPayloadSize: maxPayloadSize, initialPictureID: initialPictureID))
        case .vp9: packetizer = .vp9(Vp9Packetizer(maxPayloadSize: maxPayloadSize, initialPictureID: initialPictureID))
        }
    }

    /// The packets of one encoded frame, in sending order.
    public mutating func packets(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) -> [RtpPacket] {
        let payloads: [[UInt8]]
        switch packetizer {
        case .vp8(var p):
            payloads = p.packetize(frame)
            packetizer = .vp8(p)
        case .vp9(var p):
            payloads = p.packetize(frame, keyframe: keyframe, width: width, height: height)
            packetizer = .vp9(p)
        }
        let timestamp = clock.timestamp(captureNanoseconds: captureNanoseconds)
        let extensions = mid.map { [RtpHeaderExtension.mid(id: $0.id, $0.value)] } ?? []
        let withDelay = extensions + (playoutDelay.map { [RtpHeaderExtension.playoutDelay(id: $0.id, $0.value)] } ?? [])
        return payloads.enumerated().map { index, payload in
            defer { sequenceNumber &+= 1 }
            return RtpPacket(marker: index == payloads.count - 1, payloadType: payloadType, sequenceNumber: sequenceNumber,
                             timestamp: timestamp, ssrc: ssrc, extensions: keyframe || index == 0 ? withDelay : extensions, payload: payload)
        }
    }
}
