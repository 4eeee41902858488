import FoundationEssentials
import Glibc
import KraklBase

/// One HTTP exchange as the room drivers see it: a request with a
/// time-out, and the status, headers and body that came back. Redirects are
/// never followed here: WHIP has rules for them (which hops, which
/// credentials go along) that a generic client would get wrong, so a 3xx is
/// returned like any other reply and the driver decides.
public struct HTTPRequest: Sendable {
    public var method: String
    public var url: URL
    public var headers: [(name: String, value: String)]
    public var body: Data?
    /// Seconds until the whole exchange is given up.
    public var timeout: Duration

    public init(method: String, url: URL, headers: [(name: String, value: String)] = [], body: Data? = nil, timeout: Duration = .seconds(10)) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
    }
}

public struct HTTPResponse: Sendable {
    public var status: Int
    /// Header fields as received; names compared case-insensitively by `header(_:)`.
    public var headers: [(name: String, value: String)]
    public var body: Data
    /// The URL that was requested (the base for a relative Location).
    public var url: URL

    /// The first value of a header field (case-insensitive name).
    public func header(_ name: String) -> String? {
        headers.first { $0.name.equalsIgnoringCase(name) }?.value
    }

    /// Every value of a header field, in order; a field sent as one comma-joined line is returned as that line.
    public func headerValues(_ name: String) -> [String] {
        headers.filter { $0.name.equalsIgnoringCase(name) }.map(\.value)
    }

    /// The body's first line, shortened: what a server's error page says, for a one-line message.
    public var firstLine: String {
        let text = String(decoding: body.prefix(512), as: UTF8.self)
        let line = text.split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
        let printable = String(line.unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7F }.map(Character.init))
        return printable.count > 120 ? String(printable.prefix(117)) + "..." : printable
    }
}

/// A small blocking HTTP/1.1 client for the room drivers: one connection
/// per request (`Connection: close`), plain or TLS (OpenSSL; the server's
/// certificate checked against the system CA store and its name), every
/// step bounded by the request's time-out. Not URLSession: that drives
/// libcurl through libdispatch sources, and libdispatch's manager thread then
/// stays for the life of the process, so an agent between sessions would
/// never be down to its main thread. `invalidate()` ends running requests at
/// once (a leave must not wait out a long-poll).
///
/// Through an HTTP proxy (`ProxySettings`, by default from the environment as
/// curl reads it): https URLs by a CONNECT tunnel with TLS to the server inside
/// it; http URLs by a request in absolute form to the proxy (RFC 9112 §3.2.2).
public final class HTTPClient: Sendable {
    /// The largest reply body read (signalling is small: an SDP answer, a JSON event batch).
    public static let maximumBody = 4 << 20
    private let caFile: String?
    /// A malformed proxy setting fails each request (and says why), rather than going direct.
    private let proxies: Result<ProxySettings, RoomError>
    private struct State: Sendable {
        var invalidated = false
        /// `cancelRunning` calls so far: a request sent "unless cancelled since" an epoch a caller read
        /// before its own checks fails when a cancel came in between (it found nothing running then).
        var cancels: UInt64 = 0
        var running: [ObjectIdentifier: HTTPConnection] = [:]
        var tls: TLSClientContext?
    }
    private let state = Guarded(State())

    /// - Parameters:
    ///   - caFile: trust only the certificates in this PEM file (tests); nil: the system store.
    ///   - proxies: which proxy requests go through; nil: HTTPS_PROXY, HTTP_PROXY, NO_PROXY (and
    ///     their lower-case forms) of this process's environment.
    public init(caFile: String? = nil, proxies: ProxySettings? = nil) {
        self.caFile = caFile
        if let proxies {
            self.proxies = .success(proxies)
        } else {
            do throws(RoomError) {
                self.proxies = .success(try ProxySettings.from(environment: ProcessInfo.processInfo.environment))
            } catch {
                self.proxies = .failure(error)
            }
        }
    }

    /// Sends `request` and waits for the reply (at most `request.timeout` s in all). Throws
    /// `RoomError.unreachable` when no reply came, `.badReply` when what came is not HTTP.
    public func send(_ request: HTTPRequest, unlessCancelledSince epoch: UInt64? = nil) throws(RoomError) -> HTTPResponse {
        let what = "\(request.method) \(request.url.redactedForLog)"
        guard let scheme = request.url.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = request.url.host, !host.isEmpty else {
            throw .badReply("\(what): not an http(s) URL")
        }
        let secure = scheme == "https"
        let port = request.url.port ?? (secure ? 443 : 80)
        let proxy: HTTPProxy?
        switch proxies {
        case .success(let settings): proxy = settings.proxy(for: request.url)
        case .failure(let error): throw error
        }
        let (closed, made) = state.withLock { ($0.invalidated, $0.tls) }
        if closed { throw .unreachable("\(what): the HTTP client was closed") }
        var context = made
        if secure && context == nil {
            context = try HTTPConnection.tlsContext(caFile: caFile)
            state.withLock { $0.tls = context }
        }
        let bareHost = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        let connection = try HTTPConnection(timeout: request.timeout.inSeconds, what: what)
        let key = ObjectIdentifier(connection)
        let refusal = state.withLock { state -> String? in
            if state.invalidated { return "the HTTP client was closed" }
            if let epoch, epoch != state.cancels { return "cancelled" }
            state.running[key] = connection
            return nil
        }
        if let refusal {
            connection.cancel()
            throw .unreachable("\(what): \(refusal)")
        }
        defer { state.withLock { $0.running[key] = nil } }
        try connection.open(host: bareHost, port: port, tls: secure ? context : nil, what: what, proxy: proxy)

        // Plain http through a proxy: the proxy reads the request itself (absolute form).
        let forwardedBy = secure ? nil : proxy
        try connection.write(Self.requestBytes(request, host: host, port: port, secure: secure, proxy: forwardedBy), what: what)
        var parser = HTTPResponseParser(method: request.method, maximumBody: Self.maximumBody)
        while true {
            let bytes: [UInt8]
            do throws(RoomError) { bytes = try connection.read(maximum: 16_384, what: what) } catch {
                // The proxy or the server behind it is silent: which one cannot be told, both are named.
                if let forwardedBy, case .unreachable(let message) = error, !message.hasSuffix("(leaving)") {
                    throw .unreachable("\(message) (through the \(forwardedBy))")
                }
                throw error
            }
            let done: Bool
            do throws(HTTPResponseParser.Problem) {
                done = try bytes.isEmpty ? parser.finish() : parser.feed(bytes)
            } catch {
                throw .badReply("\(what): \(error.description)")
            }
            if done, let reply = parser.response {
                let response = HTTPResponse(status: reply.status, headers: reply.headers, body: Data(reply.body), url: request.url)
                // 407 is always the proxy's own; any other status may be the server's, and is passed on.
                if let forwardedBy, reply.status == 407 {
                    let hint = forwardedBy.username == nil ? "the proxy wants credentials: give them in the proxy URL, http://user:password@host:port"
                        : "the proxy did not accept the credentials in the proxy URL"
                    throw .proxyFailed(proxy: forwardedBy.description, message: "\(what): refused with 407 Proxy Authentication Required (\(hint))")
                }
                return response
            }
        }
    }

    /// The request as it goes on the wire. Header values with line breaks are dropped (no injection).
    /// With `proxy` (plain http through a proxy): the target in absolute form, and the proxy's credentials.
    static func requestBytes(_ request: HTTPRequest, host: String, port: Int, secure: Bool, proxy: HTTPProxy? = nil) -> [UInt8] {
        var components = URLComponents(url: request.url, resolvingAgainstBaseURL: false)
        components?.fragment = nil
        var target = components?.percentEncodedPath ?? "/"
        if target.isEmpty { target = "/" }
        if let query = components?.percentEncodedQuery { target += "?" + query }
        let defaultPort = port == (secure ? 443 : 80)
        let authority = "\(host)\(defaultPort ? "" : ":\(port)")"
        if proxy != nil { target = (secure ? "https://" : "http://") + authority + target }
        var head = "\(request.method) \(target) HTTP/1.1\r\nHost: \(authority)\r\n"
        head += "Connection: close\r\nUser-Agent: krakl-agent\r\n"
        if let authorization = proxy?.authorization { head += "Proxy-Authorization: \(authorization)\r\n" }
        for (name, value) in request.headers where !name.contains(where: \.isNewline) && !value.contains(where: \.isNewline) {
            head += "\(name): \(value)\r\n"
        }
        if let body = request.body { head += "Content-Length: \(body.count)\r\n" } else if ["POST", "PATCH", "PUT"].contains(request.method) {
            head += "Content-Length: 0\r\n"
        }
        head += "\r\n"
        return Array(head.utf8) + (request.body.map { [UInt8]($0) } ?? [])
    }

    /// Running requests fail at once ("cancelled"), and so do requests sent "unless cancelled
    /// since" an earlier `cancelEpoch`; later ones are sent as usual.
    public func cancelRunning() {
        let connections = state.withLock { state -> [HTTPConnection] in
            state.cancels &+= 1
            return Array(state.running.values)
        }
        for connection in connections { connection.cancel() }
    }

    /// Read before checking whether a request is still wanted; passed to `send(_:unlessCancelledSince:)`
    /// it closes the window between that check and the request's start.
    public var cancelEpoch: UInt64 { state.withLock { $0.cancels } }

    /// Ends the client: running requests fail at once, no new ones are sent.
    public func invalidate() {
        let connections = state.withLock { state -> [HTTPConnection] in
            state.invalidated = true
            return Array(state.running.values)
        }
        for connection in connections { connection.cancel() }
    }

    deinit { invalidate() }
}

/// Reads an HTTP/1.1 response from bytes as they arrive: status line, header
/// fields, and a body framed by Content-Length, chunked transfer coding, or
/// the end of the connection (RFC 9112 §6.3). Interim 1xx responses are
/// skipped. Everything is bounded: header section 64 KB, body `maximumBody`.
struct HTTPResponseParser {
    struct Problem: Error, CustomStringConvertible { let description: String }
    struct Response { var status: Int; var headers: [(name: String, value: String)]; var body: [UInt8] }

    let method: String
    let maximumBody: Int
    private var buffer: [UInt8] = []
    private var head: (status: Int, headers: [(name: String, value: String)])?
    private var body: [UInt8] = []
    private var framing: Framing?
    private(set) var response: Response?

    private enum Framing { case length(Int), chunked, untilClose, none }

    init(method: String, maximumBody: Int) {
        self.method = method
        self.maximumBody = maximumBody
    }

    /// Adds bytes; true once the response is complete.
    mutating func feed(_ bytes: [UInt8]) throws(Problem) -> Bool {
        buffer += bytes
        while head == nil {
            guard let end = Self.find([13, 10, 13, 10], in: buffer) else {
                if buffer.count > 65_536 { throw Problem(description: "the reply's header section is over 64 KB") }
                return false
            }
            let text = String(decoding: buffer[0..<end], as: UTF8.self)
            buffer.removeFirst(end + 4)
            let parsed = try Self.parseHead(text)
            if (100...199).contains(parsed.status) { continue }   // 100 Continue and friends: the real reply follows
            head = parsed
            framing = try framingFor(parsed)
        }
        return try advance(ended: false)
    }

    /// The connection ended; true when that completes the response.
    mutating func finish() throws(Problem) -> Bool {
        guard head != nil else {
            throw Problem(description: buffer.isEmpty ? "the server closed the connection without replying" : "the reply ended inside its header section")
        }
        return try advance(ended: true)
    }

    private func framingFor(_ head: (status: Int, headers: [(name: String, value: String)])) throws(Problem) -> Framing {
        if method == "HEAD" || head.status == 204 || head.status == 304 { return .none }
        func field(_ name: String) -> String? { head.headers.last { $0.name.equalsIgnoringCase(name) }?.value }
        if let coding = field("Transfer-Encoding") {
            guard coding.lowercased().split(separator: ",").last?.trimmingSpaces() == "chunked" else {
                throw Problem(description: "unsupported Transfer-Encoding \(coding.prefix(40))")
            }
            return .chunked
        }
        if let length = field("Content-Length") {
            guard let n = Int(length.trimmingSpaces()), n >= 0 else {
                throw Problem(description: "bad Content-Length \(length.prefix(20))")
            }
            guard n <= maximumBody else { throw Problem(description: "the reply body is \(n) bytes, more than the \(maximumBody) read") }
            return .length(n)
        }
        return .untilClose
    }

    private mutating func advance(ended: Bool) throws(Problem) -> Bool {
        guard let head, let framing else { return false }
        switch framing {
        case .none:
            break
        case .length(let n):
            body += buffer
            buffer.removeAll()
            if body.count > n { body.removeLast(body.count - n) }
            if body.count < n {
                if ended { throw Problem(description: "the reply ended after \(body.count) of its \(n) body bytes") }
                return false
            }
        case .untilClose:
            body += buffer
            buffer.removeAll()
            if body.count > maximumBody { throw Problem(description: "the reply body is over \(maximumBody) bytes") }
            if !ended { return false }
        case .chunked:
            chunks: while true {
                guard let lineEnd = Self.find([13, 10], in: buffer) else {
                    if buffer.count > 1024 { throw Problem(description: "a bad chunk size line") }
                    if ended { throw Problem(description: "the reply ended inside its chunked body") }
                    return false
                }
                let sizeText = String(decoding: buffer[0..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                guard let size = Int(sizeText.trimmingSpaces(), radix: 16), size >= 0 else {
                    throw Problem(description: "a bad chunk size \(sizeText.prefix(20))")
                }
                guard body.count + size <= maximumBody else { throw Problem(description: "the reply body is over \(maximumBody) bytes") }
                if size == 0 {
                    // The last chunk; trailer fields (ignored) end with an empty line.
                    let rest = Array(buffer[(lineEnd + 2)...])
                    if rest.starts(with: [13, 10]) || Self.find([13, 10, 13, 10], in: rest) != nil || ended { break chunks }
                    return false
                }
                guard buffer.count >= lineEnd + 2 + size + 2 else {
                    if ended { throw Problem(description: "the reply ended inside a chunk") }
                    return false
                }
                body += buffer[(lineEnd + 2)..<(lineEnd + 2 + size)]
                buffer.removeFirst(lineEnd + 2 + size + 2)
            }
        }
        response = Response(status: head.status, headers: head.headers, body: body)
        return true
    }

    static func parseHead(_ text: String) throws(Problem) -> (status: Int, headers: [(name: String, value: String)]) {
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), parts[1].count == 3, let status = Int(parts[1]), (100...599).contains(status) else {
            throw Problem(description: "not an HTTP reply: \(statusLine.prefix(60).filter { $0.isASCII && !$0.isNewline })")
        }
        var headers: [(name: String, value: String)] = []
        for line in lines where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":"), colon != line.startIndex else {
                throw Problem(description: "a malformed header line in the reply")
            }
            let name = String(line[..<colon])
            guard !name.contains(where: { $0 == " " || $0 == "\t" }) else { throw Problem(description: "a malformed header name in the reply") }
            headers.append((name: name, value: line[line.index(after: colon)...].trimmingSpaces()))
        }
        return (status, headers)
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 0...(haystack.count - needle.count) where haystack[i] == needle[0] {
            if Array(haystack[i..<(i + needle.count)]) == needle { return i }
        }
        return nil
    }
}

extension URL {
    /// The URL without query and fragment (which may carry a token), for messages and logs.
    public var redactedForLog: String {
        guard var parts = URLComponents(url: self, resolvingAgainstBaseURL: false) else { return "(a URL)" }
        let hadMore = parts.query != nil || parts.fragment != nil
        parts.query = nil
        parts.fragment = nil
        parts.user = nil
        parts.password = nil
        return (parts.string ?? "(a URL)") + (hadMore ? "?…" : "")
    }
}
