import Foundation
import Glibc
import Testing

/// docs/exit-codes.md, walked: every single-number status its tables list is provoked for real by
/// one recipe below (the real `krakl-agent`, the cheapest way there), and the run ends with exactly
/// that status, with the words of its reason (a status reached for another reason fails), and
/// without a crash. A status added to the doc without a recipe, or a recipe whose status the doc
/// does not list, fails `everyDocumentedStatusHasARecipe`.
///
/// Network: loopback only (WHIP refusals, proxies and refused ports on 127.0.0.1), or inside a
/// namespace the recipe makes (a room that gets as far as ICE: 30, 31, 32, 54, 55, 57, 58).
@Suite("Every documented exit status, provoked", .serialized, .tags(.integration, .netns))
struct ExitStatusTableTests {
    /// One way to make the agent end with `status`: `run` returns its result, or nil after
    /// `skipTest` when a component it needs is missing.
    struct Recipe: Sendable, CustomTestStringConvertible {
        let status: Int32
        /// Each must be in what the agent printed (stdout and stderr: a room's end is a line on stdout).
        let words: [String]
        let how: String
        let run: @Sendable () throws -> Harness.Result?

        init(_ status: Int32, _ words: [String], _ how: String, _ run: @escaping @Sendable () throws -> Harness.Result?) {
            self.status = status
            self.words = words
            self.how = how
            self.run = run
        }

        var testDescription: String { "\(status): \(how)" }
    }

    /// Statuses docs/exit-codes.md lists that no recipe can reach on a test machine, each with why.
    /// Empty: every one is provoked.
    static let unprovokable: [Int: String] = [:]

    @Test func everyDocumentedStatusHasARecipe() {
        let documented = ExitStatusTable.documented()
        #expect(documented.count >= 55, "docs/exit-codes.md: only \(documented.sorted())")
        let statuses = Self.recipes.map { Int($0.status) }
        let provoked = Set(statuses)
        let twice = Set(statuses.filter { status in statuses.filter { $0 == status }.count > 1 })
        #expect(twice.isEmpty, "more than one recipe for \(twice.sorted()): one recipe a status")
        let missing = documented.subtracting(provoked).subtracting(Self.unprovokable.keys)
        #expect(missing.isEmpty, "docs/exit-codes.md lists \(missing.sorted()) but no recipe provokes them")
        let undocumented = provoked.union(Self.unprovokable.keys).subtracting(documented)
        #expect(undocumented.isEmpty, "recipes (or unprovokable entries) for \(undocumented.sorted()), which docs/exit-codes.md does not list")
        #expect(provoked.isDisjoint(with: Self.unprovokable.keys), "provoked after all: \(provoked.intersection(Self.unprovokable.keys).sorted())")
    }

    @Test(arguments: ExitStatusTableTests.recipes)
    func theRecipeEndsWithItsStatus(_ recipe: Recipe) throws {
        try Harness.requireBuild()
        let started = Date()
        guard let result = try recipe.run() else { return }
        print(String(format: "exit %d (%@): got %d after %.1f s", recipe.status, recipe.how, result.status, Date().timeIntervalSince(started)))
        let said = result.stdout + "\n" + result.stderr
        let tail = String(said.suffix(1500))
        #expect(!result.timedOut, "\(recipe.how): did not end within its hang guard: \(tail)")
        #expect(result.status < 128, "\(recipe.how): ended by a signal (status \(result.status)): \(tail)")
        #expect(!said.contains("Fatal error"), "\(recipe.how): a Swift trap: \(tail)")
        #expect(result.status == recipe.status, "\(recipe.how): exit \(result.status), wanted \(recipe.status): \(tail)")
        for word in recipe.words {
            #expect(said.contains(word), "\(recipe.how): \"\(word)\" not in: \(tail)")
        }
    }

    // MARK: - The table

    static let recipes: [Recipe] = [
        // A recording run (file backend, the misbehaving fixture, fixture_backend.c).
        Recipe(0, ["stopped: 3 frames captured"], "a recording of 3 frames") {
            try Harness.agent(["--record", "x.webm", "--plugins", try registry(), "--frames", "3", "-q"], timeout: 30)
        },
        Recipe(1, ["FAIL  return-values: start() returned 7", "1 failed"], "conformance of a backend whose start() returns 7") {
            // The suite bounds itself (it prints "at most N s"); 120 s is a hang guard far above it.
            try Harness.agent(["conformance", try BackendContractTests.fixture.get(), "--timeout", "3", "--option", "misbehave=start-positive"],
                              timeout: 120)
        },
        Recipe(2, ["unknown flag --fast"], "an unknown flag") { try Harness.agent(["--fast"], timeout: 30) },
        Recipe(3, ["--option scene is not key=value"], "--option without =") {
            try Harness.agent(["--record", "x.webm", "--option", "scene"], timeout: 30)
        },
        Recipe(4, ["/nonexistent/plugins.json", "no such file"], "--plugins naming no file") {
            try Harness.agent(["--record", "x.webm", "--plugins", "/nonexistent/plugins.json"], timeout: 30)
        },
        Recipe(5, ["expected ',' or '}'"], "a plugins.json with a comma missing") {
            let path = try Harness.temporaryDirectory() + "/plugins.json"
            try "{\"version\": 1, \"default\": \"file\"\n \"backends\": {}}\n".write(toFile: path, atomically: true, encoding: .utf8)
            return try Harness.agent(["--record", "x.webm", "--plugins", path], timeout: 30)
        },
        Recipe(6, ["no backend named \"wayland\""], "--backend naming none in plugins.json") {
            try Harness.agent(["--record", "x.webm", "--plugins", try registry(), "--backend", "wayland"], timeout: 30)
        },
        Recipe(7, ["lib/libgone.so does not exist"], "a backend whose library file is missing") {
            try Harness.agent(["--record", "x.webm", "--plugins", try registry(library: "lib/libgone.so")], timeout: 30)
        },
        Recipe(8, ["cannot load"], "a backend library that is not an ELF file") {
            let folder = try Harness.temporaryDirectory()
            try "not an ELF file".write(toFile: folder + "/libjunk.so", atomically: true, encoding: .utf8)
            return try Harness.agent(["--record", "x.webm", "--plugins", try registry(library: "libjunk.so", in: folder)], timeout: 30)
        },
        Recipe(9, ["does not export krakl_backend_v1"], "fixture_backend.c -DNO_ENTRY") { try recordFixture(["-DNO_ENTRY"]) },
        Recipe(10, ["built for backend ABI 2.x"], "fixture_backend.c -DENTRY_V2") { try recordFixture(["-DENTRY_V2"]) },
        Recipe(11, ["could not be created", "EMFILE"], "create() fails with EMFILE") { try recordFixture(createErrno("EMFILE")) },
        Recipe(12, ["could not start", "returned 7"], "the misbehaving fixture's start() returns 7") {
            try recordMisbehaving(["misbehave=start-positive"])
        },
        Recipe(13, ["the source reported an error"], "the misbehaving fixture sends an ERROR event") {
            try recordMisbehaving(["misbehave=error-event", "after_ms=0"], ["--frames", "10"])
        },
        Recipe(14, ["encoding failed", "libvpx could not start a vp8 encoder for 16384x16"], "a Y4M 16384 px wide (VP8 stops at 16383)") {
            // The file backend reads Y4M up to 16384 a side and --max-size allows 16384: libvpx's VP8
            // takes 14-bit sizes, so its encoder cannot be made. Three grey frames of 16384x16.
            let path = try Harness.temporaryDirectory() + "/wide.y4m"
            var data = Data("YUV4MPEG2 W16384 H16 F30:1 Ip A1:1 C420jpeg\n".utf8)
            for _ in 0..<3 { data += Data("FRAME\n".utf8) + Data(repeating: 128, count: 16384 * 16 * 3 / 2) }
            try data.write(to: URL(fileURLWithPath: path))
            return try Harness.agent(["--record", "x.webm", "--plugins", try registry(), "--backend", "file", "--option", "path=" + path,
                                      "--max-size", "16384x16384", "-q"], timeout: 30)
        },
        Recipe(15, ["could not list its sources"], "sources of the X11 backend on a display no server has") {
            let display = (189...250).first { !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\($0)") } ?? 189
            return try Harness.agent(["sources", "--plugins", try registry(), "--backend", "x11", "--option", "display=:\(display)"], timeout: 30)
        },
        Recipe(16, ["option scene=karaoke is not valid", "EINVAL"], "a backend option the file backend rejects") {
            try Harness.agent(["--record", "x.webm", "--plugins", try registry(), "--option", "scene=karaoke"], timeout: 30)
        },
        Recipe(17, ["/nonexistent.y4m", "ENOENT"], "a Y4M file that is not there") {
            try Harness.agent(["--record", "x.webm", "--plugins", try registry(), "--backend", "file", "--option", "path=/nonexistent.y4m"],
                              timeout: 30)
        },
        Recipe(18, ["could not be created", "(EOPNOTSUPP)"], "create() fails with EOPNOTSUPP") { try recordFixture(createErrno("EOPNOTSUPP")) },
        Recipe(19, ["could not be created", "(ECONNREFUSED)"], "create() fails with ECONNREFUSED") { try recordFixture(createErrno("ECONNREFUSED")) },
        Recipe(20, ["could not be created", "(EACCES)"], "create() fails with EACCES") { try recordFixture(createErrno("EACCES")) },
        Recipe(21, ["could not be created", "(ETIMEDOUT)"], "create() fails with ETIMEDOUT") { try recordFixture(createErrno("ETIMEDOUT")) },
        Recipe(22, ["hung: its stop() did not return within"], "the misbehaving fixture's stop() never returns") {
            // The stop budget is 2 s; 60 s is the hang guard.
            try recordMisbehaving(["misbehave=hang-stop"])
        },
        Recipe(23, ["cannot write /nonexistent/x.webm"], "a recording into a missing folder") {
            try Harness.agent(["--record", "/nonexistent/x.webm", "--plugins", try registry(), "--frames", "3", "-q"], timeout: 30)
        },
        Recipe(24, ["crashed: SIGSEGV in start()"], "the isolated misbehaving fixture crashes in start()") {
            try recordMisbehaving(["misbehave=crash-start"], ["--isolate"])
        },
        Recipe(25, ["delivered no usable frame"], "the misbehaving fixture's frames all lack their plane") {
            // No frame counts towards --frames: the run is 1 s long.
            try recordMisbehaving(["misbehave=all-invalid"], ["--seconds", "1"])
        },

        // Sharing into a room. Refusals need the room server's HTTP only (loopback); a session
        // that gets as far as ICE runs in a namespace of its own with the room.
        Recipe(30, ["Sharing was ended by the room", "closed the connection"], "a WHIP room whose server closes our peer connection") {
            guard let room = try RoomSessionTests.WhipRoom() else { return nil }
            let agent = try room.agent(codeFile: try room.codeFile(identity: "Ann").path)
            defer { agent.stop() }
            // Hang guards: sharing starts within seconds, the end follows the close at once.
            try #require(agent.waitFor("sharing the screen", timeout: 30), "the agent never shared: \(agent.log.suffix(1500))")
            room.server.closePeers()
            return withExtendedLifetime(room) { finish(agent, within: 30) }
        },
        Recipe(31, ["The screen source was closed"], "a WHIP room, the test pattern ending after 45 frames") {
            guard let room = try RoomSessionTests.WhipRoom() else { return nil }
            let agent = try room.agent(codeFile: try room.codeFile(identity: "Ann").path, extra: ["--option", "frames=45"])
            defer { agent.stop() }
            return withExtendedLifetime(room) { finish(agent, within: 60) }
        },
        Recipe(32, ["Connection lost", "no connection to the room's media server within 2 s"], "a WHIP room with every UDP packet dropped") {
            guard let room = try RoomSessionTests.WhipRoom() else { return nil }
            guard try room.namespace.prepareFaults() else {
                skipTest("nft missing (Debian package nftables): UDP cannot be dropped")
                return nil
            }
            try room.namespace.dropUdp(percent: 100)
            let agent = try room.agent(codeFile: try room.codeFile(identity: "Ann").path, extra: ["--connect-timeout", "2"])
            defer { agent.stop() }
            return withExtendedLifetime(room) { finish(agent, within: 60) }
        },
        Recipe(33, ["Could not join the room", "401"], "a WHIP server answering 401") { try joinWhip(["--status", "401"]) },
        Recipe(34, ["Could not join the room", "404"], "a WHIP server answering 404") { try joinWhip(["--status", "404"]) },
        Recipe(35, ["Could not join the room", "415"], "a WHIP server answering 415") { try joinWhip(["--status", "415"]) },
        Recipe(36, ["Could not join the room", "the room server failed: 500"], "a WHIP server answering 500") { try joinWhip(["--status", "500"]) },
        Recipe(37, ["Could not join the room", "cannot reach the room server", "Connection refused"], "a WHIP URL whose port refuses") {
            let refusing = try LoopbackPort(listening: false)
            return try withExtendedLifetime(refusing) {
                try joinCode(url: "http://127.0.0.1:\(refusing.port)/whip/endpoint/r1", identity: "Ann")
            }
        },
        Recipe(38, ["Could not join the room", "201 without a Location header"], "a WHIP server answering 201 without Location") {
            try joinWhip(["--no-location"])
        },
        Recipe(39, ["expired"], "a code whose token expired in 1970") {
            try joinCode(url: "http://127.0.0.1:9/whip", identity: "Ann", extra: ["--iat", "900", "--exp", "1000"])
        },
        Recipe(40, ["not a valid join code"], "a text that is no join code") { try join(code: "hello") },
        Recipe(41, ["join code version 2 is newer than this agent"], "a version 2 code") {
            let code = try makeCode(["--kind", "whip", "--url", "http://127.0.0.1:9/whip", "--identity", "Ann"])
            return try join(code: code.replacingOccurrences(of: "krakl:v=1;", with: "krakl:v=2;"))
        },
        Recipe(42, ["the join code's token is not usable", "no exp"], "a token without exp") {
            try joinCode(url: "http://127.0.0.1:9/whip", identity: "Ann", extra: ["--no-exp"])
        },
        Recipe(43, ["names no room"], "a Janus code naming no room") {
            try join(code: try makeCode(["--kind", "janus", "--url", "http://127.0.0.1:9/janus", "--identity", "Ann"]))
        },
        Recipe(44, ["Sharing failed", "relay-only candidates were asked for (--ice-transport relay) but no TURN server is usable"],
               "relay-only into a WHIP room that names no TURN server") {
            try joinWhip([], agent: ["--ice-transport", "relay"])
        },

        // A join code from a picture (--qr).
        Recipe(45, ["no QR code found"], "a white picture") {
            let path = try Harness.temporaryDirectory() + "/blank.pgm"
            try (Data("P5\n64 64\n255\n".utf8) + Data(repeating: 255, count: 64 * 64)).write(to: URL(fileURLWithPath: path))
            return try Harness.agent(["--qr", path, "--scan-only"], timeout: 30)
        },
        Recipe(46, ["/nonexistent/picture.png"], "a picture that is not there") {
            try Harness.agent(["--qr", "/nonexistent/picture.png", "--scan-only"], timeout: 30)
        },
        Recipe(47, ["30000x30000"], "a PNG whose header says 30000x30000") {
            let path = try Harness.temporaryDirectory() + "/bomb.png"
            try QRScanTests.pngHeader(width: 30000, height: 30000, colour: 0).write(to: URL(fileURLWithPath: path))
            return try Harness.agent(["--qr", path, "--scan-only"], timeout: 30)
        },
        Recipe(48, ["not a krakl join code"], "a QR code of a web address") {
            guard try QRScanTests.tools() else { return nil }
            let picture = try QRScanTests.qrencode("https://example.org/a/long/path", in: try Harness.temporaryDirectory())
            return try Harness.agent(["--qr", picture, "--scan-only"], timeout: 30)
        },
        Recipe(49, ["not guessing"], "two different join codes side by side") {
            guard try QRScanTests.tools(python: true) else { return nil }
            let folder = try Harness.temporaryDirectory()
            let two = folder + "/two.png"
            let side = try Harness.run(QRScanTests.python, [QRScanTests.pictures, "side",
                                                            try QRScanTests.qrencode(try QRScanTests.makeCode(identity: "Ada", room: "1"), in: folder),
                                                            try QRScanTests.qrencode(try QRScanTests.makeCode(identity: "Bob", room: "9"), in: folder), two])
            try #require(side.status == 0, "qr_pictures.py side: \(side.stderr)")
            return try Harness.agent(["--qr", two, "--scan-only"], timeout: 30)
        },

        // Scanning the screen (the test pattern, which shows no code) or a camera.
        Recipe(50, ["no join code found within 1 s"], "--scan of the test pattern for 1 s") {
            try Harness.agent(["--scan", "--scan-only", "--plugins", try registry(), "--backend", "file", "--option", "width=640",
                               "--option", "height=360", "--scan-timeout", "1"], timeout: 30)
        },
        Recipe(51, ["the screen source ended before a join code was found"], "--scan of a test pattern of 5 frames") {
            try Harness.agent(["--scan", "--scan-only", "--plugins", try registry(), "--backend", "file", "--option", "width=640",
                               "--option", "height=360", "--option", "frames=5"], timeout: 30)
        },
        Recipe(52, ["cannot listen"], "the viewer on a port the test holds") {
            let taken = try LoopbackPort(listening: true)
            return try withExtendedLifetime(taken) {
                try Harness.agent(["--plugins", try registry(), "--backend", "file", "--frames", "5", "--listen", "127.0.0.1:\(taken.port)"],
                                  timeout: 30)
            }
        },
        Recipe(53, ["Could not join the room", "through the HTTP proxy", "Connection refused"], "HTTP_PROXY naming a port that refuses") {
            let proxy = try LoopbackPort(listening: false)
            return try withExtendedLifetime(proxy) {
                try joinCode(url: "http://127.0.0.1:9/whip/endpoint/r1", identity: "Ann",
                             environment: ["http_proxy": "http://127.0.0.1:\(proxy.port)", "HTTP_PROXY": "http://127.0.0.1:\(proxy.port)",
                                            "no_proxy": "", "NO_PROXY": ""])
            }
        },
        Recipe(54, ["Could not join the room", "53105"], "a Twilio room of at most 0 participants") {
            guard let room = try TwilioTestRoom(["--max-participants", "0"]) else { return nil }
            let agent = try room.agent(try room.code(identity: "Ann"))
            defer { agent.stop() }
            return withExtendedLifetime(room) { finish(agent, within: 60) }
        },
        Recipe(55, ["Sharing was ended by the room", "53205"], "the same identity joins the Twilio room a second time") {
            guard let room = try TwilioTestRoom() else { return nil }
            let first = try room.agent(try room.code(identity: "Ann"))
            defer { first.stop() }
            try #require(first.waitFor("sharing the screen", timeout: 30), "the first agent never shared: \(first.log.suffix(1500))")
            let second = try room.agent(try room.code(identity: "Ann"))
            defer { second.stop() }
            return withExtendedLifetime(room) { finish(first, within: 30) }
        },
        Recipe(56, ["no camera found"], "--scan --camera where PipeWire has no camera") {
            guard let stack = try PipeWireStack(["--no-portal"]) else { return nil }
            let folder = try Harness.temporaryDirectory()
            chmod(folder, 0o755)
            let plugins = try CameraScanTests.registry(folder)
            return try stack.run([Harness.agent, "--plugins", plugins, "--scan", "--camera", "--scan-only", "--headless"], timeout: 60)
        },
        Recipe(57, ["The TURN relay refused our credentials"], "relay-only through coturn with a wrong password") {
            guard let room = try RoomSessionTests.WhipRoom(), let turn = try CoturnServer.start(in: room.namespace) else { return nil }
            let agent = try room.agent(codeFile: try room.codeFile(identity: "Ann").path,
                                       extra: ["--ice-server", CandidateDeliveryTests.turnURL + ",u,wrong-pw", "--ice-transport", "relay"])
            defer { agent.stop() }
            return withExtendedLifetime((room, turn)) { finish(agent, within: 60) }
        },
        Recipe(58, ["The TURN relay's certificate is not trusted"], "relay-only through turns: with another CA given") {
            guard let rig = try AgentTurnTlsTests.Rig() else { return nil }
            defer { rig.hosts.remove() }
            let agent = try rig.agent(caFile: rig.certificates.otherCAFile)
            defer { agent.stop() }
            return withExtendedLifetime(rig) { finish(agent, within: 60) }
        },

        // The daemon and its clients, each with an XDG_RUNTIME_DIR of its own.
        Recipe(60, ["already running"], "a second daemon") {
            let daemon = try DaemonTests.Daemon(extra: ["--plugins", try registry()])
            return try withExtendedLifetime(daemon) {
                try Harness.run(Harness.agent, ["daemon"], timeout: 30, environment: ["XDG_RUNTIME_DIR": daemon.runtime])
            }
        },
        Recipe(61, ["no krakl-agent daemon is running"], "status with no daemon") {
            let runtime = try Harness.temporaryDirectory()
            chmod(runtime, 0o700)
            return try Harness.run(Harness.agent, ["status"], timeout: 30, environment: ["XDG_RUNTIME_DIR": runtime])
        },
        Recipe(62, ["XDG_RUNTIME_DIR=run is not an absolute path"], "status with a relative XDG_RUNTIME_DIR") {
            try Harness.agent(["status"], timeout: 30, environment: ["XDG_RUNTIME_DIR": "run"])
        },
        Recipe(63, ["already scanning the screen for a join code; stop first"], "connect --scan while the daemon scans") {
            let daemon = try DaemonTests.Daemon(extra: ["--plugins", try registry(), "--backend", "file", "--option", "width=640",
                                                        "--option", "height=360", "--scan-timeout", "600"])
            let scanning = try DtlsTestProcess("/usr/bin/env", ["XDG_RUNTIME_DIR=\(daemon.runtime)", Harness.agent, "connect", "--scan"])
            defer { scanning.stop() }
            try #require(scanning.waitFor("scanning: ", timeout: 20), "the daemon never scanned: \(scanning.log)")
            return try withExtendedLifetime(daemon) { try daemon.client(["connect", "--scan"], timeout: 30) }
        },
        Recipe(64, ["closed the connection"], "a socket that closes without a reply") {
            try BadInputTests.statusFromAnUnusableDaemon("close")
        },
    ]

    // MARK: - Shared set-up

    /// plugins.json for this build (in a fresh folder), or one naming a single backend `fixture`
    /// whose library is `library` (relative to the folder).
    static func registry(library: String? = nil, in folder: String? = nil) throws -> String {
        let folder = try folder ?? Harness.temporaryDirectory()
        guard let library else { return try Harness.registryForThisBuild(in: folder) }
        try "{\"version\": 1, \"default\": \"fixture\", \"backends\": {\"fixture\": {\"library\": \"\(library)\"}}}"
            .write(toFile: folder + "/plugins.json", atomically: true, encoding: .utf8)
        return folder + "/plugins.json"
    }

    static func createErrno(_ name: String) -> [String] { ["-DFAIL_CREATE", "-DFAIL_CREATE_ERRNO=\(name)"] }

    /// A recording of Tests/Fixtures/fixture_backend.c built with `defines`.
    static func recordFixture(_ defines: [String]) throws -> Harness.Result {
        let folder = try Harness.temporaryDirectory()
        _ = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: folder, name: "fixture", defines: defines)
        return try Harness.agent(["--record", "x.webm", "--plugins", try registry(library: "libfixture.so", in: folder), "--frames", "3", "-q"],
                                 timeout: 30)
    }

    /// A recording of Tests/Fixtures/misbehaving_backend.c with `options`; 60 s is a hang guard.
    static func recordMisbehaving(_ options: [String], _ extra: [String] = ["--frames", "3"]) throws -> Harness.Result {
        try Harness.agent(["--record", "x.webm", "--plugins", try BackendContractTests.registry(), "-q"]
                          + options.flatMap { ["--option", $0] } + extra, timeout: 60)
    }

    /// A join code from Tests/Fixtures/make_join_code.py.
    static func makeCode(_ arguments: [String]) throws -> String {
        let made = try Harness.run("/usr/bin/python3", [RoomSessionTests.codeScript] + arguments, timeout: 30)
        try #require(made.status == 0, "make_join_code.py: \(made.stderr)")
        return made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `krakl-agent --join @FILE --once` on the host, for runs that end before any media: refusals,
    /// bad codes, relay-only without a relay. The code goes in a file (not on the command line).
    static func join(code: String, arguments: [String] = [], environment: [String: String]? = nil) throws -> Harness.Result {
        let path = try Harness.temporaryDirectory() + "/code"
        try code.write(toFile: path, atomically: true, encoding: .utf8)
        // A hang guard: each of these ends within a second.
        return try Harness.agent(["--join", "@" + path, "--once", "--headless", "--address", "127.0.0.1", "--plugins", try registry(),
                                  "--option", "width=640", "--option", "height=360"] + arguments,
                                 timeout: 30, environment: environment)
    }

    static func joinCode(url: String, identity: String, extra: [String] = [], environment: [String: String]? = nil) throws -> Harness.Result {
        try join(code: try makeCode(["--kind", "whip", "--url", url, "--identity", identity] + extra), environment: environment)
    }

    /// A WHIP server (Tests/Fixtures/whip_server.py) on the host's 127.0.0.1 misbehaving with
    /// `server`, and the agent joining it with `agent` added.
    static func joinWhip(_ server: [String], agent: [String] = []) throws -> Harness.Result? {
        guard WhipTestServer.prerequisites() else { return nil }
        let whip = try WhipTestServer(namespace: nil, server)
        let token = try WhipTestServer.token(room: whip.room, identity: "Ann")
        return try withExtendedLifetime(whip) {
            try join(code: try makeCode(["--kind", "whip", "--url", whip.endpoint.absoluteString, "--token", token]), arguments: agent)
        }
    }

    /// A run in a DtlsTestProcess (a room's agent) as a Harness.Result: its output as stderr; a
    /// death by a signal as status 128 and said so; `seconds` is the hang guard.
    static func finish(_ process: DtlsTestProcess, within seconds: Double) -> Harness.Result {
        let ended = process.waitForExit(seconds: seconds)
        let signalled = ended && process.exitStatus == nil
        return Harness.Result(status: process.exitStatus ?? (signalled ? 128 : -1), stdout: "",
                              stderr: process.log + (signalled ? "\n(ended by a signal)" : ""), timedOut: !ended)
    }
}

/// A TCP socket of the test's on 127.0.0.1: listening (its port is taken) or only bound (a
/// connection to its port is refused, and no other program gets the port meanwhile).
final class LoopbackPort {
    let fd: Int32
    let port: Int

    init(listening: Bool) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let size = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, size) } }
        guard bound == 0, !listening || listen(fd, 8) == 0 else {
            close(fd)
            throw POSIXError(.EADDRINUSE)
        }
        var length = size
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(fd) }
}
