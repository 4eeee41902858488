import FoundationEssentials
import Glibc
import KraklBase

/// One HTTP/1.1 request as the viewer's server received it (RFC 9112),
/// already checked against the server's bounds.
public struct HTTPRequest: Sendable {
    public var method: String
    /// The path of the request target, without the query.
    public var path: String
    public var query: String?
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(method: String, path: String, query: String? = nil, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }

    /// The first field of that name (names are case-insensitive), trimmed.
    public func header(_ name: String) -> String? {
        headers.first { $0.name.equalsIgnoringCase(name) }?.value
    }

    /// The media type of Content-Type, lower-cased, without parameters ("application/sdp").
    public var mediaType: String? {
        header("Content-Type").map { $0.split(separator: ";", maxSplits: 1).first.map(String.init) ?? "" }
            .map { $0.trimmingSpaces().lowercased() }
    }
}

/// A response; the server adds Content-Length, Date-free framing and `Connection: close`.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A plain-text response (errors say what to do in words).
    public static func text(_ status: Int, _ text: String, headers: [(name: String, value: String)] = []) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8")] + headers, body: Array((text + "\n").utf8))
    }

    public func header(_ name: String) -> String? {
        headers.first { $0.name.equalsIgnoringCase(name) }?.value
    }

    /// The bytes on the wire; `includeBody` false for HEAD (Content-Length still the body's).
    public func serialized(includeBody: Bool = true) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(HTTPResponse.reason(status))\r\n"
        for (name, value) in headers where !name.equalsIgnoringCase("Content-Length") {
            head += "\(name): \(value)\r\n"
        }
        // 204 and 304 carry no body and no length (RFC 9110 §8.6).
        if status != 204 && status != 304 { head += "Content-Length: \(body.count)\r\n" }
        head += "Connection: close\r\n\r\n"
        return Array(head.utf8) + (includeBody && status != 204 ? body : [])
    }

    public static func reason(_ status: Int) -> String { HTTPStatusPhrase.standard(status) ?? "Status \(status)" }
}
