import COpenSSL
import FoundationEssentials
import Glibc
import KraklBase

/// A WebSocket client connection (RFC 6455) on the room drivers' own HTTP/TLS connection: `ws://`
/// and `wss://` (the certificate checked against the system CA store and the host name), through an
/// HTTP proxy by CONNECT when `https_proxy`/`http_proxy` say so (NO_PROXY honoured), every step
/// bounded in time.
///
/// Threads: one thread reads (`receive`), any thread sends (`send`, `close`); `invalidate()` from
/// any thread ends a waiting read or write at once. Pings from the server are answered inside
/// `receive`; when nothing has arrived for `Options.pingAfterIdle`, `receive` sends a ping of its
/// own, and a server that then stays silent as long again ends the connection (1006).
/// Frames leave under `sendLock`, the connection's state is under `state`; one reader thread reads.
public final class WebSocket: Sendable {
    public struct Options: Sendable {
        /// TCP connect, proxy CONNECT, TLS and the upgrade, in all.
        public var handshakeTimeout: Duration = .seconds(10)
        /// One message, all its fragments (RFC 6455 leaves the cap to the endpoint).
        public var maximumMessage = 1 << 20
        /// The server's whole upgrade reply head.
        public var maximumHandshakeHead = 16_384
        /// Silence before we ping (nil: never).
        public var pingAfterIdle: Duration? = .seconds(20)
        /// A send that cannot finish within this (a peer that stopped reading) fails the connection.
        public var sendTimeout: Duration = .seconds(10)
        /// Trust only this PEM file (tests); nil: the system store.
        public var caFile: String?
        /// nil: the process's environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY as curl reads them).
        public var proxies: ProxySettings?

        public init() {}
    }

    /// What `receive` gives.
    public enum Received: Equatable, Sendable {
        case text(String)
        case binary([UInt8])
        /// Nothing before the deadline; the connection is still open.
        case timedOut
        /// The connection is over: the close code (1000 normal, 1001 going away, 1006 abnormal: no
        /// close frame, 1009 too big, 1002/1007 protocol, 3000-4999 the application's), its reason,
        /// and whether the server closed first.
        case closed(code: UInt16, reason: String, byServer: Bool)
    }

    public let url: URL
    private let options: Options
    private let connection: HTTPConnection
    private let sendLock = Lock()
    private struct State: Sendable {
        var closeSent = false
        var ended: Received?
    }
    private let state = Guarded(State())
    /// What `receive` keeps between calls. Only the reading thread touches it, so its lock is never
    /// contended; it is there so that the compiler can check the sharing.
    private struct Reader: Sendable {
        var parser: WebSocketMessageParser
        var lastReceived: UInt64
        var pingSentAt: UInt64?
    }
    private let reader: Guarded<Reader>

    private init(url: URL, options: Options, connection: HTTPConnection, leftover: [UInt8]) {
        self.url = url
        self.options = options
        self.connection = connection
        var parser = WebSocketMessageParser(maximumMessage: options.maximumMessage)
        parser.feed(leftover)
        reader = Guarded(Reader(parser: parser, lastReceived: MonotonicClock.nanoseconds()))
    }

    /// The GUID of RFC 6455 §1.3, appended to the key for `Sec-WebSocket-Accept`.
    static let acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// `Sec-WebSocket-Accept` for a key: base64(SHA-1(key + GUID)). Wraps `EVP_Digest`.
    public static func acceptValue(forKey key: String) -> String {
        let input = Array((key + acceptGUID).utf8)
        var digest = [UInt8](repeating: 0, count: 20)
        var length: UInt32 = 0
        _ = input.withUnsafeBytes { raw in EVP_Digest(raw.baseAddress, raw.count, &digest, &length, EVP_sha1(), nil) }
        return Data(digest).base64EncodedString()
    }

    /// A cancellable connect: `cancel()` from another thread ends it at once (a leave while joining).
    public final class Attempt: Sendable {
        private struct State {
            var connection: HTTPConnection?
            var cancelled = false
        }
        private let state = Guarded(State())
        public init() {}
        func attach(_ connection: HTTPConnection) -> Bool {
            state.withLock { state -> Bool in
                state.connection = connection
                return !state.cancelled
            }
        }
        public func cancel() {
            let connection = state.withLock { state -> HTTPConnection? in
                state.cancelled = true
                return state.connection
            }
            connection?.cancel()
        }
    }

    /// Opens the connection and completes the opening handshake (§4.1): a fresh random
    /// `Sec-WebSocket-Key`, and the server's 101 with the matching `Sec-WebSocket-Accept`, no
    /// extension and no subprotocol (none were asked for).
    public static func connect(to url: URL, options: Options = Options(), headers: [(name: String, value: String)] = [],
                               attempt: Attempt? = nil) throws(RoomError) -> WebSocket {
        let what = "WebSocket \(url.redactedForLog)"
        guard let scheme = url.scheme?.lowercased(), scheme == "ws" || scheme == "wss", let host = url.host, !host.isEmpty else {
            throw .badReply("\(what): not a ws:// or wss:// URL")
        }
        let secure = scheme == "wss"
        let port = url.port ?? (secure ? 443 : 80)
        let bareHost = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        // Proxy rules as for the HTTP the other drivers use: wss is https, ws is http.
        var httpForm = URLComponents(url: url, resolvingAgainstBaseURL: false)!
        httpForm.scheme = secure ? "https" : "http"
        let proxies: ProxySettings
        if let given = options.proxies { proxies = given } else { proxies = try ProxySettings.from(environment: ProcessInfo.processInfo.environment) }
        let proxy = httpForm.url.flatMap { proxies.proxy(for: $0) }
        let tls = secure ? try HTTPConnection.tlsContext(caFile: options.caFile) : nil

        let connection = try HTTPConnection(timeout: options.handshakeTimeout.inSeconds, what: what)
        if let attempt, !attempt.attach(connection) { throw .unreachable("\(what): cancelled (leaving)") }
        try connection.open(host: bareHost, port: port, tls: tls, what: what, proxy: proxy, tunnel: true)

        var keyBytes = [UInt8](repeating: 0, count: 16)
        var generator = SystemRandomNumberGenerator()
        for index in keyBytes.indices { keyBytes[index] = generator.next() }
        let key = Data(keyBytes).base64EncodedString()
        var target = url.path.isEmpty ? "/" : url.path
        if let query = url.query { target += "?" + query }
        let defaultPort = port == (secure ? 443 : 80)
        let hostField = (host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host) + (defaultPort ? "" : ":\(port)")
        var head = "GET \(target) HTTP/1.1\r\nHost: \(hostField)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\nUser-Agent: krakl-agent\r\n"
        for header in headers { head += "\(header.name): \(header.value)\r\n" }
        head += "\r\n"
        try connection.write(Array(head.utf8), what: what)

        var reply: [UInt8] = []
        var headEnd: Int?
        while headEnd == nil {
            let bytes = try connection.read(maximum: 4096, what: what)
            guard !bytes.isEmpty else {
                throw .badReply("\(what): the server closed the connection " + (reply.isEmpty ? "without answering the upgrade" : "inside its reply"))
            }
            let searchFrom = max(0, reply.count - 3)
            reply += bytes
            if let found = HTTPResponseParser.find([13, 10, 13, 10], in: Array(reply[searchFrom...])) { headEnd = searchFrom + found }
            if headEnd == nil, reply.count > options.maximumHandshakeHead {
                throw .badReply("\(what): the upgrade reply's head is over \(options.maximumHandshakeHead / 1024) KB")
            }
        }
        guard headEnd! <= options.maximumHandshakeHead else {
            throw .badReply("\(what): the upgrade reply's head is over \(options.maximumHandshakeHead / 1024) KB")
        }
        let parsed: (status: Int, headers: [(name: String, value: String)])
        do throws(HTTPResponseParser.Problem) {
            parsed = try HTTPResponseParser.parseHead(String(decoding: reply[..<headEnd!], as: UTF8.self))
        } catch {
            throw .badReply("\(what): \(error.description)")
        }
        func field(_ name: String) -> String? { parsed.headers.first { $0.name.equalsIgnoringCase(name) }?.value }
        guard parsed.status == 101 else {
            let message = "the upgrade was answered with \(parsed.status) instead of 101 Switching Protocols"
            switch parsed.status {
            case 401, 403: throw .unauthorized(status: parsed.status, message: message)
            case 404, 410: throw .noSuchRoom(status: parsed.status, message: message)
            case 500...599: throw .serverError(status: parsed.status, message: message)
            default: throw .refused(status: parsed.status, message: message)
            }
        }
        guard field("Upgrade")?.lowercased() == "websocket",
              field("Connection")?.lowercased().split(separator: ",").contains(where: { $0.trimmingSpaces() == "upgrade" }) == true else {
            throw .badReply("\(what): the 101 reply lacks Upgrade: websocket / Connection: Upgrade")
        }
        guard field("Sec-WebSocket-Accept") == acceptValue(forKey: key) else {
            throw .badReply("\(what): the server's Sec-WebSocket-Accept does not match our key (not a WebSocket server, or a proxy in the way)")
        }
        guard field("Sec-WebSocket-Extensions") == nil, field("Sec-WebSocket-Protocol") == nil else {
            throw .badReply("\(what): the server chose an extension or subprotocol that was not offered")
        }
        return WebSocket(url: url, options: options, connection: connection, leftover: Array(reply[(headEnd! + 4)...]))
    }

    // MARK: - Sending (any thread)

    /// Sends one text message. Throws `.unreachable` when the connection is closed or broken.
    public func send(text: String) throws(RoomError) {
        try send(.text, Array(text.utf8))
    }

    public func send(binary: [UInt8]) throws(RoomError) {
        try send(.binary, binary)
    }

    private func send(_ opcode: WebSocketOpcode, _ payload: [UInt8]) throws(RoomError) {
        if opcode == .text || opcode == .binary, state.withLock({ $0.closeSent || $0.ended != nil }) {
            throw .unreachable("WebSocket \(url.redactedForLog): the connection is closed")
        }
        var generator = SystemRandomNumberGenerator()
        let mask: [UInt8] = (0..<4).map { _ in generator.next() }
        let frame = WebSocketFrameEncoder.frame(opcode, payload: payload, mask: mask)
        let deadline = MonotonicClock.nanoseconds() + options.sendTimeout.inNanoseconds
        sendLock.lock()
        defer { sendLock.unlock() }
        try connection.write(frame, what: "WebSocket \(url.redactedForLog)", until: deadline)
    }

    /// Starts the closing handshake (§7.1.2): sends our close frame once. The server's close then
    /// comes to `receive` as `.closed`; a caller with no reader can wait for it with `awaitClose`.
    public func close(code: UInt16 = 1000, reason: String = "") {
        let first = state.withLock { state -> Bool in
            defer { state.closeSent = true }
            return !state.closeSent
        }
        guard first else { return }
        try? send(.close, WebSocketFrameEncoder.closePayload(code: WebSocketFrameEncoder.isSendableCloseCode(code) ? code : 1000, reason: reason))
    }

    /// After `close`, reads until the server's close frame or the end of the stream, at most
    /// `limit`; then the connection is invalidated. For callers that have no reader thread.
    public func awaitClose(within limit: Duration) {
        let deadline = MonotonicClock.nanoseconds() + limit.inNanoseconds
        while true {
            if case .closed = receive(until: deadline) { break }
            if MonotonicClock.nanoseconds() >= deadline { break }
        }
        invalidate()
    }

    /// Ends every wait of this connection now and for good (any thread).
    public func invalidate() {
        state.withLock { state in
            if state.ended == nil { state.ended = .closed(code: 1006, reason: "closed locally", byServer: false) }
        }
        connection.cancel()
    }

    // MARK: - Receiving (one thread)

    /// The next message, or `.timedOut` at `deadline` (CLOCK_MONOTONIC ns), or `.closed` once the
    /// connection is over (then every later call says the same).
    public func receive(until deadline: UInt64) -> Received {
        let what = "WebSocket \(url.redactedForLog)"
        while true {
            if let ended = state.withLock({ $0.ended }) { return ended }
            let inbound: WebSocketInbound?
            do throws(WebSocketProtocolError) {
                inbound = try reader.withLock { reader throws(WebSocketProtocolError) in try reader.parser.next() }
            } catch {
                return end(.closed(code: error.closeCode, reason: error.description, byServer: false), sendCode: error.closeCode)
            }
            if let inbound {
                reader.withLock { reader in
                    reader.lastReceived = MonotonicClock.nanoseconds()
                    reader.pingSentAt = nil
                }
                switch inbound {
                case .text(let text): return .text(text)
                case .binary(let bytes): return .binary(bytes)
                case .ping(let payload):
                    try? send(.pong, payload)
                    continue
                case .pong:
                    continue
                case .close(let code, let reason):
                    // Echo the code (§5.5.1); an empty close is answered with 1000.
                    return end(.closed(code: code ?? 1005, reason: reason, byServer: !state.withLock { $0.closeSent }), sendCode: code ?? 1000)
                }
            }
            // Our own ping when the line has been quiet; a second quiet span after it ends the connection.
            var wakeAt = deadline
            if let idle = options.pingAfterIdle {
                let span = idle.inNanoseconds
                let now = MonotonicClock.nanoseconds()
                let (lastReceived, pingSentAt) = reader.withLock { ($0.lastReceived, $0.pingSentAt) }
                if let sent = pingSentAt {
                    if now >= sent + span {
                        return end(.closed(code: 1006, reason: "no answer to our ping within \(Int(idle.inSeconds)) s", byServer: false), sendCode: nil)
                    }
                    wakeAt = min(wakeAt, sent + span)
                } else if now >= lastReceived + span {
                    try? send(.ping, Array("krakl".utf8))
                    reader.withLock { $0.pingSentAt = now }
                    wakeAt = min(wakeAt, now + span)
                } else {
                    wakeAt = min(wakeAt, lastReceived + span)
                }
            }
            let bytes: [UInt8]?
            do throws(RoomError) { bytes = try connection.read(maximum: 16_384, what: what, until: wakeAt) } catch {
                if let ended = state.withLock({ $0.ended }) { return ended }
                return end(.closed(code: 1006, reason: "\(error)", byServer: false), sendCode: nil)
            }
            guard let bytes else {
                if MonotonicClock.nanoseconds() >= deadline { return .timedOut }
                continue
            }
            if bytes.isEmpty {
                let reason = reader.withLock { $0.parser.pendingBytes } > 0 ? "the server closed the connection inside a message" : "the server closed the connection without a close frame"
                return end(.closed(code: 1006, reason: reason, byServer: true), sendCode: nil)
            }
            reader.withLock { $0.parser.feed(bytes) }
        }
    }

    private func end(_ result: Received, sendCode: UInt16?) -> Received {
        if let sendCode {
            let reason: String
            if case .closed(_, let words, false) = result { reason = String(words.prefix(100)) } else { reason = "" }
            close(code: sendCode, reason: reason)
        }
        return state.withLock { state -> Received in
            if state.ended == nil { state.ended = result }
            return state.ended!
        }
    }
}
