import KraklBase
import Dispatch
import FoundationEssentials
import Glibc

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
public final class VideoFanout: Sendable {
    public let floorBitrate: Int
    public let keyframeInterval: Duration
    /// Ask the encoder for a keyframe. Set before adding peers.
    public var onKeyframeRequest: (@Sendable () -> Void)? {
        get { keyframeHandler.wrappedValue }
        set { keyframeHandler.wrappedValue = newValue }
    }
    /// The encoder's new target in bits per second. Set before adding peers.
    public var onBitrate: (@Sendable (Int) -> Void)? {
        get { bitrateHandler.wrappedValue }
        set { bitrateHandler.wrappedValue = newValue }
    }
    private let keyframeHandler = Locked<(@Sendable () -> Void)?>(wrappedValue: nil)
    private let bitrateHandler = Locked<(@Sendable (Int) -> Void)?>(wrappedValue: nil)

    private struct Peers {
        var peers: [ObjectIdentifier: Publisher] = [:]
        /// Each peer's last estimate (none until it reported).
        var estimates: [ObjectIdentifier: Int] = [:]
        var lastBitrate: Int?
        var limiter: KeyframeRequestLimiter
        var timerArmed = false
    }
    private let state: Guarded<Peers>

    /// - Parameters:
    ///   - floorBitrate: the encoder never gets less than this, whatever one peer estimates (bits/s).
    ///   - keyframeInterval: keyframe requests reach the encoder at most this often.
    public init(floorBitrate: Int = 300_000, keyframeInterval: Duration = .milliseconds(300)) {
        self.floorBitrate = floorBitrate
        self.keyframeInterval = keyframeInterval
        state = Guarded(Peers(limiter: KeyframeRequestLimiter(interval: keyframeInterval)))
    }

    /// The peers frames go to now.
    public var count: Int { state.withLock { $0.peers.count } }

    /// Starts sending frames to `publisher` and takes over its `onKeyframeRequest` and `onBitrate`.
    /// Its stream asks for a keyframe itself once it connects.
    public func add(_ publisher: Publisher) {
        let id = ObjectIdentifier(publisher)
        state.withLock { $0.peers[id] = publisher }
        publisher.onKeyframeRequest = { [weak self] in self?.requestKeyframe(now: MonotonicClock.nanoseconds()) }
        publisher.onBitrate = { [weak self] bps in self?.peerEstimate(id, bps) }
    }

    /// Stops sending to `publisher` (call before or after closing it); its estimate no longer counts.
    public func remove(_ publisher: Publisher) {
        let id = ObjectIdentifier(publisher)
        let removed = state.withLock { $0.peers.removeValue(forKey: id) != nil }
        guard removed else { return }
        publisher.onKeyframeRequest = nil
        publisher.onBitrate = nil
        peerEstimate(id, nil)
    }

    /// Hands one encoded frame to every peer (each queues it for its own network thread; never blocks).
    public func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {
        let targets = state.withLock { Array($0.peers.values) }
        for peer in targets {
            peer.send(frame: frame, keyframe: keyframe, captureNanoseconds: captureNanoseconds, width: width, height: height)
        }
    }

    /// A peer wants a keyframe (its own stream already filtered and rate-limited it).
    func requestKeyframe(now: UInt64) {
        let (pass, armAfter) = state.withLock { state -> (Bool, UInt64?) in
            let now = max(now, state.limiter.last ?? 0)
            let pass = state.limiter.request(now: now)
            guard !pass, !state.timerArmed, let due = state.limiter.deferredUntil else { return (pass, nil) }
            state.timerArmed = true
            return (pass, due &- min(due, now))
        }
        if pass { onKeyframeRequest?() }
        if let armAfter {
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(min(armAfter, 10_000_000_000)))) { [weak self] in
                self?.fireDeferred()
            }
        }
    }

    private func fireDeferred() {
        let fire = state.withLock { state in
            state.timerArmed = false
            return state.limiter.takeDue(now: max(MonotonicClock.nanoseconds(), state.limiter.deferredUntil ?? 0))
        }
        if fire { onKeyframeRequest?() }
    }

    private func peerEstimate(_ id: ObjectIdentifier, _ bps: Int?) {
        let (changed, target) = state.withLock { state -> (Bool, Int?) in
            state.estimates[id] = bps
            let target = state.estimates.values.min().map { max($0, floorBitrate) }
            let changed = target != nil && target != state.lastBitrate
            if changed { state.lastBitrate = target }
            return (changed, target)
        }
        if changed, let target { onBitrate?(target) }
    }
}

/// The viewers' fan-out is fed like one room's publisher (MediaPath steers the encoder by it).
extension VideoFanout: VideoFeed {}
