import KraklBase
import Foundation

/// One encoder, several peers: hands each encoded frame to every publisher added, sets the encoder's
/// bitrate to the lowest peer's estimate (never below `floorBitrate`), and passes keyframe requests
/// from any peer on at most once per `keyframeInterval` across all of them (a new viewer's PLI gets
/// a keyframe; ten viewers joining together get one, not ten).
///
/// Why the lowest estimate: every peer gets the same encoded frames, so the weakest path decides what
/// all can receive without loss; the floor keeps one bad viewer from starving the others entirely
/// (that viewer then loses packets and recovers through NACK and keyframes on its own stream).
///
/// Thread-safe: `send` from the encoder thread, the peers' callbacks from their network threads,
/// `add`/`remove` from anywhere. `onKeyframeRequest` and `onBitrate` are called on whichever thread
/// triggered them (a coalesced keyframe request on a Dispatch timer thread) and must not block.
public final class VideoFanout: @unchecked Sendable {
    public let floorBitrate: Int
    public let keyframeInterval: Duration
    /// Ask the encoder for a keyframe. Set before adding peers.
    @Locked public var onKeyframeRequest: (() -> Void)? = nil
    /// The encoder's new target in bits per second. Set before adding peers.
    @Locked public var onBitrate: ((Int) -> Void)? = nil

    private let lock = NSLock()
    private var peers: [ObjectIdentifier: Publisher] = [:]
    /// Each peer's last estimate (none until it reported).
    private var estimates: [ObjectIdentifier: Int] = [:]
    private var lastBitrate: Int?
    private var limiter: KeyframeRequestLimiter
    private var timerArmed = false

    /// - Parameters:
    ///   - floorBitrate: the encoder never gets less than this, whatever one peer estimates (bits/s).
    ///   - keyframeInterval: keyframe requests reach the encoder at most this often.
    public init(floorBitrate: Int = 300_000, keyframeInterval: Duration = .milliseconds(300)) {
        self.floorBitrate = floorBitrate
        self.keyframeInterval = keyframeInterval
        limiter = KeyframeRequestLimiter(interval: keyframeInterval.inNanoseconds)
    }

    /// The peers frames go to now.
    public var count: Int { lock.withLock { peers.count } }

    /// Starts sending frames to `publisher` and takes over its `onKeyframeRequest` and `onBitrate`.
    /// Its stream asks for a keyframe itself once it connects.
    public func add(_ publisher: Publisher) {
        let id = ObjectIdentifier(publisher)
        lock.withLock { peers[id] = publisher }
        publisher.onKeyframeRequest = { [weak self] in self?.requestKeyframe(now: MonotonicClock.nanoseconds()) }
        publisher.onBitrate = { [weak self] bps in self?.peerEstimate(id, bps) }
    }

    /// Stops sending to `publisher` (call before or after closing it); its estimate no longer counts.
    public func remove(_ publisher: Publisher) {
        let id = ObjectIdentifier(publisher)
        let removed = lock.withLock { peers.removeValue(forKey: id) != nil }
        guard removed else { return }
        publisher.onKeyframeRequest = nil
        publisher.onBitrate = nil
        peerEstimate(id, nil)
    }

    /// Hands one encoded frame to every peer (each queues it for its own network thread; never blocks).
    public func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {
        let targets = lock.withLock { Array(peers.values) }
        for peer in targets {
            peer.send(frame: frame, keyframe: keyframe, captureNanoseconds: captureNanoseconds, width: width, height: height)
        }
    }

    /// A peer wants a keyframe (its own stream already filtered and rate-limited it).
    func requestKeyframe(now: UInt64) {
        lock.lock()
        let now = max(now, limiter.last ?? 0)
        let pass = limiter.request(now: now)
        var armAfter: UInt64?
        if !pass, !timerArmed, let due = limiter.deferredUntil {
            timerArmed = true
            armAfter = due &- min(due, now)
        }
        lock.unlock()
        if pass { onKeyframeRequest?() }
        if let armAfter {
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(min(armAfter, 10_000_000_000)))) { [weak self] in
                self?.fireDeferred()
            }
        }
    }

    private func fireDeferred() {
        lock.lock()
        timerArmed = false
        let fire = limiter.takeDue(now: max(MonotonicClock.nanoseconds(), limiter.deferredUntil ?? 0))
        lock.unlock()
        if fire { onKeyframeRequest?() }
    }

    private func peerEstimate(_ id: ObjectIdentifier, _ bps: Int?) {
        lock.lock()
        estimates[id] = bps
        let lowest = estimates.values.min()
        let target = lowest.map { max($0, floorBitrate) }
        let changed = target != nil && target != lastBitrate
        if changed { lastBitrate = target }
        lock.unlock()
        if changed, let target { onBitrate?(target) }
    }
}

/// The viewers' fan-out is fed like one room's publisher (MediaPath steers the encoder by it).
extension VideoFanout: VideoFeed {}
