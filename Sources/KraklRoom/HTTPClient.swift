import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

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
    public var timeout: Double

    public init(method: String, url: URL, headers: [(name: String, value: String)] = [], body: Data? = nil, timeout: Double = 10) {
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
        headers.first { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
    }

    /// Every value of a header field, in order; a field sent as one comma-joined line is returned as that line.
    public func headerValues(_ name: String) -> [String] {
        headers.filter { $0.name.caseInsensitiveCompare(name) == .orderedSame }.map(\.value)
    }

    /// The body's first line, shortened: what a server's error page says, for a one-line message.
    public var firstLine: String {
        let text = String(decoding: body.prefix(512), as: UTF8.self)
        let line = text.split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
        let printable = String(line.unicodeScalars.filter { $0.value >= 0x20 && $0.value < 0x7F }.map(Character.init))
        return printable.count > 120 ? String(printable.prefix(117)) + "..." : printable
    }
}

/// A small blocking HTTP client over FoundationNetworking's URLSession
/// (libcurl underneath; HTTPS verified against the system CA store). One
/// client belongs to one driver; `invalidate()` ends its session and the
/// threads URLSession keeps, so an idle agent holds none.
public final class HTTPClient: NSObject, URLSessionTaskDelegate, @unchecked Sendable {
    private var session: URLSession!
    private let lock = NSLock()
    private var invalidated = false

    public override init() {
        super.init()
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpCookieStorage = nil
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        session = URLSession(configuration: configuration, delegate: self, delegateQueue: nil)
    }

    /// Sends `request` and waits for the reply (at most `request.timeout` s, plus a second of grace
    /// for URLSession to report its own time-out). Throws `RoomError.unreachable` when no reply came.
    public func send(_ request: HTTPRequest) throws(RoomError) -> HTTPResponse {
        lock.lock()
        let closed = invalidated
        lock.unlock()
        if closed { throw .unreachable("the HTTP client was closed") }
        var urlRequest = URLRequest(url: request.url)
        urlRequest.httpMethod = request.method
        urlRequest.timeoutInterval = request.timeout
        for (name, value) in request.headers { urlRequest.addValue(value, forHTTPHeaderField: name) }
        urlRequest.httpBody = request.body

        final class Outcome: @unchecked Sendable {
            var data: Data?
            var response: URLResponse?
            var error: Error?
        }
        let outcome = Outcome()
        let done = DispatchSemaphore(value: 0)
        let task = session.dataTask(with: urlRequest) { data, response, error in
            outcome.data = data
            outcome.response = response
            outcome.error = error
            done.signal()
        }
        task.resume()
        if done.wait(timeout: .now() + request.timeout + 1) == .timedOut {
            task.cancel()
            _ = done.wait(timeout: .now() + 1)
            throw .unreachable("\(request.method) \(request.url.redactedForLog): no reply within \(Self.seconds(request.timeout)) s")
        }
        if let error = outcome.error {
            let nsError = error as NSError
            if nsError.code == NSURLErrorTimedOut {
                throw .unreachable("\(request.method) \(request.url.redactedForLog): no reply within \(Self.seconds(request.timeout)) s")
            }
            throw .unreachable("\(request.method) \(request.url.redactedForLog): \(nsError.localizedDescription)")
        }
        guard let http = outcome.response as? HTTPURLResponse else {
            throw .badReply("\(request.method) \(request.url.redactedForLog): not an HTTP reply")
        }
        var headers: [(name: String, value: String)] = []
        for (name, value) in http.allHeaderFields {
            headers.append((name: "\(name)", value: "\(value)"))
        }
        return HTTPResponse(status: http.statusCode, headers: headers, body: outcome.data ?? Data(), url: request.url)
    }

    /// Ends the session: running requests are cancelled, no new ones are sent.
    public func invalidate() {
        lock.lock()
        let first = !invalidated
        invalidated = true
        lock.unlock()
        if first { session.invalidateAndCancel() }
    }

    deinit { invalidate() }

    // Redirects come back to the driver as replies (see the type's comment).
    public func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                           newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void) {
        completionHandler(nil)
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(format: "%.1f", value)
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
