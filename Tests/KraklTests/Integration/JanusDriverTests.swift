import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklRoom
import KraklRTC
import Testing

/// Janus 1.1.2 (scripts/janus-testbed) in the test's own network namespace,
/// started and driven from inside it (the test runs there through
/// InNamespace). The room's host side — create, listparticipants, destroy,
/// kick — is spoken by the test with plain JSON dictionaries, not with the
/// driver's message types, so the driver is checked against Janus and not
/// against itself.
final class JanusTestbed {
    static var script: String { Harness.repoRoot + "/scripts/janus-testbed" }
    static let api = URL(string: "http://127.0.0.1:8088/janus")!

    let folder: String
    private let http = HTTPClient()
    private var host: (session: UInt64, handle: UInt64)?

    /// Starts Janus; the caller is inside a namespace. nil after SKIP when Janus is not installed.
    static func start(in folder: String) throws -> JanusTestbed? {
        guard Harness.which("janus") != nil || FileManager.default.isExecutableFile(atPath: "/usr/bin/janus") else {
            skipTest("janus missing (scripts/setup installs it)")
            return nil
        }
        let bed = JanusTestbed(folder: folder + "/janus")
        let started = try Harness.run("/bin/bash", [script, "start", bed.folder], timeout: 20)
        try #require(started.status == 0, "Janus did not start: \(started.stderr)")
        return bed
    }

    /// Starts Janus with core token auth (`token_auth`, HMAC-signed tokens
    /// with `secret`): the testbed's config, edited, and Janus started again
    /// with the script's own command line.
    static func start(in folder: String, tokenSecret secret: String) throws -> JanusTestbed? {
        guard let bed = try start(in: folder) else { return nil }
        bed.stop()
        let path = bed.folder + "/janus.jcfg"
        var config = try String(contentsOfFile: path, encoding: .utf8)
        for (from, to) in [("#token_auth = true", "token_auth = true"), ("#token_auth_secret = \"janus\"", "token_auth_secret = \"\(secret)\"")] {
            try #require(config.contains(from), "janus.jcfg has no \(from)")
            config = config.replacingOccurrences(of: from, with: to)
        }
        try config.write(toFile: path, atomically: true, encoding: .utf8)
        // As scripts/janus-testbed does: the daemon must keep none of our descriptors (Harness.run waits for its pipes to close).
        let f = bed.folder
        let command = "for fd in $(ls /proc/$$/fd); do (( fd > 2 )) && eval \"exec $fd>&-\"; done; "
            + "exec janus -C \(f)/janus.jcfg -F \(f) -b -p \(f)/janus.pid -L \(f)/janus.log -N </dev/null >/dev/null 2>&1"
        _ = try Harness.run("/bin/bash", ["-c", command], timeout: 20)
        let deadline = Date().addingTimeInterval(5)
        var ready = false
        while !ready && Date() < deadline {
            ready = (try? bed.http.send(HTTPRequest(method: "GET", url: api.appendingPathComponent("info"), timeout: .seconds(0.5))))?.status == 200
            if !ready { usleep(50_000) }
        }
        try #require(ready, "Janus with token auth did not answer: \((try? String(contentsOfFile: f + "/janus.log", encoding: .utf8)) ?? "")")
        return bed
    }

    /// A Janus signed token (auth.c: "expiry,janus,plugin:base64(HMAC-SHA1)"), made by Python's hmac, not by us.
    static func signedToken(secret: String, validFor seconds: Int = 600) throws -> String {
        // Of the expiry times a few seconds apart, the first whose signature has a "+" (which a query must escape).
        let script = "import base64,hashlib,hmac,sys,time\n"
            + "sign = lambda d: d + ':' + base64.b64encode(hmac.new(sys.argv[1].encode(), d.encode(), hashlib.sha1).digest()).decode()\n"
            + "tokens = [sign('%d,janus,janus.plugin.videoroom' % (int(time.time()) + int(sys.argv[2]) + i)) for i in range(200)]\n"
            + "print(next((t for t in tokens if '+' in t.split(':')[1]), tokens[0]))"
        let made = try Harness.run("/usr/bin/python3", ["-c", script, secret, "\(seconds)"], timeout: 20)
        try #require(made.status == 0, "python3: \(made.stderr)")
        return made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Sent as the core `token` by the host side too, when Janus requires one.
    var token: String?

    private init(folder: String) { self.folder = folder }

    deinit { http.invalidate() }

    /// Outside, after the child: stops a Janus the child left running.
    static func stopLeftovers(_ namespace: RtcTestNamespace, _ folder: String) {
        _ = try? namespace.run("/bin/bash", [script, "stop", folder + "/janus"])
    }

    func stop() {
        _ = try? Harness.run("/bin/bash", [Self.script, "stop", folder], timeout: 20)
    }

    var pid: pid_t? {
        (try? String(contentsOfFile: folder + "/janus.pid", encoding: .utf8)).flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// One POST to the API with a JSON object; the reply as a dictionary.
    func call(_ path: String, _ body: [String: Any]) throws -> [String: Any] {
        var body = body
        body["transaction"] = UUID().uuidString
        if let token { body["token"] = token }
        let data = try JSONSerialization.data(withJSONObject: body)
        let url = path.isEmpty ? Self.api : Self.api.appendingPathComponent(path)
        let reply = try http.send(HTTPRequest(method: "POST", url: url, headers: [(name: "Content-Type", value: "application/json")], body: data, timeout: .seconds(5)))
        return try #require(try JSONSerialization.jsonObject(with: reply.body) as? [String: Any], "not JSON: \(reply.firstLine)")
    }

    /// A synchronous VideoRoom request on the host's own handle: `plugindata.data`.
    func videoroom(_ body: [String: Any]) throws -> [String: Any] {
        if host == nil {
            let session = try #require((try call("", ["janus": "create"])["data"] as? [String: Any])?["id"] as? UInt64)
            let handle = try #require((try call("\(session)", ["janus": "attach", "plugin": "janus.plugin.videoroom"])["data"] as? [String: Any])?["id"] as? UInt64)
            host = (session, handle)
        }
        let (session, handle) = host!
        let reply = try call("\(session)/\(handle)", ["janus": "message", "body": body])
        return try #require((reply["plugindata"] as? [String: Any])?["data"] as? [String: Any], "VideoRoom reply: \(reply)")
    }

    /// A room of the test's own: a realistic bitrate (the stock room caps at 128 kbit/s) and a secret.
    func createRoom(secret: String) throws -> UInt64 {
        let room = UInt64.random(in: 100_000...999_999)
        let created = try videoroom(["request": "create", "room": room, "secret": secret, "bitrate": 2_500_000, "publishers": 4, "videocodec": "vp8"])
        try #require(created["videoroom"] as? String == "created", "create: \(created)")
        return room
    }

    func participants(_ room: UInt64) throws -> [[String: Any]] {
        let listed = try videoroom(["request": "listparticipants", "room": room])
        return listed["participants"] as? [[String: Any]] ?? []
    }

    /// Polls listparticipants until `done` (bounded).
    func waitParticipants(_ room: UInt64, seconds: Double, until done: ([[String: Any]]) -> Bool) throws -> [[String: Any]] {
        let deadline = Date().addingTimeInterval(seconds)
        var listed = try participants(room)
        while !done(listed) && Date() < deadline {
            usleep(20_000)
            listed = try participants(room)
        }
        return listed
    }

    /// Whether Janus still has a session: a keepalive is acked, or refused with 458.
    func sessionExists(_ session: UInt64) throws -> Bool {
        let reply = try call("\(session)", ["janus": "keepalive"])
        if reply["janus"] as? String == "ack" { return true }
        let code = (reply["error"] as? [String: Any])?["code"] as? Int
        try #require(code == 458, "keepalive: \(reply)")
        return false
    }
}

/// The driver's events with their arrival time.
final class RoomEventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [(event: RoomEvent, ms: Double)] = []
    var events: [RoomEvent] { lock.lock(); defer { lock.unlock() }; return items.map(\.event) }
    var first: (event: RoomEvent, ms: Double)? { lock.lock(); defer { lock.unlock() }; return items.first }
    func add(_ event: RoomEvent) { lock.lock(); items.append((event, MonotonicClock.milliseconds())); lock.unlock() }

    func wait(seconds: Double) -> (event: RoomEvent, ms: Double)? {
        let deadline = Date().addingTimeInterval(seconds)
        while first == nil && Date() < deadline { usleep(2_000) }
        return first
    }
}

/// One number set from another thread (a measurement inside a callback).
final class MeasuredValue: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Double?
    func set(_ new: Double) { lock.lock(); value = new; lock.unlock() }
    func wait(seconds: Double) -> Double? {
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            lock.lock()
            let current = value
            lock.unlock()
            if current != nil || Date() >= deadline { return current }
            usleep(2_000)
        }
    }
}

/// A KraklRTC publisher on 127.0.0.2: a real offer, and a real ICE/DTLS peer for Janus.
struct JanusTestPublisher {
    let publisher: Publisher
    let log = RtcCallbackLog()

    init() throws {
        var configuration = PublisherConfiguration()
        configuration.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.2")!])
        publisher = try Publisher(configuration: configuration)
        let log = self.log
        publisher.onEvent = { log.event($0) }
    }

    func waitConnected(seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !log.connected && Date() < deadline { usleep(5_000) }
        return log.connected
    }

    func waitRemoteClosed(seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !log.events.contains(.remoteClosed) && Date() < deadline { usleep(5_000) }
        return log.events.contains(.remoteClosed)
    }
}

func openDescriptorCount() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1 }
/// What each open descriptor is (socket:[…], anon_inode:[eventfd], a path), for reports.
func openDescriptors() -> [String] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return names.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0) }
}
func threadCount() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? -1 }

@Suite(.serialized, .tags(.integration, .netns)) struct JanusDriverTests {
    static let suite = "JanusDriverTests"
    static let secret = "host-secret-\(UUID().uuidString.prefix(8))"

    /// A fresh room, and a publisher connected to it through a fresh driver whose events are logged.
    /// The caller closes the publisher.
    static func joined(_ janus: JanusTestbed, identity: String, timeouts: JanusDriver.Timeouts = JanusDriver.Timeouts()) throws
        -> (room: UInt64, peer: JanusTestPublisher, driver: JanusDriver, events: RoomEventLog) {
        let room = try janus.createRoom(secret: secret)
        let peer = try JanusTestPublisher()
        let driver = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)", timeouts: timeouts)
        let events = RoomEventLog()
        driver.onEvent = { events.add($0) }
        do {
            try peer.publisher.setAnswer(try driver.publish(offer: peer.publisher.offerSDP, identity: identity).sdp)
        } catch {
            peer.publisher.close()
            throw error
        }
        #expect(peer.waitConnected(), "not connected: \(peer.log.events)")
        return (room, peer, driver, events)
    }

    /// "socket:[inode]" → which table lists it (tcp, udp, unix, netlink), for the descriptor report.
    static func describeSocket(_ link: String) -> String {
        guard link.hasPrefix("socket:["), let inode = link.dropFirst(8).split(separator: "]").first else { return link }
        for table in ["tcp", "tcp6", "udp", "udp6", "unix", "netlink"] {
            let text = procText("/proc/self/net/" + table)
            if let line = text.split(separator: "\n").first(where: { $0.split(separator: " ").contains(Substring(inode)) }) {
                return "\(table): \(line.split(separator: " ").prefix(4).joined(separator: " "))"
            }
        }
        return link
    }

    /// Times a call in milliseconds.
    static func timed<T>(_ body: () throws -> T) rethrows -> (T, Double) {
        let start = MonotonicClock.milliseconds()
        let value = try body()
        return (value, MonotonicClock.milliseconds() - start)
    }

    @Test func publishesIsListedWithItsIdentityRestartsAndLeavesEverything() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        let room = try janus.createRoom(secret: Self.secret)
        let peer = try JanusTestPublisher()
        defer { peer.publisher.close() }
        let driver = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)")
        let events = RoomEventLog()
        driver.onEvent = { events.add($0) }
        let identity = "Ada's screen"

        let (answer, publishMs) = try Self.timed { try driver.publish(offer: peer.publisher.offerSDP, identity: identity) }
        #expect(answer.sdp.contains("a=setup:active") && answer.sdp.contains("VP8"), "Janus's answer: \(answer.sdp)")
        try peer.publisher.setAnswer(answer.sdp)
        #expect(peer.waitConnected(), "not connected through Janus: \(peer.log.events)")

        let listed = try janus.waitParticipants(room, seconds: 5) { $0.contains { $0["publisher"] as? Bool == true } }
        #expect(listed.count == 1 && listed.first?["display"] as? String == identity && listed.first?["publisher"] as? Bool == true,
                "listparticipants: \(listed)")
        let session = try #require(driver.sessionForTests)
        print(String(format: "Janus: create→answer %.0f ms, connected %@ ms after the answer; listed %@", publishMs,
                     "\(peer.publisher.stats.connectMilliseconds ?? -1)", "\(listed)"))

        // ICE restart: a configure with the restarted offer; Janus answers with fresh credentials of its own.
        let firstUfrag = try #require(answer.sdp.split(whereSeparator: \.isNewline).first { $0.hasPrefix("a=ice-ufrag:") })
        let restarted = try driver.restart(offer: peer.publisher.restartIce())
        let secondUfrag = try #require(restarted.split(whereSeparator: \.isNewline).first { $0.hasPrefix("a=ice-ufrag:") })
        #expect(firstUfrag != secondUfrag, "Janus answered the restart with its old ICE credentials")
        try peer.publisher.setAnswer(restarted)
        let afterRestart = try janus.waitParticipants(room, seconds: 5) { $0.contains { $0["publisher"] as? Bool == true } }
        #expect(afterRestart.count == 1, "after the restart: \(afterRestart)")

        // A trickled candidate and the end of candidates are accepted (best effort, no throw).
        driver.trickle(candidate: "candidate:1 1 udp 2130706431 127.0.0.2 9 typ host", mid: "0")
        driver.endOfCandidates()

        let ((), leaveMs) = Self.timed { driver.leave() }
        print(String(format: "leave: %.0f ms", leaveMs))
        #expect(leaveMs < 20_000, "a hang guard (10x leave's 2 s budget): \(leaveMs) ms")
        let gone = try janus.waitParticipants(room, seconds: 2) { $0.isEmpty }
        #expect(gone.isEmpty, "still listed after leave: \(gone)")
        #expect(try janus.sessionExists(session) == false, "leave did not destroy the Janus session")
        #expect(events.events.isEmpty, "our own leave must not be reported as an end: \(events.events)")
        driver.leave()  // idempotent
    }

    @Test func theHostDestroyingTheRoomEndsItOnceWithinTwoSeconds() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        let (room, peer, driver, events) = try Self.joined(janus, identity: "Grace")
        defer { peer.publisher.close() }
        let session = try #require(driver.sessionForTests)

        let destroyedAt = MonotonicClock.milliseconds()
        let destroyed = try janus.videoroom(["request": "destroy", "room": room, "secret": Self.secret])
        #expect(destroyed["videoroom"] as? String == "destroyed", "destroy: \(destroyed)")
        let end = try #require(events.wait(seconds: 2), "no room event within 2 s of destroy")
        print(String(format: "room destroyed → onEvent %.1f ms", end.ms - destroyedAt))
        #expect(end.event == .roomEnded(reason: "the meeting was ended"))
        // Janus then closes DTLS and hangs up the PeerConnection ("Close PC"): that hangup is explained, not a second end.
        #expect(peer.waitRemoteClosed(seconds: 3), "no close_notify from Janus: \(peer.log.events)")
        let settle = Date().addingTimeInterval(1)
        while events.events.count == 1 && Date() < settle { usleep(10_000) }
        #expect(events.events == [.roomEnded(reason: "the meeting was ended")], "events: \(events.events)")

        let ((), leaveMs) = Self.timed { driver.leave() }
        print(String(format: "leave after the room ended: %.0f ms", leaveMs))
        #expect(leaveMs < 20_000, "a hang guard (10x leave's 2 s budget): \(leaveMs) ms")
        #expect(try janus.sessionExists(session) == false)
    }

    @Test func aKickEndsItAsRemovedFromTheMeeting() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        let (room, peer, driver, events) = try Self.joined(janus, identity: "Linus")
        defer { peer.publisher.close() }
        let listed = try janus.waitParticipants(room, seconds: 5) { $0.contains { $0["publisher"] as? Bool == true } }
        let id = try #require(listed.first?["id"] as? UInt64, "listparticipants: \(listed)")

        let kickedAt = MonotonicClock.milliseconds()
        let kicked = try janus.videoroom(["request": "kick", "room": room, "secret": Self.secret, "id": id])
        #expect(kicked["videoroom"] as? String == "success", "kick: \(kicked)")
        let end = try #require(events.wait(seconds: 2), "no room event within 2 s of the kick")
        print(String(format: "kicked → onEvent %.1f ms", end.ms - kickedAt))
        #expect(end.event == .roomEnded(reason: "removed from the meeting"))
        let settle = Date().addingTimeInterval(1)
        while events.events.count == 1 && Date() < settle { usleep(10_000) }
        #expect(events.events.count == 1, "events: \(events.events)")
        let ((), leaveMs) = Self.timed { driver.leave() }
        print(String(format: "leave after the kick: %.0f ms", leaveMs))
        #expect(leaveMs < 20_000, "a hang guard (10x leave's 2 s budget): \(leaveMs) ms")
    }

    @Test func unknownRoomsAndAbsentOrSilentServersGiveTypedErrors() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        let peer = try JanusTestPublisher()
        defer { peer.publisher.close() }

        // A numeric room that does not exist: Janus's 426, in its words.
        let missing = JanusDriver(baseURL: JanusTestbed.api, room: "424242")
        #expect {
            _ = try missing.publish(offer: peer.publisher.offerSDP, identity: "Ada")
        } throws: { error in
            guard case .noSuchRoom(426, let message) = error as? RoomError else { return false }
            print("no such room: \(error)")
            return message.contains("424242")
        }
        let session = try #require(missing.sessionForTests)
        missing.leave()
        #expect(try janus.sessionExists(session) == false, "leave after a failed join left the session")

        // A string room on a numeric-id Janus: refused, with Janus's reason.
        let named = JanusDriver(baseURL: JanusTestbed.api, room: "lobby")
        #expect {
            _ = try named.publish(offer: peer.publisher.offerSDP, identity: "Ada")
        } throws: { error in
            print("string room: \(error)")
            if case .refused = error as? RoomError { return true }
            return false
        }
        named.leave()

        // Wrong path: no Janus API there.
        let wrongPath = JanusDriver(baseURL: URL(string: "http://127.0.0.1:8088/nothing")!, room: "1")
        #expect { _ = try wrongPath.publish(offer: peer.publisher.offerSDP, identity: "Ada") } throws: { error in
            print("wrong path: \(error)")
            return (error as? RoomError).map { if case .noSuchRoom(404, _) = $0 { return true } else { return false } } ?? false
        }
        wrongPath.leave()

        // Janus hung (SIGSTOP): the step that timed out is named, within the time-out.
        let pid = try #require(janus.pid)
        var quick = JanusDriver.Timeouts()
        quick.request = .seconds(1)
        kill(pid, SIGSTOP)
        // kill() returns before every thread has stopped; a loaded CI run once had Janus answer
        // "create" after it. Wait (bounded) until each of its threads shows state T.
        let stopDeadline = Date().addingTimeInterval(5)
        func allStopped() -> Bool {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            return !tasks.isEmpty && tasks.allSatisfy { procText("/proc/\(pid)/task/\($0)/stat").contains(") T ") }
        }
        while !allStopped() && Date() < stopDeadline { usleep(5_000) }
        #expect(allStopped(), "Janus (pid \(pid)) did not stop")
        let hung = JanusDriver(baseURL: JanusTestbed.api, room: "1", timeouts: quick)
        let (hungError, hungMs) = Self.timed { () -> RoomError? in
            do { _ = try hung.publish(offer: peer.publisher.offerSDP, identity: "Ada"); return nil } catch { return error as? RoomError }
        }
        kill(pid, SIGCONT)
        print(String(format: "Janus stopped (SIGSTOP): %@ after %.0f ms", "\(hungError.map { "\($0)" } ?? "no error")", hungMs))
        if case .unreachable(let message) = hungError {
            #expect(message.contains("create a Janus session") && message.contains("1 s"), "\(message)")
        } else {
            Issue.record("expected .unreachable, got \(String(describing: hungError))")
        }
        #expect(hungMs < 10_000, "a hang guard (10x the 1 s time-out): \(hungMs) ms")
        hung.leave()

        // Janus gone: connection refused at once.
        janus.stop()
        let absent = JanusDriver(baseURL: JanusTestbed.api, room: "1", timeouts: quick)
        let (absentError, absentMs) = Self.timed { () -> RoomError? in
            do { _ = try absent.publish(offer: peer.publisher.offerSDP, identity: "Ada"); return nil } catch { return error as? RoomError }
        }
        print(String(format: "Janus gone: %@ after %.0f ms", "\(absentError.map { "\($0)" } ?? "no error")", absentMs))
        if case .unreachable(let message) = absentError {
            #expect(message.contains("create a Janus session"), "\(message)")
        } else {
            Issue.record("expected .unreachable, got \(String(describing: absentError))")
        }
        let ((), leaveMs) = Self.timed { absent.leave() }
        #expect(leaveMs < 20_000, "a hang guard (10x leave's 2 s budget): \(leaveMs) ms")
    }

    @Test func janusGoingAwayMidShareIsConnectionLostAndLeaveStaysBounded() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        var timeouts = JanusDriver.Timeouts()
        timeouts.lostContact = .seconds(2)
        let (_, peer, driver, events) = try Self.joined(janus, identity: "Ada", timeouts: timeouts)
        defer { peer.publisher.close() }

        let stoppedAt = MonotonicClock.milliseconds()
        let pid = try #require(janus.pid)
        kill(pid, SIGKILL)  // no goodbye: the long-poll's connection just breaks
        let end = try #require(events.wait(seconds: 6), "no event after Janus died")
        print(String(format: "Janus killed → onEvent %.0f ms: %@", end.ms - stoppedAt, "\(end.event)"))
        guard case .connectionLost(let reason) = end.event else {
            Issue.record("expected connection-lost, got \(end.event)")
            return
        }
        #expect(reason.contains("lost contact"), "\(reason)")
        let ((), leaveMs) = Self.timed { driver.leave() }
        print(String(format: "leave with Janus gone: %.0f ms", leaveMs))
        #expect(leaveMs < 20_000, "a hang guard (10x leave's 2 s budget): \(leaveMs) ms")
        #expect(events.events.count == 1)
    }

    @Test func leaveIsBoundedWhenJanusHangsAndWorksFromTheEventHandler() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        // Janus stops answering mid-share (SIGSTOP): leave gives up within its 2 s.
        let (room, peer, driver, _) = try Self.joined(janus, identity: "Ada")
        defer { peer.publisher.close() }
        let pid = try #require(janus.pid)
        kill(pid, SIGSTOP)
        let ((), hungMs) = Self.timed { driver.leave() }
        kill(pid, SIGCONT)
        print(String(format: "leave with Janus hung: %.0f ms", hungMs))
        #expect(hungMs < 20_000, "a hang guard (10x leave's 2 s budget): leave took \(hungMs) ms with Janus hung")

        // The owner may leave from inside onEvent (the poll thread): no self-wait.
        let second = try JanusTestPublisher()
        defer { second.publisher.close() }
        let other = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)")
        let events = RoomEventLog()
        let leftMs = MeasuredValue()
        other.onEvent = { [unowned other] event in
            events.add(event)
            let start = MonotonicClock.milliseconds()
            other.leave()
            leftMs.set(MonotonicClock.milliseconds() - start)
        }
        try second.publisher.setAnswer(try other.publish(offer: second.publisher.offerSDP, identity: "Grace").sdp)
        #expect(second.waitConnected(), "not connected: \(second.log.events)")
        let session = try #require(other.sessionForTests)
        _ = try janus.videoroom(["request": "destroy", "room": room, "secret": Self.secret])
        #expect(events.wait(seconds: 2)?.event == .roomEnded(reason: "the meeting was ended"))
        let left = try #require(leftMs.wait(seconds: 3), "leave inside onEvent did not return")
        print(String(format: "leave inside onEvent: %.0f ms", left))
        #expect(left < 1_000, "leave on the poll thread waited for itself")
        #expect(try janus.sessionExists(session) == false)
    }

    @Test func aJanusRequiringATokenGetsItOnlyWhenToldToSendIt() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        let secret = "krakl-\(UUID().uuidString.prefix(8))"
        guard let janus = try JanusTestbed.start(in: inside.folder, tokenSecret: secret) else { return }
        defer { janus.stop() }
        let token = try JanusTestbed.signedToken(secret: secret)
        #expect(token.contains("+"), "the test wants a token that needs escaping: \(token.prefix(8))…")
        janus.token = token
        let room = try janus.createRoom(secret: Self.secret)
        let peer = try JanusTestPublisher()
        defer { peer.publisher.close() }

        // The token is there but not sent (the default): Janus's 403, as unauthorized.
        let silent = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)", token: token)
        #expect { _ = try silent.publish(offer: peer.publisher.offerSDP, identity: "Ada") } throws: { error in
            print("token not sent: \(error)")
            guard case .unauthorized(403, let message) = error as? RoomError else { return false }
            return !message.contains(token) && !"\(error)".contains(String(token.suffix(20)))
        }
        silent.leave()

        // A token signed with another secret: refused the same way.
        let forged = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)", token: try JanusTestbed.signedToken(secret: "not-\(secret)"), sendToken: true)
        #expect { _ = try forged.publish(offer: peer.publisher.offerSDP, identity: "Ada") } throws: { error in
            if case .unauthorized(403, _) = error as? RoomError { return true }
            return false
        }
        forged.leave()

        // Sent: every request and the long-poll (as ?token=, base64 with + / =) carry it; the join completes.
        let driver = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)", token: token, sendToken: true)
        let events = RoomEventLog()
        driver.onEvent = { events.add($0) }
        try peer.publisher.setAnswer(try driver.publish(offer: peer.publisher.offerSDP, identity: "Ada").sdp)
        #expect(peer.waitConnected(), "not connected: \(peer.log.events)")
        let listed = try janus.waitParticipants(room, seconds: 5) { $0.contains { $0["publisher"] as? Bool == true } }
        #expect(listed.first?["display"] as? String == "Ada", "\(listed)")
        let session = try #require(driver.sessionForTests)
        driver.leave()
        #expect(try janus.sessionExists(session) == false)
        #expect(events.events.isEmpty, "the long-poll was refused? \(events.events)")
    }

    @Test func twentyJoinLeaveCyclesLeaveDescriptorsThreadsAndSessionsAsTheyWere() throws {
        guard let inside = try InNamespace.enter(suite: Self.suite, cleanup: JanusTestbed.stopLeftovers) else { return }
        guard let janus = try JanusTestbed.start(in: inside.folder) else { return }
        defer { janus.stop() }
        let room = try janus.createRoom(secret: Self.secret)

        func cycle(_ n: Int) throws -> (session: UInt64, ms: Double) {
            let peer = try JanusTestPublisher()
            defer { peer.publisher.close() }
            let driver = JanusDriver(baseURL: JanusTestbed.api, room: "\(room)")
            let start = MonotonicClock.milliseconds()
            try peer.publisher.setAnswer(try driver.publish(offer: peer.publisher.offerSDP, identity: "cycle \(n)").sdp)
            #expect(peer.waitConnected(), "cycle \(n): not connected: \(peer.log.events)")
            let ms = MonotonicClock.milliseconds() - start
            let session = try #require(driver.sessionForTests)
            driver.leave()
            return (session, ms)
        }

        let before = (fds: openDescriptorCount(), threads: threadCount())
        let descriptorsBefore = openDescriptors()
        // One cycle first: URLSession, libcurl and Dispatch set up what they keep for the process.
        _ = try cycle(0)
        let settle = { (limit: Int) in
            let deadline = Date().addingTimeInterval(10)
            while threadCount() > limit && Date() < deadline { usleep(50_000) }
        }
        settle(0)
        let baseline = (fds: openDescriptorCount(), threads: threadCount())
        var sessions: [UInt64] = []
        var joins: [Double] = []
        for n in 1...20 {
            let (session, ms) = try cycle(n)
            sessions.append(session)
            joins.append(ms)
        }
        let gone = try janus.waitParticipants(room, seconds: 2) { $0.isEmpty }
        #expect(gone.isEmpty, "participants after 20 leaves: \(gone)")
        let alive = try sessions.filter { try janus.sessionExists($0) }
        #expect(alive.isEmpty, "Janus sessions left: \(alive.count) of 20")
        // Dispatch's worker threads idle out on their own schedule: wait (bounded) for them.
        settle(baseline.threads)
        let after = (fds: openDescriptorCount(), threads: threadCount())
        var kept = openDescriptors()
        for name in descriptorsBefore { if let i = kept.firstIndex(of: name) { kept.remove(at: i) } }
        print("before any driver: fds \(before.fds), threads \(before.threads); after the first cycle: fds \(baseline.fds), threads \(baseline.threads); kept by the first cycle: \(kept.map(Self.describeSocket))")
        print("20 cycles: fds \(baseline.fds) → \(after.fds), threads \(baseline.threads) → \(after.threads); publish+connect ms p50 \(Int(joins.sorted().nearestRank(0.5) ?? -1)) max \(Int(joins.max() ?? -1))")
        #expect(after.fds <= baseline.fds, "descriptors \(baseline.fds) → \(after.fds)")
        #expect(after.threads <= baseline.threads, "threads \(baseline.threads) → \(after.threads)")
    }
}
