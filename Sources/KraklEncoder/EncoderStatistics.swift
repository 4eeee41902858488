import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// What the encoder did, in total and per status-line window; read from any thread.
/// Fixed-size (running sums, an encode-time histogram): per-frame rows go to the frame log as
/// they happen (FrameLog), not into memory.
public final class EncoderStatistics: Sendable {
    public struct Frame: Sendable {
        public let bytes: Int
        public let keyframe: Bool
        public let refresh: Bool
        /// Share of 16×16 blocks the active map marked as changed (1 for full frames).
        public let activeShare: Double
        public let encodeNs: UInt64
        /// Presentation time (PresentationClock): increases from frame to frame.
        public let timestampNs: UInt64
        /// libvpx's quantizer for the frame, 0 (finest) to 63; nil if it did not say.
        public var quantizer: Int? = nil
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
        /// Backend timestamps the PresentationClock replaced (stepped back, jumped, stood still).
        public var correctedTimestamps = 0
        /// Keyframe requests that found a keyframe less than the minimum spacing ago and were
        /// merged into the next allowed one.
        public var coalescedKeyframeRequests = 0
        /// CPU time of the encoder path: conversion on the capture thread plus the encoder thread.
        public var cpuSeconds = 0.0
    }

    /// Sums over a span of frames.
    private struct Span {
        var frames = 0
        var keyframes = 0
        var refreshFrames = 0
        var bytes = 0
        var activeShareSum = 0.0
        var firstTimestamp: UInt64 = 0
        var lastTimestamp: UInt64 = 0
        var encodeTimes = LogHistogram()

        mutating func add(_ frame: Frame) {
            if frames == 0 { firstTimestamp = frame.timestampNs }
            lastTimestamp = max(lastTimestamp, frame.timestampNs)
            frames += 1
            if frame.keyframe { keyframes += 1 }
            if frame.refresh { refreshFrames += 1 }
            bytes += frame.bytes
            activeShareSum += frame.activeShare
            encodeTimes.add(frame.encodeNs)
        }
    }

    private struct Counts {
        var total = Span()
        var window = Span()
        var captured = 0
        var skipped = 0
        var dropped = 0
        var corrected = 0
        var coalesced = 0
        var conversionCpuNs: UInt64 = 0
        var encoderCpuNs: UInt64 = 0
    }
    private let counts = Guarded(Counts())

    func record(_ frame: Frame) {
        counts.withLock { c in
            c.total.add(frame)
            c.window.add(frame)
        }
    }
    func recordCapture(conversionCpuNs ns: UInt64, skippedPrevious: Bool) {
        counts.withLock { c in
            c.captured += 1
            c.conversionCpuNs += ns
            if skippedPrevious { c.skipped += 1 }
        }
    }
    func recordDrop() { counts.withLock { c in c.dropped += 1 } }
    func recordCorrectedTimestamp() { counts.withLock { c in c.corrected += 1 } }
    func recordCoalescedKeyframeRequest() { counts.withLock { c in c.coalesced += 1 } }
    func setEncoderCpu(_ ns: UInt64) { counts.withLock { c in c.encoderCpuNs = ns } }

    /// Totals over the run, or (`window: true`) over the frames since the
    /// previous windowed summary.
    public func summary(window windowed: Bool = false) -> Summary {
        counts.withLock { c in
            let span = windowed ? c.window : c.total
            if windowed { c.window = Span() }
            var s = Summary()
            s.frames = span.frames
            s.keyframes = span.keyframes
            s.refreshFrames = span.refreshFrames
            s.bytes = span.bytes
            if span.frames > 1 && span.lastTimestamp > span.firstTimestamp {
                // Span of the frames plus one mean interval, so N frames at 30 fps count N/30 s.
                let seconds = Double(span.lastTimestamp - span.firstTimestamp) / 1e9
                s.seconds = seconds * Double(span.frames) / Double(span.frames - 1)
            }
            s.bitrateKbps = s.seconds > 0 ? Double(s.bytes) * 8 / s.seconds / 1000 : 0
            func ms(_ ns: UInt64?) -> Double { Double(ns ?? 0) / 1e6 }
            s.encodeMs = (ms(span.encodeTimes.percentile(0.5)), ms(span.encodeTimes.percentile(0.99)),
                          span.frames > 0 ? ms(span.encodeTimes.maximum) : 0)
            s.activeShareMean = span.frames > 0 ? span.activeShareSum / Double(span.frames) : 0
            s.capturedFrames = c.captured
            s.skippedFrames = c.skipped
            s.droppedFrames = c.dropped
            s.correctedTimestamps = c.corrected
            s.coalescedKeyframeRequests = c.coalesced
            s.cpuSeconds = Double(c.conversionCpuNs + c.encoderCpuNs) / 1e9
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
