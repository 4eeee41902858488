import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklRoom
import Testing

/// The room drivers' HTTP client: the reply parser on hand-written replies
/// (framings of RFC 9112 §6, hostile ones), and the client against Python's
/// http.server on loopback, plain and over TLS with a CA made by the openssl
/// command (trusted, untrusted, wrong name), a server that never answers,
/// and invalidate() ending a request that waits.
@Suite(.tags(.integration)) struct HTTPClientTests {
    static func parse(_ text: String, method: String = "GET", pieces: Int = 1, ended: Bool = true) throws -> HTTPResponseParser.Response? {
        var parser = HTTPResponseParser(method: method, maximumBody: 1 << 20)
        let bytes = Array(text.utf8)
        let size = max(1, bytes.count / pieces)
        var done = false
        var offset = 0
        while offset < bytes.count && !done {
            done = try parser.feed(Array(bytes[offset..<min(bytes.count, offset + size)]))
            offset += size
        }
        if !done && ended { done = try parser.finish() }
        return done ? parser.response : nil
    }

    @Test func readsEveryFramingInAnyPieces() throws {
        for pieces in [1, 3, 17, 200] {
            let length = try #require(try Self.parse("HTTP/1.1 201 Created\r\nLocation: /r/1\r\nContent-Length: 5\r\n\r\nv=0\r\n", pieces: pieces, ended: false))
            #expect(length.status == 201 && String(decoding: length.body, as: UTF8.self) == "v=0\r\n")
            #expect(length.headers.contains { $0.name == "Location" && $0.value == "/r/1" })
            let chunked = try #require(try Self.parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n6;ext=1\r\npedia \r\n0\r\nX-Trailer: 1\r\n\r\n",
                                                      pieces: pieces, ended: false))
            #expect(String(decoding: chunked.body, as: UTF8.self) == "Wikipedia ")
            let untilClose = try #require(try Self.parse("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end", pieces: pieces))
            #expect(String(decoding: untilClose.body, as: UTF8.self) == "to the end")
        }
        let continued = try #require(try Self.parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nETag: \"x\"\r\n\r\n", ended: false))
        #expect(continued.status == 204 && continued.body.isEmpty)
        let head = try #require(try Self.parse("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method: "HEAD", ended: false))
        #expect(head.body.isEmpty)
    }

    @Test func refusesWhatIsNotHTTPOrTooBig() {
        let bad = [
            "SSH-2.0-OpenSSH_9.2\r\n\r\n",                                   // another protocol
            "HTTP/1.1 20 OK\r\n\r\n",                                        // bad status
            "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",                      // malformed field
            "HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",                 // bad length
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",        // over the bound
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",          // unsupported coding
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",   // bad chunk size
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",            // ended early
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  // ended inside a chunk
            "",                                                              // closed without a reply
        ]
        for text in bad {
            #expect(throws: HTTPResponseParser.Problem.self, "\(text.debugDescription)") { _ = try Self.parse(text) }
        }
        var parser = HTTPResponseParser(method: "GET", maximumBody: 1 << 20)
        #expect(throws: HTTPResponseParser.Problem.self, "an endless header section") {
            for _ in 0..<100 { _ = try parser.feed(Array(("X-Junk: " + String(repeating: "a", count: 1000) + "\r\n").utf8)) }
        }
    }

    @Test func requestHasNoInjectedLines() {
        let request = HTTPRequest(method: "POST", url: URL(string: "http://h:8080/a%20b?x=1#frag")!,
                                  headers: [("Authorization", "Bearer t"), ("X-Evil", "a\r\nInjected: 1")], body: Data("v=0".utf8))
        let text = String(decoding: HTTPClient.requestBytes(request, host: "h", port: 8080, secure: false), as: UTF8.self)
        #expect(text.hasPrefix("POST /a%20b?x=1 HTTP/1.1\r\nHost: h:8080\r\n"))
        #expect(text.contains("Authorization: Bearer t\r\n") && text.contains("Content-Length: 3\r\n") && text.hasSuffix("\r\n\r\nv=0"))
        #expect(!text.contains("Injected") && !text.contains("frag"))
    }

    // MARK: against Python's http.server

    /// A Python HTTP(S) server on 127.0.0.1 answering every request with 200 and the request's path,
    /// or never answering (`hang`). Prints its port first.
    final class PythonServer {
        let process: DtlsTestProcess
        let port: Int

        init(certificate: (cert: String, key: String)? = nil, hang: Bool = false) throws {
            let program = """
            import http.server, ssl, sys, time
            class H(http.server.BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"
                def do_GET(self):
                    if sys.argv[1] == "hang":
                        print("got " + self.path, flush=True)  # the request arrived: the client waits now
                        time.sleep(60)
                    body = ("you asked for " + self.path).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                def log_message(self, *a): pass
            s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
            if len(sys.argv) > 3:
                c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                c.load_cert_chain(sys.argv[2], sys.argv[3])
                s.socket = c.wrap_socket(s.socket, server_side=True)
            print(s.server_address[1], flush=True)
            s.serve_forever()
            """
            var arguments = ["-c", program, hang ? "hang" : "answer"]
            if let certificate { arguments += [certificate.cert, certificate.key] }
            process = try DtlsTestProcess("/usr/bin/python3", arguments)
            let deadline = Date().addingTimeInterval(10)
            var found: Int?
            while found == nil && Date() < deadline {
                found = process.log.split(separator: "\n").first.flatMap { Int($0) }
                if found == nil { _ = process.waitFor("\n", timeout: 0.1) }
            }
            port = try #require(found, "the Python server did not start: \(process.log)")
        }

        deinit { process.stop() }
    }

    /// A CA and a server certificate for the name localhost (no IP address) it signed, made by the openssl command.
    static func certificates(in folder: String) throws -> (ca: String, cert: String, key: String)? {
        guard let openssl = Harness.which("openssl") else {
            skipTest("openssl is not installed (Debian package openssl)")
            return nil
        }
        let steps: [[String]] = [
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", folder + "/ca.key",
             "-out", folder + "/ca.pem", "-days", "2", "-subj", "/CN=krakl test CA"],
            ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", folder + "/server.key",
             "-out", folder + "/server.csr", "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", folder + "/server.csr", "-CA", folder + "/ca.pem", "-CAkey", folder + "/ca.key", "-CAcreateserial",
             "-out", folder + "/server.pem", "-days", "2", "-extfile", folder + "/ext.cnf"],
        ]
        try "subjectAltName=DNS:localhost\n".write(toFile: folder + "/ext.cnf", atomically: true, encoding: .utf8)
        for step in steps {
            let result = try Harness.run(openssl, step, timeout: 30)
            try #require(result.status == 0, "openssl \(step[0]): \(result.stderr)")
        }
        return (folder + "/ca.pem", folder + "/server.pem", folder + "/server.key")
    }

    @Test func plainAndVerifiedTLS() throws {
        let plain = try PythonServer()
        let client = HTTPClient()
        let reply = try client.send(HTTPRequest(method: "GET", url: URL(string: "http://127.0.0.1:\(plain.port)/plain?q=1")!, timeout: .seconds(5)))
        #expect(reply.status == 200 && String(decoding: reply.body, as: UTF8.self) == "you asked for /plain?q=1")

        let folder = try Harness.temporaryDirectory()
        guard let made = try Self.certificates(in: folder) else { return }
        let tls = try PythonServer(certificate: (made.cert, made.key))
        // Trusted CA, the certificate's name.
        let secure = try HTTPClient(caFile: made.ca).send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/tls")!, timeout: .seconds(5)))
        #expect(String(decoding: secure.body, as: UTF8.self) == "you asked for /tls")
        // The system store does not know our test CA.
        #expect { try HTTPClient().send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/")!, timeout: .seconds(5))) } throws: { error in
            "\(error)".contains("not trusted")
        }
        // The same server by an address the certificate does not name: refused, though the CA is trusted.
        #expect { try HTTPClient(caFile: made.ca).send(HTTPRequest(method: "GET", url: URL(string: "https://127.0.0.1:\(tls.port)/")!, timeout: .seconds(5))) } throws: { error in
            "\(error)".contains("not trusted for 127.0.0.1")
        }
    }

    @Test func aSilentServerTimesOutAndInvalidateEndsAWaitAtOnce() throws {
        let silent = try PythonServer(hang: true)
        let url = URL(string: "http://127.0.0.1:\(silent.port)/hang")!
        let start = MonotonicClock.milliseconds()
        #expect { try HTTPClient().send(HTTPRequest(method: "GET", url: url, timeout: .seconds(1))) } throws: { error in
            "\(error)".contains("no reply within 1 s")
        }
        let timedOut = MonotonicClock.milliseconds() - start
        // At least the 1 s time-out waited (the order judged); the upper bound is a hang guard (10x the time-out).
        #expect(timedOut >= 1000 && timedOut < 10_000, "time-out after \(timedOut) ms")

        let client = HTTPClient()
        let ended = DispatchSemaphore(value: 0)
        final class Box: @unchecked Sendable { var error: Error? }
        let box = Box()
        Thread.detachNewThread {
            do { _ = try client.send(HTTPRequest(method: "GET", url: url, timeout: .seconds(30))) } catch { box.error = error }
            ended.signal()
        }
        // The server saw this second request: the client is in its wait for the reply.
        let deadline = Date().addingTimeInterval(10)
        while silent.process.log.components(separatedBy: "got /hang").count - 1 < 2 && Date() < deadline { usleep(10_000) }
        try #require(silent.process.log.components(separatedBy: "got /hang").count - 1 >= 2, "the request never reached the server: \(silent.process.log)")
        let asked = MonotonicClock.milliseconds()
        client.invalidate()
        // A hang guard (the request's own 30 s time-out would end it too late; the target is at once).
        #expect(ended.wait(timeout: .now() + 10) == .success, "invalidate() did not end the request")
        let took = MonotonicClock.milliseconds() - asked
        print(String(format: "HTTP: time-out after %.0f ms (1 s asked); invalidate() ended a waiting request in %.1f ms", timedOut, took))
        #expect("\(box.error.map { "\($0)" } ?? "")".contains("cancelled") || "\(box.error.map { "\($0)" } ?? "")".contains("closed"))
    }
}
