import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// The encoder's output to a `VideoFeed` (a room's publisher, the viewers' fan-out): the one
/// adapter between the encoder's `EncodedFrameSink` and the network side. It also keeps what the
/// status screens and the probe read of the frames that went through: each frame's capture →
/// encoded time and the last picture's size.
public final class FeedSink: EncodedFrameSink, Sendable {
    /// Only frames of this codec go on (nil: all). The home screen's local viewer answers browsers
    /// with VP8 only, so a room that chose VP9 leaves its preview dark rather than undecodable.
    public let onlyCodec: VideoCodec?
    /// Keep each frame's capture → encoded time (the room's sink: the probe reports percentiles).
    public let keepsTimes: Bool
    /// Where frames go; nil until one is plugged in (the home screen's viewer may start in the
    /// middle of a session).
    public var feed: (any VideoFeed)? {
        get { plugged.withLock { $0 } }
        set { plugged.withLock { $0 = newValue } }
    }
    private let plugged = Guarded<(any VideoFeed)?>(nil)
    /// `write` runs on the encoder thread, the readers on any thread.
    private struct Numbers {
        /// Capture → encoded, ms, a frame each: the part of the end-to-end latency spent before the network.
        var encodedAfterMs: [Double] = []
        var size: (width: Int, height: Int)?
    }
    private let numbers = Guarded(Numbers())

    public init(_ feed: (any VideoFeed)?, onlyCodec: VideoCodec? = nil, keepsTimes: Bool = false) {
        self.onlyCodec = onlyCodec
        self.keepsTimes = keepsTimes
        self.feed = feed
    }

    public var captureToEncodedMs: [Double] { numbers.withLock { $0.encodedAfterMs } }
    /// The last encoded picture's size, for status screens.
    public var lastSize: (width: Int, height: Int)? { numbers.withLock { $0.size } }

    public func write(_ frame: EncodedFrame) throws(EncoderError) {
        if let onlyCodec, frame.codec != onlyCodec { return }
        let waited = MonotonicClock.milliseconds() - Double(frame.timestampNs) / 1e6
        numbers.withLock { numbers in
            // Bounded: a session of hours must not grow this without end (the probe reads percentiles).
            if keepsTimes, numbers.encodedAfterMs.count < 1_000_000 { numbers.encodedAfterMs.append(waited) }
            numbers.size = (frame.width, frame.height)
        }
        feed?.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs, width: frame.width, height: frame.height)
    }

    public func finish() throws(EncoderError) {}
}
