// krakl-bench room --service twilio: a Twilio access token to a picture in a Twilio room, and back.
//
//   swift build -c release && sudo .build/release/krakl-bench room --service twilio [--joins 10]
//
// The Twilio room emulator (Tests/Fixtures/twilio_room.py: TCMP + RSP v2 over a WebSocket as
// twilio-video.js speaks it, aiortc decoding) with its signaling and media in a namespace of the
// bench's own; tokens from Twilio's helper library. For each join a fresh
// `krakl-agent --join @code --once` shares the file backend's typing scene at 1920x1080. Where the
// time goes comes from the emulator's own event times (CLOCK_MONOTONIC, the bench's clock): the
// WebSocket open, hello → welcome, iced, connect received → connected sent, ICE+DTLS (aiortc's
// connection state), the first decoded frame. Then the room completed over REST → the agent's exit,
// and for a second agent SIGTERM → its `disconnect` at the emulator.
import Foundation
import Glibc
import KraklBase
import KraklHost

func runTwilioRoomBench(joins: Int) throws {
    installRtcSignalCleanup()
    let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let python = "/opt/krakl-venv/bin/python"
    guard FileManager.default.isExecutableFile(atPath: python) else { throw BenchError("\(python) missing: run scripts/setup") }
    let namespace = try BenchNamespace("krakl-bench-twilio-\(getpid())")
    defer { namespace.delete() }
    let (account, key, secret) = ("AC" + String(repeating: "0", count: 32), "SK" + String(repeating: "0", count: 32), "bench-secret")
    guard let emulator = BenchChild(python, [repo + "/Tests/Fixtures/twilio_room.py", "--account-sid", account, "--api-key-sid", key,
                                             "--api-key-secret", secret, "--netns", namespace.name, "--seconds", "1800"],
                                    out: work + "/twilio-room.out", err: work + "/twilio-room.err") else {
        throw BenchError("cannot start twilio_room.py")
    }
    defer { emulator.stop(grace: 2) }
    func events() -> [[String: Any]] {
        emulator.stdout.split(separator: "\n").compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
    }
    guard let ready = emulator.poll(timeout: 30, { _ in events().first { $0["event"] as? String == "ready" } }),
          let wsPort = ready["ws_port"] as? Int, let restPort = ready["rest_port"] as? Int else {
        throw BenchError("twilio_room.py did not start: \(emulator.stderr.suffix(800))")
    }
    func code(_ identity: String, room: String) throws -> String {
        let made = measure(python, [repo + "/Tests/Fixtures/twilio_token.py", "--account-sid", account, "--api-key-sid", key,
                                    "--api-key-secret", secret, "--identity", identity, "--room", room])
        guard made.status == 0 else { throw BenchError("twilio_token.py: \(made.stderr)") }
        let path = work + "/code-\(identity)"
        try "krakl:v=1;k=twilio;u=ws://127.0.0.1:\(wsPort)/signaling;t=\(made.stdout.trimmingCharacters(in: .whitespacesAndNewlines))"
            .write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
    func startAgent(_ codePath: String, tag: String) -> BenchChild? {
        BenchChild(BenchNamespace.ip, namespace.command(agent, ["--join", "@" + codePath, "--once", "--address", "127.0.0.2",
                                                                "--plugins", work + "/plugins.json", "--option", "scene=typing",
                                                                "--option", "width=1920", "--option", "height=1080"]),
                   out: work + "/agent-\(tag).out", err: work + "/agent-\(tag).err")
    }
    /// The first event of `kind` for `identity` (or on the connection that identity's connect came on) after `since`.
    func event(_ kind: String, after since: Double, _ match: ([String: Any]) -> Bool = { _ in true }) -> Double? {
        events().first { $0["event"] as? String == kind && ($0["t_ms"] as? Double ?? 0) >= since && match($0) }?["t_ms"] as? Double
    }

    print("krakl-bench room --service twilio: the Twilio room emulator in a namespace, krakl-agent --join (1080p typing, release build); \(joins) joins")
    print("join | agent start → WebSocket open | → hello | → welcome sent | → connect received | → connected sent | connected → ICE+DTLS up | → first frame decoded | start → first frame | completed → agent exit | SIGTERM → disconnect")
    var rows: [[Double]] = []
    for n in 1...joins {
        let room = "bench-\(n)-\(UInt32.random(in: 0...UInt32.max))"
        let codePath = try code("bench-\(n)", room: room)
        let t0 = MonotonicClock.milliseconds()
        guard let child = startAgent(codePath, tag: "\(n)") else { throw BenchError("cannot start krakl-agent") }
        let first = emulator.poll(timeout: 40) { _ in event("first-frame", after: t0) }
        let open = event("ws-open", after: t0), hello = event("hello", after: t0), welcome = event("welcome", after: t0)
        let connect = event("connect", after: t0), connected = event("connected", after: t0)
        let up = event("pc-state", after: t0) { $0["state"] as? String == "connected" }
        // The owner completes the room; the agent leaves and exits.
        let asked = MonotonicClock.milliseconds()
        let status = twilioRest(port: restPort, path: "/v1/Rooms/\(room)", body: "Status=completed", user: key, password: secret)
        _ = child.poll(timeout: 20) { _ in child.isRunning ? nil : true }
        let exited = MonotonicClock.milliseconds()
        child.stop(grace: 1)
        // A second agent in a new room, stopped by SIGTERM: when does the emulator see its disconnect?
        let stopRoom = room + "-stop"
        let t1 = MonotonicClock.milliseconds()
        guard let stopped = startAgent(try code("stop-\(n)", room: stopRoom), tag: "stop-\(n)") else { throw BenchError("cannot start krakl-agent") }
        _ = stopped.poll(timeout: 30) { $0.contains("sharing the screen") ? true : nil }
        let signalled = MonotonicClock.milliseconds()
        kill(stopped.pid, SIGTERM)
        let disconnect = emulator.poll(timeout: 10) { _ in event("disconnect", after: max(t1, signalled - 1)) }
        stopped.stop(grace: 5)
        func span(_ a: Double?, _ b: Double?) -> Double { (a != nil && b != nil) ? b! - a! : .nan }
        let row = [span(t0, open), span(open, hello), span(hello, welcome), span(welcome, connect), span(connect, connected),
                   span(connected, up), span(up, first), span(t0, first), status == 200 ? exited - asked : .nan, span(signalled, disconnect)]
        print(String(format: "%4d | %7.0f ms | %5.0f ms | %5.0f ms | %5.0f ms | %5.0f ms | %6.0f ms | %6.0f ms | %6.0f ms | %6.0f ms | %5.0f ms",
                     n, row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9]))
        rows.append(row)
    }
    func stats(_ column: Int) -> String {
        let v = rows.map { $0[column] }.filter { !$0.isNaN }.sorted()
        return String(format: "p50 %.0f ms, p99 %.0f ms (n=%d)", v.nearestRank(0.5) ?? .nan, v.nearestRank(0.99) ?? .nan, v.count)
    }
    let tokenToConnected = rows.map { $0[0] + $0[1] + $0[2] + $0[3] + $0[4] }
    let sorted = tokenToConnected.filter { !$0.isNaN }.sorted()
    print(String(format: "agent start → connected sent (token → connected): p50 %.0f ms, p99 %.0f ms (n=%d)",
                 sorted.nearestRank(0.5) ?? .nan, sorted.nearestRank(0.99) ?? .nan, sorted.count))
    print("agent start → first frame decoded at the room: \(stats(7))")
    print("  of which connected → ICE+DTLS up: \(stats(5)); ICE+DTLS up → first frame decoded: \(stats(6))")
    print("room completed (REST POST sent) → agent exited: \(stats(8))")
    print("SIGTERM → disconnect received by the emulator: \(stats(9))")
}

/// One form POST with HTTP Basic to the emulator's REST on 127.0.0.1 (a raw socket: the bench
/// links no HTTP client). Returns the status, or -1.
func twilioRest(port: Int, path: String, body: String, user: String, password: String) -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return -1 }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var timeout = timeval(tv_sec: 10, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard connected == 0 else { return -1 }
    let credentials = Data("\(user):\(password)".utf8).base64EncodedString()
    let request = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAuthorization: Basic \(credentials)\r\n"
        + "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
    let bytes = Array(request.utf8)
    guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == bytes.count else { return -1 }
    var reply = [UInt8](repeating: 0, count: 64)
    let n = recv(fd, &reply, reply.count, 0)
    guard n > 12 else { return -1 }
    return Int(String(decoding: reply[9..<12], as: UTF8.self)) ?? -1
}
