import KraklBase
import Dispatch
import FoundationEssentials
import Glibc
import KraklBackendABI

/// Live numbers for a capture run: frame rate, how much of each frame the
/// damage covers, and how long a frame took from its capture timestamp to
/// reaching the host. Fed from the capture thread, read from the main one.
/// Fixed-size: running sums and latency histograms (LogHistogram), one for
/// the whole run and one for the status line's window, so a run of days or a
/// backend flooding frames costs no more memory than a short run.
public final class CaptureStatistics: Sendable {
    public struct Snapshot: Sendable {
        public var frames = 0
        public var invalidFrames = 0
        public var seconds = 0.0
        public var damageShareMean = 0.0
        public var latencyMs: (p50: Double, p99: Double, max: Double) = (0, 0, 0)
        public var lastSize = ""
        public var fps: Double { seconds > 0 ? Double(frames) / seconds : 0 }
    }

    /// Sums over a span of frames.
    private struct Span {
        var frames = 0
        var damageShareSum = 0.0
        var latencies = LogHistogram()

        mutating func add(damageShare: Double, latencyNs: UInt64) {
            frames += 1
            damageShareSum += damageShare
            latencies.add(latencyNs)
        }
    }

    private let started = DispatchTime.now().uptimeNanoseconds
    private struct Counts {
        var total = Span()
        var window = Span()
        var invalidFrames = 0
        var lastSize = ""
        var windowStartNs = DispatchTime.now().uptimeNanoseconds
    }
    private let counts = Guarded(Counts())

    public init() {}

    /// Records one delivered frame that passed FrameCheck.
    public func record(_ frame: FrameInfo, receivedNs: UInt64) {
        // A timestamp from the future (a backend on another clock) counts as no latency, never as a trap.
        let latency = receivedNs > frame.raw.timestamp_ns ? receivedNs - frame.raw.timestamp_ns : 0
        let size = lastSizeText(frame)
        counts.withLock { c in
            c.total.add(damageShare: frame.damageShare, latencyNs: latency)
            c.window.add(damageShare: frame.damageShare, latencyNs: latency)
            if c.lastSize != size { c.lastSize = size }
        }
    }

    private func lastSizeText(_ frame: FrameInfo) -> String { "\(FrameCheck.formatName(frame.format)) \(frame.width)x\(frame.height)" }

    public func recordInvalid() { counts.withLock { c in c.invalidFrames += 1 } }

    public var frameCount: Int { counts.withLock { c in c.total.frames } }
    public var invalidCount: Int { counts.withLock { c in c.invalidFrames } }

    /// Numbers over the whole run, or (`window: true`) over the frames since
    /// the previous windowed snapshot, for the once-a-second status line.
    public func snapshot(window windowed: Bool = false) -> Snapshot {
        counts.withLock { c in
            let now = DispatchTime.now().uptimeNanoseconds
            let span = windowed ? c.window : c.total
            var shot = Snapshot()
            shot.frames = span.frames
            shot.invalidFrames = c.invalidFrames
            let from = windowed ? c.windowStartNs : started
            shot.seconds = Double(now > from ? now - from : 0) / 1e9
            shot.damageShareMean = span.frames > 0 ? span.damageShareSum / Double(span.frames) : 0
            func ms(_ ns: UInt64?) -> Double { Double(ns ?? 0) / 1e6 }
            shot.latencyMs = (ms(span.latencies.percentile(0.5)), ms(span.latencies.percentile(0.99)),
                              span.frames > 0 ? ms(span.latencies.maximum) : 0)
            shot.lastSize = c.lastSize
            if windowed {
                c.window = Span()
                c.windowStartNs = now
            }
            return shot
        }
    }
}
