import FoundationEssentials
import KraklBase
import Glibc

/// Reads one request from the bytes a connection has received so far,
/// within the server's bounds (RFC 9112 §2–§6, the parts a WHEP client and
/// a browser use): a request line, header fields, and a body framed by
/// Content-Length only. Anything else is refused with the status that says
/// why, before the body is read.
struct HTTPRequestParser {
    enum Outcome {
        /// More bytes are needed.
        case incomplete
        case request(HTTPRequest)
        /// Refused: answer with this status and close.
        case refused(status: Int, reason: String)
    }

    let maximumHeadBytes: Int
    let maximumBodyBytes: Int
    /// Where the search for the end of the head resumes, so bytes that trickle in one at a
    /// time are scanned once, not once per read.
    private var scanned = 0
    private var head: (request: HTTPRequest, bodyStart: Int, length: Int)?

    init(maximumHeadBytes: Int, maximumBodyBytes: Int) {
        self.maximumHeadBytes = maximumHeadBytes
        self.maximumBodyBytes = maximumBodyBytes
    }

    mutating func parse(_ buffer: [UInt8]) -> Outcome {
        if head == nil {
            guard let end = headEnd(buffer) else {
                if buffer.count > maximumHeadBytes { return .refused(status: 431, reason: "the request line and headers exceed \(maximumHeadBytes) bytes") }
                // A request that does not even start like one is refused before it grows.
                if let problem = earlyProblem(buffer) { return .refused(status: 400, reason: problem) }
                return .incomplete
            }
            if end > maximumHeadBytes { return .refused(status: 431, reason: "the request line and headers exceed \(maximumHeadBytes) bytes") }
            switch parseHead(buffer[..<end]) {
            case .failure(let refusal): return .refused(status: refusal.status, reason: refusal.reason)
            case .success(let parsed): head = (parsed.request, end + 4, parsed.length)
            }
        }
        guard let (request, start, length) = head else { return .incomplete }
        guard buffer.count - start >= length else { return .incomplete }
        var complete = request
        complete.body = Array(buffer[start..<(start + length)])
        return .request(complete)
    }

    private mutating func headEnd(_ buffer: [UInt8]) -> Int? {
        var index = max(0, scanned - 3)
        while index + 3 < buffer.count {
            if buffer[index] == 13 && buffer[index + 1] == 10 && buffer[index + 2] == 13 && buffer[index + 3] == 10 { return index }
            index += 1
        }
        scanned = buffer.count
        return nil
    }

    /// The first bytes of a request line are a method token: letters only.
    private func earlyProblem(_ buffer: [UInt8]) -> String? {
        for byte in buffer.prefix(16) {
            if byte == UInt8(ascii: " ") { return nil }
            if !(UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) { return "not an HTTP request line" }
        }
        return nil
    }

    struct Refusal: Error { let status: Int; let reason: String }

    private func parseHead(_ bytes: ArraySlice<UInt8>) -> Result<(request: HTTPRequest, length: Int), Refusal> {
        // Field values are octets; anything not UTF-8 is refused rather than guessed at.
        guard let text = String(validating: bytes, as: UTF8.self) else { return .failure(Refusal(status: 400, reason: "the head is not UTF-8 text")) }
        var lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)[...]
        guard let requestLine = lines.popFirst() else { return .failure(Refusal(status: 400, reason: "no request line")) }
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, parts[0].allSatisfy({ $0.isASCII && $0.isUppercase }),
              parts[1].hasPrefix("/") || parts[1] == "*" else {
            return .failure(Refusal(status: 400, reason: "malformed request line"))
        }
        guard parts[2] == "HTTP/1.1" || parts[2] == "HTTP/1.0" else {
            return .failure(Refusal(status: parts[2].hasPrefix("HTTP/") ? 505 : 400, reason: "only HTTP/1.1 and 1.0 are served"))
        }
        guard parts[1].allSatisfy({ $0.isASCII && !$0.isWhitespace && $0 != "\0" }) else {
            return .failure(Refusal(status: 400, reason: "the request target has characters it may not have"))
        }
        var headers: [(name: String, value: String)] = []
        for line in lines {
            // Obsolete line folding and fields without a colon are refused (RFC 9112 §5.2).
            guard let colon = line.firstIndex(of: ":"), line.first != " ", line.first != "\t" else {
                return .failure(Refusal(status: 400, reason: "malformed header field"))
            }
            let name = String(line[..<colon])
            guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.!#$%&'*+^`|~".contains($0)) }) else {
                return .failure(Refusal(status: 400, reason: "malformed header field name"))
            }
            let value = line[line.index(after: colon)...].trimmingSpaces()
            guard !value.unicodeScalars.contains(where: { $0.value < 0x20 && $0 != "\t" || $0.value == 0x7F }) else {
                return .failure(Refusal(status: 400, reason: "control characters in a header field"))
            }
            headers.append((name, value))
        }
        if headers.contains(where: { $0.name.equalsIgnoringCase("Transfer-Encoding") }) {
            return .failure(Refusal(status: 501, reason: "Transfer-Encoding is not accepted; send a Content-Length"))
        }
        let lengths = Set(headers.filter { $0.name.equalsIgnoringCase("Content-Length") }.map(\.value))
        var length = 0
        if let only = lengths.first {
            // Digits only, at most 9 of them: no sign, no list, no overflow.
            guard lengths.count == 1, !only.isEmpty, only.count <= 9, only.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int(only) else {
                return .failure(Refusal(status: 400, reason: "malformed Content-Length"))
            }
            length = value
        }
        if length > maximumBodyBytes {
            return .failure(Refusal(status: 413, reason: "the body exceeds \(maximumBodyBytes) bytes"))
        }
        let target = parts[1]
        let path: String, query: String?
        if let mark = target.firstIndex(of: "?") {
            path = String(target[..<mark])
            query = String(target[target.index(after: mark)...])
        } else {
            path = String(target)
            query = nil
        }
        return .success((HTTPRequest(method: String(parts[0]), path: path, query: query, headers: headers), length))
    }
}
