import FoundationEssentials
import Glibc
import KraklSession

// The daemon's control protocol (docs/daemon.md): newline-delimited JSON over a unix
// stream socket, one request object a line from the client, one or more reply objects a
// line from the daemon. Every message carries the protocol version `v`; every reply has
// `ok`, and a reply with `ok: false` has `error` (and `exitStatus`, the status the client exits with).

enum ControlProtocol {
    static let version = 1
    /// The longest request line the daemon reads; a longer one gets an error and is skipped.
    static let maximumRequest = 64 * 1024
    /// The longest reply line a client reads (replies are a few hundred bytes).
    static let maximumReply = 1 << 20

    static func encode<T: Encodable>(_ value: T) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var bytes = [UInt8]((try? encoder.encode(value)) ?? Data(#"{"v":1,"ok":false,"error":"unencodable reply"}"#.utf8))
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }
}

/// A client's request: `{"v":1,"cmd":"status"}`, `{"v":1,"cmd":"connect","code":"…"}`,
/// `{"v":1,"cmd":"connect","qr":"/abs/path.png"}`, `{"v":1,"cmd":"stop"}`, `{"v":1,"cmd":"watch"}`.
struct ControlRequest: Codable, Equatable {
    var v: Int
    var cmd: String
    /// connect: the join code's text.
    var code: String?
    /// connect: an absolute path of a picture holding the join code's QR code (the daemon reads it).
    var qr: String?
    /// connect: scan the daemon's screen (its sharing backend) for the join code's QR code.
    var scan: Bool?
    /// connect with scan: a camera's view instead of the screen ("": the first camera; `--camera`).
    var camera: String?

    init(_ cmd: String, code: String? = nil, qr: String? = nil, scan: Bool? = nil, camera: String? = nil) {
        v = ControlProtocol.version
        self.cmd = cmd
        self.code = code
        self.qr = qr
        self.scan = scan
        self.camera = camera
    }
}

/// One reply line. `event` names what a watch line reports: "status" (the first line and
/// once a second while sharing), "state" (the lifecycle moved), "ended" (a session ended).
struct ControlReply: Codable, Equatable {
    var v = ControlProtocol.version
    var ok: Bool
    var event: String?
    var error: String?
    var exitStatus: Int32?
    var message: String?
    var status: ControlStatus?

    static func failure(_ error: String, status: Int32) -> ControlReply {
        ControlReply(ok: false, error: error, exitStatus: status)
    }
}

/// Splits a byte stream into lines of at most `limit` bytes without holding more than that:
/// a longer line is reported once as `.tooLong` and the rest of it, up to its newline, is dropped
/// as it arrives (a 10 MB message costs no more memory than a 64 KB one).
struct BoundedLineSplitter {
    enum Piece: Equatable { case line([UInt8]), tooLong }

    let limit: Int
    private var pending: [UInt8] = []
    private var discarding = false

    init(limit: Int) { self.limit = limit }

    mutating func feed(_ chunk: ArraySlice<UInt8>) -> [Piece] {
        var pieces: [Piece] = []
        var start = chunk.startIndex
        while start < chunk.endIndex {
            let newline = chunk[start...].firstIndex(of: UInt8(ascii: "\n"))
            let end = newline ?? chunk.endIndex
            if discarding {
                if newline != nil { discarding = false }
            } else if pending.count + (end - start) > limit {
                pieces.append(.tooLong)
                pending.removeAll()
                discarding = newline == nil
            } else {
                pending.append(contentsOf: chunk[start..<end])
                if newline != nil {
                    if pending.last == UInt8(ascii: "\r") { pending.removeLast() }
                    pieces.append(.line(pending))
                    pending.removeAll(keepingCapacity: true)
                }
            }
            start = newline.map { $0 + 1 } ?? chunk.endIndex
        }
        return pieces
    }

    /// Bytes held for an unfinished line (tests check it stays bounded).
    var held: Int { pending.count }
}

/// Why the control socket cannot be used. Exit statuses 60–64 (ExitStatus.swift).
enum ControlError: Error, CustomStringConvertible {
    /// `krakl-agent daemon` while another daemon of this user runs.
    case alreadyRunning(String)
    /// A client command with no daemon listening.
    case noDaemon(String)
    /// No place for the socket, a folder that is not ours, a path too long, not allowed.
    case socket(String)
    /// The daemon answered with something unusable, or closed without an answer.
    case badReply(String)

    var description: String {
        switch self {
        case .alreadyRunning(let words), .noDaemon(let words), .socket(let words), .badReply(let words): return words
        }
    }
}

/// Where the control socket lives and the unix-socket calls around it.
enum ControlSocket {
    /// `$XDG_RUNTIME_DIR/krakl`; without XDG_RUNTIME_DIR, /run/user/UID/krakl when that folder
    /// exists (what pam_systemd makes), else an error saying what to set.
    static func directory(environment: [String: String] = ProcessInfo.processInfo.environment) throws(ControlError) -> String {
        if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            guard runtime.hasPrefix("/") else { throw .socket("XDG_RUNTIME_DIR=\(runtime) is not an absolute path") }
            return runtime + "/krakl"
        }
        let fallback = "/run/user/\(getuid())"
        var info = stat()
        if stat(fallback, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR, info.st_uid == getuid() { return fallback + "/krakl" }
        // The hint names a folder that can work here: /run/user/UID does not exist on this machine.
        throw .socket("XDG_RUNTIME_DIR is not set and \(fallback) does not exist (no login session made it): set XDG_RUNTIME_DIR "
                      + "to a folder only you can use, e.g. mkdir -m 700 -p /tmp/krakl-$(id -u) && export XDG_RUNTIME_DIR=/tmp/krakl-$(id -u), "
                      + "and use the same value for the daemon and its clients")
    }

    static func path(environment: [String: String] = ProcessInfo.processInfo.environment) throws(ControlError) -> String {
        try directory(environment: environment) + "/control.sock"
    }

    /// A sockaddr_un for `path`; a leading "@" names an abstract socket (systemd's NOTIFY_SOCKET may).
    static func address(_ path: String) throws(ControlError) -> (sockaddr_un, socklen_t) {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else {
            throw .socket("the socket path \(path) is \(bytes.count) bytes; a unix socket path must be shorter than \(capacity): use a shorter XDG_RUNTIME_DIR")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \sockaddr_un.sun_path) ?? 2
        // A path is NUL-terminated (the struct is zeroed); an abstract name is exactly its bytes.
        let length = abstract ? pathOffset + bytes.count : MemoryLayout<sockaddr_un>.size
        return (address, socklen_t(length))
    }

    /// A stream socket connected to `path`; errno's story as a ControlError otherwise.
    static func connect(_ path: String) throws(ControlError) -> Int32 {
        let (address, length) = try address(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .socket("socket: \(String(cString: strerror(errno)))") }
        var copy = address
        let result = withUnsafePointer(to: &copy) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, length) }
        }
        if result == 0 { return fd }
        let error = errno
        close(fd)
        switch error {
        case ENOENT, ECONNREFUSED:
            throw .noDaemon("no krakl-agent daemon is running for this user (nothing answers on \(path)): "
                            + "start one with `systemctl --user start krakl-agent` (the user unit) or "
                            + "`systemd-run --user krakl-agent daemon`; a `krakl-agent daemon &` ends with this terminal")
        case EACCES, EPERM:
            throw .socket("not allowed to use \(path): the control socket belongs to another user")
        default:
            throw .socket("cannot connect to \(path): \(String(cString: strerror(error)))")
        }
    }

    /// The uid of the process at the other end of a connected unix socket (SO_PEERCRED), nil if unknown.
    static func peerUID(_ fd: Int32) -> uid_t? {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; }: three 32-bit fields on Linux.
        var credentials: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: credentials))
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0, length == 12 else { return nil }
        return credentials.1
    }

    /// Writes all of `bytes` to a blocking socket; false when the peer is gone.
    @discardableResult
    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            offset += n
        }
        return true
    }
}

/// systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram of
/// "KEY=VALUE" lines to the unix socket named by $NOTIFY_SOCKET. Nothing happens without it.
enum ServiceNotifier {
    private static let target: String? = {
        guard let path = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"], !path.isEmpty,
              path.hasPrefix("/") || path.hasPrefix("@") else { return nil }
        return path
    }()

    static func notify(_ assignments: String) {
        guard let target, let (address, length) = try? ControlSocket.address(target) else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var copy = address
        let bytes = Array(assignments.utf8)
        _ = withUnsafePointer(to: &copy) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), pointer, length) }
            }
        }
    }
}
