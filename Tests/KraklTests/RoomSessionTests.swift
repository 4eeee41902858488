import Foundation
import Glibc
import KraklCore
import Testing

/// `krakl-agent --join` end to end against a real room: Janus VideoRoom in
/// the test's own network namespace (scripts/janus-testbed), a join code
/// made by the independent Python generator, an aiortc subscriber through
/// Janus that decodes the published frames, and the room's host
/// (Tests/Fixtures/janus_host.py) ending the meeting or removing us.
@Suite(.serialized) struct RoomSessionTests {
    static var hostScript: String { Harness.repoRoot + "/Tests/Fixtures/janus_host.py" }
    static var codeScript: String { Harness.repoRoot + "/Tests/Fixtures/make_join_code.py" }

    /// A namespace with Janus running and a room made, or nil after SKIP.
    final class JanusRoom {
        let namespace: RtcTestNamespace
        let folder: String
        let registry: String
        let room = Int.random(in: 10_000...99_999)
        let secret = "host-secret"

        init?() throws {
            guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return nil }
            guard Harness.which("janus") != nil else {
                print("SKIP: janus missing (scripts/setup installs it)")
                return nil
            }
            self.namespace = namespace
            folder = try Harness.temporaryDirectory()
            registry = try Harness.registryForThisBuild(in: folder)
            let started = try namespace.run("/bin/bash", [RTCJanusTests.testbed, "start", folder + "/janus"])
            try #require(started.status == 0, "Janus did not start: \(started.stderr)")
            let created = try host(["create"])
            try #require(created["created"] as? String == "created", "room not created: \(created)")
        }

        deinit { _ = try? namespace.run("/bin/bash", [RTCJanusTests.testbed, "stop", folder + "/janus"]) }

        /// One janus_host.py command in the namespace; its JSON line.
        @discardableResult
        func host(_ arguments: [String], timeout: Double = 60) throws -> [String: Any] {
            let (program, argv) = namespace.command(RtcPublisherSession.python, [RoomSessionTests.hostScript] + arguments
                                                    + ["--room", "\(room)", "--secret", secret])
            let result = try Harness.run(program, argv, timeout: timeout)
            let line = result.stdout.split(separator: "\n").last.map(String.init) ?? ""
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? ["stderr": result.stderr]
        }

        /// A join code for this room, written to a file (so it is not in ps).
        func codeFile(identity: String) throws -> (path: String, token: String) {
            let made = try Harness.run("/usr/bin/python3", [RoomSessionTests.codeScript, "--kind", "janus", "--url", "http://127.0.0.1:8088/janus",
                                                           "--room", "\(room)", "--identity", identity, "--secret", "conference-secret",
                                                           "--print", "json"])
            let object = try #require(try JSONSerialization.jsonObject(with: Data(made.stdout.utf8)) as? [String: Any], "generator: \(made.stderr)")
            let code = try #require(object["code"] as? String), token = try #require(object["token"] as? String)
            let path = folder + "/code-\(UUID().uuidString.prefix(6))"
            try code.write(toFile: path, atomically: true, encoding: .utf8)
            return (path, token)
        }

        /// The agent sharing the typing scene into this room.
        func agent(codeFile: String) throws -> DtlsTestProcess {
            let (program, argv) = namespace.command(Harness.agent, ["--join", "@" + codeFile, "--once", "--address", "127.0.0.2",
                                                                    "--plugins", registry, "--option", "scene=typing",
                                                                    "--option", "width=640", "--option", "height=360"])
            return try DtlsTestProcess(program, argv)
        }
    }

    static func waitExit(_ process: DtlsTestProcess, seconds: Double) -> (status: Int32?, ms: Double) {
        let start = MonotonicClock.milliseconds()
        _ = process.waitForExit(seconds: seconds)
        return (process.exitStatus, MonotonicClock.milliseconds() - start)
    }

    @Test(arguments: ["destroy", "kick"])
    func theHostEndingTheMeetingEndsTheShare(how: String) throws {
        guard let room = try JanusRoom() else { return }
        let identity = "Ada's screen"
        let (code, token) = try room.codeFile(identity: identity)
        let agent = try room.agent(codeFile: code)
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log)")

        let watched = try room.host(["watch", "--display", identity, "--seconds", "3"])
        let participants = watched["participants"] as? [[String: Any]] ?? []
        let decoded = watched["frames_decoded"] as? Int ?? 0
        #expect(participants.contains { $0["display"] as? String == identity && $0["publisher"] as? Bool == true },
                "listparticipants: \(participants)")
        #expect(decoded >= 45, "the subscriber decoded \(decoded) frames in 3 s through Janus: \(watched)")
        #expect(watched["decreasing"] as? Int == 0, "frame stamps went backwards: \(watched)")
        #expect((watched["stamps_read"] as? Int ?? 0) >= decoded * 9 / 10, "stamps unreadable: \(watched)")

        let ended = try room.host(["end", "--how", how, "--display", identity])
        #expect(ended["result"] as? String == (how == "destroy" ? "destroyed" : "success"), "\(ended)")
        let (status, _) = Self.waitExit(agent, seconds: 10)
        let ms = (agent.exitedAtMs ?? .infinity) - (ended["t_ms"] as? Double ?? 0)
        print(String(format: "room %@: the agent left and exited %.0f ms after the host's request; subscriber decoded %d frames in 3 s",
                     how, ms, decoded))
        #expect(status == 30, "exit status \(status.map(String.init) ?? "none") (30 = room ended): \(agent.log.suffix(600))")
        #expect(ms <= 2000, "the agent took \(ms) ms to end after the room ended")
        let words = how == "destroy" ? "the meeting was ended" : "removed from the meeting"
        #expect(agent.log.contains("Sharing was ended by the room: \(words)."), "\(agent.log.suffix(400))")
        let signature = String(token.split(separator: ".").last ?? "")
        #expect(signature.count > 20 && !agent.log.contains(signature), "the token's signature appeared in the agent's output")
    }

    @Test func stoppingLeavesTheRoom() throws {
        guard let room = try JanusRoom() else { return }
        let (code, _) = try room.codeFile(identity: "Bo")
        let agent = try room.agent(codeFile: code)
        defer { agent.stop() }
        #expect(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log)")
        let listed = try room.host(["gone", "--display", "nobody"])
        #expect((listed["participants"] as? [[String: Any]] ?? []).contains { $0["display"] as? String == "Bo" }, "\(listed)")
        agent.signal(SIGTERM)
        let (status, ms) = Self.waitExit(agent, seconds: 10)
        let gone = try room.host(["gone", "--display", "Bo"])
        print(String(format: "stop: the agent exited %.0f ms after SIGTERM; gone from the room: %@", ms, "\(gone["gone"] ?? "?")"))
        #expect(status == 0, "exit status \(status.map(String.init) ?? "none"): \(agent.log.suffix(600))")
        #expect(agent.log.contains("You stopped sharing."))
        #expect(gone["gone"] as? Bool == true, "still listed after the agent left: \(gone)")
    }

    /// Bad codes end before any network use, each with its own status and a message that says what is wrong.
    @Test func badJoinCodesHaveTheirOwnExitStatuses() throws {
        try Harness.requireBuild()
        func code(_ extra: [String]) throws -> String {
            let made = try Harness.run("/usr/bin/python3", [Self.codeScript, "--kind", "janus", "--url", "http://127.0.0.1:1/janus",
                                                           "--room", "7", "--identity", "Cy", "--secret", "s"] + extra)
            return made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let good = try code([])
        let cases: [(String, String, Int32, String)] = [
            ("not a code", "hello", 40, "not a valid join code"),
            ("newer version", "krakl:v=2;k=janus", 41, "newer than this agent"),
            ("expired token", try code(["--exp", "\(Int(Date().timeIntervalSince1970) - 3600)"]), 39, "expired"),
            ("broken token", good.replacingOccurrences(of: ";t=eyJ", with: ";t=xx.eyJ"), 42, "token"),
            ("room mismatch", try code(["--token-room", "8"]), 43, "room mismatch"),
            // Port 1 on loopback: nothing listens, so the connection is refused at once.
            ("unreachable server", good, 37, "cannot reach the room server"),
        ]
        for (name, text, wanted, words) in cases {
            let result = try Harness.agent(["--join", "-", "--once", "--plugins", registry], timeout: 30, stdin: text + "\n")
            #expect(result.status == wanted, "\(name): exit \(result.status), wanted \(wanted): \(result.stderr)")
            #expect((result.stdout + result.stderr).contains(words), "\(name): \(result.stdout) \(result.stderr)")
            let signature = text.split(separator: ".").last.map(String.init) ?? ""
            if signature.count > 20 { #expect(!(result.stdout + result.stderr).contains(signature), "\(name): token printed") }
        }
    }
}
