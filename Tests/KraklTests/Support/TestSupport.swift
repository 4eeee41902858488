import Foundation
import Synchronization
import Testing

/// Paths and process helpers shared by the tests. The tests drive the real
/// `krakl-agent` binary and the real backend libraries that `swift build`
/// put next to the test runner.
enum Harness {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

    /// The build folder: where the test runner, krakl-agent and the backend .so files are.
    static let buildDir: String = {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var url = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // The runner may be inside a bundle folder (…/x.xctest/…); walk up to the folder holding krakl-agent.
        for _ in 0..<4 where !FileManager.default.fileExists(atPath: url.appendingPathComponent("krakl-agent").path) {
            url.deleteLastPathComponent()
        }
        return url.path
    }()

    static var agent: String { buildDir + "/krakl-agent" }
    static func library(_ name: String) -> String { buildDir + "/lib\(name).so" }
    static let header = repoRoot + "/Sources/KraklBackendABI/include"

    /// Fails the test (rather than crash later) when `swift build` has not produced the binaries.
    static func requireBuild() throws {
        for path in [agent, library("BackendFile"), library("BackendX11"), library("BackendPipeWire")] {
            try #require(FileManager.default.fileExists(atPath: path), "missing \(path): run `swift build` before `swift test` (scripts/test does)")
        }
    }

    /// A fresh scratch folder for one test, inside this run's folder.
    static func temporaryDirectory() throws -> String {
        let path = runFolder + "/" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Every scratch folder of a test run lives in one folder, removed when the
    /// runner exits: the tests write raw 1080p pictures for ffmpeg to compare
    /// (≈ 0.8 GB a recording), and folders left behind filled a disk here
    /// (79 GB after some 50 runs). Folders of runs that died before exiting
    /// are removed by the next run. World-readable: daemons of the PipeWire
    /// tests run as another user and read fixtures from it.
    static let runFolder: String = {
        let base = NSTemporaryDirectory() + "krakl-tests-"
        let parent = (base as NSString).deletingLastPathComponent
        for name in (try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? [] {
            let path = parent + "/" + name
            guard path.hasPrefix(base), let pid = pid_t(path.dropFirst(base.count)),
                  kill(pid, 0) != 0, errno == ESRCH else { continue }
            try? FileManager.default.removeItem(atPath: path)
        }
        let folder = base + "\(getpid())"
        try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        chmod(folder, 0o755)
        atexit { try? FileManager.default.removeItem(atPath: Harness.runFolder) }
        return folder
    }()

    /// The repository's plugins.json with its `.build/release/` libraries
    /// pointed at this build's folder (the tests run the debug build).
    static func registryForThisBuild(in folder: String) throws -> String {
        let text = try String(contentsOfFile: repoRoot + "/plugins.json", encoding: .utf8)
            .replacingOccurrences(of: "\".build/release/", with: "\"\(buildDir)/")
        let path = folder + "/plugins.json"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    struct Result {
        let status: Int32
        let stdout: String
        let stderr: String
        let timedOut: Bool
    }

    /// Runs a program to completion, killing it after `timeout` seconds.
    @discardableResult
    static func run(_ program: String, _ arguments: [String], timeout: Double = 60,
                    environment: [String: String]? = nil, currentDirectory: String? = nil, stdin: String? = nil) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
        // stdout and stderr are pipes of our own, read and closed with read(2)/close(2): given a Pipe,
        // Foundation's run() closes the parent's write end with `try!`, which traps when that
        // descriptor number was closed meanwhile by another thread's stale close (a CI run crashed
        // so in ChaosTests), and FileHandle's reads trap the same way.
        var outFds: [Int32] = [-1, -1], errFds: [Int32] = [-1, -1]
        guard pipe(&outFds) == 0 else { throw POSIXError(.EMFILE) }
        guard pipe(&errFds) == 0 else { Glibc.close(outFds[0]); Glibc.close(outFds[1]); throw POSIXError(.EMFILE) }
        for fd in outFds + errFds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        process.standardOutput = FileHandle(fileDescriptor: outFds[1], closeOnDealloc: false)
        process.standardError = FileHandle(fileDescriptor: errFds[1], closeOnDealloc: false)
        let input = Pipe()
        process.standardInput = stdin == nil ? FileHandle.nullDevice : input
        // The handler is set before run(): a child that ends at once may
        // otherwise end before there is a handler to hear of it.
        let finished = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in finished.signal() }
        do {
            try process.run()
        } catch {
            for fd in outFds + errFds { Glibc.close(fd) }
            throw error
        }
        Glibc.close(outFds[1])
        Glibc.close(errFds[1])
        // Read both pipes while it runs so a chatty child never blocks on a full pipe. Each reader
        // closes its own end when it is done: it may outlive this call (below).
        let output = OutputReader(fd: outFds[0], closing: true), errors = OutputReader(fd: errFds[0], closing: true)
        if let stdin {
            input.fileHandleForWriting.write(Data(stdin.utf8))
            try? input.fileHandleForWriting.close()
        }
        var timedOut = false
        if finished.wait(timeout: .now() + timeout) == .timedOut {
            timedOut = true
            process.terminate()
            if finished.wait(timeout: .now() + 5) == .timedOut {
                kill(process.processIdentifier, SIGKILL)
                // Bounded even if the termination is never reported.
                let deadline = Date().addingTimeInterval(10)
                while finished.wait(timeout: .now() + 0.1) == .timedOut && process.isRunning && Date() < deadline {}
            }
        }
        // The pipes end when the last holder closes them, which is not the child when it left a
        // process of its own running with them (a daemon, a backend host stuck in a call). Waiting
        // for that without a bound hung a CI run until its time ran out; ten seconds after the
        // child ended, what was read is the answer, and the note says why it may be short.
        let ended = DispatchTime.now() + 10
        let (stdout, stderr) = (output.text(by: ended), errors.text(by: ended))
        // Foundation traps on the status of a process it has not seen end.
        guard reap(process) else {
            return Result(status: -1, stdout: stdout, stderr: stderr + "\n(its end was never reported)", timedOut: true)
        }
        // A death by signal must not pass for an exit status of the same number.
        let status = process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
        return Result(status: status, stdout: stdout, stderr: stderr, timedOut: timedOut)
    }

    /// Runs krakl-agent in a fresh folder, so its default recording
    /// (krakl-recording.webm) never lands in the repository.
    static func agent(_ arguments: [String], timeout: Double = 60, environment: [String: String]? = nil, stdin: String? = nil) throws -> Result {
        try run(agent, arguments, timeout: timeout, environment: environment, currentDirectory: try temporaryDirectory(), stdin: stdin)
    }

    /// Compiles a C backend with nothing but the public header and `cc -shared`.
    static func compileBackend(_ source: String, into folder: String, name: String, defines: [String] = []) throws -> String {
        let output = folder + "/lib\(name).so"
        let result = try run("/usr/bin/cc", ["-std=c99", "-D_DEFAULT_SOURCE", "-Wall", "-Werror", "-O1", "-shared", "-fPIC", "-pthread",
                                             "-I", header] + defines + [source, "-o", output])
        try #require(result.status == 0, "cc failed: \(result.stderr)")
        return output
    }

    /// Finds a program on PATH, or nil.
    static func which(_ program: String) -> String? {
        for folder in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(folder)/\(program)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }
}

/// Filled by one reader thread, read after the group wait.
final class DataBox: @unchecked Sendable { var data = Data() }

/// Reads a program's output from the moment it starts (so it never blocks on a full pipe) until
/// the pipe ends, on a thread of its own; `text(by:)` answers within a bound even when a process
/// the program started still holds the pipe open (the reader then outlives the answer).
final class OutputReader: Sendable {
    private let box = OutputBox()
    private let done = DispatchSemaphore(value: 0)

    /// `fd` is closed by the reader at the pipe's end when `closing`; else `owner` (a Pipe whose
    /// descriptor it is) is kept alive until then.
    init(fd: Int32, closing: Bool, owner: (any Sendable)? = nil) {
        Thread.detachNewThread { [box, done] in
            withExtendedLifetime(owner) { Harness.readToEnd(fd, into: box) }
            if closing { Glibc.close(fd) }
            done.signal()
        }
    }

    convenience init(_ pipe: Pipe) {
        self.init(fd: pipe.fileHandleForReading.fileDescriptor, closing: false, owner: pipe)
    }

    /// Everything read once the pipe ended, or what was read by `deadline`, with a note.
    func text(by deadline: DispatchTime) -> String {
        guard done.wait(timeout: deadline) == .success else {
            return box.text + "\n(the output was still open at the deadline: a process it started holds it)"
        }
        done.signal() // for the next caller
        return box.text
    }

    func text(within seconds: Double) -> String { text(by: .now() + seconds) }
}

/// A program's output, filled by a reader thread while others may read it
/// (a reader can outlive the wait for it: Harness.run).
final class OutputBox: Sendable {
    private let bytes = Mutex(Data())
    func append(_ chunk: ArraySlice<UInt8>) { bytes.withLock { $0.append(contentsOf: chunk) } }
    var data: Data { bytes.withLock { $0 } }
    var text: String { String(decoding: data, as: UTF8.self) }
}

/// A fixture program compiled once per test run. Tests run in parallel, so
/// the cache is behind a lock (a CI run failed on another unguarded static:
/// two tests drew the same namespace name from a shared counter).
final class BuiltOnce: @unchecked Sendable {
    private let lock = NSLock()
    private var path: String?
    private let build: () throws -> String
    init(_ build: @escaping () throws -> String) { self.build = build }

    func get() throws -> String {
        lock.lock()
        defer { lock.unlock() }
        if let path { return path }
        let made = try build()
        path = made
        return made
    }
}

/// A krakl-agent left running, for tests that signal it mid-run.
/// Appends a child's output from `fd` to `text` until `done` holds for it,
/// the output ends, or `timeout` passes; returns whether `done` holds. It
/// polls before each read, so a silent child cannot hold a test past its deadline.
@discardableResult
func readOutput(_ fd: Int32, into text: inout String, timeout: Double, until done: (String) -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    var buffer = [UInt8](repeating: 0, count: 65536)
    while !done(text) {
        let left = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard left > 0, poll(&pfd, 1, left) > 0 else { break }
        let n = Glibc.read(fd, &buffer, buffer.count)
        if n <= 0 { break }
        text += String(decoding: buffer[0..<n], as: UTF8.self)
    }
    return done(text)
}

final class RunningAgent {
    let process = Process()
    private let out = Pipe()
    private(set) var output = ""

    init(_ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: Harness.agent)
        process.arguments = arguments
        process.currentDirectoryURL = URL(fileURLWithPath: try Harness.temporaryDirectory())
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    /// Reads stdout until it holds `text` `count` times, or `timeout` passes,
    /// or the output ends. Returns whether it got there.
    @discardableResult
    func read(until text: String, count: Int = 1, timeout: Double = 20) -> Bool {
        readOutput(out.fileHandleForReading.fileDescriptor, into: &output, timeout: timeout) { $0.components(separatedBy: text).count - 1 >= count }
    }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Interrupts it and waits for it to end; returns its exit status.
    func stop() -> Int32 {
        signal(SIGINT)
        read(until: "\u{0}", timeout: 20) // reads to the end of its output (bounded)
        if !Harness.waitForExit(process, seconds: 10) {
            signal(SIGKILL)
            process.waitUntilExit()
            return -1
        }
        return process.terminationReason == .exit ? process.terminationStatus : -1
    }

    deinit {
        if process.isRunning { signal(SIGKILL) }
    }
}

/// An Xvfb of the test's own on a free display number, stopped on deinit.
/// `-noreset`: an X server resets (root window back to its default, every
/// drawing gone) whenever its last client disconnects, which is what
/// happens between the test drawing with a short-lived client and the
/// backend connecting.
final class XvfbServer {
    let display: String
    let process = Process()

    /// nil (after printing SKIP) when Xvfb is not installed.
    init?(width: Int = 1024, height: Int = 768) throws {
        guard let xvfb = Harness.which("Xvfb") else {
            skipTest("Xvfb is not installed (scripts/setup installs it)")
            return nil
        }
        // Xvfb picks a free display number itself (-displayfd: it takes the first whose lock file it
        // can create, atomically, and writes the number to stdout once it listens), so tests here
        // and in other processes never pick the same one, as "the first number without a socket"
        // once did.
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: xvfb)
        process.arguments = ["-displayfd", "1", "-screen", "0", "\(width)x\(height)x24", "-nolisten", "tcp", "-noreset"]
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        try? output.fileHandleForWriting.close()
        let reader = output.fileHandleForReading
        let box = DataBox()
        let got = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            // Until the number's line, or the end (Xvfb exited).
            while !box.data.contains(UInt8(ascii: "\n")) {
                let chunk = reader.availableData
                if chunk.isEmpty { break }
                box.data.append(chunk)
            }
            got.signal()
        }
        guard got.wait(timeout: .now() + 10) == .success,
              let number = Int(String(decoding: box.data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) else {
            if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
            throw XvfbFailed()
        }
        display = ":\(number)"
        // Ready for clients now; one client's request proves it (bounded: 10 s).
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if (try? Harness.run("/usr/bin/xsetroot", ["-display", display, "-solid", "#336699"], timeout: 5).status) == 0 { return }
            _ = Harness.waitForExit(process, seconds: 0.05)
        }
        throw XvfbFailed()
    }

    struct XvfbFailed: Error {}

    /// Fills a rectangle of the root window (Tests/Fixtures/xfill.c).
    func fill(x: Int, y: Int, width: Int, height: Int, rgb: String) throws {
        let tool = try XvfbServer.xfill()
        let result = try Harness.run(tool, [display, "\(x)", "\(y)", "\(width)", "\(height)", rgb])
        try #require(result.status == 0, "xfill: \(result.stderr)")
    }

    private static let xfillTool = BuiltOnce {
        let out = try Harness.temporaryDirectory() + "/xfill"
        let cc = try Harness.run("/usr/bin/cc", [Harness.repoRoot + "/Tests/Fixtures/xfill.c", "-o", out, "-lX11"])
        try #require(cc.status == 0, "cc xfill: \(cc.stderr)")
        return out
    }
    static func xfill() throws -> String { try xfillTool.get() }

    /// SIGKILL: children of the test runner inherit a signal mask that
    /// blocks SIGTERM (seen: Xvfb ignored terminate()), and a killed server
    /// is also what "the X server died" means.
    /// Moves the pointer as a device would (Tests/Fixtures/xpointer.c, XTest).
    func movePointer(x: Int, y: Int) throws {
        let dir = try Harness.temporaryDirectory()
        let tool = dir + "/xpointer"
        let cc = try Harness.run("/usr/bin/cc", [Harness.repoRoot + "/Tests/Fixtures/xpointer.c", "-o", tool, "-lX11", "-lXtst"])
        try #require(cc.status == 0, "cc xpointer: \(cc.stderr)")
        let result = try Harness.run(tool, [display, "\(x)", "\(y)"])
        try #require(result.status == 0, "xpointer: \(result.stderr)")
    }

    func kill() {
        let pid = process.processIdentifier
        if process.isRunning { Glibc.kill(pid, SIGKILL) }
        process.waitUntilExit()
        // A killed server leaves its socket and lock file: free the number, but only while the lock
        // still names this server (its pid, as X writes it): after a first kill() the number may
        // already be another test's server's.
        let number = display.dropFirst()
        let lock = "/tmp/.X\(number)-lock"
        guard let owner = try? String(contentsOfFile: lock, encoding: .utf8),
              Int32(owner.trimmingCharacters(in: .whitespacesAndNewlines)) == pid else { return }
        try? FileManager.default.removeItem(atPath: "/tmp/.X11-unix/X\(number)")
        try? FileManager.default.removeItem(atPath: lock)
    }

    deinit { kill() }
}

extension Harness {
    /// Waits up to `seconds` for `process` to exit (a bounded pause between polls).
    @discardableResult
    static func waitForExit(_ process: Process, seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { usleep(5_000) }
        return reap(process)
    }

    /// Appends what `fd` gives to `box` as it comes, until its end (or a read error).
    static func readToEnd(_ fd: Int32, into box: OutputBox) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = Glibc.read(fd, &buffer, buffer.count)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return }
            box.append(buffer[0..<n])
        }
    }

    /// Whether `process` has ended; if so, lets Foundation release it. swift-corelibs-foundation's
    /// Process and its run-loop source hold each other until `waitUntilExit()` drops the source, so a
    /// Process only waited for through `terminationHandler` or `isRunning` is never freed, nor the
    /// pipes it holds. The test runner leaked two descriptors per program run that way (1,100 after
    /// 5 minutes of the suite), and past ~1,360 open descriptors Foundation's own `run()` crashed
    /// in CI: it copies each `/proc/self/fd` entry's whole 256-byte name, reading past readdir's
    /// 32 KB buffer once that buffer is full (Process.swift, findMaximumOpenFromProcSelfFD).
    @discardableResult
    static func reap(_ process: Process) -> Bool {
        guard !process.isRunning else { return false }
        process.waitUntilExit() // returns at once for an ended process, dropping the source
        return true
    }
}

/// A test that cannot run here says why (the caller returns). Plain `swift test` reports it as
/// skipped, not passed (Swift Testing's test cancellation, Swift 6.3); under scripts/test (CI), where
/// every component must be installed, it is a failure (KRAKL_SKIP_IS_FAILURE=1): a skipped test that
/// reads as passed would hide a missing install step.
func skipTest(_ reason: String) {
    print("SKIP: \(reason)")
    if ProcessInfo.processInfo.environment["KRAKL_SKIP_IS_FAILURE"] == "1" {
        Issue.record(Comment(rawValue: "skipped under scripts/test, where every component must be installed: \(reason)"))
    } else {
        // Cancels the running test (reported as skipped with this reason); the error it throws is
        // dropped because the caller returns by itself, from helpers as well as from test bodies.
        _ = try? Test.cancel(Comment(rawValue: reason))
    }
}

/// The whole text of a /proc file. Foundation's `String(contentsOfFile:)` stops after one read
/// there (procfs reports size 0 and hands out about a page per read), so in a test process with
/// many mappings a line past the first 4 KB of /proc/self/maps was never seen.
func procText(_ path: String) -> String {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return "" }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    // Bounded: no /proc file a test reads comes near 64 MB.
    while bytes.count < 64 << 20 {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { break }
        bytes += chunk[..<n]
    }
    return String(decoding: bytes, as: UTF8.self)
}
