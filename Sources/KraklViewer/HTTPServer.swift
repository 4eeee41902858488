import FoundationEssentials
import Glibc
import KraklBase

/// The server's bounds. Every connection is closed after one response, so
/// a connection's whole life is bounded by the two time-outs.
public struct HTTPLimits: Sendable {
    /// Request line and header fields together.
    public var maximumHeadBytes = 16 * 1024
    /// A body (an SDP offer is a few KB).
    public var maximumBodyBytes = 256 * 1024
    /// From accept to the last byte of the request: a client that sends slowly (slowloris) is cut off.
    public var requestTimeout: Duration = .seconds(10)
    /// From the request to the last byte of the response written: a client that never reads is cut off.
    public var responseTimeout: Duration = .seconds(10)
    /// Open connections at once; more are answered 503 and closed at once.
    public var maximumConnections = 32

    public init() {}
}

public enum ViewerServerError: Error, Equatable, CustomStringConvertible {
    /// The listening socket cannot be made: the port is taken, the address is not this machine's, no permission.
    case bindFailed(address: String, reason: String)

    public var description: String {
        switch self {
        case .bindFailed(let address, let reason):
            return "the viewer cannot listen on \(address): \(reason) (choose another with --listen ADDR:PORT or --viewer-port N)"
        }
    }
}

/// A small HTTP/1.1 server on one thread of its own: poll(2) over the
/// listening socket and every connection, non-blocking I/O, one request
/// and one response per connection (`Connection: close`). The handler runs
/// on that thread, so it must not block for long. Bounded everywhere: head
/// and body sizes, time to send a request, time to take the response, open
/// connections. The connections are the serving thread's own (locals of `serve`).
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (HTTPRequest) -> HTTPResponse

    /// The address actually bound (its port is the chosen one when 0 was asked for).
    public let address: ListenAddress
    public let limits: HTTPLimits
    private let handler: Handler
    private let listener: Int32
    private let wake: (read: Int32, write: Int32)
    private struct Serving {
        var stopping = false
        /// From `start` until the serving thread ended: `stop` waits for it.
        var running = false
    }
    private let serving = Guarded(Serving())

    private final class Connection {
        let fd: Int32
        var input: [UInt8] = []
        var parser: HTTPRequestParser
        var output: [UInt8] = []
        var written = 0
        var deadline: UInt64
        enum Phase { case reading, writing, draining }
        var phase = Phase.reading
        var closed = false

        init(fd: Int32, parser: HTTPRequestParser, deadline: UInt64) {
            self.fd = fd
            self.parser = parser
            self.deadline = deadline
        }
    }

    /// Binds and listens now (so a taken port is an error here, before anything else starts).
    public init(address: ListenAddress, limits: HTTPLimits = HTTPLimits(), handler: @escaping Handler) throws(ViewerServerError) {
        self.limits = limits
        self.handler = handler
        guard let bytes = ListenAddress.parse(address.host) else {
            throw .bindFailed(address: address.description, reason: "not an IP address")
        }
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw .bindFailed(address: address.description, reason: String(cString: strerror(errno))) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if family == AF_INET6 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size)) }
        var bound: Int32
        if family == AF_INET {
            var sa = sockaddr_in()
            sa.sin_family = sa_family_t(AF_INET)
            sa.sin_port = address.port.bigEndian
            withUnsafeMutableBytes(of: &sa.sin_addr) { $0.copyBytes(from: bytes) }
            bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        } else {
            var sa = sockaddr_in6()
            sa.sin6_family = sa_family_t(AF_INET6)
            sa.sin6_port = address.port.bigEndian
            withUnsafeMutableBytes(of: &sa.sin6_addr) { $0.copyBytes(from: bytes) }
            bound = withUnsafePointer(to: &sa) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) } }
        }
        if bound != 0 || listen(fd, 64) != 0 {
            let reason = errno == EADDRINUSE ? "the port is in use" : errno == EADDRNOTAVAIL ? "that address is not one of this machine's" : String(cString: strerror(errno))
            close(fd)
            throw .bindFailed(address: address.description, reason: reason)
        }
        var actual = address
        if address.port == 0 {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            let port = withUnsafePointer(to: &storage) { pointer -> UInt16 in
                family == AF_INET ? pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_port }
                                  : pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_port }
            }
            actual.port = UInt16(bigEndian: port)
        }
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else {
            close(fd)
            throw .bindFailed(address: address.description, reason: "pipe: \(String(cString: strerror(errno)))")
        }
        for end in ends { Self.makeNonBlocking(end) }
        listener = fd
        wake = (ends[0], ends[1])
        self.address = actual
    }

    deinit {
        close(listener)
        close(wake.read)
        close(wake.write)
    }

    /// Starts serving on the server's own thread.
    public func start() {
        serving.withLock { $0.running = true }
        startThread(name: "krakl-viewer-http") { [self] in
            serve()
            serving.change { $0.running = false }
        }
    }

    /// Any thread but the server's: stops accepting, closes every connection, and waits for the thread to end.
    public func stop() {
        serving.withLock { $0.stopping = true }
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
        serving.wait(until: Date().addingTimeInterval(5), for: { !$0.running }) { _, _ in }
    }

    private var isStopping: Bool { serving.withLock { $0.stopping } }

    private func serve() {
        var connections: [Connection] = []
        defer { for connection in connections { close(connection.fd) } }
        while !isStopping {
            var fds = [pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0), pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            for connection in connections {
                fds.append(pollfd(fd: connection.fd, events: Int16(connection.phase == .writing ? POLLOUT : POLLIN), revents: 0))
            }
            let now = MonotonicClock.nanoseconds()
            let nearest = connections.map(\.deadline).min().map { $0 > now ? $0 - now : 0 }
            let timeout = nearest.map { Int32(min($0 / 1_000_000 + 1, 1000)) } ?? 1000
            let ready = poll(&fds, nfds_t(fds.count), timeout)
            if ready < 0 && errno != EINTR { break }
            if fds[0].revents != 0 { break }
            let after = MonotonicClock.nanoseconds()
            var keep: [Connection] = []
            for (index, connection) in connections.enumerated() {
                let events = fds[index + 2].revents
                if events != 0 { service(connection, events: events) }
                if connection.closed || after >= connection.deadline {
                    close(connection.fd)
                    continue
                }
                keep.append(connection)
            }
            connections = keep
            if fds[1].revents & Int16(POLLIN) != 0 { accept(into: &connections) }
        }
    }

    private static func makeNonBlocking(_ fd: Int32) {
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    }

    /// Marks a connection done; the loop closes it.
    private func done(_ connection: Connection) { connection.closed = true }

    private func accept(into connections: inout [Connection]) {
        // A bounded number per turn, so a flood of connects cannot starve the open ones.
        for _ in 0..<64 {
            // Glibc's module has no accept4 (a GNU extension): the flags are set after accept.
            let fd = Glibc.accept(listener, nil, nil)
            if fd < 0 { return }
            Self.makeNonBlocking(fd)
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if connections.count >= limits.maximumConnections {
                // Best effort, never waiting: the socket's buffer takes this much.
                let busy = HTTPResponse.text(503, "too many connections; try again shortly", headers: [("Retry-After", "2")]).serialized()
                _ = busy.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                close(fd)
                continue
            }
            let parser = HTTPRequestParser(maximumHeadBytes: limits.maximumHeadBytes, maximumBodyBytes: limits.maximumBodyBytes)
            connections.append(Connection(fd: fd, parser: parser, deadline: MonotonicClock.nanoseconds() + limits.requestTimeout.inNanoseconds))
        }
    }

    private func service(_ connection: Connection, events: Int16) {
        switch connection.phase {
        case .reading:
            var chunk = [UInt8](repeating: 0, count: 16 * 1024)
            let count = chunk.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, 0) }
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            if count <= 0 { done(connection); return }
            connection.input.append(contentsOf: chunk[0..<count])
            switch connection.parser.parse(connection.input) {
            case .incomplete:
                return
            case .refused(let status, let reason):
                respond(connection, HTTPResponse.text(status, reason), includeBody: true)
            case .request(let request):
                let response = handler(request)
                respond(connection, response, includeBody: request.method != "HEAD")
            }
        case .writing:
            let count = connection.output[connection.written...].withUnsafeBytes { send(connection.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            if count <= 0 { done(connection); return }
            connection.written += count
            if connection.written == connection.output.count { startDraining(connection) }
        case .draining:
            // What the client still sends after our answer (the rest of a refused body) is read
            // and dropped until it closes, so the answer is not lost to a reset.
            var chunk = [UInt8](repeating: 0, count: 16 * 1024)
            let count = chunk.withUnsafeMutableBytes { recv(connection.fd, $0.baseAddress, $0.count, 0) }
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            if count <= 0 { done(connection) }
        }
    }

    private func respond(_ connection: Connection, _ response: HTTPResponse, includeBody: Bool) {
        connection.output = response.serialized(includeBody: includeBody)
        connection.input = []
        connection.written = 0
        connection.phase = .writing
        connection.deadline = MonotonicClock.nanoseconds() + limits.responseTimeout.inNanoseconds
    }

    private func startDraining(_ connection: Connection) {
        shutdown(connection.fd, Int32(SHUT_WR))
        connection.phase = .draining
        connection.output = []
        connection.deadline = min(connection.deadline, MonotonicClock.nanoseconds() + 1_000_000_000)
    }
}
