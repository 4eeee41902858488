import KraklBase

/// Frames encoded while ICE and DTLS are still connecting, kept so that the first picture does not
/// wait for an encode that starts only once the transport is up.
///
/// A 1080p keyframe of a detailed screen takes libvpx 115–300 ms on this project's 2-core machines;
/// the answer → connected part of a join is 30–250 ms. A session starts capture and encoding at the
/// room's answer, so the first keyframe is usually ready (or nearly) when DTLS comes up, instead of
/// only being asked for then. What is kept is a decodable chain: the newest keyframe and the frames
/// after it. Anything older than the newest keyframe is useless to a receiver that has seen nothing.
///
/// Bounds: a chain is kept at most `maximumFrames` frames and `maximumBytes` bytes (past either, it is
/// given up and the transport's start asks for a keyframe, as without this), and a chain whose
/// keyframe was captured more than `maximumAge` before the connection is stale: a screen shown that
/// late is worse than a fresh keyframe. Pure state: the publisher's network thread owns it.
public struct EarlyFrames: Sendable {
    public let maximumFrames: Int
    public let maximumBytes: Int
    public let maximumAge: Duration
    private var chain: [OutgoingVideoFrame] = []
    private var bytes = 0

    public init(maximumFrames: Int = 60, maximumBytes: Int = 4 << 20, maximumAge: Duration = .seconds(1)) {
        self.maximumFrames = maximumFrames
        self.maximumBytes = maximumBytes
        self.maximumAge = maximumAge
    }

    /// Frames handed over before the transport connected, in encoding order. Returns how many frames
    /// were given up (before the chain's keyframe, or past a bound): the publisher counts them dropped.
    @discardableResult
    public mutating func add(_ frames: [OutgoingVideoFrame]) -> Int {
        var discarded = 0
        for frame in frames {
            if frame.keyframe {
                discarded += chain.count
                chain = [frame]
                bytes = frame.data.count
            } else if chain.isEmpty {
                discarded += 1   // an inter frame with no keyframe before it cannot be decoded
            } else if chain.count >= maximumFrames || bytes + frame.data.count > maximumBytes {
                discarded += chain.count + 1
                chain.removeAll()
                bytes = 0
            } else {
                chain.append(frame)
                bytes += frame.data.count
            }
        }
        return discarded
    }

    /// At connect: the chain to send first, or nothing when there is none or its keyframe is older
    /// than `maximumAge` at `now` (CLOCK_MONOTONIC ns, the clock of `captureNs`), and how many stale
    /// frames were given up. Empties the store.
    public mutating func take(now: UInt64) -> (chain: [OutgoingVideoFrame], discarded: Int) {
        defer { clear() }
        guard let keyframe = chain.first else { return ([], 0) }
        if keyframe.captureNs < now, now - keyframe.captureNs > maximumAge.inNanoseconds { return ([], chain.count) }
        return (chain, 0)
    }

    /// The transport ended: nothing kept will be sent.
    public mutating func clear() {
        chain.removeAll()
        bytes = 0
    }

    public var isEmpty: Bool { chain.isEmpty }
}
