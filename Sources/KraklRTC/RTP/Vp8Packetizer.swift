/// Splits VP8 frames into RTP payloads (RFC 7741 §4). Every payload starts
/// with a 4-byte descriptor: X=1, S=1 on the first packet (libvpx gives one
/// partition, so PID is 0), and a 15-bit PictureID (I=1, M=1) that receivers
/// use to detect lost frames and that pairs PLI/NACK reports with frames.
public struct Vp8Packetizer: Sendable {
    public static let descriptorSize = 4
    public let maxPayloadSize: Int
    /// The PictureID of the next frame; wraps at 2^15.
    public private(set) var pictureID: UInt16

    public init(maxPayloadSize: Int = 1200, initialPictureID: UInt16 = UInt16.random(in: 0...0x7FFF)) {
        precondition(maxPayloadSize > Self.descriptorSize, "a payload must fit the descriptor and at least one byte")
        self.maxPayloadSize = maxPayloadSize
        self.pictureID = initialPictureID & 0x7FFF
    }

    /// The payloads of one encoded frame, in order; the caller sets the marker on the last (RFC 7741 §4.1).
    /// Sizes are balanced so the last packet is not a runt.
    public mutating func packetize(_ frame: [UInt8]) -> [[UInt8]] {
        guard !frame.isEmpty else { return [] }
        defer { pictureID = (pictureID &+ 1) & 0x7FFF }
        return balancedChunks(count: frame.count, capacity: maxPayloadSize - Self.descriptorSize).enumerated().map { index, range in
            let descriptor: [UInt8] = [
                0x80 | (index == 0 ? 0x10 : 0),           // X, S (start of partition 0), PID 0
                0x80,                                      // I: PictureID present
                0x80 | UInt8(pictureID >> 8),              // M: 15-bit PictureID, high 7 bits
                UInt8(pictureID & 0xFF),
            ]
            return descriptor + frame[range]
        }
    }
}

/// `count` bytes cut into the fewest chunks of at most `capacity`, sizes differing by at most one.
func balancedChunks(count: Int, capacity: Int, firstCapacity: Int? = nil) -> [Range<Int>] {
    let first = firstCapacity ?? capacity
    if count <= first { return [0..<count] }
    // The first chunk may have less room (VP9 keyframes carry the scalability structure there).
    let pieces = 1 + (count - first + capacity - 1) / capacity
    var ranges: [Range<Int>] = []
    var start = 0
    for i in 0..<pieces {
        let remaining = count - start, left = pieces - i
        var size = (remaining + left - 1) / left
        if i == 0 { size = min(size, first) }
        size = min(size, capacity)
        ranges.append(start..<(start + size))
        start += size
    }
    if start < count { ranges[ranges.count - 1] = ranges[ranges.count - 1].lowerBound..<count }
    return ranges
}
