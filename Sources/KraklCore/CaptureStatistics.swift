import Foundation
import KraklBackendABI

/// Live numbers for a capture run: frame rate, how much of each frame the
/// damage covers, and how long a frame took from its capture timestamp to
/// reaching the host. Fed from the capture thread, read from the main one.
public final class CaptureStatistics: @unchecked Sendable {
    public struct Snapshot {
        public var frames = 0
        public var invalidFrames = 0
        public var seconds = 0.0
        public var damageShareMean = 0.0
        public var latencyMs: (p50: Double, p99: Double, max: Double) = (0, 0, 0)
        public var lastSize = ""
        public var fps: Double { seconds > 0 ? Double(frames) / seconds : 0 }
    }

    private let lock = PThreadLock()
    private let started = DispatchTime.now().uptimeNanoseconds
    private var frames = 0
    private var invalidFrames = 0
    private var damageShares: [Double] = []
    private var latenciesNs: [UInt64] = []
    private var lastSize = ""
    private var windowStart = 0
    private var windowStartNs = DispatchTime.now().uptimeNanoseconds

    public init() {}

    /// Records one delivered frame that passed FrameCheck.
    public func record(_ frame: FrameInfo, receivedNs: UInt64) {
        let latency = receivedNs > frame.raw.timestamp_ns ? receivedNs - frame.raw.timestamp_ns : 0
        lock.withLock {
            frames += 1
            damageShares.append(frame.damageShare)
            latenciesNs.append(latency)
            lastSize = "\(FrameCheck.formatName(frame.format)) \(frame.width)x\(frame.height)"
        }
    }

    public func recordInvalid() { lock.withLock { invalidFrames += 1 } }

    public var frameCount: Int { lock.withLock { frames } }

    /// Numbers over the whole run, or (`window: true`) over the frames since
    /// the previous windowed snapshot, for the once-a-second status line.
    public func snapshot(window: Bool = false) -> Snapshot {
        lock.withLock {
            let now = DispatchTime.now().uptimeNanoseconds
            let from = window ? windowStart : 0
            let slice = latenciesNs[from...].sorted()
            var shot = Snapshot()
            shot.frames = frames - from
            shot.invalidFrames = invalidFrames
            shot.seconds = Double(now - (window ? windowStartNs : started)) / 1e9
            shot.damageShareMean = shot.frames > 0 ? damageShares[from...].reduce(0, +) / Double(shot.frames) : 0
            func percentile(_ p: Double) -> Double { slice.nearestRank(p).map { Double($0) / 1e6 } ?? 0 }
            shot.latencyMs = (percentile(0.5), percentile(0.99), Double(slice.last ?? 0) / 1e6)
            shot.lastSize = lastSize
            if window {
                windowStart = frames
                windowStartNs = now
            }
            return shot
        }
    }
}
