import KraklBase
import KraklHost
import Glibc

/// Writes a WebM (Matroska) file that browsers, ffmpeg and mpv play: one
/// video track of SimpleBlocks in clusters that start at keyframes (or
/// every few seconds), and Cues for seeking. Sizes that are known only at
/// the end (segment, clusters, duration, the Cues' place) are written as
/// "unknown" and patched, so a recording cut short by a crash is still
/// readable as a live stream of unknown length. On an output that cannot be
/// patched (a FIFO, a terminal, /dev/stdout into a pipe) it writes exactly
/// such a live stream: unknown sizes, no Duration, no Cues.
public final class WebMWriter: EncodedFrameSink {
    private let file: OutputFile
    private let codec: VideoCodec
    private var segmentDataStart = 0
    private var segmentSizeOffset = 0
    private var durationOffset: Int?
    private var cuesSeekOffset: Int?
    private var clusterStart: Int?
    private var clusterSizeOffset = 0
    private var clusterTimecode: UInt64 = 0
    private var firstTimestamp: UInt64?
    private var lastTimecode: UInt64 = 0
    private var cues: [(time: UInt64, cluster: Int)] = []
    static let maximumClusterMs: UInt64 = 5000
    /// Where Info starts in the segment: SeekHead (fixed layout below) plus a Void pad.
    private static let infoAt = 0x70

    public init(path: String, codec: VideoCodec, width: Int, height: Int) throws(EncoderError) {
        file = try OutputFile(path: path)
        self.codec = codec
        let live = !file.isSeekable
        // The whole head is built in memory (every place in it known before it is written).
        var out = ebml(0x1A45DFA3, [
            uintElement(0x4286, 1), uintElement(0x42F7, 1), uintElement(0x42F2, 4), uintElement(0x42F3, 8),
            stringElement(0x4282, "webm"), uintElement(0x4287, 4), uintElement(0x4285, 2),
        ].flatMap { $0 })
        // Segment of unknown size for now.
        out += id(0x18538067)
        segmentSizeOffset = out.count
        out += unknownSize
        segmentDataStart = out.count

        // Info: 1 ms timecodes; Duration (8-byte float) patched at the end (none in a live stream).
        var info = uintElement(0x2AD7B1, 1_000_000) + stringElement(0x4D80, "krakl-agent") + stringElement(0x5741, "krakl-agent")
        let durationElement = id(0x4489) + vintSize(8, length: 1)
        let durationLength = live ? 0 : durationElement.count + 8
        let infoHeader = id(0x1549A966) + vintSize(UInt64(info.count + durationLength), length: 8)
        if !live {
            durationOffset = segmentDataStart + Self.infoAt + infoHeader.count + info.count + durationElement.count
            info += durationElement + be(Double(0).bitPattern, 8)
        }
        info = infoHeader + info
        let tracksAt = Self.infoAt + info.count

        // SeekHead: where Info, Tracks and (patched at the end) Cues are.
        let seekEntry = { (element: UInt32, at: Int) -> [UInt8] in
            ebml(0x4DBB, ebml(0x53AB, id(element)) + ebml(0x53AC, be(UInt64(at), 8)))
        }
        var seekHead = seekEntry(0x1549A966, Self.infoAt) + seekEntry(0x1654AE6B, tracksAt)
        let cuesEntryStart = seekHead.count
        if !live { seekHead += seekEntry(0x1C53BB6B, 0) }
        let seekHeadBytes = ebml(0x114D9B74, seekHead)
        if !live {
            let headerLength = seekHeadBytes.count - seekHead.count
            cuesSeekOffset = segmentDataStart + headerLength + cuesEntryStart + (seekEntry(0x1C53BB6B, 0).count - 8)
        }
        out += seekHeadBytes
        let pad = Self.infoAt - (out.count - segmentDataStart)
        precondition(pad >= 2, "SeekHead outgrew its reserved space")
        out += [0xEC] + vintSize(UInt64(pad - 2), length: 1) + [UInt8](repeating: 0, count: pad - 2)
        out += info

        let video = ebml(0xE0, uintElement(0xB0, UInt64(width)) + uintElement(0xBA, UInt64(height)))
        let track = ebml(0xAE, uintElement(0xD7, 1) + uintElement(0x73C5, 1) + uintElement(0x83, 1)
                         + uintElement(0x9C, 0) + stringElement(0x86, codec.webmCodecID) + video)
        out += ebml(0x1654AE6B, track)
        try file.write(out)
    }

    public func write(_ frame: EncodedFrame) throws(EncoderError) {
        let start = firstTimestamp ?? frame.timestampNs
        firstTimestamp = start
        // Milliseconds since the first frame, never going backwards.
        let timecode = forwardMilliseconds(frame.timestampNs, since: start, floor: lastTimecode)
        lastTimecode = timecode
        if clusterStart == nil || frame.keyframe || timecode - clusterTimecode >= Self.maximumClusterMs {
            try closeCluster()
            clusterStart = file.position
            clusterTimecode = timecode
            try file.write(id(0x1F43B675))
            clusterSizeOffset = file.position
            try file.write(unknownSize)
            try file.write(uintElement(0xE7, timecode))
            if frame.keyframe { cues.append((timecode, clusterStart! - segmentDataStart)) }
        }
        // SimpleBlock: track 1, timecode relative to the cluster (< maximumClusterMs), keyframe flag.
        let relative = Int16(timecode - clusterTimecode)
        let block = [0x81] + be(UInt64(UInt16(bitPattern: relative)), 2) + [frame.keyframe ? 0x80 : 0x00]
        try file.write(id(0xA3) + vintSize(UInt64(block.count + frame.data.count), length: 8) + block)
        try file.write(frame.data)
        // Each frame leaves stdio at once: a live reader (a FIFO) gets it now, and a full disk says so at this frame.
        try file.flush()
    }

    private func closeCluster() throws(EncoderError) {
        guard clusterStart != nil else { return }
        if file.isSeekable {
            try file.patch(vintSize(UInt64(file.position - clusterSizeOffset - 8), length: 8), at: clusterSizeOffset)
        }
        clusterStart = nil
    }

    public func finish() throws(EncoderError) {
        try closeCluster()
        if file.isSeekable, let cuesSeekOffset, let durationOffset {
            let cuesAt = file.position - segmentDataStart
            let points = cues.flatMap { cue in
                ebml(0xBB, uintElement(0xB3, cue.time) + ebml(0xB7, uintElement(0xF7, 1) + uintElement(0xF1, UInt64(cue.cluster))))
            }
            if !points.isEmpty {
                try file.write(ebml(0x1C53BB6B, points))
                try file.patch(be(UInt64(cuesAt), 8), at: cuesSeekOffset)
            }
            // One frame interval past the last timecode is unknown; the last timecode is honest.
            try file.patch(be(Double(lastTimecode).bitPattern, 8), at: durationOffset)
            try file.patch(vintSize(UInt64(file.position - segmentDataStart), length: 8), at: segmentSizeOffset)
        }
        try file.close()
    }
}

// MARK: EBML encoding

/// "Unknown size": a reader treats the element as running to its parent's end.
private let unknownSize: [UInt8] = [0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]

/// An element ID as written (IDs keep their length marker bits).
private func id(_ value: UInt32) -> [UInt8] {
    let length = value > 0xFFFFFF ? 4 : value > 0xFFFF ? 3 : value > 0xFF ? 2 : 1
    return be(UInt64(value), length)
}

/// A size as an EBML variable-length integer of `length` bytes (or the shortest).
private func vintSize(_ value: UInt64, length: Int? = nil) -> [UInt8] {
    let bytes = length ?? (1...8).first { value < (UInt64(1) << (7 * UInt64($0))) - 1 }!
    var out = be(value, bytes)
    out[0] |= UInt8(0x80 >> (bytes - 1))
    return out
}

private func ebml(_ element: UInt32, _ payload: [UInt8]) -> [UInt8] { id(element) + vintSize(UInt64(payload.count)) + payload }

private func uintElement(_ element: UInt32, _ value: UInt64) -> [UInt8] {
    let length = max(1, (64 - value.leadingZeroBitCount + 7) / 8)
    return ebml(element, be(value, length))
}

private func stringElement(_ element: UInt32, _ value: String) -> [UInt8] { ebml(element, Array(value.utf8)) }

/// Big-endian bytes of `value`.
func be(_ value: UInt64, _ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64(count - 1 - $0))) } }
