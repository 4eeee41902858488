/// Splits VP9 frames into RTP payloads (RFC 9628 §4.2), non-flexible mode
/// with one spatial and one temporal layer: I=1 with a 15-bit PictureID, P
/// on inter frames, B on a frame's first packet, E on its last, and on
/// keyframes V=1 with a scalability structure giving the size and a GOF of one
/// frame that references the previous one.
public struct Vp9Packetizer: Sendable {
    public let maxPayloadSize: Int
    public private(set) var pictureID: UInt16

    public init(maxPayloadSize: Int = 1200, initialPictureID: UInt16 = UInt16.random(in: 0...0x7FFF)) {
        precondition(maxPayloadSize > 16, "a payload must fit the descriptor, the scalability structure and data")
        self.maxPayloadSize = maxPayloadSize
        self.pictureID = initialPictureID & 0x7FFF
    }

    /// The payloads of one encoded frame; `width`/`height` go into the keyframe's scalability structure.
    public mutating func packetize(_ frame: [UInt8], keyframe: Bool, width: Int, height: Int) -> [[UInt8]] {
        guard !frame.isEmpty else { return [] }
        defer { pictureID = (pictureID &+ 1) & 0x7FFF }
        var ss: [UInt8] = []
        if keyframe {
            ss.append(0x18)                                   // N_S=0 (one layer), Y=1 sizes, G=1 GOF
            ss.appendBE16(UInt16(clamping: width))
            ss.appendBE16(UInt16(clamping: height))
            ss.append(1)                                      // N_G: one picture in the GOF
            ss.append(0x04)                                   // T=0, U=0, R=1 reference
            ss.append(1)                                      // P_DIFF: the previous picture
        }
        let base = 3
        let ranges = balancedChunks(count: frame.count, capacity: maxPayloadSize - base, firstCapacity: maxPayloadSize - base - ss.count)
        return ranges.enumerated().map { index, range in
            let first = index == 0, last = index == ranges.count - 1
            var flags: UInt8 = 0x80                               // I: PictureID present
            if !keyframe { flags |= 0x40 }                        // P: inter-picture predicted
            if first { flags |= 0x08 }                            // B: start of frame
            if last { flags |= 0x04 }                             // E: end of frame
            if first && keyframe { flags |= 0x02 }                // V: scalability structure follows
            var payload: [UInt8] = [flags, 0x80 | UInt8(pictureID >> 8), UInt8(pictureID & 0xFF)]
            if first { payload += ss }
            return payload + frame[range]
        }
    }
}
