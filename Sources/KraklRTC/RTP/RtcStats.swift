/// The publisher's numbers, in the spirit of WebRTC's getStats()
/// (outbound-rtp, remote-inbound-rtp, candidate-pair, transport). A value
/// copy: `Publisher.stats` takes it under a lock, so any thread may read it.
public struct RtcStats: Sendable, Equatable {
    /// "new", "checking", "connected", "closed", "failed", "lost".
    public var state = "new"
    /// From applying the answer to DTLS connected.
    public var connectMilliseconds: Double?
    public var selectedPair: String?
    /// The selected pair's candidate types, "local/transport -> remote" (e.g. "relay/udp -> host").
    public var selectedPairTypes: String?
    /// For a relay pair, how we reach the TURN server: "udp", "tcp" or "tls" (WebRTC's `relayProtocol`).
    public var selectedRelayProtocol: String?
    /// What a status line shows: the pair's types with the protocol that leaves this machine,
    /// "host/udp -> host", "srflx/udp -> host", "relay/tls -> host".
    public var selectedPath: String?
    /// Why TURN servers gave no relay candidate (the session may still connect on other candidates).
    public var relayErrors: [String] = []
    /// A TURN server refused our credentials or its certificate was not trusted.
    public var relayRefusal: RelayRefusal?
    public var codec: String?
    public var dtlsRole: String?
    public var srtpProfile: String?

    // outbound-rtp
    public var framesSent = 0
    public var keyframesSent = 0
    /// Frames dropped before packetizing: the frame queue was full or the connection was not up.
    public var framesDropped = 0
    /// Frames encoded while the transport was connecting and sent when it came up (`EarlyFrames`).
    public var earlyFramesSent = 0
    public var packetsSent = 0
    /// RTP bytes (headers + payload) before SRTP, media and retransmissions.
    public var bytesSent = 0
    public var payloadBytesSent = 0
    public var retransmittedPackets = 0
    public var retransmittedBytes = 0
    /// Copies of small frames' packets sent unasked while the receiver reports loss (loss protection).
    public var redundantPackets = 0
    public var redundantBytes = 0
    public var nacksReceived = 0
    /// Packets named in NACKs (a packet named in three NACKs counts three times), and what became of
    /// each naming: resent; not resent because its last resend left less than the resend window ago
    /// (it is still on its way); or not resent at all (no longer in the history, resent too often, or
    /// in a NACK the size of an outage, which gets a keyframe instead).
    public var nackedPackets = 0
    public var nackedPacketsResent = 0
    public var nackedPacketsInFlight = 0
    public var nackedPacketsRefused = 0
    /// Copies beyond the first of resent packets (`retransmissionCopies`).
    public var retransmissionsRepeated = 0
    /// The longest a retransmission waited in the pacer, ms (they go before media).
    public var retransmissionWaitMaxMs = 0.0
    public var plisReceived = 0
    public var firsReceived = 0
    /// Keyframe requests handed to the encoder (after rate limiting).
    public var keyframeRequests = 0
    /// PLI/FIR that arrived while a keyframe was on its way, so not passed on.
    public var keyframeRequestsSuppressed = 0
    public var senderReportsSent = 0
    public var pacerDroppedPackets = 0
    /// Seconds media packets waited in the pacer, summed (getStats' totalPacketSendDelay);
    /// divide by the media packets sent for the mean.
    public var totalPacketSendDelay = 0.0
    public var socketSendFailures = 0

    // remote-inbound-rtp (from receiver reports)
    public var receiverReports = 0
    /// When the peer's last RTCP packet (a report, feedback, a keyframe request) arrived, monotonic
    /// ms: a round-trip time is only as fresh as this (the room answers every second or so).
    public var lastRtcpReceivedMs: Double?
    public var roundTripMilliseconds: Double?
    public var fractionLost: Double?
    public var cumulativeLost: Int?
    public var jitterMilliseconds: Double?

    // bandwidth
    public var targetBitrate: Double = 0
    public var rembBitrate: Double?
    public var ackedBitrate: Double?
    public var lossBasedBitrate: Double = 0
    public var delayBasedBitrate: Double?
    public var bitrateUpdates = 0
    public var transportFeedbacks = 0
    /// The first keyframe's probe (StartupProbe): bytes sent under it and the fastest pacing rate, bits/s.
    public var startupProbeBytes = 0
    public var startupProbePeakRate = 0.0
    /// When (CLOCK_MONOTONIC ms) the first keyframe was handed to the pacer and when its last packet left:
    /// the sender's share of the time to the first picture.
    public var firstKeyframeQueuedMs: Double?
    public var firstKeyframeSentMs: Double?

    // ICE
    public var iceChecksSent = 0
    public var iceRequestsReceived = 0
    public var consentResponses = 0
    /// DTLS datagrams (the peer's ClientHello) that arrived before the answer and were kept to be replayed.
    public var earlyDtlsDatagrams = 0
    /// DTLS handshakes completed: 1 for a session, also after ICE restarts (they keep DTLS).
    public var dtlsHandshakes = 0
    /// ICE restarts done (answerer: the peer's; offerer: ours, counted when the answer arrives).
    public var iceRestarts = 0

    public init() {}

    /// A JSON-ready dictionary (numbers, strings, null), keys in snake case.
    public var dictionary: [String: Any] {
        var d: [String: Any] = [
            "state": state, "frames_sent": framesSent, "keyframes_sent": keyframesSent, "frames_dropped": framesDropped, "early_frames_sent": earlyFramesSent,
            "packets_sent": packetsSent, "bytes_sent": bytesSent, "payload_bytes_sent": payloadBytesSent,
            "retransmitted_packets": retransmittedPackets, "retransmitted_bytes": retransmittedBytes,
            "redundant_packets": redundantPackets, "redundant_bytes": redundantBytes,
            "nacks_received": nacksReceived, "nacked_packets": nackedPackets, "nacked_packets_resent": nackedPacketsResent,
            "nacked_packets_in_flight": nackedPacketsInFlight, "nacked_packets_refused": nackedPacketsRefused,
            "retransmissions_repeated": retransmissionsRepeated, "retransmission_wait_max_ms": retransmissionWaitMaxMs, "plis_received": plisReceived,
            "firs_received": firsReceived, "keyframe_requests": keyframeRequests, "keyframe_requests_suppressed": keyframeRequestsSuppressed, "sender_reports_sent": senderReportsSent,
            "pacer_dropped_packets": pacerDroppedPackets, "total_packet_send_delay": totalPacketSendDelay, "socket_send_failures": socketSendFailures,
            "receiver_reports": receiverReports, "target_bitrate": targetBitrate, "loss_based_bitrate": lossBasedBitrate,
            "bitrate_updates": bitrateUpdates, "transport_feedbacks": transportFeedbacks,
            "startup_probe_bytes": startupProbeBytes, "startup_probe_peak_rate": startupProbePeakRate,
            "ice_checks_sent": iceChecksSent, "ice_requests_received": iceRequestsReceived, "consent_responses": consentResponses, "early_dtls_datagrams": earlyDtlsDatagrams,
            "dtls_handshakes": dtlsHandshakes, "ice_restarts": iceRestarts,
            "relay_errors": relayErrors,
        ]
        let optional: [String: Any?] = [
            "connect_ms": connectMilliseconds, "selected_pair": selectedPair, "selected_pair_types": selectedPairTypes, "selected_relay_protocol": selectedRelayProtocol, "selected_path": selectedPath, "codec": codec, "dtls_role": dtlsRole,
            "srtp_profile": srtpProfile, "rtt_ms": roundTripMilliseconds, "fraction_lost": fractionLost,
            "cumulative_lost": cumulativeLost, "jitter_ms": jitterMilliseconds, "remb_bitrate": rembBitrate,
            "acked_bitrate": ackedBitrate, "delay_based_bitrate": delayBasedBitrate,
            "first_keyframe_queued_ms": firstKeyframeQueuedMs, "first_keyframe_sent_ms": firstKeyframeSentMs,
        ]
        for (key, value) in optional { if let value { d[key] = value } }
        return d
    }
}
