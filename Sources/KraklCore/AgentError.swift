import Glibc

/// Every way krakl-agent can fail before or while capturing, each with its
/// own exit status (documented in docs/exit-codes.md and `--help`) and a
/// one-line message that says what to do.
public enum AgentError: Error, Equatable, CustomStringConvertible {
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

    /// Process exit status. 1 stays free for "ran, but a check failed"
    /// (conformance) so a script can tell the two apart.
    public var exitStatus: Int32 {
        switch self {
        case .usage: return 2
        case .invalidOption: return 3
        case .registryUnreadable: return 4
        case .registryMalformed: return 5
        case .unknownBackend: return 6
        case .libraryMissing: return 7
        case .libraryUnloadable: return 8
        case .entrySymbolMissing: return 9
        case .abiMismatch: return 10
        case .createFailed(_, let code, _): return Self.createStatus(code)
        case .startFailed: return 12
        case .encoderFailed: return 14
        case .listFailed: return 15
        }
    }

    /// A failed create() says why through its errno (the ABI's contract), so
    /// a script can tell "fix the options" from "start the service" from
    /// "the person said no" for any backend, in-tree or not.
    public static func createStatus(_ code: Int32) -> Int32 {
        switch -code {
        case EINVAL: return 16                              // an option or input the backend rejected
        case ENODEV, ENOENT: return 17                      // what to capture is not there (display, monitor, node, file)
        case EOPNOTSUPP, ENOSYS: return 18                  // the system lacks what the backend needs (no portal, unsupported format)
        case ECONNREFUSED, ENXIO, EHOSTDOWN: return 19      // a service it needs is not running (PipeWire, the session bus)
        case EACCES, EPERM: return 20                       // capture was not allowed (the portal dialog was denied)
        case ETIMEDOUT: return 21                           // nobody answered in time (the portal dialog)
        default: return 11
        }
    }

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
            return "backend \(backend) could not be created: \(message) (\(errnoName(code)))"
        case .startFailed(let backend, let code, let message):
            return "backend \(backend) could not start: \(message) (\(errnoName(code)))"
        case .encoderFailed(let message):
            return "encoding failed: \(message)"
        case .listFailed(let backend, let code, let message):
            return "backend \(backend) could not list its sources: \(message) (\(errnoName(code)))"
        }
    }
}

/// "ENOSYS" for -38: errno names are what backend authors grep for.
public func errnoName(_ code: Int32) -> String {
    let names: [Int32: String] = [
        1: "EPERM", 2: "ENOENT", 5: "EIO", 6: "ENXIO", 12: "ENOMEM", 13: "EACCES", 16: "EBUSY",
        19: "ENODEV", 22: "EINVAL", 24: "EMFILE", 38: "ENOSYS", 95: "EOPNOTSUPP", 110: "ETIMEDOUT", 111: "ECONNREFUSED",
        112: "EHOSTDOWN",
    ]
    return names[-code] ?? "error \(code)"
}
