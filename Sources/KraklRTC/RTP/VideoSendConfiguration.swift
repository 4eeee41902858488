/// How one video stream is paced, repaired and adapted (`VideoSendStream`, `LossProtection`): the part
/// of a publisher's configuration the RTP side reads, so that it needs nothing of ICE or signalling.
public struct VideoSendConfiguration: Sendable {
    /// Encoder bitrate bounds and start, bits per second.
    public var minimumBitrate = 150_000.0
    public var maximumBitrate = 4_000_000.0
    public var startBitrate = 2_500_000.0
    /// Pacing rate = this × the target bitrate.
    public var pacingFactor = 2.5
    /// The first keyframe after connecting probes the path (`StartupProbe`): its packets leave in
    /// clusters at 2, 4, 8 … × the pacing rate, up to this many bits per second, until feedback says
    /// the path did not carry them. At or below pacingFactor × startBitrate it is off.
    /// Measured (docs/PERFORMANCE.md, issue 17): the first picture of a 1080p scrolling screen
    /// ~650 ms after connecting without it.
    public var startupProbeCeiling = 60_000_000.0
    public var maximumPayloadSize = 1200
    public var pacerCapacity = 2048
    /// Sent packets kept for NACKs and loss-protection copies. 1024 holds more than any receiver
    /// here can still wait for: aiortc asks for a packet while fewer than 128 newer ones have come
    /// and gives up on it after 512, and libwebrtc's own sender keeps 600. At 2.5 Mbit/s that is
    /// about 4 s of 1200-byte packets; 2048 held about 2.6 MB while scrolling 1080p (issue 27's
    /// 64 MB target), 1024 half that.
    public var historyCapacity = 1024
    /// Keyframe requests reach the encoder at most this often.
    public var keyframeRequestInterval: Duration = .milliseconds(300)
    /// Who sends the PLIs and FIRs: the receiver itself, or an SFU on behalf of its subscribers.
    public var keyframeRequestSender = KeyframeRequestSender.theReceiver
    /// A NACK asking for more packets than this gets a keyframe instead of retransmissions.
    public var nackBurstLimit = 64
    /// How many copies of a NACKed packet go out (each its own RTX packet). Two: a receiver that asks for a
    /// lost packet only when it sees a new gap (aiortc) and forgets it once 128 newer packets came cannot
    /// recover a packet whose NACK and resends are all lost; its 512-packet jitter buffer then waits and
    /// asks for a keyframe (a 2.3-2.8 s freeze). At 5 % loss a single resend is lost 1 time in 20, two
    /// copies 1 in 400. Measured against aiortc at 5 % loss (issue 26, docs/webrtc.md "5 % loss,
    /// scrolling"): lost packets whose first NACK did not bring them 6.3-8.7 % -> 3.0-5.3 % (what is left
    /// is NACKs lost on the way), for about 5 % more packets; typing sessions with a freeze over 1 s 1 in
    /// 40 -> 0 in 40. Always, not only while receiver reports say loss: in a typing run the first NACK came
    /// while the last report still said 0 %, its one resend was lost, and aiortc asked again 1.8 s later.
    /// A packet is copied only when asked for, so a clean path pays nothing.
    public var retransmissionCopies = 2
    public var senderReportInterval: Duration = .seconds(1)
    /// Loss protection for small frames: until the first receiver report says the path loses nothing,
    /// and while the receiver has reported loss (a NACK, or a receiver report with loss) within
    /// `protectionHold`, every packet of a frame of at most `protectedFramePackets` packets is sent
    /// again `protectionDelay` later (on RTX when negotiated),
    /// and a second time after twice that while the last receiver report said `secondCopyLoss` or more.
    /// Repetition is what forward error correction amounts to for a frame of one packet; it costs
    /// little (such frames are small: typing, a cursor). It matters for receivers that ask for a lost
    /// packet only once: aiortc re-asks only when it sees a new gap, and with one packet a frame it then
    /// releases one frame per arriving packet, so a lost NACK or retransmission stalled it until the
    /// next loss and left a backlog that never drained (measured at 5 % loss: 88–94 % of typing frames
    /// decoded, freezes to 1.2 s). With one copy a packet lost with its copy and its NACK or
    /// retransmission still stalled aiortc in about one session of ten (0.9–1.9 s); at 5 % loss a
    /// second copy makes that ~1 in 10 000 packets' worth rarer. The copies wait longer than a frame
    /// interval on purpose: the next frame's packet then still reaches the receiver first, so a lost
    /// packet still shows as a gap and the NACK (which lists every packet still missing) stays the fast
    /// path; an immediate copy hid those gaps. 0 packets turns it off.
    public var protectedFramePackets = 2
    public var protectionDelay: Duration = .milliseconds(50)
    public var secondCopyLoss = 0.02
    public var protectionHold: Duration = .seconds(10)
    /// Answerer only: the playout delay asked of a receiver whose offer has the playout-delay header
    /// extension (Chromium's does); nil leaves the extension out of the answer. We never offer it.
    public var playoutDelay: PlayoutDelay?

    public init() {}
}

/// Whose keyframe requests a stream gets, which decides whether a request that arrives while a keyframe
/// is on its way is answered.
public enum KeyframeRequestSender: Sendable, Equatable {
    /// The one receiver: a request that arrives while a keyframe is in the pacer, or within an RTT
    /// (+50 ms) after it left, most likely crossed it and is dropped. Otherwise a congested link
    /// answers every PLI with another large keyframe and stays congested.
    case theReceiver
    /// An SFU (a room): it asks for a subscriber that has just joined, and that subscriber gets only
    /// the packets sent after it joined, so a keyframe already leaving may not reach it. Every request
    /// is answered, at most once per `keyframeRequestInterval`; the SFU repairs its own uplink with
    /// NACKs and throttles its subscribers' requests itself. Measured with Janus (docs/PERFORMANCE.md,
    /// "The static screen's slow first frame"): a subscriber that joined while the first keyframe was
    /// leaving got its PLI dropped and, on a still screen, saw its first picture ≈ 1.3 s after the
    /// start instead of ≈ 0.25 s.
    case anSfu
}
