import KraklEncoder
import KraklRTC

/// The encoder's output to every viewer of a `VideoFanout`: what `PublisherSink` is for one publisher.
/// Wire the fan-out's `onKeyframeRequest` to `EncoderPipeline.requestKeyframe()` and `onBitrate` to
/// `setBitrate(kbps:)` (weakly: the pipeline holds this sink).
public final class VideoFanoutSink: EncodedFrameSink, @unchecked Sendable {
    public let fanout: VideoFanout

    public init(_ fanout: VideoFanout) { self.fanout = fanout }

    public func write(_ frame: EncodedFrame) throws(EncoderError) {
        fanout.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs, width: frame.width, height: frame.height)
    }

    public func finish() throws(EncoderError) {}
}
