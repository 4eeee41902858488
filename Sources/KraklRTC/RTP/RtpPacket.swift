/// Why an RTP packet (or a payload inside it) could not be read.
public enum RtpError: Error, Equatable, CustomStringConvertible {
    case truncated(String)
    case badVersion(UInt8)
    case badPadding(String)
    case badExtension(String)
    case badPayload(String)

    public var description: String {
        switch self {
        case .truncated(let what): return "RTP packet truncated: \(what)"
        case .badVersion(let v): return "RTP version is \(v), not 2: not an RTP packet"
        case .badPadding(let why): return "RTP padding invalid: \(why)"
        case .badExtension(let why): return "RTP header extension invalid: \(why)"
        case .badPayload(let why): return "RTP payload invalid: \(why)"
        }
    }
}

/// One header extension element (RFC 8285): a local id (1-14 in the one-byte form) and 1-16 bytes.
public struct RtpHeaderExtension: Equatable, Sendable {
    public var id: UInt8
    public var data: [UInt8]

    public init(id: UInt8, data: [UInt8]) {
        self.id = id
        self.data = data
    }

    /// The RtpStreamId-style mid value (RFC 8843 §15): the m-section's mid as text.
    public static func mid(id: UInt8, _ mid: String) -> RtpHeaderExtension {
        RtpHeaderExtension(id: id, data: Array(mid.utf8.prefix(16)))
    }

    /// abs-send-time: seconds as 6.18 fixed point, the low 24 bits (about 64 s wrap, 3.8 µs steps).
    public static func absSendTime(id: UInt8, nanoseconds: UInt64) -> RtpHeaderExtension {
        let seconds = nanoseconds / 1_000_000_000, fraction = nanoseconds % 1_000_000_000
        let value = UInt32(truncatingIfNeeded: (seconds << 18) | ((fraction << 18) / 1_000_000_000)) & 0xFF_FFFF
        var data: [UInt8] = []
        data.appendBE24(value)
        return RtpHeaderExtension(id: id, data: data)
    }

    /// playout-delay: the receiver's minimum and maximum delay before rendering, 12 bits each.
    public static func playoutDelay(id: UInt8, _ delay: PlayoutDelay) -> RtpHeaderExtension {
        let value = UInt32(delay.minimum) << 12 | UInt32(delay.maximum)
        var data: [UInt8] = []
        data.appendBE24(value)
        return RtpHeaderExtension(id: id, data: data)
    }

    /// transport-wide-cc: a 16-bit sequence number over every packet on the transport.
    public static func transportSequence(id: UInt8, _ sequence: UInt16) -> RtpHeaderExtension {
        var data: [UInt8] = []
        data.appendBE16(sequence)
        return RtpHeaderExtension(id: id, data: data)
    }
}

/// An RTP packet (RFC 3550 §5.1) with one-byte header extensions (RFC 8285 §4.2).
public struct RtpPacket: Equatable, Sendable {
    public var marker: Bool
    public var payloadType: UInt8
    public var sequenceNumber: UInt16
    public var timestamp: UInt32
    public var ssrc: UInt32
    public var csrcs: [UInt32] = []
    public var extensions: [RtpHeaderExtension] = []
    public var payload: [UInt8]
    /// Padding bytes to append (pacer probes); the last one holds the count (RFC 3550 §5.1 P bit).
    public var paddingCount: UInt8 = 0

    public init(marker: Bool = false, payloadType: UInt8, sequenceNumber: UInt16, timestamp: UInt32, ssrc: UInt32,
                extensions: [RtpHeaderExtension] = [], payload: [UInt8]) {
        self.marker = marker
        self.payloadType = payloadType
        self.sequenceNumber = sequenceNumber
        self.timestamp = timestamp
        self.ssrc = ssrc
        self.extensions = extensions
        self.payload = payload
    }

    public func extensionData(id: UInt8) -> [UInt8]? { extensions.first { $0.id == id }?.data }

    /// Adds or replaces the element with this id (e.g. transport-wide sequence, stamped when the pacer sends).
    public mutating func setExtension(_ element: RtpHeaderExtension) {
        if let i = extensions.firstIndex(where: { $0.id == element.id }) { extensions[i] = element } else { extensions.append(element) }
    }

    /// Bytes the header takes, extensions included.
    public var headerSize: Int {
        12 + 4 * csrcs.count + (extensions.isEmpty ? 0 : 4 + paddedTo4(extensions.reduce(0) { $0 + 1 + $1.data.count }))
    }

    /// Bytes on the wire before SRTP: header, payload and padding.
    public var serializedSize: Int { headerSize + payload.count + Int(paddingCount) }

    public func serialized() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(serializedSize)
        out.append(0x80 | (paddingCount > 0 ? 0x20 : 0) | (extensions.isEmpty ? 0 : 0x10) | UInt8(csrcs.count & 0x0F))
        out.append((marker ? 0x80 : 0) | (payloadType & 0x7F))
        out.appendBE16(sequenceNumber)
        out.appendBE32(timestamp)
        out.appendBE32(ssrc)
        for c in csrcs.prefix(15) { out.appendBE32(c) }
        if !extensions.isEmpty {
            var body: [UInt8] = []
            for e in extensions {
                precondition((1...14).contains(e.id) && (1...16).contains(e.data.count), "one-byte header extensions carry ids 1-14 and 1-16 bytes")
                body.append(e.id << 4 | UInt8(e.data.count - 1))
                body += e.data
            }
            body += [UInt8](repeating: 0, count: paddedTo4(body.count) - body.count)
            out.appendBE16(0xBEDE)
            out.appendBE16(UInt16(body.count / 4))
            out += body
        }
        out += payload
        if paddingCount > 0 {
            out += [UInt8](repeating: 0, count: Int(paddingCount) - 1)
            out.append(paddingCount)
        }
        return out
    }

    /// Reads a packet. One-byte (0xBEDE) and two-byte (0x100X) extension elements both land in
    /// `extensions`; other extension profiles are skipped.
    public init(parsing bytes: [UInt8]) throws(RtpError) {
        guard bytes.count >= 12 else { throw RtpError.truncated("\(bytes.count) bytes, a header needs 12") }
        let version = bytes[0] >> 6
        guard version == 2 else { throw RtpError.badVersion(version) }
        let hasPadding = bytes[0] & 0x20 != 0, hasExtension = bytes[0] & 0x10 != 0
        let csrcCount = Int(bytes[0] & 0x0F)
        marker = bytes[1] & 0x80 != 0
        payloadType = bytes[1] & 0x7F
        sequenceNumber = bytes.be16(at: 2)
        timestamp = bytes.be32(at: 4)
        ssrc = bytes.be32(at: 8)
        var offset = 12
        guard bytes.count >= offset + 4 * csrcCount else { throw RtpError.truncated("\(csrcCount) CSRCs do not fit") }
        csrcs = (0..<csrcCount).map { bytes.be32(at: 12 + 4 * $0) }
        offset += 4 * csrcCount

        var end = bytes.count
        if hasPadding {
            let count = Int(bytes[bytes.count - 1])
            guard count >= 1, count <= end - offset else { throw RtpError.badPadding("count \(count) with \(end - offset) bytes after the header") }
            end -= count
            paddingCount = UInt8(count)
        }
        if hasExtension {
            guard end - offset >= 4 else { throw RtpError.truncated("extension header does not fit") }
            let profile = bytes.be16(at: offset)
            let length = 4 * Int(bytes.be16(at: offset + 2))
            offset += 4
            guard end - offset >= length else { throw RtpError.badExtension("\(length) extension bytes declared, \(end - offset) present") }
            let blockEnd = offset + length
            if profile == 0xBEDE || profile & 0xFFF0 == 0x1000 {
                extensions = try Self.readElements(bytes, from: offset, to: blockEnd, oneByte: profile == 0xBEDE)
            }
            offset = blockEnd
        }
        payload = Array(bytes[offset..<end])
    }

    private static func readElements(_ bytes: [UInt8], from start: Int, to end: Int, oneByte: Bool) throws(RtpError) -> [RtpHeaderExtension] {
        var result: [RtpHeaderExtension] = []
        var i = start
        while i < end {
            let id: UInt8, length: Int
            if oneByte {
                id = bytes[i] >> 4
                if id == 0 { i += 1; continue }      // padding byte
                if id == 15 { break }                 // reserved: stop reading (RFC 8285 §4.2)
                length = Int(bytes[i] & 0x0F) + 1
                i += 1
            } else {
                id = bytes[i]
                if id == 0 { i += 1; continue }
                guard i + 1 < end else { throw RtpError.badExtension("two-byte element header cut off") }
                length = Int(bytes[i + 1])
                i += 2
            }
            guard i + length <= end else { throw RtpError.badExtension("element id \(id) of \(length) bytes runs past the block") }
            result.append(RtpHeaderExtension(id: id, data: Array(bytes[i..<(i + length)])))
            i += length
        }
        return result
    }
}
