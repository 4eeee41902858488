/// A receiver of encoded video that talks back to the encoder: a room's `Publisher`, the viewers'
/// `VideoFanout`, the built-in viewer's answerer. `MediaPath` hands it every encoded frame (through
/// `FeedSink`) and connects its keyframe requests and bitrate estimates to the encoder; that is the
/// one place where the feedback is wired, whatever the feed is.
public protocol VideoFeed: AnyObject, Sendable {
    /// Encoder thread: one encoded frame. Queues it and returns; never blocks.
    func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int)
    /// A receiver lost pictures or just arrived and wants a keyframe; any thread, must not block.
    var onKeyframeRequest: (@Sendable () -> Void)? { get set }
    /// The encoder's new target, bit/s (the receivers' estimate); any thread, must not block.
    var onBitrate: (@Sendable (Int) -> Void)? { get set }
}
