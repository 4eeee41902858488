import COpenSSL
import FoundationEssentials
import Glibc
import KraklBase
import Synchronization

/// One TCP connection (plain, or TLS through OpenSSL with the peer's
/// certificate checked against the system CA store, or a given CA file, and
/// the host name), where every step waits in poll(2) against one deadline.
/// The room drivers' HTTP runs on this instead of URLSession: URLSession
/// drives libcurl through libdispatch sources, whose manager thread then
/// stays for the life of the process, and an idle agent must hold no thread
/// but its main one. `cancel()` from another thread ends a wait at once.
///
/// A WebSocket reads on one thread while others write: each OpenSSL call on the connection holds
/// `io` (one SSL object must not be used by two threads at once), but the waits in poll(2) do not,
/// so a reader waiting for the server never holds up a writer (only `open`'s handshake waits under
/// `io`: no other thread uses the connection before `open` returns). Reads and writes may pass a
/// deadline of their own; without one, the connection's deadline applies.
final class HTTPConnection: Sendable {
    /// The socket and its TLS session (an SSL*, owned here: freed by `closeNow`), under `io`: every
    /// send, recv and OpenSSL call on them holds it. A Mutex, not a Guarded: the SSL object is not
    /// Sendable, and a Mutex lets it live only inside the lock (it never leaves `withLock`).
    private struct Stream {
        var fd: Int32 = -1
        var ssl: OpaquePointer?
    }
    private let io = Mutex(Stream())
    private let deadline: UInt64
    /// "10 s": the time-out as the person set it, for messages.
    private let timeoutText: String
    /// A pipe whose write end `cancel()` closes: every poll also watches the read end.
    private let wake: (read: Int32, write: Int32)
    private struct Ending: Sendable {
        var cancelled = false
        var closed = false
    }
    /// Cancelling and closing; the wake pipe is written and closed under it only.
    private let ending = Guarded(Ending())

    /// A connection not yet made, whose every step ends by `timeout` s from now; `cancel()` works
    /// from here on, so a request can be cut short while it connects (a silent proxy, a slow handshake).
    init(timeout: Double, what: String) throws(RoomError) {
        deadline = MonotonicClock.nanoseconds() + UInt64(max(timeout, 0.001) * 1e9)
        timeoutText = timeout == timeout.rounded() ? "\(Int(timeout)) s" : String(cFormat: "%.1f s", timeout)
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw .unreachable("\(what): pipe: \(String(cString: strerror(errno)))") }
        for end in ends {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
        }
        wake = (ends[0], ends[1])
    }

    /// Connects to `host:port` (each address getaddrinfo gives, in order) and, for TLS, completes the
    /// handshake; all before the deadline. `what` names the request in errors. With a `proxy`, the
    /// TCP connection goes to the proxy instead; for TLS it is first made a tunnel to `host:port`
    /// (HTTP CONNECT), and the handshake runs inside it with `host`'s name. Call once.
    /// `tunnel`: go through the proxy by CONNECT even without TLS (a `ws://` WebSocket: a forwarding
    /// proxy would not pass the upgraded connection on).
    func open(host: String, port: Int, tls: TLSClientContext?, what: String, proxy: HTTPProxy? = nil, tunnel alwaysTunnel: Bool = false) throws(RoomError) {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var list: UnsafeMutablePointer<addrinfo>?
        let dial = (host: proxy?.host ?? host, port: proxy?.port ?? port)
        // What went wrong before a reply names the proxy when there is one: that is where to look.
        func failure(_ message: String) -> RoomError {
            proxy.map { .proxyFailed(proxy: $0.description, message: message) } ?? .unreachable(message)
        }
        let resolved = getaddrinfo(dial.host, String(dial.port), &hints, &list)
        guard resolved == 0, let first = list else {
            throw failure("\(what): cannot resolve \(dial.host): \(String(cString: gai_strerror(resolved)))")
        }
        defer { freeaddrinfo(list) }
        var lastError = "no address"
        var connected: Int32 = -1
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let info = entry, connected < 0 {
            entry = info.pointee.ai_next
            let socket = Glibc.socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard socket >= 0 else { lastError = String(cString: strerror(errno)); continue }
            if Glibc.connect(socket, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0 || errno == EINPROGRESS {
                let ready = HTTPConnection.wait(socket, events: Int16(POLLOUT), deadline: deadline, wake: wake.read)
                var error: Int32 = 0
                var length = socklen_t(MemoryLayout<Int32>.size)
                if ready == .ready, getsockopt(socket, SOL_SOCKET, SO_ERROR, &error, &length) == 0, error == 0 {
                    connected = socket
                    break
                }
                lastError = ready == .timedOut ? "no connection within \(timeoutText)" : ready == .cancelled ? "cancelled" : String(cString: strerror(error))
            } else {
                lastError = String(cString: strerror(errno))
            }
            close(socket)
            if lastError == "cancelled" || lastError.hasPrefix("no connection") { break }
        }
        guard connected >= 0 else {
            if lastError == "cancelled" { throw .unreachable("\(what): cancelled (leaving)") }
            throw failure("\(what): cannot connect to \(dial.host):\(dial.port): \(lastError)")
        }
        io.withLock { $0.fd = connected }
        var one: Int32 = 1
        setsockopt(connected, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        if let proxy, tls != nil || alwaysTunnel {
            do throws(RoomError) { try tunnel(through: proxy, to: host, port: port, what: what) } catch {
                closeNow()
                throw error
            }
        }
        if let tls {
            do throws(RoomError) { try handshake(tls, host: host, what: what) } catch {
                closeNow()
                throw error
            }
        }
    }

    deinit { closeNow() }

    /// Ends every wait of this connection now (from any thread); later calls fail as cancelled.
    func cancel() {
        ending.withLock { ending in
            // Once closed, the pipe's numbers may belong to another file: nothing is written.
            guard !ending.cancelled, !ending.closed else { return }
            ending.cancelled = true
            var byte: UInt8 = 1
            _ = Glibc.write(wake.write, &byte, 1)
        }
    }

    private func closeNow() {
        ending.withLock { ending in
            guard !ending.closed else { return }
            ending.closed = true
            io.withLock { stream in
                if let ssl = stream.ssl { SSL_free(ssl) }   // before its socket closes
                stream.ssl = nil
                if stream.fd >= 0 { close(stream.fd) }
                stream.fd = -1
            }
            close(wake.read)
            close(wake.write)
        }
    }

    enum Wait { case ready, timedOut, cancelled }

    /// poll(2) on `fd` for `events` and on the wake pipe, until `deadline`.
    static func wait(_ fd: Int32, events: Int16, deadline: UInt64, wake: Int32) -> Wait {
        while true {
            let now = MonotonicClock.nanoseconds()
            guard now < deadline else { return .timedOut }
            var fds = [pollfd(fd: fd, events: events, revents: 0), pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            let ms = Int32(min((deadline - now) / 1_000_000 + 1, 60_000))
            let n = poll(&fds, 2, ms)
            if n < 0 && errno == EINTR { continue }
            if n < 0 { return .cancelled }
            if fds[1].revents != 0 { return .cancelled }
            if fds[0].revents != 0 { return .ready }
        }
    }

    private func waitFor(_ fd: Int32, _ events: Int16, what: String, until: UInt64? = nil) throws(RoomError) {
        switch Self.wait(fd, events: events, deadline: until ?? deadline, wake: wake.read) {
        case .ready: return
        case .timedOut: throw .unreachable("\(what): no reply within \(timeoutText)")
        case .cancelled: throw .unreachable("\(what): cancelled (leaving)")
        }
    }

    /// HTTP CONNECT (RFC 9110 §9.3.6) on the fresh connection to `proxy`: afterwards the bytes go to
    /// `host:port` as they are. Every failure here is the proxy's and names it.
    private func tunnel(through proxy: HTTPProxy, to host: String, port: Int, what: String) throws(RoomError) {
        let authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        var head = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\nUser-Agent: krakl-agent\r\n"
        if let authorization = proxy.authorization { head += "Proxy-Authorization: \(authorization)\r\n" }
        head += "\r\n"
        let step = "\(what): CONNECT \(authority)"
        func failed(_ message: String) -> RoomError { .proxyFailed(proxy: proxy.description, message: message) }
        do throws(RoomError) {
            try write(Array(head.utf8), what: step)
        } catch {
            if case .unreachable(let message) = error, !message.hasSuffix("(leaving)") { throw failed(message) }
            throw error
        }
        // One byte at a time: nothing after the reply's head may be taken from the socket, it is
        // the TLS server's. The head is a line or two; 16 KB bounds a proxy that babbles.
        var reply: [UInt8] = []
        while HTTPResponseParser.find([13, 10, 13, 10], in: Array(reply.suffix(4))) == nil {
            guard reply.count < 16_384 else { throw failed("\(step): the reply's head is over 16 KB") }
            let byte: [UInt8]
            do throws(RoomError) {
                byte = try read(maximum: 1, what: step)
            } catch {
                if case .unreachable(let message) = error, !message.hasSuffix("(leaving)") {
                    throw failed(message.replacing("no reply within", with: "no answer to CONNECT within"))
                }
                throw error
            }
            guard !byte.isEmpty else {
                throw failed("\(step): the proxy closed the connection " + (reply.isEmpty ? "without answering" : "inside its reply"))
            }
            reply += byte
        }
        let text = String(decoding: reply.dropLast(4), as: UTF8.self)
        let status: Int
        do throws(HTTPResponseParser.Problem) { status = try HTTPResponseParser.parseHead(text).status } catch {
            throw failed("\(step): \(error.description)")
        }
        if (200...299).contains(status) { return }
        let firstLine = text.split(separator: "\r\n").first.map(String.init) ?? ""
        let reason = firstLine.split(separator: " ", maxSplits: 2).dropFirst(2).first.map { " " + $0.prefix(60) } ?? ""
        let hint: String
        switch status {
        case 401 where proxy.username == nil, 407 where proxy.username == nil:
            hint = " (the proxy wants credentials: give them in the proxy URL, http://user:password@host:port)"
        case 401, 407:
            hint = " (the proxy did not accept the credentials in the proxy URL)"
        case 403:
            hint = " (the proxy does not allow this destination or port; NO_PROXY can name hosts to reach directly)"
        case 502, 503, 504:
            hint = " (the proxy could not reach the room server)"
        default:
            hint = ""
        }
        throw failed("\(step): refused with \(status)\(reason)\(hint)")
    }

    private func handshake(_ tls: TLSClientContext, host: String, what: String) throws(RoomError) {
        // Under `io` although it waits in poll(2): until `open` returns no other thread reads or
        // writes (`cancel` takes no `io`), so no one waits for the lock, and the SSL object never
        // leaves it. Set before the handshake: `closeNow` frees it, after a failed one too.
        try io.withLock { stream throws(RoomError) in
            guard let ssl = SSL_new(tls.context) else { throw .unreachable("\(what): TLS set-up failed") }
            stream.ssl = ssl
            let fd = stream.fd
            SSL_set_fd(ssl, fd)
            TLSClientContext.expect(ssl, server: host)
            while true {
                ERR_clear_error()
                let result = SSL_connect(ssl)
                if result == 1 { return }
                let error = SSL_get_error(ssl, result)
                if error == SSL_ERROR_WANT_READ { try waitFor(fd, Int16(POLLIN), what: what); continue }
                if error == SSL_ERROR_WANT_WRITE { try waitFor(fd, Int16(POLLOUT), what: what); continue }
                let verify = SSL_get_verify_result(ssl)
                if verify != X509_V_OK {
                    throw .unreachable("\(what): TLS: the server's certificate is not trusted for \(host): \(String(cString: X509_verify_cert_error_string(verify)))")
                }
                throw .unreachable("\(what): TLS handshake with \(host) failed: \(Self.openSSLError())")
            }
        }
    }

    static func openSSLError() -> String { OpenSSLErrors.drain() ?? "the connection closed" }

    /// The client context for HTTPS and WSS, its failure as the room's.
    static func tlsContext(caFile: String?) throws(RoomError) -> TLSClientContext {
        do throws(TLSSetupError) { return try TLSClientContext(caFile: caFile) } catch { throw .unreachable("TLS: \(error)") }
    }

    /// Writes all of `bytes` before the deadline (`until`, else the connection's).
    func write(_ bytes: [UInt8], what: String, until: UInt64? = nil) throws(RoomError) {
        var offset = 0
        while offset < bytes.count {
            let (n, sslError, savedErrno, failure, hasSSL, fd) = io.withLock { stream in
                let fd = stream.fd
                let ssl = stream.ssl
                let (n, sslError, savedErrno): (Int, Int32, Int32) = bytes[offset...].withUnsafeBytes { raw in
                    if let ssl {
                        ERR_clear_error()
                        let n = Int(SSL_write(ssl, raw.baseAddress, Int32(raw.count)))
                        return (n, n > 0 ? 0 : SSL_get_error(ssl, Int32(n)), 0)
                    }
                    let n = Glibc.send(fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL))
                    return (n, 0, n < 0 ? errno : 0)
                }
                let failure = n > 0 || sslError == SSL_ERROR_WANT_WRITE || sslError == SSL_ERROR_WANT_READ ? "" : (ssl != nil ? Self.openSSLError() : String(cString: strerror(savedErrno)))
                return (n, sslError, savedErrno, failure, ssl != nil, fd)
            }
            if n > 0 { offset += n; continue }
            if hasSSL {
                if sslError == SSL_ERROR_WANT_WRITE { try waitFor(fd, Int16(POLLOUT), what: what, until: until); continue }
                if sslError == SSL_ERROR_WANT_READ { try waitFor(fd, Int16(POLLIN), what: what, until: until); continue }
                throw .unreachable("\(what): sending failed: \(failure)")
            }
            if savedErrno == EAGAIN || savedErrno == EINTR { try waitFor(fd, Int16(POLLOUT), what: what, until: until); continue }
            throw .unreachable("\(what): sending failed: \(failure)")
        }
    }

    /// Up to `maximum` bytes, waiting for some before the deadline; empty at the end of the stream.
    func read(maximum: Int, what: String) throws(RoomError) -> [UInt8] {
        guard let bytes = try read(maximum: maximum, what: what, until: deadline) else {
            throw .unreachable("\(what): no reply within \(timeoutText)")
        }
        return bytes
    }

    /// Up to `maximum` bytes, waiting for some until `until` (CLOCK_MONOTONIC ns): nil when that
    /// passed first, empty at the end of the stream. A cancel throws.
    func read(maximum: Int, what: String, until: UInt64) throws(RoomError) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: maximum)
        while true {
            let (n, sslError, savedErrno, peek, failure, hasSSL, fd) = io.withLock { stream in
                let fd = stream.fd
                let ssl = stream.ssl
                let (n, sslError, savedErrno, peek): (Int, Int32, Int32, UInt) = buffer.withUnsafeMutableBytes { raw in
                    if let ssl {
                        ERR_clear_error()
                        let n = Int(SSL_read(ssl, raw.baseAddress, Int32(raw.count)))
                        return (n, n > 0 ? 0 : SSL_get_error(ssl, Int32(n)), errno, ERR_peek_error())
                    }
                    let n = Glibc.recv(fd, raw.baseAddress, raw.count, 0)
                    return (n, 0, n < 0 ? errno : 0, 0)
                }
                let hasSSL = ssl != nil
                let failure = hasSSL && n <= 0 && peek != 0 ? Self.openSSLError() : ""
                return (n, sslError, savedErrno, peek, failure, hasSSL, fd)
            }
            if n > 0 { return Array(buffer[0..<n]) }
            let wanted: Int16
            if hasSSL {
                if sslError == SSL_ERROR_ZERO_RETURN { return [] }
                if sslError == SSL_ERROR_WANT_READ { wanted = Int16(POLLIN) } else if sslError == SSL_ERROR_WANT_WRITE { wanted = Int16(POLLOUT) } else {
                    // A server that closes without close_notify ends the stream as plain TCP would.
                    if sslError == SSL_ERROR_SYSCALL || sslError == SSL_ERROR_SSL, peek == 0 { return [] }
                    throw .unreachable("\(what): reading failed: \(failure)")
                }
            } else {
                if n == 0 { return [] }
                guard savedErrno == EAGAIN || savedErrno == EINTR else {
                    throw .unreachable("\(what): reading failed: \(String(cString: strerror(savedErrno)))")
                }
                wanted = Int16(POLLIN)
            }
            switch Self.wait(fd, events: wanted, deadline: until, wake: wake.read) {
            case .ready: continue
            case .timedOut: return nil
            case .cancelled: throw .unreachable("\(what): cancelled (leaving)")
            }
        }
    }
}
