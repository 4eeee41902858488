import KraklBase
import FoundationEssentials
import Glibc

/// What a send stream was negotiated to: read from an answer to our offer (`SdpAnswer`, SDP/) or from
/// the remote offer we answer (`SdpRemoteOffer`).
public struct VideoSendParameters: Sendable, Equatable {
    public var codec: VideoCodec
    public var payloadType: UInt8
    /// Retransmissions go on this payload type and `rtxSSRC` (RFC 4588); nil: resent as is.
    public var rtxPayloadType: UInt8?
    /// Header extension ids the peer accepted; only these are written.
    public var extensions: [RtpHeaderExtensionKind: UInt8]
    /// The m-section's mid (for the mid header extension).
    public var mid: String

    public init(codec: VideoCodec, payloadType: UInt8, rtxPayloadType: UInt8?, extensions: [RtpHeaderExtensionKind: UInt8], mid: String) {
        self.codec = codec
        self.payloadType = payloadType
        self.rtxPayloadType = rtxPayloadType
        self.extensions = extensions
        self.mid = mid
    }
}

/// One encoded frame on its way to the network.
public struct OutgoingVideoFrame: Sendable {
    public var data: [UInt8]
    public var keyframe: Bool
    /// CLOCK_MONOTONIC capture time: the RTP timestamp follows it.
    public var captureNs: UInt64
    public var width: Int
    public var height: Int

    public init(data: [UInt8], keyframe: Bool, captureNs: UInt64, width: Int, height: Int) {
        self.data = data
        self.keyframe = keyframe
        self.captureNs = captureNs
        self.width = width
        self.height = height
    }
}

/// The publisher's numbers behind a lock: written on the network thread, read from any.
public final class RtcStatsCell: Sendable {
    private let value = Guarded(RtcStats())

    public init() {}

    public var snapshot: RtcStats { value.withLock { $0 } }

    public func update(_ change: (inout RtcStats) -> Void) { value.withLock { change(&$0) } }
}

/// One video stream's sending rules, without sockets or a clock: packetizing, the RTP history for
/// retransmissions, the pacer, loss protection, RTCP feedback (NACK, PLI/FIR, REMB, transport-wide-cc,
/// receiver reports, BYE), sender reports and the bandwidth estimate. The owner (`Publisher`, over a
/// `PeerTransport`) passes the time into every call and sends what `pump` hands it; tests drive it the
/// same way with a made-up clock. Network thread only: given its loop (`confinedTo`), every call
/// checks that it runs there (tests drive it from one thread without a loop).
///
/// Split out of the publisher so that these rules can be tested without a network and so that one
/// encoder can feed several peers: each peer has its own stream (sequence numbers, history, estimate).
public final class VideoSendStream {
    /// Why a datagram did not leave (the transport's answer to `transmit`).
    public enum TransmitResult { case sent, sendFailed, protectFailed }

    public let configuration: VideoSendConfiguration
    public let parameters: VideoSendParameters
    public let ssrc: UInt32
    public let rtxSSRC: UInt32
    public let cname: String

    /// The encoder should make the next frame a keyframe (rate-limited here). Must not block.
    public var onKeyframeRequest: (() -> Void)?
    /// The encoder's new target bitrate in bits per second. Must not block.
    public var onBitrate: ((Int) -> Void)?

    /// True between `start` (DTLS connected) and `stop`: frames are packetized and packets leave.
    public private(set) var media = false
    private let stats: RtcStatsCell

    private var sender: RtpVideoSender
    private var rtx: RtxPacketizer?
    private var history: RtpSendHistory
    private var pacer: Pacer
    private var estimator: BandwidthEstimator
    /// The first keyframe after `start` paces as a probe of the path.
    public private(set) var startupProbe: StartupProbe
    private var lastReportedBitrate: Double?
    private var transportSequence: UInt16 = 0
    private var sentTimes: [(sequence: UInt16, sendNs: UInt64, size: Int)?]
    private var keyframeLimiter: KeyframeRequestLimiter
    private var lastFirSequence: UInt8?
    private let keyframeRequestSender: KeyframeRequestSender
    /// The last packet of the newest keyframe while it waits in the pacer, and when such a packet last left.
    private var keyframeTailSequence: UInt16?
    private var lastKeyframeSentNs: UInt64?
    private var sawKeyframe = false
    /// Which small frames' packets to send again, and when (loss protection).
    private var protection: LossProtection
    private var nextSenderReportAt: UInt64?
    private var mediaPacketCount: UInt32 = 0
    private var mediaOctetCount: UInt32 = 0
    private var roundTripMilliseconds: Double?
    /// The network loop whose thread alone may call in (nil: the caller keeps to one thread).
    private let loop: EventLoop?

    public init(configuration: VideoSendConfiguration, parameters: VideoSendParameters, ssrc: UInt32, rtxSSRC: UInt32, cname: String,
                stats: RtcStatsCell = RtcStatsCell(), confinedTo loop: EventLoop? = nil) {
        self.loop = loop
        self.configuration = configuration
        self.parameters = parameters
        self.ssrc = ssrc
        self.rtxSSRC = rtxSSRC
        self.cname = cname
        self.stats = stats
        var sender = RtpVideoSender(codec: parameters.codec, ssrc: ssrc, payloadType: parameters.payloadType,
                                    maxPayloadSize: configuration.maximumPayloadSize)
        if let id = parameters.extensions[.mid] { sender.mid = (id, parameters.mid) }
        if let id = parameters.extensions[.playoutDelay], let delay = configuration.playoutDelay { sender.playoutDelay = (id, delay) }
        self.sender = sender
        if let rtxType = parameters.rtxPayloadType { rtx = RtxPacketizer(ssrc: rtxSSRC, payloadType: rtxType) }
        history = RtpSendHistory(capacity: configuration.historyCapacity)
        pacer = Pacer(rate: configuration.startBitrate * configuration.pacingFactor, capacity: configuration.pacerCapacity)
        protection = LossProtection(configuration: configuration)
        estimator = BandwidthEstimator(minimum: configuration.minimumBitrate, maximum: configuration.maximumBitrate,
                                       start: configuration.startBitrate)
        startupProbe = StartupProbe(baseRate: configuration.startBitrate * configuration.pacingFactor,
                                    ceiling: configuration.startupProbeCeiling)
        sentTimes = Array(repeating: nil, count: 8192)
        keyframeLimiter = KeyframeRequestLimiter(interval: configuration.keyframeRequestInterval)
        keyframeRequestSender = configuration.keyframeRequestSender
        stats.update { $0.targetBitrate = estimator.target }
    }

    /// The estimate's current target, bits per second.
    public var targetBitrate: Double { estimator.target }

    /// The transport is up (SRTP keys in place): media may flow. The encoder is told the current target
    /// and, unless a keyframe encoded while connecting is about to be enqueued (`keyframeReady`), asked
    /// for a keyframe: the receiver has nothing to decode from.
    public func start(now: UInt64, keyframeReady: Bool = false) {
        loop?.preconditionInLoop()
        media = true
        nextSenderReportAt = now + configuration.senderReportInterval.inNanoseconds / 2
        reportBitrate(force: true, now: now)
        if !keyframeReady { requestKeyframe(now: now) }
    }

    /// No more media (the peer ended the session, or it failed).
    public func stop() {
        loop?.preconditionInLoop()
        media = false
    }

    // MARK: Frames

    /// Packetizes encoded frames into the pacer. `queueOverflowed`: frames were dropped before they got
    /// here, so the receiver needs a keyframe. Returns false (and does nothing) before `start`.
    @discardableResult
    public func enqueue(_ frames: [OutgoingVideoFrame], queueOverflowed: Bool, now: UInt64) -> Bool {
        loop?.preconditionInLoop()
        guard media else { return false }
        if queueOverflowed { requestKeyframe(now: now) }
        var framesSent = 0, keyframes = 0, dropped = 0
        for frame in frames {
            let packets = sender.packets(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.captureNs,
                                         width: frame.width, height: frame.height)
            dropped += pacer.enqueue(packets, kind: .media, now: now)
            protection.frameQueued(packets.lazy.map(\.sequenceNumber), now: now)  // no array per frame
            framesSent += 1
            if frame.keyframe {
                keyframes += 1
                keyframeTailSequence = packets.last?.sequenceNumber
                if startupProbe.state == .waiting {
                    startupProbe.keyframeQueued()
                    updatePacingRate(now: now)
                }
                if !sawKeyframe {
                    sawKeyframe = true
                    stats.update { $0.firstKeyframeQueuedMs = Double(now) / 1e6 }
                }
            }
        }
        stats.update {
            $0.framesSent += framesSent
            $0.keyframesSent += keyframes
            $0.pacerDroppedPackets += dropped
        }
        if dropped > 0 {
            keyframeTailSequence = nil  // it may have been among the dropped; never wait on a packet that will not leave
            endStartupProbe(now: now)
            requestKeyframe(now: now)
        }
        return true
    }

    // MARK: Timed work

    /// Runs what is due at `now`: a deferred keyframe request, a sender report (handed to `transmit` as
    /// RTCP), loss-protection copies, and the packets the pacer lets out (handed to `transmit` as RTP).
    /// - Parameters:
    ///   - pathReady: the transport has a selected path and SRTP keys; while false, packets wait in the
    ///     pacer and a due sender report is skipped.
    ///   - clock: the send time of each packet (abs-send-time, transport-wide feedback); the pacer decides at `now`.
    ///   - unixNanoseconds: wall-clock time for the sender report's NTP timestamp.
    ///   - transmit: protects and sends one datagram (`rtcp` tells which kind).
    public func poll(now: UInt64, pathReady: Bool = true, clock: () -> UInt64, unixNanoseconds: () -> UInt64,
                     transmit: (_ plain: [UInt8], _ rtcp: Bool) -> TransmitResult) {
        loop?.preconditionInLoop()
        if keyframeLimiter.takeDue(now: now) {
            stats.update { $0.keyframeRequests += 1 }
            onKeyframeRequest?()
        }
        if media, let due = nextSenderReportAt, due <= now {
            if pathReady, let report = senderReport(now: now, unixNanoseconds: unixNanoseconds()), transmit(report, true) != .protectFailed {
                stats.update { $0.senderReportsSent += 1 }
            }
            nextSenderReportAt = now + configuration.senderReportInterval.inNanoseconds
        }
        queueDueCopies(now: now)
        if pathReady { pump(now: now, clock: clock, transmit: transmit) }
    }

    /// When `poll` must run next (nil: nothing timed).
    public func nextDeadline(now: UInt64) -> UInt64? {
        loop?.preconditionInLoop()
        var next: UInt64?
        func consider(_ t: UInt64?) { if let t { next = min(next ?? t, t) } }
        consider(keyframeLimiter.deferredUntil)
        if media { consider(nextSenderReportAt); consider(pacer.nextSendTime(now: now)); consider(protection.nextDue) }
        return next
    }

    /// Sends what the pacer lets out now.
    private func pump(now: UInt64, clock: () -> UInt64, transmit: (_ plain: [UInt8], _ rtcp: Bool) -> TransmitResult) {
        guard media else { return }
        var packets = 0, bytes = 0, payload = 0, resent = 0, resentBytes = 0, redundant = 0, redundantBytes = 0, failures = 0
        var waitedNs: UInt64 = 0, resentWaitNs: UInt64 = 0
        for _ in 0..<512 {
            guard let item = pacer.pop(now: now) else { break }
            var packet = item.packet
            let sendNs = clock()
            if let id = parameters.extensions[.absSendTime] {
                packet.setExtension(.absSendTime(id: id, nanoseconds: sendNs))
            }
            if let id = parameters.extensions[.transportWideSequence] {
                packet.setExtension(.transportSequence(id: id, transportSequence))
                sentTimes[Int(transportSequence) & (sentTimes.count - 1)] = (transportSequence, sendNs, item.size)
                transportSequence &+= 1
            }
            let plain = packet.serialized()
            switch transmit(plain, false) {
            case .protectFailed: failures += 1; continue
            case .sendFailed: failures += 1
            case .sent: break
            }
            packets += 1
            bytes += plain.count
            if item.kind == .media {
                if startupProbe.rate != nil {
                    startupProbe.sent(bytes: item.size)
                    updatePacingRate(now: now)
                }
                if packet.sequenceNumber == keyframeTailSequence {
                    keyframeTailSequence = nil
                    if lastKeyframeSentNs == nil { stats.update { $0.firstKeyframeSentMs = Double(sendNs) / 1e6 } }
                    lastKeyframeSentNs = sendNs
                    endStartupProbe(now: now)
                }
                history.store(packet, sentNanoseconds: sendNs)
                protection.packetSent(packet.sequenceNumber, at: sendNs)
                waitedNs += sendNs &- min(sendNs, item.enqueuedNs)
                payload += packet.payload.count
                mediaPacketCount &+= 1
                mediaOctetCount &+= UInt32(truncatingIfNeeded: packet.payload.count)
            } else if item.kind == .retransmission {
                resent += 1
                resentBytes += plain.count
                resentWaitNs = max(resentWaitNs, sendNs &- min(sendNs, item.enqueuedNs))
            } else {
                redundant += 1
                redundantBytes += plain.count
            }
        }
        guard packets > 0 || failures > 0 else { return }
        stats.update {
            $0.packetsSent += packets
            $0.bytesSent += bytes
            $0.payloadBytesSent += payload
            $0.retransmittedPackets += resent
            $0.retransmittedBytes += resentBytes
            $0.redundantPackets += redundant
            $0.redundantBytes += redundantBytes
            $0.socketSendFailures += failures
            $0.totalPacketSendDelay += Double(waitedNs) / 1e9
            $0.retransmissionWaitMaxMs = max($0.retransmissionWaitMaxMs, Double(resentWaitNs) / 1e6)
        }
    }

    /// A sender report with SDES (RFC 3550 §6.4.1), once media has left; nil before.
    public func senderReport(now: UInt64, unixNanoseconds: UInt64) -> [UInt8]? {
        loop?.preconditionInLoop()
        guard mediaPacketCount > 0 else { return nil }
        var clock = sender.clock
        let rtpTimestamp = clock.timestamp(captureNanoseconds: now)
        let ntp = NtpTime.from(unixNanoseconds: unixNanoseconds)
        let report = RtcpSenderReport(ssrc: ssrc, ntpTime: ntp, rtpTimestamp: rtpTimestamp, packetCount: mediaPacketCount,
                                      octetCount: mediaOctetCount)
        return RtcpWriter.compound([RtcpWriter.senderReport(report), RtcpWriter.sourceDescription(ssrc: ssrc, cname: cname)])
    }

    /// RTCP BYE for our SSRC (RFC 3550 §6.6), for the transport to send when we end the session.
    public var bye: [UInt8] { RtcpWriter.compound([RtcpWriter.bye(ssrcs: [ssrc])]) }

    // MARK: Keyframes

    /// A PLI, FIR or outage-sized NACK. From the receiver itself, ignored while a keyframe is still in
    /// the pacer or less than an RTT (+50 ms) has passed since one left (`KeyframeRequestSender`).
    private func receiverWantsKeyframe(now: UInt64) {
        if keyframeRequestSender == .anSfu {
            requestKeyframe(now: now)
            return
        }
        if keyframeTailSequence != nil {
            stats.update { $0.keyframeRequestsSuppressed += 1 }
            return
        }
        let rttNs = UInt64((roundTripMilliseconds ?? 0) * 1e6)
        if let sent = lastKeyframeSentNs, now < sent + rttNs + 50_000_000 {
            stats.update { $0.keyframeRequestsSuppressed += 1 }
            return
        }
        requestKeyframe(now: now)
    }

    /// Asks the encoder for a keyframe, at most once per `keyframeRequestInterval` (later ones coalesce into one).
    public func requestKeyframe(now: UInt64) {
        loop?.preconditionInLoop()
        guard keyframeLimiter.request(now: now) else { return }
        stats.update { $0.keyframeRequests += 1 }
        onKeyframeRequest?()
    }

    // MARK: RTCP in

    /// Handles one decrypted RTCP compound packet. Returns the BYE when the peer said goodbye (the
    /// session is over: its reason, control characters removed), else nil.
    /// - Parameter unixNanoseconds: wall-clock time of arrival, for round-trip times from report blocks.
    public func handleRtcp(_ datagram: [UInt8], now: UInt64, unixNanoseconds: () -> UInt64) -> RemoteBye? {
        loop?.preconditionInLoop()
        guard let packets = try? RtcpPacket.parseCompound(datagram) else { return nil }
        stats.update { $0.lastRtcpReceivedMs = Double(now) / 1e6 }
        var bitrateInput = false
        var bye: String??
        for packet in packets {
            switch packet {
            case .bye(_, let reason):
                // Any BYE from the peer ends the session: a receive-only peer's names its own SSRC,
                // and the peer's SRTCP key vouches that it came from the peer.
                bye = .some(reason)
            case .receiverReport(_, let reports):
                handleReports(reports, now: now, unixNanoseconds: unixNanoseconds)
                bitrateInput = true
            case .senderReport(let report):
                handleReports(report.reports, now: now, unixNanoseconds: unixNanoseconds)
                bitrateInput = true
            case .pictureLossIndication(_, let mediaSSRC) where mediaSSRC == ssrc || mediaSSRC == 0:
                stats.update { $0.plisReceived += 1 }
                receiverWantsKeyframe(now: now)
            case .fullIntraRequest(_, let entries):
                for entry in entries where entry.ssrc == ssrc {
                    stats.update { $0.firsReceived += 1 }
                    // A repeated sequence number is a retransmitted request, not a new one (RFC 5104 §4.3.1.1).
                    if entry.sequenceNumber != lastFirSequence {
                        lastFirSequence = entry.sequenceNumber
                        receiverWantsKeyframe(now: now)
                    }
                }
            case .nack(_, let mediaSSRC, let lost) where mediaSSRC == ssrc:
                retransmit(lost, now: now)
            case .remb(_, let bitrate, _):
                estimator.onRemb(bitsPerSecond: Double(min(bitrate, UInt64(1e12))))
                stats.update { $0.rembBitrate = Double(min(bitrate, UInt64(1e12))) }
                bitrateInput = true
            case .transportFeedback(let feedback):
                var samples: [BandwidthSample] = []
                for entry in feedback.packets {
                    guard let sent = sentTimes[Int(entry.sequenceNumber) & (sentTimes.count - 1)], sent.sequence == entry.sequenceNumber else { continue }
                    samples.append(BandwidthSample(sendNs: sent.sendNs, arrivalUs: entry.arrivalMicroseconds, size: sent.size))
                }
                estimator.onTransportFeedback(samples, now: now)
                stats.update { $0.transportFeedbacks += 1 }
                bitrateInput = true
            default:
                break
            }
        }
        if bitrateInput {
            let lossFraction = packets.contains { if case .receiverReport = $0 { true } else if case .senderReport = $0 { true } else { false } }
                ? estimator.lastLossFraction : nil
            if startupProbe.rate != nil || startupProbe.state == .waiting {
                startupProbe.feedback(usage: estimator.usage, lossFraction: lossFraction)
                if startupProbe.state == .stopped { endStartupProbe(now: now) }
            }
            reportBitrate(force: false, now: now)
        }
        if let bye { return RemoteBye(reason: bye.map(Self.printable)) }
        return nil
    }

    /// A BYE from the peer.
    public struct RemoteBye: Equatable, Sendable { public var reason: String? }

    /// The peer's words without control characters (they end up in logs and terminals).
    static func printable(_ text: String) -> String {
        // Foundation's CharacterSet.controlCharacters: general categories Cc and Cf.
        String(String.UnicodeScalarView(text.unicodeScalars.filter {
            $0.properties.generalCategory != .control && $0.properties.generalCategory != .format
        }))
    }

    private func handleReports(_ reports: [RtcpReportBlock], now: UInt64, unixNanoseconds: () -> UInt64) {
        for block in reports where block.ssrc == ssrc {
            let arrival = NtpTime.compact(NtpTime.from(unixNanoseconds: unixNanoseconds()))
            let rtt = block.roundTripSeconds(arrivalCompactNtp: arrival)
            estimator.onLossReport(fractionLost: block.lossFraction, now: now)
            protection.receiverReport(lossFraction: block.lossFraction, now: now)
            if let rtt { roundTripMilliseconds = rtt * 1000 }
            stats.update {
                $0.receiverReports += 1
                if let rtt { $0.roundTripMilliseconds = rtt * 1000 }
                $0.fractionLost = block.lossFraction
                $0.cumulativeLost = Int(block.cumulativeLost)
                $0.jitterMilliseconds = Double(block.jitter) / 90
            }
        }
    }

    /// Moves the copies whose time has come into the pacer (they leave with the retransmissions).
    private func queueDueCopies(now: UInt64) {
        var copies: [RtpPacket] = []
        for sequence in protection.takeDue(now: now) {
            // Read, not taken: a copy does not count as a retransmission, so a NACK that crosses it is
            // still answered (seen with aiortc: the copy and the packet both lost, the NACK sent 3 ms
            // after the copy left was ignored as "resent less than an RTT ago", and aiortc, which asks
            // only once per gap, stalled 370 ms).
            guard let original = history.entry(sequenceNumber: sequence)?.packet else { continue }
            if rtx != nil { copies.append(rtx!.wrap(original)) } else { copies.append(original) }
        }
        if !copies.isEmpty { pacer.enqueue(copies, kind: .redundant, now: now) }
    }

    private func retransmit(_ sequences: [UInt16], now: UInt64) {
        protection.lossSeen(now: now)
        stats.update {
            $0.nacksReceived += 1
            $0.nackedPackets += sequences.count
        }
        // A receiver asking for this much lost an outage's worth: resending it would arrive as a
        // stale burst behind live video (and resets some receivers' jitter buffers to the past).
        // A keyframe repairs the picture in one frame (libwebrtc receivers make the same choice).
        if sequences.count > configuration.nackBurstLimit {
            stats.update { $0.nackedPacketsRefused += sequences.count }
            receiverWantsKeyframe(now: now)
            return
        }
        var queued: [RtpPacket] = [], again: [RtpPacket] = []
        var inFlight = 0, refused = 0
        let rttNs = UInt64((roundTripMilliseconds ?? 20) * 1e6)
        for sequence in sequences {
            guard let entry = history.entry(sequenceNumber: sequence), entry.retransmissions < 8 else {
                refused += 1
                continue
            }
            // Resent less than an RTT ago: that resend is still on its way (the NACK crossed it). No age
            // limit: a receiver that re-asks only when it sees the next gap (aiortc) may ask seconds later
            // and waits for exactly this packet; an outage's backlog is handled above (a keyframe instead).
            if entry.retransmissions > 0 && now &- entry.sentNanoseconds < max(rttNs * 3 / 2, 20_000_000) {
                inFlight += 1
                continue
            }
            guard let original = history.takeForRetransmission(sequenceNumber: sequence, nowNanoseconds: now) else { continue }
            queued.append(rtx != nil ? rtx!.wrap(original) : original)
            // Further copies (`retransmissionCopies`) follow all the first ones, so the copies of a packet are
            // as far apart as the NACK is long.
            for _ in 1..<max(configuration.retransmissionCopies, 1) { again.append(rtx != nil ? rtx!.wrap(original) : original) }
        }
        stats.update {
            $0.nackedPacketsResent += queued.count
            $0.nackedPacketsInFlight += inFlight
            $0.nackedPacketsRefused += refused
            $0.retransmissionsRepeated += again.count
        }
        if !queued.isEmpty { pacer.enqueue(queued + again, kind: .retransmission, now: now) }
    }

    /// The pacer's rate: the probe's while it runs, else the pacing factor × the estimate.
    private func updatePacingRate(now: UInt64) {
        let rate = startupProbe.rate ?? estimator.target * configuration.pacingFactor
        if rate != pacer.rate { pacer.setRate(rate, now: now) }
    }

    /// The probed keyframe left (or will not): back to the estimate's rate, and the numbers for getStats.
    private func endStartupProbe(now: UInt64) {
        startupProbe.keyframeSent()
        updatePacingRate(now: now)
        stats.update {
            $0.startupProbeBytes = startupProbe.bytesSent
            $0.startupProbePeakRate = startupProbe.peakRate
        }
    }

    private func reportBitrate(force: Bool, now: UInt64) {
        let target = estimator.target
        updatePacingRate(now: now)
        let changed = lastReportedBitrate.map { abs(target - $0) / $0 > 0.05 } ?? true
        stats.update {
            $0.targetBitrate = target
            $0.lossBasedBitrate = estimator.lossBased
            $0.delayBasedBitrate = estimator.delayBased
            $0.ackedBitrate = estimator.ackedBitrate
        }
        guard force || changed else { return }
        lastReportedBitrate = target
        stats.update { $0.bitrateUpdates += 1 }
        onBitrate?(Int(target))
    }
}

/// At most one keyframe request per interval: a request inside the interval is not lost but
/// coalesced into one at its end (a receiver that asked must get a keyframe; several that asked
/// together need only one). Pure state; the owner passes the time and runs `takeDue` when
/// `deferredUntil` passes.
public struct KeyframeRequestLimiter: Sendable {
    /// CLOCK_MONOTONIC nanoseconds, as the times passed in.
    private let interval: UInt64
    public private(set) var last: UInt64?
    /// When the coalesced request is due; nil when none waits.
    public private(set) var deferredUntil: UInt64?

    public init(interval: Duration) { self.interval = interval.inNanoseconds }

    /// True: make the request now. False: one at `deferredUntil` covers it.
    public mutating func request(now: UInt64) -> Bool {
        if let last, now < last + interval {
            if deferredUntil == nil { deferredUntil = last + interval }
            return false
        }
        last = now
        return true
    }

    /// True (once) when the coalesced request is due at `now`: make it.
    public mutating func takeDue(now: UInt64) -> Bool {
        guard let due = deferredUntil, due <= now else { return false }
        deferredUntil = nil
        return request(now: now)
    }
}
