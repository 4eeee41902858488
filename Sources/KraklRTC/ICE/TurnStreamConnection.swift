import KraklBase
import Glibc

/// A TCP connection to a TURN server (RFC 8656 §3.1), plain or with TLS on it (`turns:`), on the
/// event loop's thread: connected without blocking, messages written whole (queued while
/// connecting, during the TLS handshake or while the send buffer is full, up to a bound) and read
/// back as whole STUN messages or ChannelData (`TurnStreamFramer`).
final class TurnStreamConnection {
    /// Bytes queued beyond this are dropped whole (ICE and TURN retransmit; media is lossy anyway).
    static let maximumQueued = 1 << 20

    let server: TransportAddress
    let fd: Int32
    private(set) var isConnected = false
    private(set) var isClosed = false
    /// Why the connection ended, once it did (a phrase about "the connection"; the server is named by the caller).
    private(set) var failure: String?
    /// The failure was the TLS server's certificate (not trusted, or not for its name).
    private(set) var certificateUntrusted = false
    private var queued: [UInt8] = []
    private var queuedStart = 0
    private var framer = TurnStreamFramer()
    private var readBuffer = [UInt8](repeating: 0, count: 65_536)
    /// Called once, just before the socket is closed (to stop watching it while the fd is still ours).
    var onClose: (() -> Void)?
    /// For `turns:`: the context and the name the certificate must be for; TLS starts once TCP is connected.
    private let tlsSetUp: (context: TLSClientContext, name: String)?
    private var tls: TurnTlsSession?
    /// Messages written before the TLS handshake finished (sealed once it has).
    private var waitingForHandshake: [UInt8] = []

    /// Starts connecting; `connected` or `failed` follow through the loop's writable watch.
    /// With `tls`, a TLS client handshake follows, checking the server's certificate for `name`.
    init(server: TransportAddress, tls: (context: TLSClientContext, name: String)? = nil) throws(NetworkError) {
        self.server = server
        self.tlsSetUp = tls
        let family = server.ip.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw NetworkError.socket("socket(TCP): \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        // Small STUN and media messages must not wait for Nagle.
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var storage = UdpSocket.sockaddr(server)
        let result = withUnsafePointer(to: &storage.address) {
            $0.withMemoryRebound(to: Glibc.sockaddr.self, capacity: 1) { connect(fd, $0, storage.length) }
        }
        guard result == 0 || errno == EINPROGRESS else {
            let text = String(cString: strerror(errno))
            Glibc.close(fd)
            throw NetworkError.socket("the connection failed: \(text)")
        }
        self.fd = fd
        isConnected = result == 0
        if isConnected { startTls() }
    }

    deinit { close() }

    /// After the writable watch fired while connecting: true when connected, else the connection failed.
    func finishConnecting() -> Bool {
        guard !isClosed else { return false }
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        _ = getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
        guard error == 0 else {
            fail("the connection failed: \(String(cString: strerror(error)))")
            return false
        }
        isConnected = true
        startTls()
        return !isClosed
    }

    /// TCP is up: the ClientHello goes out (queued; the caller flushes).
    private func startTls() {
        guard let tlsSetUp, tls == nil else { return }
        do {
            tls = try TurnTlsSession(context: tlsSetUp.context, name: tlsSetUp.name)
        } catch {
            fail("\(error)")
            return
        }
        advanceHandshake()
    }

    /// Moves the handshake on with what arrived; once done, seals what waited for it.
    private func advanceHandshake() {
        guard let tls, !tls.handshakeDone else { return }
        if let failure = tls.handshake() {
            certificateUntrusted = failure.untrustedCertificate
            fail(failure.reason)
            return
        }
        queue(tls.takeOutgoing())
        if tls.handshakeDone, !waitingForHandshake.isEmpty {
            let plain = waitingForHandshake
            waitingForHandshake = []
            seal(plain)
        }
    }

    private func seal(_ plain: [UInt8]) {
        guard let tls else { return }
        guard tls.seal(plain) else { fail("TLS sealing failed"); return }
        queue(tls.takeOutgoing())
    }

    /// Appends bytes for the socket (no bound: callers checked it).
    private func queue(_ bytes: [UInt8]) {
        if !bytes.isEmpty { queued += bytes }
    }

    /// Queues one whole message and writes what it can; false when dropped (closed or queue full).
    @discardableResult
    func write(_ message: [UInt8]) -> Bool {
        guard !isClosed, queued.count - queuedStart + waitingForHandshake.count + message.count <= Self.maximumQueued else { return false }
        if tlsSetUp != nil {
            if let tls, tls.handshakeDone { seal(message) } else { waitingForHandshake += message }
        } else {
            queued += message
        }
        flush()
        return !isClosed
    }

    /// True when bytes are waiting for the socket to become writable.
    var hasQueued: Bool { queuedStart < queued.count }

    /// Writes queued bytes until done or the socket would block.
    func flush() {
        guard isConnected, !isClosed else { return }
        while queuedStart < queued.count {
            let sent = queued[queuedStart...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
            if sent > 0 { queuedStart += sent; continue }
            if sent < 0, errno == EINTR { continue }
            if sent < 0, errno == EAGAIN || errno == EWOULDBLOCK { break }
            fail("the connection broke while sending: \(String(cString: strerror(errno)))")
            return
        }
        if queuedStart == queued.count {
            queued.removeAll(keepingCapacity: true)
            queuedStart = 0
        } else if queuedStart >= 65_536 {
            queued.removeFirst(queuedStart)
            queuedStart = 0
        }
    }

    /// Reads what is there (bounded) and returns the whole messages; a closed or broken stream
    /// ends the connection (`failure` says why).
    func readMessages() -> [[UInt8]] {
        var messages: [[UInt8]] = []
        for _ in 0..<64 where !isClosed {
            let count = readBuffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count < 0, errno == EINTR { continue }
            if count < 0, errno == EAGAIN || errno == EWOULDBLOCK { break }
            guard count > 0 else {
                fail(count == 0 ? "the server closed the connection"
                                : "the connection \(isConnected ? "broke" : "failed"): \(String(cString: strerror(errno)))")
                break
            }
            if let tls {
                tls.feed(readBuffer[0..<count])
                advanceHandshake()
                guard !isClosed, tls.handshakeDone else { continue }
                let (plain, closed, failure) = tls.open(into: &plainBuffer)
                queue(tls.takeOutgoing())
                frame(plain[...], into: &messages)
                if let failure { fail(failure) } else if closed { fail("the server closed the TLS session") }
            } else {
                frame(readBuffer[0..<count], into: &messages)
            }
        }
        flush()
        return messages
    }

    private var plainBuffer = [UInt8](repeating: 0, count: 16_384)

    private func frame(_ bytes: ArraySlice<UInt8>, into messages: inout [[UInt8]]) {
        guard !bytes.isEmpty, !isClosed else { return }
        do throws(TurnStreamFramer.Failure) {
            messages += try framer.feed(bytes)
        } catch {
            fail("\(error)")
        }
    }

    private func fail(_ reason: String) {
        if failure == nil { failure = reason }
        tls = nil  // no close_notify on a broken session
        close()
    }

    func close() {
        guard !isClosed else { return }
        if let tls, isConnected {
            // close_notify, sent if the socket takes it now; nothing waits for it.
            self.tls = nil
            tls.shutDown()
            queue(tls.takeOutgoing())
            flush()
            guard !isClosed else { return }  // the send failed, and closed
        }
        isClosed = true
        onClose?()
        onClose = nil
        // Unread bytes at close() make the kernel reset the connection (RFC 1122 §4.2.2.13), which
        // the server logs as an error: read what already arrived first.
        for _ in 0..<16 {
            guard readBuffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }) > 0 else { break }
        }
        Glibc.close(fd)
    }
}
