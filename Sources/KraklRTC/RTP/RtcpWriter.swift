/// Builds RTCP packets. A sender sends a compound of SR + SDES(CNAME)
/// (RFC 3550 §6.1); with rtcp-rsize (RFC 5506) feedback may go alone. The
/// feedback builders exist for the receiving role and for tests.
public enum RtcpWriter {
    /// A compound datagram: the packets back to back.
    public static func compound(_ packets: [[UInt8]]) -> [UInt8] { packets.flatMap { $0 } }

    public static func senderReport(_ sr: RtcpSenderReport) -> [UInt8] {
        var body: [UInt8] = []
        body.appendBE32(sr.ssrc)
        body.appendBE64(sr.ntpTime)
        body.appendBE32(sr.rtpTimestamp)
        body.appendBE32(sr.packetCount)
        body.appendBE32(sr.octetCount)
        appendReports(sr.reports, to: &body)
        return packet(type: RtcpPacket.PacketType.senderReport, count: UInt8(sr.reports.count), body: body)
    }

    public static func receiverReport(ssrc: UInt32, reports: [RtcpReportBlock]) -> [UInt8] {
        var body: [UInt8] = []
        body.appendBE32(ssrc)
        appendReports(reports, to: &body)
        return packet(type: RtcpPacket.PacketType.receiverReport, count: UInt8(reports.count), body: body)
    }

    /// One SDES chunk with a CNAME item (RFC 3550 §6.5.1).
    public static func sourceDescription(ssrc: UInt32, cname: String) -> [UInt8] {
        var body: [UInt8] = []
        body.appendBE32(ssrc)
        let text = Array(cname.utf8.prefix(255))
        body += [1, UInt8(text.count)] + text + [0]
        body += [UInt8](repeating: 0, count: paddedTo4(body.count) - body.count)
        return packet(type: RtcpPacket.PacketType.sourceDescription, count: 1, body: body)
    }

    public static func bye(ssrcs: [UInt32]) -> [UInt8] {
        var body: [UInt8] = []
        for s in ssrcs { body.appendBE32(s) }
        return packet(type: RtcpPacket.PacketType.bye, count: UInt8(ssrcs.count), body: body)
    }

    public static func pictureLossIndication(senderSSRC: UInt32, mediaSSRC: UInt32) -> [UInt8] {
        feedback(type: RtcpPacket.PacketType.payloadFeedback, format: 1, sender: senderSSRC, media: mediaSSRC, fci: [])
    }

    public static func fullIntraRequest(senderSSRC: UInt32, entries: [RtcpFirEntry]) -> [UInt8] {
        var fci: [UInt8] = []
        for e in entries {
            fci.appendBE32(e.ssrc)
            fci += [e.sequenceNumber, 0, 0, 0]
        }
        return feedback(type: RtcpPacket.PacketType.payloadFeedback, format: 4, sender: senderSSRC, media: 0, fci: fci)
    }

    /// Generic NACK: sorted sequence numbers packed into PID + 16-bit BLP entries.
    public static func nack(senderSSRC: UInt32, mediaSSRC: UInt32, lost: [UInt16]) -> [UInt8] {
        var fci: [UInt8] = []
        var pending = lost
        while let pid = pending.first {
            var blp: UInt16 = 0
            pending.removeFirst()
            pending.removeAll { seq in
                let d = seq &- pid
                guard (1...16).contains(d) else { return false }
                blp |= 1 << (d - 1)
                return true
            }
            fci.appendBE16(pid)
            fci.appendBE16(blp)
        }
        return feedback(type: RtcpPacket.PacketType.transportFeedback, format: 1, sender: senderSSRC, media: mediaSSRC, fci: fci)
    }

    /// REMB with the bitrate as an 18-bit mantissa and 6-bit exponent (rounded down).
    public static func remb(senderSSRC: UInt32, bitrate: UInt64, ssrcs: [UInt32]) -> [UInt8] {
        var exponent: UInt64 = 0
        while bitrate >> exponent > 0x3FFFF { exponent += 1 }
        let mantissa = UInt32(bitrate >> exponent)
        var fci = Array("REMB".utf8)
        fci.append(UInt8(ssrcs.count))
        fci.append(UInt8(exponent << 2) | UInt8(mantissa >> 16))
        fci.appendBE16(UInt16(mantissa & 0xFFFF))
        for s in ssrcs { fci.appendBE32(s) }
        return feedback(type: RtcpPacket.PacketType.payloadFeedback, format: 15, sender: senderSSRC, media: 0, fci: fci)
    }

    static func feedback(type: UInt8, format: UInt8, sender: UInt32, media: UInt32, fci: [UInt8]) -> [UInt8] {
        var body: [UInt8] = []
        body.appendBE32(sender)
        body.appendBE32(media)
        return packet(type: type, count: format, body: body + fci)
    }

    static func packet(type: UInt8, count: UInt8, body: [UInt8]) -> [UInt8] {
        precondition(body.count % 4 == 0, "RTCP bodies are whole 32-bit words")
        var out: [UInt8] = [0x80 | (count & 0x1F), type]
        out.appendBE16(UInt16(body.count / 4))
        return out + body
    }

    private static func appendReports(_ reports: [RtcpReportBlock], to body: inout [UInt8]) {
        for r in reports.prefix(31) {
            body.appendBE32(r.ssrc)
            body.append(r.fractionLost)
            body.appendBE24(UInt32(bitPattern: r.cumulativeLost) & 0xFF_FFFF)
            body.appendBE32(r.extendedHighestSequence)
            body.appendBE32(r.jitter)
            body.appendBE32(r.lastSenderReport)
            body.appendBE32(r.delaySinceLastSenderReport)
        }
    }
}

/// NTP timestamps (RFC 5905 §6): 32.32 fixed-point seconds since 1900, as sender reports carry them.
public enum NtpTime {
    /// Seconds from 1900-01-01 to 1970-01-01.
    public static let unixEpochOffset: UInt64 = 2_208_988_800

    /// The NTP timestamp of a wall-clock time given as nanoseconds since the Unix epoch.
    public static func from(unixNanoseconds ns: UInt64) -> UInt64 {
        let seconds = ns / 1_000_000_000 + unixEpochOffset
        let fraction = ((ns % 1_000_000_000) << 32) / 1_000_000_000
        return seconds << 32 | fraction
    }

    /// The middle 32 bits (16.16 seconds), the form LSR and DLSR use.
    public static func compact(_ ntp: UInt64) -> UInt32 { UInt32(truncatingIfNeeded: ntp >> 16) }
}
