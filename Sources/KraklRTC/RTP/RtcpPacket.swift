/// Why an RTCP datagram could not be read. A compound packet that fails is
/// dropped whole (RFC 3550 §6.1: validity checks apply to the compound).
public enum RtcpError: Error, Equatable, CustomStringConvertible {
    case truncated(String)
    case badVersion(UInt8)
    case badLength(String)
    case badPadding(String)
    case badFeedback(String)

    public var description: String {
        switch self {
        case .truncated(let what): return "RTCP packet truncated: \(what)"
        case .badVersion(let v): return "RTCP version is \(v), not 2"
        case .badLength(let why): return "RTCP length invalid: \(why)"
        case .badPadding(let why): return "RTCP padding invalid: \(why)"
        case .badFeedback(let why): return "RTCP feedback malformed: \(why)"
        }
    }
}

/// One reception report block (RFC 3550 §6.4.1), as a receiver tells us how our stream arrives.
public struct RtcpReportBlock: Equatable, Sendable {
    public var ssrc: UInt32
    /// Fraction of packets lost since the last report, in 1/256 units.
    public var fractionLost: UInt8
    /// Cumulative number of packets lost (24-bit signed: duplicates can make it negative).
    public var cumulativeLost: Int32
    public var extendedHighestSequence: UInt32
    /// Interarrival jitter in RTP timestamp units.
    public var jitter: UInt32
    /// Middle 32 bits of the NTP time of the last SR this receiver got from us (0: none yet).
    public var lastSenderReport: UInt32
    /// Delay since that SR, in 1/65536 s.
    public var delaySinceLastSenderReport: UInt32

    public init(ssrc: UInt32, fractionLost: UInt8, cumulativeLost: Int32, extendedHighestSequence: UInt32, jitter: UInt32,
                lastSenderReport: UInt32, delaySinceLastSenderReport: UInt32) {
        self.ssrc = ssrc
        self.fractionLost = fractionLost
        self.cumulativeLost = cumulativeLost
        self.extendedHighestSequence = extendedHighestSequence
        self.jitter = jitter
        self.lastSenderReport = lastSenderReport
        self.delaySinceLastSenderReport = delaySinceLastSenderReport
    }

    /// Round-trip time (RFC 3550 §6.4.1): arrival − LSR − DLSR, all in compact NTP (1/65536 s).
    /// nil before the receiver has seen a sender report, or when the result is negative (clock trouble).
    public func roundTripSeconds(arrivalCompactNtp: UInt32) -> Double? {
        guard lastSenderReport != 0 else { return nil }
        let rtt = Int64(arrivalCompactNtp &- lastSenderReport) - Int64(delaySinceLastSenderReport)
        let wrapped = Int32(truncatingIfNeeded: rtt)
        return wrapped < 0 ? nil : Double(wrapped) / 65536
    }

    /// `fractionLost` as 0.0-1.0.
    public var lossFraction: Double { Double(fractionLost) / 256 }
}

public struct RtcpSenderReport: Equatable, Sendable {
    public var ssrc: UInt32
    public var ntpTime: UInt64
    public var rtpTimestamp: UInt32
    public var packetCount: UInt32
    public var octetCount: UInt32
    public var reports: [RtcpReportBlock] = []

    public init(ssrc: UInt32, ntpTime: UInt64, rtpTimestamp: UInt32, packetCount: UInt32, octetCount: UInt32, reports: [RtcpReportBlock] = []) {
        self.ssrc = ssrc
        self.ntpTime = ntpTime
        self.rtpTimestamp = rtpTimestamp
        self.packetCount = packetCount
        self.octetCount = octetCount
        self.reports = reports
    }
}

/// A keyframe request entry of a FIR (RFC 5104 §4.3.1): whose keyframe, and a sequence number
/// that repeats for retransmitted requests (a repeat must not trigger a second keyframe).
public struct RtcpFirEntry: Equatable, Sendable {
    public var ssrc: UInt32
    public var sequenceNumber: UInt8
}

/// One packet of a compound RTCP datagram.
public enum RtcpPacket: Equatable, Sendable {
    case senderReport(RtcpSenderReport)
    case receiverReport(ssrc: UInt32, reports: [RtcpReportBlock])
    /// SDES chunks: SSRC and its CNAME (other items are skipped).
    case sourceDescription([(ssrc: UInt32, cname: String?)])
    case bye(ssrcs: [UInt32], reason: String?)
    /// Picture loss indication (RFC 4585 §6.3.1): send a keyframe.
    case pictureLossIndication(senderSSRC: UInt32, mediaSSRC: UInt32)
    case fullIntraRequest(senderSSRC: UInt32, entries: [RtcpFirEntry])
    /// Generic NACK (RFC 4585 §6.2.1), expanded from PID/BLP pairs into sequence numbers.
    case nack(senderSSRC: UInt32, mediaSSRC: UInt32, lost: [UInt16])
    /// Receiver-estimated maximum bitrate (draft-alvestrand-rmcat-remb-03 §2.2).
    case remb(senderSSRC: UInt32, bitrate: UInt64, ssrcs: [UInt32])
    case transportFeedback(TransportWideFeedback)
    /// Anything else (APP, XR, other feedback), kept whole.
    case other(packetType: UInt8, count: UInt8, bytes: [UInt8])

    public static func == (a: RtcpPacket, b: RtcpPacket) -> Bool {
        switch (a, b) {
        case (.sourceDescription(let x), .sourceDescription(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { $0.ssrc == $1.ssrc && $0.cname == $1.cname }
        case (.senderReport(let x), .senderReport(let y)): return x == y
        case (.receiverReport(let s1, let r1), .receiverReport(let s2, let r2)): return s1 == s2 && r1 == r2
        case (.bye(let s1, let r1), .bye(let s2, let r2)): return s1 == s2 && r1 == r2
        case (.pictureLossIndication(let a1, let b1), .pictureLossIndication(let a2, let b2)): return a1 == a2 && b1 == b2
        case (.fullIntraRequest(let a1, let e1), .fullIntraRequest(let a2, let e2)): return a1 == a2 && e1 == e2
        case (.nack(let a1, let b1, let l1), .nack(let a2, let b2, let l2)): return a1 == a2 && b1 == b2 && l1 == l2
        case (.remb(let a1, let b1, let s1), .remb(let a2, let b2, let s2)): return a1 == a2 && b1 == b2 && s1 == s2
        case (.transportFeedback(let x), .transportFeedback(let y)): return x == y
        case (.other(let p1, let c1, let b1), .other(let p2, let c2, let b2)): return p1 == p2 && c1 == c2 && b1 == b2
        default: return false
        }
    }

    enum PacketType {
        static let senderReport: UInt8 = 200, receiverReport: UInt8 = 201, sourceDescription: UInt8 = 202, bye: UInt8 = 203
        static let transportFeedback: UInt8 = 205, payloadFeedback: UInt8 = 206
    }

    /// True for datagrams that are RTCP rather than RTP on a muxed port (RFC 5761 §4: PT 192-223).
    public static func looksLikeRtcp(_ datagram: [UInt8]) -> Bool {
        datagram.count >= 8 && datagram[0] >> 6 == 2 && (192...223).contains(datagram[1])
    }

    /// Reads every packet of a compound datagram. Throws on the first malformed one.
    public static func parseCompound(_ bytes: [UInt8]) throws(RtcpError) -> [RtcpPacket] {
        guard bytes.count >= 4 else { throw RtcpError.truncated("\(bytes.count) bytes, a header needs 4") }
        var packets: [RtcpPacket] = []
        var offset = 0
        while offset < bytes.count {
            guard bytes.count - offset >= 4 else { throw RtcpError.truncated("\(bytes.count - offset) stray bytes after packet \(packets.count)") }
            let version = bytes[offset] >> 6
            guard version == 2 else { throw RtcpError.badVersion(version) }
            let length = 4 * (Int(bytes.be16(at: offset + 2)) + 1)
            guard length <= bytes.count - offset else {
                throw RtcpError.badLength("packet \(packets.count) declares \(length) bytes, \(bytes.count - offset) remain")
            }
            var packet = Array(bytes[offset..<(offset + length)])
            if packet[0] & 0x20 != 0 {
                // Padding is only valid on the last packet of a compound (RFC 3550 §6.4.1).
                let pad = Int(packet[length - 1])
                guard offset + length == bytes.count else { throw RtcpError.badPadding("padding bit set on a packet that is not last") }
                guard pad <= length - 4 else { throw RtcpError.badPadding("padding count \(pad) larger than the packet body") }
                packet.removeLast(pad)
            }
            packets.append(try parseOne(packet))
            offset += length
        }
        return packets
    }

    static func parseOne(_ p: [UInt8]) throws(RtcpError) -> RtcpPacket {
        let count = p[0] & 0x1F, type = p[1]
        func need(_ n: Int, _ what: String) throws(RtcpError) {
            guard p.count >= n else { throw RtcpError.truncated("\(what) needs \(n) bytes, has \(p.count)") }
        }
        switch type {
        case PacketType.senderReport:
            try need(28 + 24 * Int(count), "SR with \(count) report blocks")
            return .senderReport(RtcpSenderReport(ssrc: p.be32(at: 4), ntpTime: p.be64(at: 8), rtpTimestamp: p.be32(at: 16),
                                                  packetCount: p.be32(at: 20), octetCount: p.be32(at: 24),
                                                  reports: reportBlocks(p, at: 28, count: Int(count))))
        case PacketType.receiverReport:
            try need(8 + 24 * Int(count), "RR with \(count) report blocks")
            return .receiverReport(ssrc: p.be32(at: 4), reports: reportBlocks(p, at: 8, count: Int(count)))
        case PacketType.sourceDescription:
            return .sourceDescription(try sdesChunks(p, count: Int(count)))
        case PacketType.bye:
            try need(4 + 4 * Int(count), "BYE with \(count) SSRCs")
            let ssrcs = (0..<Int(count)).map { p.be32(at: 4 + 4 * $0) }
            var reason: String?
            let at = 4 + 4 * Int(count)
            if p.count > at {
                let n = Int(p[at])
                guard p.count >= at + 1 + n else { throw RtcpError.truncated("BYE reason of \(n) bytes") }
                reason = String(decoding: p[(at + 1)..<(at + 1 + n)], as: UTF8.self)
            }
            return .bye(ssrcs: ssrcs, reason: reason)
        case PacketType.transportFeedback:
            try need(12, "transport feedback")
            switch count {
            case 1:
                guard (p.count - 12) % 4 == 0 else { throw RtcpError.badFeedback("NACK FCI is not whole 4-byte entries") }
                var lost: [UInt16] = []
                for at in stride(from: 12, to: p.count, by: 4) {
                    let pid = p.be16(at: at), blp = p.be16(at: at + 2)
                    lost.append(pid)
                    for bit in 0..<16 where blp & (1 << bit) != 0 { lost.append(pid &+ UInt16(bit + 1)) }
                }
                return .nack(senderSSRC: p.be32(at: 4), mediaSSRC: p.be32(at: 8), lost: lost)
            case 15:
                return .transportFeedback(try TransportWideFeedback(parsing: p))
            default:
                return .other(packetType: type, count: count, bytes: p)
            }
        case PacketType.payloadFeedback:
            try need(12, "payload feedback")
            switch count {
            case 1:
                return .pictureLossIndication(senderSSRC: p.be32(at: 4), mediaSSRC: p.be32(at: 8))
            case 4:
                guard (p.count - 12) % 8 == 0 else { throw RtcpError.badFeedback("FIR FCI is not whole 8-byte entries") }
                let entries = stride(from: 12, to: p.count, by: 8).map { RtcpFirEntry(ssrc: p.be32(at: $0), sequenceNumber: p[$0 + 4]) }
                return .fullIntraRequest(senderSSRC: p.be32(at: 4), entries: entries)
            case 15 where p.count >= 16 && Array(p[12..<16]) == Array("REMB".utf8):
                try need(20, "REMB")
                let ssrcCount = Int(p[16])
                try need(20 + 4 * ssrcCount, "REMB with \(ssrcCount) SSRCs")
                let exponent = UInt64(p[17] >> 2)
                let mantissa = UInt64(p[17] & 0x03) << 16 | UInt64(p.be16(at: 18))
                // A huge exponent would overflow: saturate (it means "no limit").
                let bitrate = exponent >= 46 ? (mantissa == 0 ? 0 : UInt64.max) : mantissa << exponent
                return .remb(senderSSRC: p.be32(at: 4), bitrate: bitrate, ssrcs: (0..<ssrcCount).map { p.be32(at: 20 + 4 * $0) })
            default:
                return .other(packetType: type, count: count, bytes: p)
            }
        default:
            return .other(packetType: type, count: count, bytes: p)
        }
    }

    private static func reportBlocks(_ p: [UInt8], at start: Int, count: Int) -> [RtcpReportBlock] {
        (0..<count).map { i in
            let b = start + 24 * i
            let lost24 = p.be24(at: b + 5)
            return RtcpReportBlock(ssrc: p.be32(at: b), fractionLost: p[b + 4],
                                   cumulativeLost: Int32(bitPattern: lost24 << 8) >> 8,
                                   extendedHighestSequence: p.be32(at: b + 8), jitter: p.be32(at: b + 12),
                                   lastSenderReport: p.be32(at: b + 16), delaySinceLastSenderReport: p.be32(at: b + 20))
        }
    }

    private static func sdesChunks(_ p: [UInt8], count: Int) throws(RtcpError) -> [(ssrc: UInt32, cname: String?)] {
        var chunks: [(ssrc: UInt32, cname: String?)] = []
        var at = 4
        for _ in 0..<count {
            guard p.count - at >= 4 else { throw RtcpError.truncated("SDES chunk \(chunks.count) has no SSRC") }
            let ssrc = p.be32(at: at)
            at += 4
            var cname: String?
            while true {
                guard at < p.count else { throw RtcpError.truncated("SDES chunk \(chunks.count) has no end item") }
                let itemType = p[at]
                if itemType == 0 { break }
                guard at + 2 <= p.count, at + 2 + Int(p[at + 1]) <= p.count else { throw RtcpError.truncated("SDES item runs past the packet") }
                let n = Int(p[at + 1])
                if itemType == 1 { cname = String(decoding: p[(at + 2)..<(at + 2 + n)], as: UTF8.self) }
                at += 2 + n
            }
            // The end item and the padding to the next 32-bit boundary.
            at = paddedTo4(at + 1)
            chunks.append((ssrc, cname))
        }
        return chunks
    }
}
