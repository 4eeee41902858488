import FoundationEssentials
import KraklBase
import Glibc

/// Turns a backend's capture timestamps into presentation times the outputs can trust: always
/// increasing, close to CLOCK_MONOTONIC, and equal to the backend's own timestamps for as long
/// as those behave.
///
/// A backend's timestamps are input like its pixels: one may step back (a clock reset, a
/// reordering bug), jump ahead, run on another clock, or never move. Containers need
/// increasing times, the host stamps its own refresh frames with CLOCK_MONOTONIC between the
/// backend's, and unsigned arithmetic on a time earlier than the first one traps. So each
/// timestamp is checked against the host's clock: its step from the previous frame must go
/// forward and agree with the host's step (when each frame reached the host) within
/// `tolerance`. A timestamp that does not is replaced by the previous presentation time plus
/// the host's step, and later timestamps keep that correction (the backend's clock is followed
/// again from its new offset), so one bad stamp costs one frame's precision, not the rest of
/// the recording.
struct PresentationClock {
    /// How far a backend's step may differ from the host's: delivery jitter (a frame that waited
    /// in a compositor, a burst after a stall) stays well within it; a clock that stepped does not.
    static let tolerance: UInt64 = 1_000_000_000

    /// Added (wrapping) to a backend timestamp to get the presentation time.
    private var offset: UInt64 = 0
    private var last: UInt64?
    private var lastHostNs: UInt64 = 0

    /// The presentation time of a frame captured at `capture` (the backend's timestamp) that
    /// reached the host at `hostNs`, and what was wrong with `capture` if it was not used as is.
    mutating func stamp(capture: UInt64, hostNs: UInt64) -> (time: UInt64, problem: String?) {
        guard let last else {
            // The first frame: the backend's time if it is near the host's clock.
            let skew = distance(capture, hostNs)
            let time = skew <= Self.tolerance ? capture : hostNs
            offset = time &- capture
            remember(time, hostNs)
            return (time, skew <= Self.tolerance ? nil
                : "the first timestamp is \(seconds(skew)) s \(capture > hostNs ? "ahead of" : "behind") the host's clock (CLOCK_MONOTONIC)")
        }
        let predicted = self.next(after: last, hostNs: hostNs)
        let candidate = capture &+ offset
        // Compared as a signed step, so a wild value (near 0 or UInt64.max) is just "far away".
        let step = Int64(bitPattern: candidate &- last)
        if step > 0 && distance(candidate, predicted) <= Self.tolerance {
            remember(candidate, hostNs)
            return (candidate, nil)
        }
        offset = predicted &- capture
        remember(predicted, hostNs)
        let problem: String
        if step == 0 {
            problem = "a timestamp did not advance"
        } else if step < 0 {
            problem = "a timestamp went back \(seconds(last &- candidate)) s"
        } else {
            problem = "a timestamp jumped \(seconds(distance(candidate, predicted))) s away from the host's clock"
        }
        return (predicted, problem)
    }

    /// The presentation time of a picture the host encodes on its own (a refresh, a requested
    /// keyframe of the current picture) at `hostNs`.
    mutating func stamp(hostNs: UInt64) -> UInt64 {
        guard let last else {
            remember(hostNs, hostNs)
            return hostNs
        }
        let time = next(after: last, hostNs: hostNs)
        remember(time, hostNs)
        return time
    }

    /// The previous time plus the host's step since then (at least 1 ns: times only go forward).
    private func next(after last: UInt64, hostNs: UInt64) -> UInt64 {
        let hostStep = hostNs > lastHostNs ? hostNs - lastHostNs : 0
        return last &+ max(1, hostStep)
    }

    private mutating func remember(_ time: UInt64, _ hostNs: UInt64) {
        last = time
        lastHostNs = max(lastHostNs, hostNs)
    }

    private func distance(_ a: UInt64, _ b: UInt64) -> UInt64 { a > b ? a - b : b - a }
    private func seconds(_ ns: UInt64) -> String { String(cFormat: "%.3f", Double(ns) / 1e9) }
}
