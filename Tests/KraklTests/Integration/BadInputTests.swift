import Foundation
import Testing

/// Every kind of bad input ends with one actionable line on stderr and its
/// own documented exit status, never a crash or a hang.
@Suite("Bad input: one line, distinct exit status", .tags(.integration))
struct BadInputTests {
    /// Asserts a failed run: the status, one line on stderr containing every fragment, no timeout.
    func expectFailure(_ result: Harness.Result, status: Int32, _ fragments: [String],
                       sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(!result.timedOut, "timed out", sourceLocation: sourceLocation)
        #expect(result.status == status, "exit \(result.status), stderr: \(result.stderr)", sourceLocation: sourceLocation)
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.count == 1, "expected one line, got: \(result.stderr)", sourceLocation: sourceLocation)
        for fragment in fragments {
            #expect(result.stderr.contains(fragment), "\"\(fragment)\" not in: \(result.stderr)", sourceLocation: sourceLocation)
        }
    }

    /// `--ice-server`, `--ice-transport` and `--ice-ca` refuse what the agent cannot use, before anything starts,
    /// and never print a credential.
    @Test(arguments: [
        (["--ice-server", "turn:127.0.0.2:3478"], "needs its user and credential"),
        (["--ice-server", "http://127.0.0.2/"], "not a stun:/turn:/turns: URL"),
        (["--ice-server", "turns:127.0.0.2:5349?transport=udp,u,secret-credential"], "would be DTLS to the TURN server"),
        (["--ice-server", "turns:127.0.0.2"], "needs its user and credential"),
        (["--ice-ca", "/nonexistent/ca.pem"], "--ice-ca /nonexistent/ca.pem: cannot read it"),
        (["--ice-transport", "direct"], "use all or relay"),
    ])
    func iceServerOptionsThatCannotBeUsed(arguments: [String], fragment: String) throws {
        try Harness.requireBuild()
        let result = try Harness.agent(["--join", "-"] + arguments)
        expectFailure(result, status: 2, [fragment])
        #expect(!result.stderr.contains("secret-credential"), "a credential was printed: \(result.stderr)")
    }

    @Test func malformedRegistryReportsFileLineColumn() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let path = dir + "/plugins.json"
        try "{\n  \"version\": 1,\n  \"default\": \"file\"\n  \"backends\": {}\n}\n".write(toFile: path, atomically: true, encoding: .utf8)
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", path, "--frames", "1"])
        expectFailure(result, status: 5, ["\(path):3:20:", "expected ',' or '}'"])
    }

    @Test func registryContentErrorsPointAtTheMember() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let path = dir + "/plugins.json"
        try """
        {
          "version": 1,
          "default": "file",
          "backends": {
            "file": { "library": 42 }
          }
        }
        """.write(toFile: path, atomically: true, encoding: .utf8)
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", path]), status: 5, ["\(path):5:26:", "needs \"library\""])
        try "{\"version\": 1, \"default\": \"nope\", \"backends\": {\"a\": {\"library\": \"x.so\"}}}"
            .write(toFile: path, atomically: true, encoding: .utf8)
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", path]), status: 5, ["\(path):1:27:", "\"nope\"", "not among the backends (a)"])
    }

    /// Names from the file are printed escaped: a NUL cut the message short (the rest, and its
    /// newline, never reached the terminal), and bidi overrides or escapes would reach it raw.
    @Test func registryNamesAreEscapedInMessages() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let path = dir + "/plugins.json"
        try "{\"version\": 1, \"backends\": {\"a\\u0000b\\u202ec\\u001b[2J\": {\"library\": \"x.so\"}}}"
            .write(toFile: path, atomically: true, encoding: .utf8)
        let result = try Harness.agent(["--record", "krakl-recording.webm", "--plugins", path])
        expectFailure(result, status: 5, ["backend name \"a\\x00b\\u{202e}c\\x1b[2J\" must be letters, digits, '-' or '_'"])
        #expect(result.stderr.hasSuffix("\n") && !result.stderr.contains("\u{1B}") && !result.stderr.contains("\u{202E}"), "\(result.stderr.debugDescription)")
    }

    @Test func unreadableRegistry() throws {
        try Harness.requireBuild()
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", "/nonexistent/plugins.json"]), status: 4,
                      ["/nonexistent/plugins.json", "no such file", "--plugins"])
    }

    @Test func unknownBackendListsTheKnownOnes() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--backend", "wayland"]), status: 6,
                      ["no backend named \"wayland\"", "known backends: file, x11, pipewire"])
    }

    @Test func missingLibraryFile() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        try "{\"version\": 1, \"default\": \"gone\", \"backends\": {\"gone\": {\"library\": \"lib/libgone.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", dir + "/plugins.json"]), status: 7,
                      ["backend gone", "\(dir)/lib/libgone.so does not exist"])
    }

    @Test func fileThatIsNotALibrary() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        try "not an ELF file".write(toFile: dir + "/libjunk.so", atomically: true, encoding: .utf8)
        try "{\"version\": 1, \"default\": \"junk\", \"backends\": {\"junk\": {\"library\": \"libjunk.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", dir + "/plugins.json"]), status: 8, ["cannot load \(dir)/libjunk.so"])
    }

    /// Registers a fixture built with `defines` and runs the agent on it.
    func runFixture(_ defines: [String], extra: [String] = []) throws -> Harness.Result {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        _ = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/fixture_backend.c", into: dir, name: "fixture", defines: defines)
        try "{\"version\": 1, \"default\": \"fixture\", \"backends\": {\"fixture\": {\"library\": \"libfixture.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        return try Harness.agent(["--record", "krakl-recording.webm", "--plugins", dir + "/plugins.json", "--frames", "3", "-q"] + extra)
    }

    @Test func libraryWithoutEntrySymbol() throws {
        expectFailure(try runFixture(["-DNO_ENTRY"]), status: 9, ["does not export krakl_backend_v1", "docs/backend-guide.md"])
    }

    @Test func backendForANewerMajorABI() throws {
        expectFailure(try runFixture(["-DENTRY_V2"]), status: 10, ["built for backend ABI 2.x", "this agent speaks 1.1"])
        expectFailure(try runFixture(["-DABI_MAJOR=2"]), status: 10, ["declares backend ABI 2.1", "rebuild the backend"])
    }

    @Test func malformedBackendTable() throws {
        expectFailure(try runFixture(["-DTABLE_SIZE=16"]), status: 10, ["malformed backend table: struct_size is 16 bytes"])
        expectFailure(try runFixture(["-DNULL_START"]), status: 10, ["malformed backend table: start is NULL"])
    }

    @Test func createFailureShowsTheBackendsReason() throws {
        // ENODEV: what to capture is not there (exit 17); an errno without a class of its own gives 11.
        expectFailure(try runFixture(["-DFAIL_CREATE"]), status: 17, ["could not be created", "no such device /dev/krakl0; plug it in", "ENODEV"])
        expectFailure(try runFixture(["-DFAIL_CREATE", "-DFAIL_CREATE_ERRNO=EMFILE"]), status: 11, ["could not be created", "EMFILE"])
    }

    @Test func badBackendOptionFailsCreate() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--option", "scene=karaoke"]), status: 16,
                      ["option scene=karaoke is not valid: use one of static, typing, scrolling, video", "EINVAL"])
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "--option", "scnee=typing"]), status: 16,
                      ["unknown option \"scnee\"", "known options: scene,"])
    }

    /// A room session's outputs are checked before anything is joined, as a recording's are: the
    /// join code here names a port nobody listens on, so only the path check can end it with 23.
    @Test(arguments: ["--frame-log", "--dump-input"])
    func aRoomSessionsUnwritableOutputIsRefusedBeforeJoining(flag: String) throws {
        try Harness.requireBuild()
        let code = "https://127.0.0.1:9/whip#t=abc"
        expectFailure(try Harness.agent(["--join", code, "--once", flag, "/nonexistent-folder/out"], timeout: 30), status: 23,
                      ["/nonexistent-folder/out", "folder"])
    }

    @Test func invalidOptionSyntax() throws {
        try Harness.requireBuild()
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--option", "scene"]), status: 3, ["--option scene is not key=value"])
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--option", "a b=1"]), status: 3, ["may hold only letters"])
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--option", "size={\"w\":1}"]), status: 3, ["objects and arrays are not accepted"])
    }

    @Test func usageErrors() throws {
        try Harness.requireBuild()
        expectFailure(try Harness.agent(["--fast"]), status: 2, ["unknown flag --fast", "--help"])
        expectFailure(try Harness.agent(["--record", "krakl-recording.webm", "--frames", "-3"]), status: 2, ["--frames -3"])
        expectFailure(try Harness.agent(["conformance"]), status: 2, ["needs the path"])
    }

    /// Every flag `--help` names is one the parser knows (its table prints those lines), and the
    /// OPTIONS lines line up: a flag added to the help text alone, or one renamed in the table but
    /// not in the words around it, fails here. Each run ends on a command that does not exist, so
    /// nothing is started: the flag's own check or "unknown command" answers, never "unknown flag".
    @Test func everyFlagHelpNamesIsParsed() throws {
        try Harness.requireBuild()
        let help = try Harness.agent(["--help"])
        try #require(help.status == 0, "\(help)")
        let regex = try NSRegularExpression(pattern: #"(?<![\w-])--[a-z][a-z0-9-]*"#)
        let text = help.stdout
        let flags = Set(regex.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap { Range($0.range, in: text).map { String(text[$0]) } })
        #expect(flags.count >= 50, "only \(flags.sorted()) in --help")
        // systemctl's, quoted in the daemon's words ("systemctl --user enable --now krakl-agent").
        let others: Set<String> = ["--user", "--now"]
        for flag in flags.subtracting(others).sorted() {
            let result = try Harness.agent([flag + "=1", "no-such-command"], timeout: 20)
            // --help and --version answer before anything else is read; the others end on their
            // own check of "1" (2, or 3 for --option) or on the command that does not exist (2).
            let expected: Set<Int32> = flag == "--help" || flag == "--version" ? [0] : [2, 3]
            #expect(expected.contains(result.status) && !result.stderr.contains("unknown flag"), "\(flag): \(result.status) \(result.stderr.prefix(300))")
        }
        // The generated OPTIONS lines: names and value, then the words from column 27.
        let options = text.split(separator: "\n").drop { $0 != "OPTIONS" }.dropFirst().prefix { !$0.isEmpty }
        #expect(options.count > 30, "OPTIONS: \(options)")
        for line in options where line.hasPrefix("  -") || line.hasPrefix("      --") {
            let head = line.prefix(26)
            #expect(line.count <= 26 || head.hasSuffix(" ") || !line.dropFirst(26).hasPrefix(" "), "misaligned: \(line)")
        }
    }

    /// A "daemon" whose replies are unusable (not JSON, or the connection closed without a reply):
    /// the client says so with 64, not a crash or a hang.
    @Test(arguments: ["garbage", "close"])
    func anUnusableDaemonReplyIs64(_ how: String) throws {
        try Harness.requireBuild()
        expectFailure(try Self.statusFromAnUnusableDaemon(how), status: 64, [how == "garbage" ? "reply" : "closed the connection"])
    }

    /// `krakl-agent status` against a fake daemon on the control socket that answers each request
    /// with a line that is no reply ("garbage") or closes the connection without one ("close").
    static func statusFromAnUnusableDaemon(_ how: String) throws -> Harness.Result {
        let runtime = try Harness.temporaryDirectory()
        chmod(runtime, 0o700)
        mkdir(runtime + "/krakl", 0o700)
        let server = try DtlsTestProcess("/usr/bin/python3", ["-c", """
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(sys.argv[1]); s.listen(4); print("ready", flush=True)
            while True:
                c, _ = s.accept(); c.recv(4096)
                if sys.argv[2] == "garbage": c.sendall(b"this is not a reply\\n")
                c.close()
            """, runtime + "/krakl/control.sock", how])
        defer { server.stop() }
        try #require(server.waitFor("ready", timeout: 10), "the fake daemon did not start: \(server.log)")
        return try Harness.run(Harness.agent, ["status"], timeout: 30, environment: ["XDG_RUNTIME_DIR": runtime])
    }

    /// docs/exit-codes.md, `--help`'s EXIT STATUS and Sources/Agent/CLI/ExitStatus.swift name the same
    /// statuses: what one lists and another does not is an error (a status added in code and not
    /// documented, or one documented that nothing returns).
    @Test func everyStatusIsDocumentedInTheDocsAndInHelp() throws {
        try Harness.requireBuild()
        let documented = ExitStatusTable.documented()
        #expect(documented.count >= 55, "docs/exit-codes.md: only \(documented.sorted())")
        let help = try Harness.agent(["--help"])
        #expect(help.status == 0)
        let inHelp = ExitStatusTable.inHelp(help.stdout)
        #expect(inHelp == documented, "--help lists \(inHelp.subtracting(documented).sorted()) that the docs do not; the docs list \(documented.subtracting(inHelp).sorted()) that --help does not")
        let inCode = ExitStatusTable.inCode()
        #expect(inCode.isSubset(of: documented), "ExitStatus.swift returns \(inCode.subtracting(documented).sorted()), undocumented")
    }
}

/// The exit statuses as docs/exit-codes.md, `--help` and ExitStatus.swift give them.
enum ExitStatusTable {
    /// The single numbers in the first column of docs/exit-codes.md's tables (ranges such as
    /// "39–43" refer back to rows of their own).
    static func documented() -> Set<Int> {
        let text = (try? String(contentsOfFile: Harness.repoRoot + "/docs/exit-codes.md", encoding: .utf8)) ?? ""
        return Set(text.split(separator: "\n").compactMap { line -> Int? in
            guard line.hasPrefix("| ") else { return nil }
            let cell = line.dropFirst(2).prefix { $0 != "|" }.trimmingCharacters(in: .whitespaces)
            return Int(cell)
        })
    }

    /// The statuses of `--help`'s EXIT STATUS section: a number opening a line or a column.
    static func inHelp(_ help: String) -> Set<Int> {
        guard let start = help.range(of: "\nEXIT STATUS\n") else { return [] }
        var found: Set<Int> = []
        for line in help[start.upperBound...].split(separator: "\n") {
            let pattern = #"(?:^|\s{2,})(\d{1,2}) [a-z-]"#
            let regex = try? NSRegularExpression(pattern: pattern)
            let text = String(line)
            for match in regex?.matches(in: text, range: NSRange(text.startIndex..., in: text)) ?? [] {
                if let range = Range(match.range(at: 1), in: text), let n = Int(text[range]) { found.insert(n) }
            }
        }
        return found
    }

    /// Every `return N` and `= N` of Sources/Agent/CLI/ExitStatus.swift.
    static func inCode() -> Set<Int> {
        let text = (try? String(contentsOfFile: Harness.repoRoot + "/Sources/Agent/CLI/ExitStatus.swift", encoding: .utf8)) ?? ""
        let regex = try? NSRegularExpression(pattern: #"(?:return|: Int32 =) (\d+)\b"#)
        return Set((regex?.matches(in: text, range: NSRange(text.startIndex..., in: text)) ?? []).compactMap { match in
            Range(match.range(at: 1), in: text).flatMap { Int(text[$0]) }
        })
    }
}

