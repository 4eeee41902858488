import KraklCore

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
    /// recover and quality keeps improving. 0 turns it off.
    public var refreshInterval = 1.0
    /// A keyframe at least this often (seconds); 0: only when requested.
    public var keyframeInterval = 0.0
    /// Encoder threads; 0 chooses by picture size and cores.
    public var threads = 0

    public init() {}
}
