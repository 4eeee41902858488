import Foundation
import Glibc
import KraklRTC
import Testing

/// Runs code with the calling thread's network namespace switched to a test
/// namespace, on a thread of its own. A socket keeps the namespace it was
/// made in, so a `Publisher` made here gathers and binds 127.0.0.2 inside
/// the namespace while the rest of the test process, and the WHIP driver's
/// URLSession with it, stays on the host's loopback, where the test server
/// listens. (setns(CLONE_NEWNET) changes only the calling thread, unlike
/// re-running the test binary under `ip netns exec`, this keeps the driver
/// in the test process exactly as the agent runs it.)
enum WhipNamespaceThread {
    struct Failed: Error, CustomStringConvertible { let description: String }

    private typealias SetNs = @convention(c) (Int32, Int32) -> Int32
    private static let CLONE_NEWNET: Int32 = 0x4000_0000

    static func run<T>(in namespace: String, _ body: @escaping () throws -> T) throws -> T {
        // Glibc's module map leaves setns out (it needs _GNU_SOURCE): look it up.
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "setns") else {
            throw Failed(description: "setns not found in libc")
        }
        let setns = unsafeBitCast(symbol, to: SetNs.self)
        let box = WhipResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        // Runs on the thread below while this one waits for it: never on two threads at once.
        nonisolated(unsafe) let body = body
        let thread = Thread {
            defer { done.signal() }
            let home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)
            let target = open("/var/run/netns/\(namespace)", O_RDONLY | O_CLOEXEC)
            defer { if home >= 0 { close(home) }; if target >= 0 { close(target) } }
            guard home >= 0, target >= 0, setns(target, CLONE_NEWNET) == 0 else {
                box.result = .failure(Failed(description: "cannot enter network namespace \(namespace): \(String(cString: strerror(errno)))"))
                return
            }
            box.result = Result { try body() }
            // The thread ends here anyway; going back keeps it harmless if Foundation ever reuses it.
            _ = setns(home, CLONE_NEWNET)
        }
        thread.start()
        guard done.wait(timeout: .now() + 30) == .success, let result = box.result else {
            throw Failed(description: "the namespace thread did not finish in 30 s")
        }
        return try result.get()
    }
}

final class WhipResultBox<T>: @unchecked Sendable { var result: Result<T, Error>? }

/// Tests/Fixtures/whip_server.py as a subprocess: a WHIP endpoint on
/// 127.0.0.1 whose aiortc peer sits in the test's namespace.
final class WhipTestServer {
    static let python = "/opt/krakl-venv/bin/python"
    static var script: String { Harness.repoRoot + "/Tests/Fixtures/whip_server.py" }
    static let secret = "whip-test-secret-\(UUID().uuidString.prefix(8))"

    let process: DtlsTestProcess
    let port: Int
    let secondPort: Int
    let room: String

    /// nil (after SKIP) when the venv with aiortc and pyjwt is missing.
    static func prerequisites() -> Bool {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            skipTest("\(python) missing (scripts/setup makes the venv with aiortc and pyjwt)")
            return false
        }
        return true
    }

    /// `namespace`: HTTP on the host's 127.0.0.1, aiortc in the namespace. `inside`: the whole server
    /// runs in that namespace (HTTP on its own 127.0.0.1), for an agent that runs there too.
    init(namespace: RtcTestNamespace?, inside: RtcTestNamespace? = nil, room: String = "room-\(UUID().uuidString.prefix(6))",
         _ arguments: [String] = []) throws {
        self.room = room
        var argv = [Self.script, "--secret", Self.secret, "--room", room, "--seconds", "120"]
        if let namespace { argv += ["--netns", namespace.name] }
        let (program, full) = inside?.command(Self.python, argv + arguments) ?? (Self.python, argv + arguments)
        let started = try DtlsTestProcess(program, full)
        process = started
        _ = started.waitFor("\"ready\"", timeout: 20)
        guard let ready = Self.events(started.log).first(where: { $0["event"] as? String == "ready" }),
              let port = ready["port"] as? Int, let second = ready["second_port"] as? Int else {
            throw WhipNamespaceThread.Failed(description: "whip_server.py did not start: \(started.log)")
        }
        self.port = port
        secondPort = second
    }

    deinit { process.stop() }

    var endpoint: URL { URL(string: "http://127.0.0.1:\(port)/whip/endpoint/\(room)")! }

    /// Every JSON line printed so far.
    var events: [[String: Any]] { Self.events(process.log) }

    /// Closes every peer connection now (SIGUSR1: aiortc's close sends DTLS close_notify), as a
    /// room whose host ended it; sent once the test saw what it waits for, not on a timer.
    func closePeers() { process.send(signal: SIGUSR1) }

    static func events(_ text: String) -> [[String: Any]] {
        text.split(whereSeparator: \.isNewline).compactMap { line in
            guard line.hasPrefix("{") else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
    }

    func events(_ kind: String) -> [[String: Any]] { events.filter { $0["event"] as? String == kind } }

    func requests(_ method: String) -> [[String: Any]] { events("request").filter { $0["method"] as? String == method } }

    /// The `method` requests once at least `count` are logged (bounded): the server prints a request's
    /// line before it replies, but our reader thread may collect it after the driver has the reply.
    func requests(_ method: String, atLeast count: Int, timeout: Double = 2) -> [[String: Any]] {
        let deadline = Date().addingTimeInterval(timeout)
        while requests(method).count < count && Date() < deadline && process.isRunning {
            _ = process.waitFor("\u{1}never\u{1}", timeout: 0.05)
        }
        return requests(method)
    }

    /// The first event of `kind` matching `match`, waiting for it (bounded).
    func waitForEvent(_ kind: String, timeout: Double = 10, where match: ([String: Any]) -> Bool = { _ in true }) -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if let found = events(kind).first(where: match) { return found }
            if Date() >= deadline || !process.isRunning { return events(kind).first(where: match) }
            _ = process.waitFor("\u{1}never\u{1}", timeout: 0.05)  // returns on new output or after 50 ms
        }
    }

    /// An HS256 token shaped like a Twilio Video access token, made by pyjwt (not by our code).
    static func token(room: String?, identity: String = "Ann Example", secret: String = WhipTestServer.secret) throws -> String {
        let program = """
        import jwt, sys, time
        now = int(time.time())
        video = {} if sys.argv[2] == "" else {"room": sys.argv[2]}
        claims = {"jti": "SK-test-%d" % now, "iss": "SK-test", "sub": "AC-test", "iat": now, "nbf": now - 5, "exp": now + 600,
                  "grants": {"identity": sys.argv[3], "video": video}}
        print(jwt.encode(claims, sys.argv[1], algorithm="HS256", headers={"cty": "twilio-fpa;v=1"}))
        """
        let result = try Harness.run(python, ["-c", program, secret, room ?? "", identity], timeout: 20)
        guard result.status == 0 else { throw WhipNamespaceThread.Failed(description: "pyjwt: \(result.stderr)") }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// A publisher whose sockets are in `namespace` (127.0.0.2), with its events logged.
func whipPublisher(in namespace: RtcTestNamespace) throws -> (Publisher, RtcCallbackLog) {
    let publisher = try WhipNamespaceThread.run(in: namespace.name) { () throws -> Publisher in
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.2")!])
        return try Publisher(configuration: configuration)
    }
    let log = RtcCallbackLog()
    publisher.onEvent = { log.event($0) }
    return (publisher, log)
}

/// Waits (bounded) until `condition` holds.
func whipPoll(timeout: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while !condition() {
        if Date() >= deadline { return false }
        usleep(10_000)
    }
    return true
}
