import Glibc

/// A failure a backend reports through the ABI: a negative errno for the
/// host and a sentence for the person, saying what to do about it.
public struct BackendError: Error, CustomStringConvertible {
    /// Negative errno (e.g. -EINVAL), as the ABI returns it.
    public let code: Int32
    public let message: String
    /// The host already logged the reason (check_options does), so the
    /// message must not be logged a second time.
    public let alreadyLogged: Bool

    public init(_ code: Int32, _ message: String, alreadyLogged: Bool = false) {
        precondition(code < 0, "ABI error codes are negative errno values")
        self.code = code
        self.message = message
        self.alreadyLogged = alreadyLogged
    }

    public static func invalidOption(_ message: String) -> BackendError { BackendError(-EINVAL, message) }

    public var description: String { message }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock every frame timestamp uses.
@inline(__always)
public func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}
