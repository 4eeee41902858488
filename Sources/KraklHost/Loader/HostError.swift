import KraklBase
import FoundationEssentials
import Glibc

/// Every way the host can fail before or while capturing (command line,
/// plugins.json, loading and running a backend, the encoder), each with a
/// one-line message that says what to do. The agent maps each case to its
/// own exit status (Sources/Agent/CLI/ExitStatus.swift, docs/exit-codes.md).
public enum HostError: Error, Equatable, Sendable, CustomStringConvertible {
    case usage(String)
    case invalidOption(String)
    case registryUnreadable(path: String, reason: String)
    case registryMalformed(path: String, line: Int, column: Int, message: String)
    case unknownBackend(name: String, known: [String], registry: String)
    case libraryMissing(backend: String, path: String)
    case libraryUnloadable(path: String, reason: String)
    case entrySymbolMissing(path: String)
    case abiMismatch(path: String, message: String)
    case createFailed(backend: String, code: Int32, message: String)
    case startFailed(backend: String, code: Int32, message: String)
    case encoderFailed(String)
    case listFailed(backend: String, code: Int32, message: String)
    /// A call into the backend (`call`: "create", "start", "stop", "destroy", "list_sources")
    /// did not return within its budget; the host gave up on it.
    case backendHung(backend: String, call: String, budgetSeconds: Double)
    /// An output (recording, --stats-json, --frame-log, --dump-input) could not be
    /// written, flushed or closed.
    case outputFailed(path: String, reason: String)
    /// A backend in its own process (isolated mode) died: crashed on a signal or exited.
    case backendCrashed(backend: String, reason: String)
    /// The run captured no usable frame (every frame the backend delivered was invalid).
    case noValidFrames(backend: String, invalid: Int)

    public var description: String {
        switch self {
        case .usage(let message):
            return "\(message) (see krakl-agent --help)"
        case .invalidOption(let message):
            return message
        case .registryUnreadable(let path, let reason):
            return "cannot read the backend registry \(path): \(reason); pass another with --plugins FILE"
        case .registryMalformed(let path, let line, let column, let message):
            return "\(path):\(line):\(column): \(message)"
        case .unknownBackend(let name, let known, let registry):
            return "no backend named \"\(name)\" in \(registry); known backends: \(known.joined(separator: ", "))"
        case .libraryMissing(let backend, let path):
            return "backend \(backend): library \(path) does not exist; build it (swift build -c release) or fix its \"library\" path"
        case .libraryUnloadable(let path, let reason):
            return "cannot load \(path): \(reason)"
        case .entrySymbolMissing(let path):
            return "\(path) is not a krakl backend: it does not export krakl_backend_v1 (see docs/backend-guide.md)"
        case .abiMismatch(let path, let message):
            return "\(path): \(message)"
        case .createFailed(let backend, let code, let message):
            return "backend \(backend) could not be created: \(message) (\(returnValueName(code)))"
        case .startFailed(let backend, let code, let message):
            return "backend \(backend) could not start: \(message) (\(returnValueName(code)))"
        case .encoderFailed(let message):
            return "encoding failed: \(message)"
        case .listFailed(let backend, let code, let message):
            return "backend \(backend) could not list its sources: \(message) (\(returnValueName(code)))"
        case .backendHung(let backend, let call, let budget):
            return "backend \(backend) hung: its \(call)() did not return within \(String(cFormat: "%g", budget)) s; the host gave up on it (report this to the backend's author)"
        case .outputFailed(let path, let reason):
            return "cannot write \(path): \(reason)"
        case .backendCrashed(let backend, let reason):
            return "backend \(backend) crashed: \(reason)"
        case .noValidFrames(let backend, let invalid):
            return "backend \(backend) delivered no usable frame (\(invalid) invalid frames dropped; see the first error above); nothing was recorded"
        }
    }
}

/// The largest errno Linux defines codes up to (MAX_ERRNO): -1...-4095 are errno values.
let maximumErrno: Int32 = 4095

/// "ENOSYS" for -38: errno names are what backend authors grep for. Total over Int32, so a
/// backend's INT32_MIN costs no overflow: 0 is "no error code", anything else that is not a
/// negative errno says so.
public func errnoName(_ code: Int32) -> String {
    let names: [Int32: String] = [
        1: "EPERM", 2: "ENOENT", 5: "EIO", 6: "ENXIO", 11: "EAGAIN", 12: "ENOMEM", 13: "EACCES", 16: "EBUSY",
        19: "ENODEV", 22: "EINVAL", 24: "EMFILE", 38: "ENOSYS", 95: "EOPNOTSUPP", 110: "ETIMEDOUT", 111: "ECONNREFUSED",
        112: "EHOSTDOWN",
    ]
    if code == 0 { return "no error code" }
    guard code < 0, code >= -maximumErrno else { return "error \(code), not a negative errno" }
    let errno = 0 - code   // in 1...4095 here, so the negation cannot overflow
    return names[errno] ?? "errno \(errno)"
}

/// How a failed call's return value reads in an error: its errno name when it is a negative errno,
/// otherwise what it was and that it means nothing (krakl_backend.h "Return values").
public func returnValueName(_ code: Int32) -> String {
    guard code < 0, code >= -maximumErrno else { return "returned \(code), which the ABI does not define" }
    return errnoName(code)
}
