import Glibc
import KraklBase
import KraklHost
import KraklRoom
import KraklScan
import KraklSession
import KraklViewer

// The agent's exit statuses, all in one place (documented in docs/exit-codes.md
// and --help). Libraries throw typed errors and end sessions with typed
// reasons; only the agent turns them into numbers.

extension HostError {
    /// Process exit status. 1 stays free for "ran, but a check failed"
    /// (conformance) so a script can tell the two apart.
    var exitStatus: Int32 {
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
        case .backendHung: return 22
        case .outputFailed: return 23
        case .backendCrashed: return 24
        case .noValidFrames: return 25
        }
    }

    /// Which of a recording run's failures gives its exit status (the first of these, then the first
    /// said): the backend hung, an output failed, the encoder failed, no usable frame.
    var recordingPrecedence: Int {
        switch self {
        case .backendHung: return 0
        case .outputFailed: return 1
        case .encoderFailed: return 2
        case .noValidFrames: return 3
        default: return 4
        }
    }

    /// A failed create() says why through its errno (the ABI's contract), so
    /// a script can tell "fix the options" from "start the service" from
    /// "the person said no" for any backend, in-tree or not.
    static func createStatus(_ code: Int32) -> Int32 {
        // Matched as negative values: negating the backend's code would trap on INT32_MIN.
        switch code {
        case -EINVAL: return 16                                // an option or input the backend rejected
        case -ENODEV, -ENOENT: return 17                       // what to capture is not there (display, monitor, node, file)
        case -EOPNOTSUPP, -ENOSYS: return 18                   // the system lacks what the backend needs (no portal, unsupported format)
        case -ECONNREFUSED, -ENXIO, -EHOSTDOWN: return 19      // a service it needs is not running (PipeWire, the session bus)
        case -EACCES, -EPERM: return 20                        // capture was not allowed (the portal dialog was denied)
        case -ETIMEDOUT: return 21                             // nobody answered in time (the portal dialog)
        default: return 11                                     // any other errno, or a value the ABI does not define
        }
    }
}

extension EndReason {
    /// How `krakl-agent --join … --once` exits when the session ends this way.
    var exitStatus: Int32 {
        switch self {
        case .userStopped: return 0
        case .roomEnded: return 30
        case .replaced: return 55
        case .sourceEnded: return 31
        case .connectionLost: return 32
        case .relayRefused(.credentials, _): return 57
        case .relayRefused(.certificate, _): return 58
        case .joinRefused(let error): return error.exitStatus
        case .tokenExpired: return 39
        case .sourceUnavailable(let error): return error.exitStatus
        case .failure: return 44
        }
    }
}

extension SessionController.Refusal.Reason {
    /// A connect the session controller refused (the daemon's reply, `--join`'s exit).
    var exitStatus: Int32 {
        switch self {
        case .alreadySharing: return ExitCode.daemonRefused
        case .joinCode(let error): return error.exitStatus
        case .cannotStart: return ExitCode.failure
        }
    }
}

extension RoomError {
    var exitStatus: Int32 {
        switch self {
        case .unauthorized: return 33
        case .noSuchRoom: return 34
        case .refused, .restartUnsupported: return 35
        case .roomFull: return 54
        case .serverError: return 36
        case .unreachable: return 37
        case .badReply: return 38
        case .proxyFailed: return 53
        }
    }
}

extension ViewerServerError {
    /// The built-in viewer cannot listen (port in use, not this machine's address).
    var exitStatus: Int32 { 52 }
}

extension ControlError {
    /// The daemon and its control socket (docs/daemon.md).
    var exitStatus: Int32 {
        switch self {
        case .alreadyRunning: return 60
        case .noDaemon: return 61
        case .socket: return ExitCode.controlSocket
        case .badReply: return ExitCode.daemonReplyUnusable
        }
    }
}

extension JoinCodeError {
    /// Exit statuses 39–43 (docs/exit-codes.md).
    var exitStatus: Int32 {
        switch self {
        case .tokenExpired, .tokenNotYetValid: return 39
        case .malformedCode: return 40
        case .unsupportedVersion: return 41
        case .malformedToken: return 42
        case .roomMismatch, .noRoom: return 43
        }
    }
}

extension ImageFileError {
    /// A picture given to --qr that cannot be read (docs/exit-codes.md).
    var exitStatus: Int32 {
        switch self {
        case .tooLarge: return ExitCode.qrTooLarge
        case .cannotOpen, .notAFile, .empty, .unknownFormat, .damaged: return ExitCode.qrUnreadable
        }
    }
}

/// The statuses that are no error type's mapping above, by name, so that every number the agent
/// exits with is written in this file (docs/exit-codes.md says what each means).
enum ExitCode {
    static let done: Int32 = 0
    static let usage: Int32 = 2
    /// A recording run's source reported an error while capturing (and nothing worse happened).
    static let sourceReportedError: Int32 = 13
    /// Something on our side failed (the daemon's socket thread, the session's control loop).
    static let failure: Int32 = 44
    /// --qr: no QR code in the picture; the picture is unreadable; too large; a QR code that is no
    /// join code; two or more different join codes.
    static let qrNoCode: Int32 = 45
    static let qrUnreadable: Int32 = 46
    static let qrTooLarge: Int32 = 47
    static let qrNotAJoinCode: Int32 = 48
    static let qrSeveralCodes: Int32 = 49
    /// --scan: no join code within --scan-timeout; the source (or camera) ended first; no camera.
    static let scanTimedOut: Int32 = 50
    static let scanSourceEnded: Int32 = 51
    static let noCamera: Int32 = 56
    /// The control socket cannot be made or used (also: a connection from another user, turned away).
    static let controlSocket: Int32 = 62
    /// The daemon refused the request (already sharing, malformed, unknown command): sent in its reply.
    static let daemonRefused: Int32 = 63
    /// The daemon's reply is unusable, or it closed the connection without one.
    static let daemonReplyUnusable: Int32 = 64
}
