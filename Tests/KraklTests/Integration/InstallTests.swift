import Foundation
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import Testing

/// scripts/install, scripts/uninstall and scripts/package-deb, run on this build (`--build-dir`):
/// every file where docs/install.md says, the installed agent working from its installed paths only
/// (run from a folder of its own, so nothing is found in the repository by accident), the Debian
/// package installed and removed with apt-get, krakl: links through xdg-open to a daemon, and the
/// installed user unit under a real systemd user manager.
@Suite(.serialized, .tags(.integration, .netns)) struct InstallTests {
    static let install = Harness.repoRoot + "/scripts/install"
    static let uninstall = Harness.repoRoot + "/scripts/uninstall"

    /// Runs one of the scripts on this build, failing the test when it fails.
    @discardableResult
    static func script(_ path: String, _ arguments: [String], environment: [String: String] = [:], timeout: Double = 300) throws -> Harness.Result {
        let result = try Harness.run("/bin/bash", [path] + arguments, timeout: timeout, environment: environment)
        try #require(result.status == 0, "\(path) \(arguments): \(result.stdout) \(result.stderr)")
        return result
    }

    /// Installs this build into `prefix` (nil: --user, into `home`).
    @discardableResult
    static func installThisBuild(prefix: String?, environment: [String: String] = [:]) throws -> Harness.Result {
        try Harness.requireBuild()
        return try script(install, (prefix.map { ["--prefix", $0] } ?? ["--user"]) + ["--build-dir", Harness.buildDir], environment: environment)
    }

    /// Every file and folder below `folder`, relative to it.
    static func tree(_ folder: String) -> [String] {
        ((try? FileManager.default.subpathsOfDirectory(atPath: folder)) ?? []).sorted()
    }

    /// The files an install into PREFIX puts there (besides the Swift runtime in lib/krakl-agent/swift).
    static let expectedFiles = ["bin/krakl-agent", "lib/krakl-agent/krakl-backend-host", "lib/krakl-agent/libBackendFile.so",
                                "lib/krakl-agent/libBackendX11.so", "lib/krakl-agent/libBackendPipeWire.so", "lib/krakl-agent/plugins.json",
                                "lib/krakl-agent/build-info", "lib/krakl-agent/install-manifest", "lib/krakl-agent/swift/libswiftCore.so",
                                "lib/systemd/user/krakl-agent.service", "share/applications/krakl-agent.desktop",
                                "share/bash-completion/completions/krakl-agent", "share/man/man1/krakl-agent.1.gz"]

    /// The commit `--version` should name: this checkout's.
    static func headCommit() throws -> String {
        let result = try Harness.run("/usr/bin/git", ["-C", Harness.repoRoot, "rev-parse", "HEAD"])
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `--version`, `backends` and the file backend's conformance of an installed agent, from a folder
    /// of its own: each backend must load from `libraries`.
    static func checkInstalledAgent(_ agent: String, libraries: String) throws {
        let elsewhere = try Harness.temporaryDirectory()
        let version = try Harness.run(agent, ["--version"], currentDirectory: elsewhere)
        let commit = try headCommit()
        #expect(version.status == 0 && version.stdout.contains("commit: " + commit) && version.stdout.contains("libvpx"), "\(version)")
        let backends = try Harness.run(agent, ["backends"], currentDirectory: elsewhere)
        #expect(backends.status == 0 && backends.stdout.contains("Backends in \(libraries)/plugins.json"), "\(backends)")
        for backend in ["BackendFile", "BackendX11", "BackendPipeWire"] {
            #expect(backends.stdout.contains("loads    ABI 1.1  \(libraries)/lib\(backend).so"), "\(backend): \(backends.stdout)")
        }
        let conformance = try Harness.run(agent, ["conformance", libraries + "/libBackendFile.so"], timeout: 120, currentDirectory: elsewhere)
        #expect(conformance.status == 0 && conformance.stdout.contains(" 0 failed"), "\(conformance.stdout.suffix(600))")
        // The Swift runtime is the one installed with it, not the toolchain's.
        let ldd = try Harness.run("/usr/bin/ldd", [agent])
        #expect(ldd.stdout.contains(libraries + "/swift/libswiftCore.so") && !ldd.stdout.contains("/opt/swift") && !ldd.stdout.contains("not found"),
                "\(ldd.stdout)")
    }

    @Test func installIntoAPrefixThenUninstallLeavesNothing() throws {
        let prefix = try Harness.temporaryDirectory()
        let started = MonotonicClock.milliseconds()
        try Self.installThisBuild(prefix: prefix)
        print(String(format: "scripts/install --build-dir: %.1f s, %d files and folders", (MonotonicClock.milliseconds() - started) / 1000,
                     Self.tree(prefix).count))
        let files = Set(Self.tree(prefix).filter { !FileManager.default.isDirectory(prefix + "/" + $0) })
        for expected in Self.expectedFiles { #expect(files.contains(expected), "\(expected) was not installed: \(files.sorted())") }
        // The manifest lists every file there is, and only those (itself aside). A mimeinfo.cache is
        // there (and listed) when desktop-file-utils is installed.
        let manifest = try String(contentsOfFile: prefix + "/lib/krakl-agent/install-manifest", encoding: .utf8)
        let listed = Set(manifest.split(separator: "\n").filter { $0.hasPrefix("f ") }.map { String($0.dropFirst(2 + prefix.count + 1)) })
        #expect(listed.union(["lib/krakl-agent/install-manifest"]) == files, "manifest vs files: \(listed.symmetricDifference(files))")

        let unit = try String(contentsOfFile: prefix + "/lib/systemd/user/krakl-agent.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=\(prefix)/bin/krakl-agent daemon\n"), "\(unit)")
        #expect(FileManager.default.isExecutableFile(atPath: prefix + "/bin/krakl-agent"))
        guard let analyze = Harness.which("systemd-analyze") else {
            skipTest("systemd-analyze is not installed (Debian systemd; scripts/setup installs it)")
            return
        }
        let verify = try Harness.run(analyze, ["verify", "--man=no", prefix + "/lib/systemd/user/krakl-agent.service"], timeout: 30)
        #expect(verify.status == 0 && !["Unknown", "Invalid", "not executable", "No such file"].contains { verify.stderr.contains($0) },
                "systemd-analyze verify: \(verify)")
        let desktop = try String(contentsOfFile: prefix + "/share/applications/krakl-agent.desktop", encoding: .utf8)
        #expect(desktop.contains("\nExec=\(prefix)/bin/krakl-agent open %u\n") && desktop.contains("\nMimeType=x-scheme-handler/krakl;\n"), "\(desktop)")
        let registry = try String(contentsOfFile: prefix + "/lib/krakl-agent/plugins.json", encoding: .utf8)
        #expect(!registry.contains(".build") && registry.contains("\"\(prefix)/lib/krakl-agent/libBackendX11.so\""), "\(registry)")

        try Self.checkInstalledAgent(prefix + "/bin/krakl-agent", libraries: prefix + "/lib/krakl-agent")
        try Self.checkManPageAndCompletion(prefix: prefix)

        let removed = try Self.script(Self.uninstall, ["--prefix", prefix])
        #expect(removed.stdout.contains("removed \(listed.count) files"), "\(removed.stdout)")
        #expect(Self.tree(prefix).isEmpty, "left behind: \(Self.tree(prefix))")
        let again = try Harness.run("/bin/bash", [Self.uninstall, "--prefix", prefix])
        #expect(again.status == 1 && again.stderr.contains("nothing to remove"), "\(again)")
    }

    /// The man page is --help's text and renders without warnings; completion offers the commands and flags.
    static func checkManPageAndCompletion(prefix: String) throws {
        let page = prefix + "/share/man/man1/krakl-agent.1.gz"
        guard let man = Harness.which("man") else {
            skipTest("man is not installed (Debian man-db; scripts/setup installs it)")
            return
        }
        let rendered = try Harness.run(man, ["--warnings", "-l", page], environment: ["MANWIDTH": "120", "MANPAGER": "cat", "LC_ALL": "C.UTF-8"])
        #expect(rendered.status == 0 && rendered.stderr.isEmpty, "man: \(rendered.stderr)")
        #expect(rendered.stdout.contains("krakl-agent - share this machine's screen into a video room") && rendered.stdout.contains("open LINK")
                && rendered.stdout.contains("--connect-timeout S"), "\(rendered.stdout.prefix(800))")
        let completion = prefix + "/share/bash-completion/completions/krakl-agent"
        let complete = { (words: String, index: Int) throws -> String in
            try Harness.run("/bin/bash", ["-c", "source '\(completion)'; COMP_WORDS=('\(prefix)/bin/krakl-agent' \(words)); COMP_CWORD=\(index); "
                                          + "_krakl_agent; echo \"${COMPREPLY[*]}\""]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(try complete("co", 1).split(separator: " ").sorted() == ["code", "conformance", "connect"], "commands")
        #expect(try complete("--join x --conn", 3).contains("--connect-timeout"), "flags")
    }

    @Test func theDebianPackageInstallsRunsAndIsRemoved() throws {
        guard geteuid() == 0, let apt = Harness.which("apt-get"), Harness.which("dpkg-deb") != nil, Harness.which("dpkg-shlibdeps") != nil,
              Harness.which("patchelf") != nil else {
            skipTest("packaging and installing a .deb needs root, apt-get, dpkg-deb, dpkg-shlibdeps (dpkg-dev) and patchelf (scripts/setup)")
            return
        }
        try Harness.requireBuild()
        let output = try Harness.temporaryDirectory()
        let started = MonotonicClock.milliseconds()
        let built = try Self.script(Harness.repoRoot + "/scripts/package-deb", ["--build-dir", Harness.buildDir, "--output", output], timeout: 600)
        let deb = built.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let size = ((try? FileManager.default.attributesOfItem(atPath: deb))?[.size] as? Int) ?? 0
        print(String(format: "scripts/package-deb: %.1f s, %@ (%.1f MB)", (MonotonicClock.milliseconds() - started) / 1000, deb, Double(size) / 1e6))
        let architecture = try Harness.run("/usr/bin/dpkg", ["--print-architecture"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(deb.hasSuffix("/krakl-agent_0.1.0_\(architecture).deb"), "\(deb)")

        let contents = try Harness.run("/usr/bin/dpkg-deb", ["-c", deb]).stdout
        for path in ["./usr/bin/krakl-agent", "./usr/lib/krakl-agent/krakl-backend-host", "./usr/lib/krakl-agent/libBackendFile.so",
                     "./usr/lib/krakl-agent/libBackendX11.so", "./usr/lib/krakl-agent/libBackendPipeWire.so", "./usr/lib/krakl-agent/plugins.json",
                     "./usr/lib/krakl-agent/build-info", "./usr/lib/krakl-agent/swift/libswiftCore.so", "./usr/lib/systemd/user/krakl-agent.service",
                     "./usr/share/applications/krakl-agent.desktop", "./usr/share/bash-completion/completions/krakl-agent",
                     "./usr/share/man/man1/krakl-agent.1.gz", "./usr/share/doc/krakl-agent/copyright"] {
            #expect(contents.contains(" \(path)\n"), "\(path) is not in the package: \(contents)")
        }
        #expect(!contents.contains("install-manifest"), "a package keeps no manifest of its own")
        let fields = try Harness.run("/usr/bin/dpkg-deb", ["-f", deb, "Depends"]).stdout
        #expect(fields.contains("libvpx") && fields.contains("libssl3") && !fields.contains("swift"), "Depends: \(fields)")

        let environment = ["DEBIAN_FRONTEND": "noninteractive"]
        let installed = try Harness.run(apt, ["install", "-y", deb], timeout: 300, environment: environment)
        defer { _ = try? Harness.run(apt, ["purge", "-y", "krakl-agent"], timeout: 300, environment: environment) }
        try #require(installed.status == 0, "apt-get install: \(installed.stdout.suffix(1000)) \(installed.stderr)")
        try Self.checkInstalledAgent("/usr/bin/krakl-agent", libraries: "/usr/lib/krakl-agent")
        let unit = try String(contentsOfFile: "/usr/lib/systemd/user/krakl-agent.service", encoding: .utf8)
        #expect(unit.contains("\nExecStart=/usr/bin/krakl-agent daemon\n"), "\(unit)")

        let purged = try Harness.run(apt, ["purge", "-y", "krakl-agent"], timeout: 300, environment: environment)
        #expect(purged.status == 0, "apt-get purge: \(purged.stdout.suffix(800)) \(purged.stderr)")
        #expect(!FileManager.default.fileExists(atPath: "/usr/bin/krakl-agent") && !FileManager.default.fileExists(atPath: "/usr/lib/krakl-agent"))
    }

    /// A desktop session's folders, all inside one test folder: what --user installs into and what
    /// xdg-mime and xdg-open read (never the machine's own configuration).
    struct Session {
        let home: String
        var dataHome: String { home + "/.local/share" }
        var configHome: String { home + "/.config" }
        var agent: String { home + "/.local/bin/krakl-agent" }
        var environment: [String: String] { ["HOME": home, "XDG_DATA_HOME": dataHome, "XDG_CONFIG_HOME": configHome] }

        init() throws {
            home = try Harness.temporaryDirectory() + "/home"
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        }

        /// An xdg-utils command with only this session's variables: no desktop (X-Generic, so xdg-open
        /// reads the desktop entries and mimeapps.list itself), no system folders, and a browser that
        /// fails, so a link nobody handles cannot open anything.
        func xdg(_ command: String, _ arguments: [String], runtime: String) throws -> Harness.Result {
            try Harness.run("/usr/bin/env", ["-i", "PATH=/usr/bin:/bin", "HOME=\(home)", "XDG_DATA_HOME=\(dataHome)", "XDG_CONFIG_HOME=\(configHome)",
                                             "XDG_DATA_DIRS=\(home)/none", "XDG_CONFIG_DIRS=\(home)/none", "XDG_CURRENT_DESKTOP=X-Generic",
                                             "DISPLAY=:krakl-test", "BROWSER=/bin/false", "XDG_RUNTIME_DIR=\(runtime)", "KRAKL_NO_NOTIFY=1",
                                             command] + arguments, timeout: 60)
        }
    }

    /// A --user install registers the krakl: handler, and xdg-open hands a link, percent-encoded as a
    /// browser may send it, to the running daemon (the installed agent, in a WHIP room), which shares;
    /// a link that is no join code is refused with the join code's message and status.
    @Test func aJoinLinkThroughXdgOpenReachesTheDaemon() throws {
        guard let xdgOpen = Harness.which("xdg-open"), let xdgMime = Harness.which("xdg-mime") else {
            skipTest("xdg-open and xdg-mime are not installed (Debian xdg-utils; scripts/setup installs it)")
            return
        }
        let session = try Session()
        try Self.installThisBuild(prefix: nil, environment: session.environment)
        let runtime = try Harness.temporaryDirectory()
        chmod(runtime, 0o700)
        let handler = try session.xdg(xdgMime, ["query", "default", "x-scheme-handler/krakl"], runtime: runtime)
        #expect(handler.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "krakl-agent.desktop", "xdg-mime: \(handler)")

        guard let room = try RoomSessionTests.WhipRoom() else { return }
        // The installed agent with its installed plugins.json (no --plugins), in a folder without one.
        let daemon = try DaemonTests.Daemon(runtime: runtime, namespace: room.namespace,
                                            extra: ["--address", "127.0.0.2", "--option", "scene=typing", "--option", "width=640", "--option", "height=360"],
                                            agent: session.agent, folder: session.home)
        let (codeFile, _) = try room.codeFile(identity: "Link's screen")
        let code = try String(contentsOfFile: codeFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let link = "krakl:" + (code.dropFirst("krakl:".count).addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
        #expect(link.hasPrefix("krakl:v%3D1%3B"), "\(link)")
        let opened = try session.xdg(xdgOpen, [link], runtime: runtime)
        #expect(opened.status == 0 && opened.stdout.contains("krakl-agent: sharing in ") && opened.stdout.contains("as \"Link's screen\""),
                "xdg-open: \(opened)")
        let status = try daemon.status()
        #expect(status["state"] as? String == "sharing" && status["identity"] as? String == "Link's screen", "\(status)")
        #expect(try daemon.client(["stop"]).status == 0)
        #expect(room.server.requests("DELETE", atLeast: 1, timeout: 5).count == 1, "the room never saw DELETE")

        // No join code: refused by the handler, in the join code's words; the daemon is not asked.
        let refused = try session.xdg(xdgOpen, ["krakl:hello"], runtime: runtime)
        #expect(refused.status != 0 && refused.stderr.contains("not a valid join code: its first field must be the version, v=1"), "\(refused)")
        for (text, status) in [("https://example.com/", 40), ("krakl:v%3D2%3Bk%3Dwhip", 41), ("krakl:v=1;k=whip;u=http://127.0.0.1:9/;t=x", 42)] {
            let direct = try daemon.client(["open", text])
            #expect(direct.status == Int32(status) && direct.stderr.contains("join code"), "open \(text): \(direct)")
        }
        let idle = try daemon.status()
        #expect(idle["state"] as? String == "idle" && (idle["lastEnd"] as? [String: Any])?["reason"] as? String == "user-stopped", "\(idle)")
        // No daemon running: `open` starts one (in a session of its own, with open's other flags,
        // its output in XDG_STATE_HOME) and hands it the code over the socket; the room gets it.
        let lonely = try Harness.temporaryDirectory(), state = try Harness.temporaryDirectory()
        chmod(lonely, 0o700)
        let (second, _) = try room.codeFile(identity: "Lone link")
        let secondLink = try String(contentsOfFile: second, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let (program, argv) = room.namespace.command("/usr/bin/env", ["XDG_RUNTIME_DIR=" + lonely, "XDG_STATE_HOME=" + state, session.agent,
                                                                      "open", secondLink, "--address", "127.0.0.2", "--option", "scene=typing"])
        let started = try Harness.run(program, argv, timeout: 60, currentDirectory: session.home)
        #expect(started.status == 0 && started.stderr.contains("no daemon was running: started one")
                && started.stdout.contains("as \"Lone link\""), "open with no daemon: \(started)")
        let lone = try Harness.run(session.agent, ["status", "--json"], environment: ["XDG_RUNTIME_DIR": lonely])
        let loneStatus = (try? JSONSerialization.jsonObject(with: Data(lone.stdout.utf8)) as? [String: Any])?["status"] as? [String: Any] ?? [:]
        #expect(loneStatus["state"] as? String == "sharing" && loneStatus["identity"] as? String == "Lone link", "\(lone)")
        #expect((try? String(contentsOfFile: state + "/krakl-agent/daemon.log", encoding: .utf8))?.contains("as \"Lone link\"") == true,
                "the started daemon's log")
        _ = try Harness.run(session.agent, ["stop"], environment: ["XDG_RUNTIME_DIR": lonely])
        if let pid = loneStatus["pid"] as? Int, pid > 0 { kill(pid_t(pid), SIGTERM) }

        try Self.script(Self.uninstall, ["--user"], environment: session.environment)
        #expect(Self.tree(session.home).isEmpty, "left behind: \(Self.tree(session.home))")
    }

    /// `scripts/install --user`, then `systemctl --user enable --now krakl-agent` under a real user
    /// manager (as DaemonTests.theUnitRunsUnderASystemdUserManager runs one: a mount namespace with a
    /// tmpfs on /run/systemd, since no systemd is PID 1 here): the installed unit starts the installed
    /// agent, which answers; `scripts/uninstall --user` disables and stops it and leaves nothing.
    @Test func theInstalledUserUnitEnablesAndStarts() throws {
        guard geteuid() == 0, FileManager.default.isExecutableFile(atPath: "/lib/systemd/systemd"), let unshare = Harness.which("unshare"),
              let systemctl = Harness.which("systemctl") else {
            skipTest("a systemd user manager needs root (a mount namespace), /lib/systemd/systemd, unshare and systemctl")
            return
        }
        let session = try Session()
        try Self.installThisBuild(prefix: nil, environment: session.environment)
        let runtime = try Harness.temporaryDirectory()
        chmod(runtime, 0o700)
        let show = "'\(systemctl)' --user show -p ActiveState,SubState,FragmentPath,ExecMainStatus krakl-agent | tr '\\n' ' '; echo"
        let wants = session.configHome + "/systemd/user/graphical-session.target.wants/krakl-agent.service"
        let exports = "HOME='\(session.home)' XDG_DATA_HOME='\(session.dataHome)' XDG_CONFIG_HOME='\(session.configHome)' "
            + "XDG_RUNTIME_DIR='\(runtime)' KRAKL_NO_NOTIFY=1"
        let script = DaemonTests.userManagerScript(exports: exports, log: runtime + "/manager.log") + """
            '\(systemctl)' --user enable --now krakl-agent; echo "ENABLED=$?"
            echo "AFTER-ENABLE: $(\(show))"
            [ -L '\(wants)' ] && echo "WANTS-LINK"
            '\(session.agent)' status; echo "STATUS=$?"
            bash '\(Self.uninstall)' --user; echo "UNINSTALLED=$?"
            echo "AFTER-UNINSTALL: $(\(show))"
            [ -e '\(wants)' ] || [ -L '\(wants)' ] || echo "NO-WANTS-LINK"
            """
        let path = runtime + "/enable.sh"
        try script.write(toFile: path, atomically: true, encoding: .utf8)
        let run = try Harness.run(unshare, ["-m", "--propagation", "private", "/bin/bash", path], timeout: 120)
        print("systemd --user with the installed unit: \(run.stdout)")
        try #require(!run.stdout.contains("MANAGER-DID-NOT-START") && run.status == 0, "\(run) \(procText(runtime + "/manager.log"))")
        let enabled = run.stdout.components(separatedBy: "AFTER-ENABLE:").last?.components(separatedBy: "\n").first ?? ""
        #expect(run.stdout.contains("ENABLED=0") && enabled.contains("ActiveState=active") && enabled.contains("SubState=running")
                && enabled.contains("FragmentPath=\(session.dataHome)/systemd/user/krakl-agent.service"), "enable --now: \(run.stdout)")
        #expect(run.stdout.contains("WANTS-LINK") && run.stdout.contains("krakl-agent: idle (daemon pid") && run.stdout.contains("STATUS=0"), "\(run.stdout)")
        let after = run.stdout.components(separatedBy: "AFTER-UNINSTALL:").last ?? ""
        #expect(run.stdout.contains("UNINSTALLED=0") && after.contains("ActiveState=inactive") && run.stdout.contains("NO-WANTS-LINK"),
                "after uninstall: \(run.stdout)")
        #expect(!FileManager.default.fileExists(atPath: session.home + "/.local"), "left behind: \(Self.tree(session.home))")
    }

    /// A join link as a browser may hand it over: percent-encoded as a whole, or not at all.
    @Test func joinLinksAreDecodedOnce() {
        let code = "krakl:v=1;k=whip;u=https://h/w%3Bx;t=a.b.c"
        #expect(JoinCode.text(ofLink: code) == code)
        #expect(JoinCode.text(ofLink: " \(code)\n") == code)
        let encoded = "krakl:" + (code.dropFirst(6).addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
        #expect(encoded.contains("%253B") && JoinCode.text(ofLink: encoded) == code, "\(encoded)")
        #expect(JoinCode.text(ofLink: "KRAKL:v%3d1%3Bk%3Dwhip") == "KRAKL:v=1;k=whip")
        #expect(JoinCode.text(ofLink: "krakl:v%3D1%ZZ") == "krakl:v%3D1%ZZ", "an undecodable link is left for the parser to refuse")
        #expect(JoinCode.text(ofLink: "https://example.com/") == "https://example.com/")
    }
}

extension FileManager {
    func isDirectory(_ path: String) -> Bool {
        var directory: ObjCBool = false
        return fileExists(atPath: path, isDirectory: &directory) && directory.boolValue
    }
}
