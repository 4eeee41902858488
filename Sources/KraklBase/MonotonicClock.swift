import Glibc

/// CLOCK_MONOTONIC, the one clock of the agent: backends stamp frames with
/// it (krakl_backend.h), the encoder and the network side take deadlines,
/// pacing and RTT from it, and the frame stamp carries it, so a frame's age
/// is a subtraction wherever it is read.
public enum MonotonicClock {
    @inline(__always) public static func nanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    public static func milliseconds() -> Double {
        Double(nanoseconds()) / 1e6
    }
}
