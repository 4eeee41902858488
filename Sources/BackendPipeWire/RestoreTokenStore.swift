import BackendKit
import Glibc

/// The portal's restore token, kept between runs so the person is asked
/// once, not at every start: `$XDG_STATE_HOME/krakl/` (default
/// `~/.local/state/krakl/`, folder 0700), one file per kind of source
/// (`pipewire-restore-token-monitor`, ...), mode 0600, written atomically
/// (a temporary file renamed over the old one). A token is good for one
/// session: the portal hands out a new one with each Start, which replaces
/// the stored one.
struct RestoreTokenStore {
    let directory: String
    let path: String

    init(kind: String) {
        let state: String
        if let xdg = getenv("XDG_STATE_HOME").map({ String(cString: $0) }), xdg.hasPrefix("/") {
            state = xdg
        } else {
            state = Self.home() + "/.local/state"
        }
        directory = state + "/krakl"
        path = directory + "/pipewire-restore-token-\(kind)"
    }

    private static func home() -> String {
        if let home = getenv("HOME"), home.pointee != 0 { return String(cString: home) }
        if let entry = getpwuid(getuid()), let dir = entry.pointee.pw_dir { return String(cString: dir) }
        return "/tmp"
    }

    /// The stored token, or nil when there is none (or it is unreadable).
    func load() -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { return nil }
        let token = String(decoding: buffer[0..<count], as: UTF8.self).trimmingWhitespace()
        return token.isEmpty ? nil : token
    }

    /// Replaces the stored token (atomically; the file is 0600, the folder 0700).
    func save(_ token: String) throws(BackendError) {
        try makeDirectory()
        let temporary = path + ".tmp.\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw failure("cannot write \(temporary)") }
        let bytes = Array((token + "\n").utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        Glibc.close(fd)
        guard written == bytes.count, synced, rename(temporary, path) == 0 else {
            let error = failure("cannot store the restore token in \(path)")
            unlink(temporary)
            throw error
        }
    }

    /// Removes the stored token (option restore=false).
    func forget() { unlink(path) }

    private func makeDirectory() throws(BackendError) {
        var prefix = ""
        for part in directory.split(separator: "/") {
            prefix += "/" + part
            if mkdir(prefix, 0o700) != 0 && errno != EEXIST { throw failure("cannot create \(prefix)") }
        }
        chmod(directory, 0o700)
    }

    private func failure(_ what: String) -> BackendError {
        let code = errno
        return BackendError(-(code == 0 ? EIO : code), "\(what): \(String(cString: strerror(code)))")
    }
}

extension String {
    func trimmingWhitespace() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first.isWhitespace { scalars.removeFirst() }
        while let last = scalars.last, last.isWhitespace { scalars.removeLast() }
        return String(scalars)
    }

    /// A token shortened for logs: never the whole secret.
    var shortenedToken: String { count > 8 ? String(prefix(4)) + "…" : "…" }
}
