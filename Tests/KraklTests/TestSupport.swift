import Foundation
import Testing

/// Paths and process helpers shared by the tests. The tests drive the real
/// `krakl-agent` binary and the real backend libraries that `swift build`
/// put next to the test runner.
enum Harness {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

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

    static func temporaryDirectory() throws -> String {
        let path = NSTemporaryDirectory() + "krakl-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

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
                    environment: [String: String]? = nil, currentDirectory: String? = nil) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        // Read both pipes while it runs so a chatty child never blocks on a full pipe.
        let group = DispatchGroup()
        let outData = DataBox(), errData = DataBox()
        for (pipe, box) in [(out, outData), (err, errData)] {
            group.enter()
            DispatchQueue.global().async { box.data = pipe.fileHandleForReading.readDataToEndOfFile(); group.leave() }
        }
        try process.run()
        let finished = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in finished.signal() }
        var timedOut = false
        if finished.wait(timeout: .now() + timeout) == .timedOut {
            timedOut = true
            process.terminate()
            if finished.wait(timeout: .now() + 5) == .timedOut { kill(process.processIdentifier, SIGKILL); finished.wait() }
        }
        group.wait()
        return Result(status: process.terminationStatus, stdout: String(decoding: outData.data, as: UTF8.self),
                      stderr: String(decoding: errData.data, as: UTF8.self), timedOut: timedOut)
    }

    /// Runs krakl-agent in a fresh folder, so its default recording
    /// (krakl-recording.webm) never lands in the repository.
    static func agent(_ arguments: [String], timeout: Double = 60, environment: [String: String]? = nil) throws -> Result {
        try run(agent, arguments, timeout: timeout, environment: environment, currentDirectory: try temporaryDirectory())
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

/// A krakl-agent left running, for tests that signal it mid-run.
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
        let deadline = Date().addingTimeInterval(timeout)
        while output.components(separatedBy: text).count - 1 < count && Date() < deadline {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            output += String(decoding: chunk, as: UTF8.self)
        }
        return output.components(separatedBy: text).count - 1 >= count
    }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Interrupts it and waits for it to end; returns its exit status.
    func stop() -> Int32 {
        signal(SIGINT)
        output += String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return process.terminationReason == .exit ? process.terminationStatus : -1
    }
}
