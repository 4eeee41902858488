import KraklBase
import KraklHost

/// How frames are encoded. Defaults suit a screen shared into a call.
public struct EncoderSettings: Sendable {
    public var codec: VideoCodec = .vp8
    /// Target bitrate, kbit/s (CBR).
    public var bitrateKbps = 2500
    /// The picture is scaled down to fit within this, aspect kept.
    public var maximumSize = (width: 1920, height: 1080)
    /// At most this many encoded frames per second.
    public var maximumFps = 30.0
    /// With no change for this long, the current picture is encoded again
    /// (all blocks active) so receivers that lost packets or joined late
    /// recover and quality keeps improving. Zero turns it off.
    public var refreshInterval: Duration = .seconds(1)
    /// With `refreshInterval` zero: once the screen has not changed for 1 s, the current picture is
    /// encoded again (all blocks active) pass after pass at the frame rate until libvpx's
    /// quantizer says it converged, then nothing until the next change (`SettleRefinement`).
    /// What the periodic refresh was for besides loss repair (which receivers that ask for it get
    /// from NACK and PLI) is raising the quality of parts that stopped changing after a coarse
    /// keyframe or a busy moment; this does that, and an unchanged screen then costs nothing
    /// (issue 17: the periodic refresh was ≈ 1.2 % of a core at 1080p).
    public var refineAfterSettling = false

    /// For receivers that ask for what they miss (NACK, PLI/FIR: a room, the viewer): no periodic
    /// refresh; refinement after the screen settles.
    public mutating func refreshForReceiversThatAsk() {
        refreshInterval = .zero
        refineAfterSettling = true
        followStillFrames = true
    }
    /// After a keyframe of an unchanged picture, or the last refinement pass, one frame interval
    /// later a frame of no blocks (a few bytes) follows unless something else did. Some receivers
    /// hand a frame to their decoder only when a packet of the next one arrives (aiortc: measured
    /// through Janus, a static 1080p screen's keyframe sat there until the settle pass 1 s later,
    /// and the last pass until the next change); with this it is shown at once.
    public var followStillFrames = false
    /// A keyframe at least this often; zero: only when requested.
    public var keyframeInterval: Duration = .zero
    /// Requested keyframes (SIGUSR1, a viewer's PLI or FIR) at most this often; requests in between
    /// merge into the next one. A keyframe costs about ten delta frames: answered one for one, 8,000
    /// requests made 154 of 183 frames keyframes (3.7 Mbit/s against 2.5). 0.3 s is the publisher's
    /// own PLI coalescing interval, so a viewer who lost a picture still has one within about a
    /// third of a second.
    public var keyframeRequestSpacing: Duration = .milliseconds(300)
    /// Encoder threads; 0 chooses by picture size and cores.
    public var threads = 0
    /// The VP8 bitstream version (RFC 6386 §9.1: 0 normal loop filter and six-tap motion filters;
    /// 1 simple loop filter, bilinear; 2 no loop filter, bilinear; 3 also whole-pixel motion).
    /// Every RFC 6386 decoder takes all four; libvpx and FFmpeg decode a version-2 stream to the
    /// same pixels. Version 2 is the default: on a screen, where most blocks are unchanged, the
    /// loop filter ran over every block edge of every frame and was ~20 % of libvpx's time at
    /// 1080p typing; without it, typing took 7.7–8.0 instead of 9.8–10.1 CPU s/min at 63.7 vs
    /// 63.9 dB, scrolling 27–29 instead of 30–32 (krakl-bench, docs/PERFORMANCE.md). Text, which
    /// the loop filter smooths, does not need it; 0 is there for a receiver that needs version 0
    /// (a hardware decoder that knows only it).
    public var vp8Profile = EncoderSettings.defaultVp8Profile
    public static let defaultVp8Profile = 2

    public init() {}
}
