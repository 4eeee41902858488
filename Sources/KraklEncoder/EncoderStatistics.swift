import Foundation
import KraklCore

/// What the encoder did, per frame and in total; read from any thread.
public final class EncoderStatistics: @unchecked Sendable {
    public struct Frame: Sendable {
        public let bytes: Int
        public let keyframe: Bool
        public let refresh: Bool
        /// Share of 16×16 blocks the active map marked as changed (1 for full frames).
        public let activeShare: Double
        public let encodeNs: UInt64
        public let timestampNs: UInt64
    }

    public struct Summary: Sendable {
        public var frames = 0
        public var keyframes = 0
        public var refreshFrames = 0
        public var bytes = 0
        public var seconds = 0.0
        public var bitrateKbps = 0.0
        public var encodeMs: (p50: Double, p99: Double, max: Double) = (0, 0, 0)
        public var activeShareMean = 0.0
        public var capturedFrames = 0
        public var skippedFrames = 0
        /// Pictures libvpx dropped to hold the bitrate.
        public var droppedFrames = 0
        /// CPU time of the encoder path: conversion on the capture thread plus the encoder thread.
        public var cpuSeconds = 0.0
    }

    private let lock = NSLock()
    private var frames: [Frame] = []
    private var windowStart = 0
    private(set) var captured = 0
    private(set) var skipped = 0
    private var dropped = 0
    private var conversionCpuNs: UInt64 = 0
    private var encoderCpuNs: UInt64 = 0

    func record(_ frame: Frame) { lock.withLock { frames.append(frame) } }
    func recordCapture(conversionCpuNs ns: UInt64, skippedPrevious: Bool) {
        lock.withLock {
            captured += 1
            conversionCpuNs += ns
            if skippedPrevious { skipped += 1 }
        }
    }
    func recordDrop() { lock.withLock { dropped += 1 } }
    func setEncoderCpu(_ ns: UInt64) { lock.withLock { encoderCpuNs = ns } }

    public var allFrames: [Frame] { lock.withLock { frames } }

    /// Totals over the run, or (`window: true`) over the frames since the
    /// previous windowed summary.
    public func summary(window: Bool = false) -> Summary {
        lock.withLock {
            let from = window ? windowStart : 0
            let slice = frames[from...]
            if window { windowStart = frames.count }
            var s = Summary()
            s.frames = slice.count
            s.keyframes = slice.filter(\.keyframe).count
            s.refreshFrames = slice.filter(\.refresh).count
            s.bytes = slice.reduce(0) { $0 + $1.bytes }
            if let first = slice.first, let last = slice.last, slice.count > 1 {
                // Span of the frames plus one mean interval, so N frames at 30 fps count N/30 s.
                let span = Double(last.timestampNs - first.timestampNs) / 1e9
                s.seconds = span * Double(slice.count) / Double(slice.count - 1)
            }
            s.bitrateKbps = s.seconds > 0 ? Double(s.bytes) * 8 / s.seconds / 1000 : 0
            let times = slice.map(\.encodeNs).sorted()
            func percentile(_ p: Double) -> Double { times.nearestRank(p).map { Double($0) / 1e6 } ?? 0 }
            s.encodeMs = (percentile(0.5), percentile(0.99), Double(times.last ?? 0) / 1e6)
            s.activeShareMean = slice.isEmpty ? 0 : slice.reduce(0) { $0 + $1.activeShare } / Double(slice.count)
            s.capturedFrames = captured
            s.skippedFrames = skipped
            s.droppedFrames = dropped
            s.cpuSeconds = Double(conversionCpuNs + encoderCpuNs) / 1e9
            return s
        }
    }
}

/// CPU time this thread has used, ns.
func threadCpuNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}
