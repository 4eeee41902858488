import Foundation
import Testing
import KraklBase
import KraklHost

/// Ctrl-C while the agent waits on a room server that accepted the connection and never answers:
/// the person gets the idle prompt at once (not after the driver's 10 s request time-out), and the
/// idle agent then ends when its input ends (it used to spin at full CPU in the standard library's
/// readLine, which retries getline while a stale EINTR from the Ctrl-C sits in errno).
@Suite(.tags(.integration)) struct StopWhileJoiningTests {
    /// A TCP listener on loopback that never accepts: connects succeed, requests are never read.
    final class SilentServer {
        let fd: Int32
        let port: Int
        init() throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let bound = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
            }
            guard fd >= 0, bound, listen(fd, 8) == 0 else {
                if fd >= 0 { close(fd) }
                throw POSIXError(.EADDRNOTAVAIL)
            }
            self.fd = fd
            port = Int(UInt16(bigEndian: address.sin_port))
        }
        deinit { close(fd) }
    }

    /// The agent joining `server` (a WHIP code naming it) with `arguments`: the process, its stdin,
    /// and the pipe its stdout and stderr go to (keep it: it owns the descriptor).
    static func joinSilentServer(_ server: SilentServer, _ arguments: [String]) throws -> (Process, Pipe, Pipe) {
        let made = try Harness.run("/usr/bin/python3", [RoomSessionTests.codeScript, "--kind", "whip",
                                                       "--url", "http://127.0.0.1:\(server.port)/whip", "--identity", "Ada"])
        let code = try Harness.temporaryDirectory() + "/code.txt"
        try made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).write(toFile: code, atomically: true, encoding: .utf8)
        let agent = Process()
        agent.executableURL = URL(fileURLWithPath: Harness.agent)
        agent.arguments = ["--join", "@" + code] + arguments
        let input = Pipe(), output = Pipe()
        agent.standardInput = input
        agent.standardOutput = output
        agent.standardError = output
        try agent.run()
        return (agent, input, output)
    }

    @Test func ctrlCWhileJoiningIsIdleAtOnceAndEndOfInputQuits() throws {
        try Harness.requireBuild()
        let server = try SilentServer()
        let (agent, input, output) = try Self.joinSilentServer(server, ["--plugins", try Harness.registryForThisBuild(in: try Harness.temporaryDirectory()), "--backend", "file"])
        defer { if agent.isRunning { kill(agent.processIdentifier, SIGKILL) } }
        let fd = output.fileHandleForReading.fileDescriptor
        var text = ""
        try #require(readOutput(fd, into: &text, timeout: 30) { $0.contains("joining") }, "never joined: \(text)")

        kill(agent.processIdentifier, SIGINT)
        let interrupted = MonotonicClock.milliseconds()
        let idle = readOutput(fd, into: &text, timeout: 20) { $0.contains("idle.") }
        let idleMs = MonotonicClock.milliseconds() - interrupted
        print(String(format: "Ctrl-C while a silent WHIP server holds the POST: idle after %.0f ms (request time-out 10 s)", idleMs))
        #expect(idle && text.contains("You stopped sharing."), "\(text)")
        // Structural, not a speed claim: before the fix the stop waited out the 10 s request time-out.
        #expect(idleMs < 5000, "the stop waited for the request's time-out: \(Int(idleMs)) ms")

        try input.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(10)
        while agent.isRunning && Date() < deadline { usleep(20_000) }
        #expect(!agent.isRunning, "the idle agent did not end when its input ended: \(text)")
        if !agent.isRunning { #expect(agent.terminationStatus == 0, "exit \(agent.terminationStatus): \(text)") }
        withExtendedLifetime(output) {}
    }

    /// Ctrl-C while the backend has not returned from create() (a portal's dialog waiting for the
    /// person, or a hang): the session ends at once instead of queueing its leave behind create(),
    /// and the idle agent quits when its input ends.
    @Test func ctrlCWhileTheSourceIsBeingMadeIsIdleAtOnce() throws {
        try Harness.requireBuild()
        let server = try SilentServer()
        let (agent, input, output) = try Self.joinSilentServer(server, ["--plugins", try BackendContractTests.registry(), "--option", "misbehave=hang-create"])
        defer { if agent.isRunning { kill(agent.processIdentifier, SIGKILL) } }
        let fd = output.fileHandleForReading.fileDescriptor
        var text = ""
        try #require(readOutput(fd, into: &text, timeout: 30) { $0.contains("preparing the screen source") }, "never began: \(text)")
        // The backend's child (isolated by default: the fixture lies outside the agent's folder) is
        // up, with the thread that calls create() (bounded poll).
        let inside = Date().addingTimeInterval(10)
        while !BackendContractTests.hasThread(named: "krakl-ctl", in: agent.processIdentifier) && Date() < inside { usleep(20_000) }
        kill(agent.processIdentifier, SIGINT)
        let interrupted = MonotonicClock.milliseconds()
        let idle = readOutput(fd, into: &text, timeout: 90) { $0.contains("idle.") }
        let idleMs = MonotonicClock.milliseconds() - interrupted
        #expect(idle && text.contains("You stopped sharing."), "\(text)")
        // Structural, not a speed claim: a hang guard far below create()'s 900 s budget, which the old order
        // waited for (the fixture's create() never returns); the target is at once (well under 1 s).
        #expect(idleMs < 60_000, "the stop waited for create(): \(Int(idleMs)) ms")
        try input.fileHandleForWriting.close()
        let end = Date().addingTimeInterval(10)
        while agent.isRunning && Date() < end { usleep(20_000) }
        #expect(!agent.isRunning, "the idle agent did not end when its input ended: \(text)")
        withExtendedLifetime(output) {}
    }
}
