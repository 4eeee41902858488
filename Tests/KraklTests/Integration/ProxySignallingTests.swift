import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklRoom
import Testing

/// Signalling through an HTTP proxy: the NO_PROXY and proxy-URL rules on their own, the HTTP
/// client through a real tinyproxy on loopback (CONNECT for https, absolute form for http,
/// Basic credentials, a refused CONNECT, a proxy that never answers), and `krakl-agent --join`
/// publishing to a WHIP server over https in a test namespace whose only way to the server is
/// the proxy (nftables rejects the agent's own connections to it).
@Suite(.serialized, .tags(.integration, .netns)) struct ProxySignallingTests {
    // MARK: rules

    @Test func noProxyFormsMatchLikeCurl() {
        let list = NoProxyList("example.com, .corp.test,10.0.0.0/8, ::1 ,192.168.1.7,[fd00::/8],media.test:8443, bad!entry,")
        let cases: [(host: String, port: Int, direct: Bool)] = [
            ("example.com", 443, true), ("www.example.com", 80, true), ("EXAMPLE.COM.", 443, true),
            ("myexample.com", 443, false), ("example.com.org", 443, false),
            ("corp.test", 443, true), ("a.b.corp.test", 443, true), ("notcorp.test", 443, false),
            ("10.1.2.3", 443, true), ("11.1.2.3", 443, false),
            ("::1", 443, true), ("[::1]", 8088, true), ("::2", 443, false),
            ("192.168.1.7", 80, true), ("192.168.1.8", 80, false),
            ("fd12::5", 443, true), ("[fe80::1]", 443, false),
            ("media.test", 8443, true), ("media.test", 443, false),
            // Loopback is not special (as in curl): listed above only as ::1.
            ("127.0.0.1", 443, false), ("localhost", 443, false),
            // A name never matches an address entry, nor an address a name entry.
            ("10.example.com", 443, true), ("10.0.0.1.nip.test", 443, false),
        ]
        for c in cases {
            #expect(list.matches(host: c.host, port: c.port) == c.direct, "\(c.host):\(c.port) should go \(c.direct ? "direct" : "through the proxy")")
        }
        #expect(NoProxyList("*").matches(host: "anything.test", port: 1))
        #expect(!NoProxyList("").matches(host: "anything.test", port: 1))
        #expect(NoProxyList("localhost,127.0.0.0/8").matches(host: "127.0.0.2", port: 80))
    }

    @Test func proxySettingsFromTheEnvironment() throws {
        let settings = try ProxySettings.from(environment: [
            "HTTPS_PROXY": "http://upper.test:1", "https_proxy": "http://alice:p%40ss@proxy.test:3128",
            "HTTP_PROXY": "plain.test:8080", "NO_PROXY": "direct.test",
        ])
        let https = try #require(settings.https)
        #expect(https.host == "proxy.test" && https.port == 3128, "lower case wins: \(https)")
        #expect(https.username == "alice" && https.password == "p@ss")
        #expect(https.authorization == "Basic " + Data("alice:p@ss".utf8).base64EncodedString())
        #expect("\(https)" == "proxy proxy.test:3128 (user alice)", "the password is never shown")
        #expect(settings.http == HTTPProxy(host: "plain.test", port: 8080), "a bare host:port is an http:// proxy")
        #expect(settings.proxy(for: URL(string: "https://room.test/whip")!) == https)
        #expect(settings.proxy(for: URL(string: "http://room.test:8088/janus")!)?.host == "plain.test")
        #expect(settings.proxy(for: URL(string: "https://sfu.direct.test/whip")!) == nil)
        // ALL_PROXY fills in for either; none at all is direct.
        let all = try ProxySettings.from(environment: ["ALL_PROXY": "http://all.test"])
        #expect(all.https?.host == "all.test" && all.https?.port == 1080 && all.http?.host == "all.test")
        #expect(try ProxySettings.from(environment: [:]) == .direct)
        // What the client cannot do is refused with a word on what works, never echoing the value.
        for (value, words) in [("socks5://u:secret@s.test:1080", "SOCKS"), ("https://u:secret@p.test", "https://"), ("ftp://p.test", "scheme ftp"),
                               ("http://u:secret@p.test:99999", "port")] {
            #expect { try ProxySettings.from(environment: ["https_proxy": value]) } throws: { error in
                guard case .proxyFailed = error as? RoomError else { return false }
                return "\(error)".contains(words) && "\(error)".contains("https_proxy") && !"\(error)".contains("secret")
            }
        }
    }

    @Test func absoluteFormCarriesTheProxyCredentialsOnly() {
        let request = HTTPRequest(method: "POST", url: URL(string: "http://room.test:8088/janus/1?x=1#f")!, headers: [("Authorization", "Bearer t")],
                                  body: Data("{}".utf8))
        let proxy = HTTPProxy(host: "p.test", port: 3128, username: "alice", password: "pw")
        let text = String(decoding: HTTPClient.requestBytes(request, host: "room.test", port: 8088, secure: false, proxy: proxy), as: UTF8.self)
        #expect(text.hasPrefix("POST http://room.test:8088/janus/1?x=1 HTTP/1.1\r\nHost: room.test:8088\r\n"), "\(text)")
        #expect(text.contains("Proxy-Authorization: Basic " + Data("alice:pw".utf8).base64EncodedString() + "\r\n"))
        let direct = String(decoding: HTTPClient.requestBytes(request, host: "room.test", port: 8088, secure: false), as: UTF8.self)
        #expect(direct.hasPrefix("POST /janus/1?x=1 HTTP/1.1\r\n") && !direct.contains("Proxy-Authorization"))
    }

    // MARK: the HTTP client through tinyproxy on loopback

    @Test func httpAndHttpsThroughTinyproxyAndNoProxyBypass() throws {
        guard let proxy = try Tinyproxy() else { return }
        let folder = try Harness.temporaryDirectory()
        guard let made = try HTTPClientTests.certificates(in: folder) else { return }
        let plain = try HTTPClientTests.PythonServer()
        let tls = try HTTPClientTests.PythonServer(certificate: (made.cert, made.key))
        let through = ProxySettings(https: proxy.address, http: proxy.address)

        let reply = try HTTPClient(proxies: through).send(HTTPRequest(method: "GET", url: URL(string: "http://127.0.0.1:\(plain.port)/plain?q=1")!, timeout: .seconds(10)))
        #expect(reply.status == 200 && String(decoding: reply.body, as: UTF8.self) == "you asked for /plain?q=1")
        #expect(proxy.waitForLog("Request (file descriptor") { $0.contains("GET http://127.0.0.1:\(plain.port)/plain?q=1 HTTP/1.1") },
                "no absolute-form request in the proxy's log: \(proxy.log)")

        // TLS inside the tunnel: the certificate is checked for localhost, the name in the URL, not the proxy's.
        let secure = try HTTPClient(caFile: made.ca, proxies: through).send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/tls")!, timeout: .seconds(10)))
        #expect(String(decoding: secure.body, as: UTF8.self) == "you asked for /tls")
        #expect(proxy.waitForLog("CONNECT localhost:\(tls.port) HTTP/1.1"), "no CONNECT in the proxy's log: \(proxy.log)")

        // NO_PROXY: straight to the server, the proxy sees nothing more.
        let seen = proxy.requests
        var bypass = through
        bypass.noProxy = NoProxyList("localhost,127.0.0.1")
        let direct = try HTTPClient(caFile: made.ca, proxies: bypass).send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/direct")!, timeout: .seconds(10)))
        #expect(String(decoding: direct.body, as: UTF8.self) == "you asked for /direct")
        _ = try HTTPClient(proxies: bypass).send(HTTPRequest(method: "GET", url: URL(string: "http://127.0.0.1:\(plain.port)/direct")!, timeout: .seconds(10)))
        #expect(proxy.requests == seen, "NO_PROXY hosts went through the proxy: \(proxy.log)")
    }

    @Test func proxyCredentialsAndRefusals() throws {
        guard let proxy = try Tinyproxy(["BasicAuth alice s3cret-pw"]) else { return }
        let folder = try Harness.temporaryDirectory()
        guard let made = try HTTPClientTests.certificates(in: folder) else { return }
        let plain = try HTTPClientTests.PythonServer()
        let tls = try HTTPClientTests.PythonServer(certificate: (made.cert, made.key))
        var good = proxy.address
        good.username = "alice"
        good.password = "s3cret-pw"
        let reply = try HTTPClient(proxies: ProxySettings(http: good)).send(HTTPRequest(method: "GET", url: URL(string: "http://127.0.0.1:\(plain.port)/auth")!, timeout: .seconds(10)))
        #expect(reply.status == 200, "http with the right credentials")
        let secure = try HTTPClient(caFile: made.ca, proxies: ProxySettings(https: good)).send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/auth")!, timeout: .seconds(10)))
        #expect(secure.status == 200, "https with the right credentials")

        // No credentials: 407 whichever way. (tinyproxy 1.11 answers wrong ones in absolute form with 401 and
        // WWW-Authenticate, which cannot be told from the room server's own 401: docs/rooms.md says so.)
        #expect { try HTTPClient(proxies: ProxySettings(http: proxy.address)).send(HTTPRequest(method: "GET", url: URL(string: "http://127.0.0.1:\(plain.port)/auth")!, timeout: .seconds(10))) } throws: { error in
            guard case .proxyFailed(let name, let message)? = error as? RoomError else { return false }
            print("proxy refusal: \(error)")
            return name == "proxy 127.0.0.1:\(proxy.port)" && message.contains("407") && message.contains("give them in the proxy URL")
        }
        var wrong = good
        wrong.password = "not-the-pw"
        for settings in [ProxySettings(https: proxy.address), ProxySettings(https: wrong)] {
            #expect { try HTTPClient(caFile: made.ca, proxies: settings).send(HTTPRequest(method: "GET", url: URL(string: "https://localhost:\(tls.port)/")!, timeout: .seconds(10))) } throws: { error in
                guard case .proxyFailed(let name, let message)? = error as? RoomError else { return false }
                print("proxy refusal: \(error)")
                let hint = settings.https?.username == nil ? "give them in the proxy URL" : "did not accept the credentials"
                return name == "\(settings.https!)" && message.contains("CONNECT localhost:\(tls.port)") && (message.contains("407") || message.contains("401"))
                    && message.contains(hint)
                    && !"\(error)".contains("not-the-pw") && !"\(error)".contains("s3cret")
            }
        }

        // CONNECT to a port the proxy does not allow (ConnectPort 443 only): 403, the proxy named.
        guard let strict = try Tinyproxy(["ConnectPort 443"]) else { return }
        #expect { try HTTPClient(proxies: ProxySettings(https: strict.address)).send(HTTPRequest(method: "GET", url: URL(string: "https://127.0.0.1:\(plain.port)/")!, timeout: .seconds(10))) } throws: { error in
            guard case .proxyFailed(let name, let message)? = error as? RoomError else { return false }
            print("proxy refusal: \(error)")
            return name == "proxy 127.0.0.1:\(strict.port)" && message.contains("CONNECT 127.0.0.1:\(plain.port)") && message.contains("403")
                && message.contains("does not allow")
        }
        #expect(strict.waitForLog("Refused CONNECT method on port \(plain.port)"), "\(strict.log)")
    }

    @Test func aSilentProxyTimesOutAndCancelEndsTheWait() throws {
        let silent = try SilentListener()
        let settings = ProxySettings(https: HTTPProxy(host: "127.0.0.1", port: silent.port))
        let url = URL(string: "https://room.test/whip/endpoint")!
        #expect { try HTTPClient(proxies: settings).send(HTTPRequest(method: "POST", url: url, timeout: .seconds(1))) } throws: { error in
            guard case .proxyFailed(let name, let message)? = error as? RoomError else { return false }
            print("silent proxy: \(error)")
            return name == "proxy 127.0.0.1:\(silent.port)" && message.contains("no answer to CONNECT within 1 s")
        }

        // The person stops while the request waits on the proxy: cancelRunning ends it, not the time-out.
        let client = HTTPClient(proxies: settings)
        // The first request's connection is still in the queue (never accepted): count from here.
        let before = silent.connectionsWaiting()
        let ended = DispatchSemaphore(value: 0)
        let box = WhipResultBox<HTTPResponse>()
        Thread.detachNewThread {
            box.result = Result { try client.send(HTTPRequest(method: "POST", url: url, timeout: .seconds(60))) }
            ended.signal()
        }
        // Until the connection is accepted by the kernel (bounded); cancelling earlier would also end it.
        _ = whipPoll(timeout: 5) { silent.connectionsWaiting() > before }
        client.cancelRunning()
        #expect(ended.wait(timeout: .now() + 5) == .success, "cancelRunning() did not end a request waiting on the proxy")
        if case .failure(let error)? = box.result {
            #expect("\(error)".contains("cancelled"), "\(error)")
        } else {
            Issue.record("the request did not fail: \(String(describing: box.result))")
        }
    }

    // MARK: krakl-agent through the proxy, in a namespace

    @Test func agentJoinsAWhipRoomOnlyThroughTheProxy() throws {
        guard let room = try ProxiedWhipRoom() else { return }
        guard let proxy = try Tinyproxy(in: room.namespace, folder: room.folder) else { return }
        try room.onlyTheProxyReachesTheServer()
        let agent = try room.agent(environment: ["HTTPS_PROXY": "http://127.0.0.1:\(proxy.port)"])
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(800))")
        #expect(proxy.waitForLog("CONNECT 127.0.0.1:\(room.server.port) HTTP/1.1"), "no CONNECT in the proxy's log: \(proxy.log)")
        agent.signal(SIGTERM)
        let status = RoomSessionTests.waitExit(agent, seconds: 10).status
        #expect(status == 0, "exit \(status.map(String.init) ?? "none"): \(agent.log.suffix(500))")
        #expect(room.server.requests("POST", atLeast: 1).count >= 1 && room.server.requests("DELETE", atLeast: 1).count == 1,
                "the POST and the DELETE went through the proxy")
        let connects = proxy.log.components(separatedBy: "CONNECT 127.0.0.1:\(room.server.port)").count - 1
        print("proxy: agent shared through tinyproxy, \(connects) CONNECT tunnels (the POST, the DELETE, any trickle PATCH)")
    }

    @Test func agentNoProxyGoesDirect() throws {
        guard let room = try ProxiedWhipRoom() else { return }
        guard let proxy = try Tinyproxy(in: room.namespace, folder: room.folder) else { return }
        let agent = try room.agent(environment: ["HTTPS_PROXY": "http://127.0.0.1:\(proxy.port)", "NO_PROXY": "localhost,127.0.0.1"])
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(800))")
        agent.signal(SIGTERM)
        #expect(RoomSessionTests.waitExit(agent, seconds: 10).status == 0)
        #expect(proxy.requests == 0, "NO_PROXY: nothing should have gone through the proxy: \(proxy.log)")
    }

    @Test func agentProxyRefusingConnectHasItsOwnExitStatus() throws {
        guard let room = try ProxiedWhipRoom() else { return }
        guard let proxy = try Tinyproxy(["ConnectPort 443"], in: room.namespace, folder: room.folder) else { return }
        let agent = try room.agent(environment: ["HTTPS_PROXY": "http://127.0.0.1:\(proxy.port)"])
        defer { agent.stop() }
        let (status, ms) = RoomSessionTests.waitExit(agent, seconds: 30)
        let last = agent.log.split(separator: "\n").last { $0.contains("proxy") }.map(String.init) ?? ""
        print(String(format: "proxy 403: exit %@ after %.0f ms: %@", status.map(String.init) ?? "none", ms, last))
        #expect(status == 53, "exit \(status.map(String.init) ?? "none"), wanted 53: \(agent.log.suffix(500))")
        #expect(last.contains("proxy 127.0.0.1:\(proxy.port)") && last.contains("403"), "the message names the proxy and its status: \(last)")
        #expect(room.server.requests("POST").isEmpty, "the server was reached")
    }

    @Test func agentSilentProxyTimesOutWithinTheRequestTimeOut() throws {
        guard let room = try ProxiedWhipRoom() else { return }
        let silentPort = 3129
        let (program, argv) = room.namespace.command("/usr/bin/python3", ["-c", SilentListener.program, "\(silentPort)"])
        let silent = try DtlsTestProcess(program, argv)
        defer { silent.stop() }
        #expect(silent.waitFor("listening", timeout: 10), "the silent proxy did not start: \(silent.log)")
        let agent = try room.agent(environment: ["HTTPS_PROXY": "http://127.0.0.1:\(silentPort)"])
        defer { agent.stop() }
        let (status, ms) = RoomSessionTests.waitExit(agent, seconds: 40)
        let last = agent.log.split(separator: "\n").last { $0.contains("proxy") }.map(String.init) ?? ""
        print(String(format: "silent proxy: exit %@ after %.0f ms: %@", status.map(String.init) ?? "none", ms, last))
        #expect(status == 53, "exit \(status.map(String.init) ?? "none"), wanted 53: \(agent.log.suffix(500))")
        #expect(last.contains("proxy 127.0.0.1:\(silentPort)") && last.contains("no answer to CONNECT within"), "\(last)")
    }
}

/// tinyproxy (Debian tinyproxy-bin) on 127.0.0.1, in the foreground, logging every connection and
/// request line to a file; as root it runs as nobody (so nftables can tell its connections apart).
final class Tinyproxy {
    let process: DtlsTestProcess
    let port: Int
    let logFile: String

    var address: HTTPProxy { HTTPProxy(host: "127.0.0.1", port: port) }
    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }
    /// Requests and CONNECTs the proxy has read.
    var requests: Int { log.components(separatedBy: "Request (file descriptor").count - 1 }

    /// nil after SKIP when tinyproxy is not installed. `extra`: more configuration lines.
    init?(_ extra: [String] = [], in namespace: RtcTestNamespace? = nil, folder given: String? = nil) throws {
        guard let program = Harness.which("tinyproxy") else {
            skipTest("tinyproxy missing (scripts/setup installs tinyproxy-bin)")
            return nil
        }
        let folder = try given ?? Harness.temporaryDirectory()
        // In a fresh namespace any port is free; on the host's loopback ask the kernel for one.
        port = namespace == nil ? try Self.freePort() : 3128
        let name = "tinyproxy-\(UUID().uuidString.prefix(6))"
        logFile = folder + "/\(name).log"
        // The proxy writes its log as nobody.
        chmod(folder, 0o755)
        _ = FileManager.default.createFile(atPath: logFile, contents: nil, attributes: [.posixPermissions: 0o666])
        var lines = ["Port \(port)", "Listen 127.0.0.1", "Timeout 30", "MaxClients 20", "Allow 127.0.0.1",
                     "LogFile \"\(logFile)\"", "LogLevel Info"]
        if geteuid() == 0 { lines += ["User nobody", "Group nogroup"] }
        let configuration = folder + "/\(name).conf"
        try (lines + extra).joined(separator: "\n").appending("\n").write(toFile: configuration, atomically: true, encoding: .utf8)
        let (command, argv) = namespace?.command(program, ["-d", "-c", configuration]) ?? (program, ["-d", "-c", configuration])
        process = try DtlsTestProcess(command, argv)
        let deadline = Date().addingTimeInterval(10)
        while !log.contains("Accepting connections") && Date() < deadline && process.isRunning { usleep(20_000) }
        try #require(log.contains("Accepting connections"), "tinyproxy did not start: \(process.log) \(log)")
    }

    deinit { process.stop() }

    /// Waits (bounded) until the log has `text` on a line for which `match` holds.
    func waitForLog(_ text: String, timeout: Double = 5, _ match: (String) -> Bool = { _ in true }) -> Bool {
        whipPoll(timeout: timeout) { self.log.split(separator: "\n").contains { $0.contains(text) && match(String($0)) } }
    }

    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        try #require(bound, "cannot bind a loopback port")
        return Int(UInt16(bigEndian: address.sin_port))
    }

}

/// A "proxy" that takes TCP connections (the kernel completes them from the backlog) and never says a word.
final class SilentListener {
    static let program = """
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
    print("listening", flush=True)
    time.sleep(120)
    """
    let fd: Int32
    let port: Int

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        self.fd = fd
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ready = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        try #require(ready, "cannot listen on loopback")
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    /// Connections completed by the kernel and not accepted (the listen queue's length, from /proc).
    func connectionsWaiting() -> Int {
        let hex = String(format: "%04X", port)
        let table = procText("/proc/net/tcp")
        // A listening socket's rx_queue is its accept backlog.
        for line in table.split(separator: "\n") where line.contains("0100007F:\(hex) 00000000:0000 0A") {
            let fields = line.split(separator: " ")
            if fields.count > 4, let queue = fields[4].split(separator: ":").last, let n = Int(queue, radix: 16) { return n }
        }
        return 0
    }

    deinit { close(fd) }
}

/// krakl-agent and a WHIP server over https (a test CA, the certificate for 127.0.0.1) in the
/// test's namespace; the agent trusts the CA through SSL_CERT_FILE, as OpenSSL reads it.
struct ProxiedWhipRoom {
    let namespace: RtcTestNamespace
    let server: WhipTestServer
    let registry: String
    let folder: String
    let ca: String

    init?() throws {
        guard RtcPublisherSession.prerequisites(), WhipTestServer.prerequisites(), let namespace = try RtcTestNamespace() else { return nil }
        self.namespace = namespace
        folder = try Harness.temporaryDirectory()
        guard let made = try Self.certificate(in: folder) else { return nil }
        ca = made.ca
        server = try WhipTestServer(namespace: nil, inside: namespace, ["--tls", made.cert, made.key])
        registry = try Harness.registryForThisBuild(in: folder)
    }

    var endpoint: String { "https://127.0.0.1:\(server.port)/whip/endpoint/\(server.room)" }

    /// nftables in the namespace rejects root's connections to the server: only the proxy (nobody) gets there.
    func onlyTheProxyReachesTheServer() throws {
        let nft = RtcTestNamespace.nft
        try #require(FileManager.default.isExecutableFile(atPath: nft), "nft missing (scripts/setup installs nftables)")
        for rule in [["add", "table", "inet", "proxytest"],
                     ["add", "chain", "inet", "proxytest", "out", "{", "type", "filter", "hook", "output", "priority", "0", ";", "}"],
                     ["add", "rule", "inet", "proxytest", "out", "tcp", "dport", "\(server.port)", "meta", "skuid", "0", "reject", "with", "tcp", "reset"]] {
            let result = try namespace.run(nft, rule)
            try #require(result.status == 0, "nft \(rule.joined(separator: " ")): \(result.stderr)")
        }
        // The rule works: root cannot reach the server directly.
        let probe = try namespace.run("/usr/bin/python3", ["-c", "import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3); print('reached')\nexcept OSError as e: print('refused', e)",
                                                           "\(server.port)"])
        try #require(probe.stdout.hasPrefix("refused"), "nftables did not block the direct path: \(probe.stdout) \(probe.stderr)")
    }

    func agent(environment: [String: String]) throws -> DtlsTestProcess {
        let token = try WhipTestServer.token(room: server.room, identity: "Ann")
        let made = try Harness.run("/usr/bin/python3", [RoomSessionTests.codeScript, "--kind", "whip", "--url", endpoint, "--token", token])
        let code = folder + "/code-\(UUID().uuidString.prefix(6))"
        try made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).write(toFile: code, atomically: true, encoding: .utf8)
        // Only the variables given: none of the test's own proxy settings leak in.
        let settings = ["SSL_CERT_FILE=\(ca)", "HTTPS_PROXY=", "https_proxy=", "HTTP_PROXY=", "http_proxy=", "ALL_PROXY=", "all_proxy=",
                        "NO_PROXY=", "no_proxy="] + environment.map { "\($0.key)=\($0.value)" }
        let (program, argv) = namespace.command("/usr/bin/env", settings + [Harness.agent, "--join", "@" + code, "--once", "--address", "127.0.0.2",
                                                                            "--plugins", registry, "--option", "scene=typing",
                                                                            "--option", "width=640", "--option", "height=360"])
        return try DtlsTestProcess(program, argv)
    }

    /// A CA and a certificate for the address 127.0.0.1 it signed (openssl command).
    static func certificate(in folder: String) throws -> (ca: String, cert: String, key: String)? {
        guard let openssl = Harness.which("openssl") else {
            skipTest("openssl is not installed (Debian package openssl)")
            return nil
        }
        try "subjectAltName=IP:127.0.0.1\n".write(toFile: folder + "/ip.cnf", atomically: true, encoding: .utf8)
        let steps: [[String]] = [
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", folder + "/ca.key",
             "-out", folder + "/ca.pem", "-days", "2", "-subj", "/CN=krakl proxy test CA"],
            ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", folder + "/server.key",
             "-out", folder + "/server.csr", "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", folder + "/server.csr", "-CA", folder + "/ca.pem", "-CAkey", folder + "/ca.key", "-CAcreateserial",
             "-out", folder + "/server.pem", "-days", "2", "-extfile", folder + "/ip.cnf"],
        ]
        for step in steps {
            let result = try Harness.run(openssl, step, timeout: 30)
            try #require(result.status == 0, "openssl \(step[0]): \(result.stderr)")
        }
        // The server reads its key as root in the namespace; the agent reads the CA.
        return (folder + "/ca.pem", folder + "/server.pem", folder + "/server.key")
    }
}
