import Foundation
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import Testing

/// Tests/Fixtures/twilio_room.py as a subprocess: an emulator of Twilio's room signaling (TCMP + RSP
/// v2 on a WebSocket), Twilio-shaped REST, and aiortc decoding what is published. Its REST listens on
/// the host's 127.0.0.1 (the test talks to it); its signaling socket and aiortc live in the test's
/// namespace, where the agent runs too.
final class TwilioTestRoom {
    static var script: String { Harness.repoRoot + "/Tests/Fixtures/twilio_room.py" }
    static var tokenScript: String { Harness.repoRoot + "/Tests/Fixtures/twilio_token.py" }
    static let accountSid = "AC" + String(repeating: "0", count: 24) + "7e57ab1e"
    static let apiKeySid = "SK" + String(repeating: "0", count: 24) + "7e57ab1e"
    let secret = "twilio-test-secret-\(UUID().uuidString.prefix(8))"

    let namespace: RtcTestNamespace
    let folder: String
    let registry: String
    let process: DtlsTestProcess
    let wsPort: Int
    let restPort: Int
    let room: String
    private let rest = HTTPClient(proxies: .direct)

    /// nil after SKIP when a component is missing.
    init?(room: String = "room-\(UUID().uuidString.prefix(6))", _ arguments: [String] = []) throws {
        guard WhipTestServer.prerequisites() else { return nil }
        guard (try? Harness.run(WhipTestServer.python, ["-c", "import twilio, aiohttp"], timeout: 30).status) == 0 else {
            skipTest("the twilio and aiohttp packages are missing from \(WhipTestServer.python) (scripts/setup installs them)")
            return nil
        }
        guard let namespace = try RtcTestNamespace() else { return nil }
        self.namespace = namespace
        self.room = room
        folder = try Harness.temporaryDirectory()
        registry = try Harness.registryForThisBuild(in: folder)
        process = try DtlsTestProcess(WhipTestServer.python, [Self.script, "--account-sid", Self.accountSid, "--api-key-sid", Self.apiKeySid,
                                                              "--api-key-secret", secret, "--netns", namespace.name, "--seconds", "300"] + arguments)
        guard process.waitFor("\"ready\"", timeout: 30), let ready = WhipTestServer.events(process.log).first(where: { $0["event"] as? String == "ready" }),
              let ws = ready["ws_port"] as? Int, let restPort = ready["rest_port"] as? Int else {
            throw WhipNamespaceThread.Failed(description: "twilio_room.py did not start: \(process.log.suffix(2000))")
        }
        wsPort = ws
        self.restPort = restPort
    }

    deinit { process.stop() }

    var signalingURL: String { "ws://127.0.0.1:\(wsPort)/signaling" }

    /// A Twilio access token from Twilio's own helper library (`twilio` on PyPI).
    func token(identity: String, room: String? = nil, secret: String? = nil, extra: [String] = []) throws -> String {
        var argv = [Self.tokenScript, "--account-sid", Self.accountSid, "--api-key-sid", Self.apiKeySid,
                    "--api-key-secret", secret ?? self.secret, "--identity", identity] + extra
        if let room = room ?? Optional(self.room), !room.isEmpty { argv += ["--room", room] }
        let result = try Harness.run(WhipTestServer.python, argv, timeout: 30)
        guard result.status == 0 else { throw WhipNamespaceThread.Failed(description: "twilio_token.py: \(result.stderr)") }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A file holding `text` (a join code or a bare token), so it is not on a command line.
    func file(_ text: String) throws -> String {
        let path = folder + "/code-\(UUID().uuidString.prefix(6))"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// A `k=twilio` join code naming this emulator.
    func code(identity: String, extra: [String] = []) throws -> String {
        try file("krakl:v=1;k=twilio;u=\(signalingURL);t=\(try token(identity: identity, extra: extra))")
    }

    /// `krakl-agent --join @file --once` in the namespace, sharing the typing scene at 640x360.
    /// `source`: the backend's options (nil: none, the screen's backend chooses).
    func agent(_ file: String, arguments: [String] = [], environment: [String: String] = [:],
               source: [String]? = ["--option", "scene=typing", "--option", "width=640", "--option", "height=360"]) throws -> DtlsTestProcess {
        var argv = ["--join", "@" + file, "--once", "--address", "127.0.0.2", "--plugins", registry] + (source ?? []) + arguments
        var program = Harness.agent
        if !environment.isEmpty {
            argv = environment.map { "\($0.key)=\($0.value)" } + [Harness.agent] + argv
            program = "/usr/bin/env"
        }
        let (command, full) = namespace.command(program, argv)
        return try DtlsTestProcess(command, full)
    }

    // MARK: REST (Twilio's shapes, HTTP Basic with the API key)

    @discardableResult
    func restCall(_ method: String, _ path: String, form: [String: String]? = nil) throws -> (status: Int, json: [String: Any]) {
        var headers = [(name: "Authorization", value: "Basic " + Data("\(Self.apiKeySid):\(secret)".utf8).base64EncodedString())]
        var body: Data?
        if let form {
            headers.append((name: "Content-Type", value: "application/x-www-form-urlencoded"))
            body = Data(form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")" }.joined(separator: "&").utf8)
        }
        let response = try rest.send(HTTPRequest(method: method, url: URL(string: "http://127.0.0.1:\(restPort)\(path)")!, headers: headers,
                                                 body: body, timeout: .seconds(10)))
        return (response.status, (try? JSONSerialization.jsonObject(with: response.body)) as? [String: Any] ?? [:])
    }

    /// The room's owner ends it: `POST /v1/Rooms/{name}` with `Status=completed`. Returns when (ms) it was asked.
    func complete() throws -> Double {
        let asked = MonotonicClock.milliseconds()
        let (status, json) = try restCall("POST", "/v1/Rooms/\(room)", form: ["Status": "completed"])
        #expect(status == 200 && json["status"] as? String == "completed", "completing the room: \(status) \(json)")
        return asked
    }

    /// The emulator's whole state (`GET /test/state`).
    func state() throws -> [String: Any] { try restCall("GET", "/test/state").json }

    /// The emulator's record of the participant with `identity` (the last one, if it joined twice).
    func participant(_ identity: String) throws -> [String: Any]? {
        (try state()["participants"] as? [[String: Any]] ?? []).last { $0["identity"] as? String == identity }
    }

    /// Polls (bounded) until the participant's record satisfies `condition`; returns the last record seen.
    func waitForParticipant(_ identity: String, timeout: Double = 20, _ condition: ([String: Any]) -> Bool) throws -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        var last: [String: Any]?
        while Date() < deadline {
            last = try participant(identity)
            if let last, condition(last) { return last }
            usleep(100_000)
        }
        return last
    }

    // MARK: Events

    /// Every event line of `kind` so far (JSON lines, read as the WHIP server's are).
    func events(_ kind: String) -> [[String: Any]] { WhipTestServer.events(process.log).filter { $0["event"] as? String == kind } }

    /// Waits (bounded) for an event of `kind`.
    func waitForEvent(_ kind: String, timeout: Double = 10) -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let found = events(kind).first { return found }
            _ = process.waitFor("\u{1}never\u{1}", timeout: 0.05)
        }
        return events(kind).first
    }

    static func frames(_ participant: [String: Any]?) -> [String: Any] { participant?["frames"] as? [String: Any] ?? [:] }

    /// Waits (bounded) until `count` more frames than now were decoded from `identity`: whether they
    /// were, and the frame record then (media going on through a reconnect or a renegotiation).
    func framesKeepComing(_ identity: String, count: Int = 30) throws -> (ok: Bool, frames: [String: Any]) {
        let before = Self.frames(try participant(identity))["decoded"] as? Int ?? 0
        let later = Self.frames(try waitForParticipant(identity) { (Self.frames($0)["decoded"] as? Int ?? 0) >= before + count })
        return ((later["decoded"] as? Int ?? 0) >= before + count, later)
    }

    static func waitExit(_ process: DtlsTestProcess, seconds: Double) -> Int32? {
        _ = process.waitForExit(seconds: seconds)
        return process.exitStatus
    }
}
