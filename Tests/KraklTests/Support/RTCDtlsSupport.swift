import Foundation
import Glibc
import KraklBase
import KraklHost
import KraklRTC
import Testing

/// Upper-case hex without separators, as `openssl s_server` prints keying material.
func dtlsHex(_ bytes: [UInt8]) -> String {
    bytes.map { String(format: "%02X", $0) }.joined()
}

/// Bytes from hex text (whitespace ignored); nil on an odd length or a non-hex digit.
func dtlsBytes(hex text: String) -> [UInt8]? {
    let digits = Array(text.filter { !$0.isWhitespace })
    guard digits.count % 2 == 0 else { return nil }
    var bytes: [UInt8] = []
    for index in stride(from: 0, to: digits.count, by: 2) {
        guard let byte = UInt8(String(digits[index...index + 1]), radix: 16) else { return nil }
        bytes.append(byte)
    }
    return bytes
}

/// A non-blocking UDP socket bound to 127.0.0.1 on a port the kernel picks.
final class DtlsTestUdpSocket {
    let fd: Int32
    let port: UInt16

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        try #require(fd >= 0, "socket() failed")
        var address = DtlsTestUdpSocket.loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if bound != 0 { close(fd) }
        try #require(bound == 0, "bind(127.0.0.1:0) failed")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        self.fd = fd
        port = UInt16(bigEndian: address.sin_port)
    }

    deinit { close(fd) }

    static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }

    func send(_ datagram: [UInt8], to peer: sockaddr_in) {
        var peer = peer
        _ = datagram.withUnsafeBytes { bytes in
            withUnsafePointer(to: &peer) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
    }

    /// One datagram, waiting at most `timeout` seconds for it.
    func receive(timeout: Double) -> (bytes: [UInt8], from: sockaddr_in)? {
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, Int32(max(0, timeout) * 1000)) > 0 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var from = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let count = buffer.withUnsafeMutableBytes { bytes in
            withUnsafeMutablePointer(to: &from) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { recvfrom(fd, bytes.baseAddress, bytes.count, 0, $0, &length) }
            }
        }
        guard count >= 0 else { return nil }
        return (Array(buffer[0..<count]), from)
    }
}

/// An independent peer (`openssl s_server`/`s_client`, an aiortc script) run
/// as a subprocess with stdin held open. Its output is collected by a reader thread; it is killed when the test ends.
/// @unchecked Sendable: the reader thread and the termination handler touch its state under `condition` only.
final class DtlsTestProcess: @unchecked Sendable {
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private let condition = NSCondition()
    private var text = ""
    private var ended = false
    private var _exitedAtMs: Double?

    /// An openssl subcommand; nil (after printing SKIP) when openssl is not installed.
    static func openssl(_ arguments: [String]) throws -> DtlsTestProcess? {
        guard let program = Harness.which("openssl") else {
            skipTest("openssl is not installed (Debian package openssl)")
            return nil
        }
        return try DtlsTestProcess(program, arguments)
    }

    init(_ program: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        // A pipe we hold open: s_server/s_client treat end of stdin as "quit".
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        // Set before run(): a child that ends at once would otherwise end unseen.
        process.terminationHandler = { [condition] _ in
            condition.lock()
            self._exitedAtMs = MonotonicClock.milliseconds()
            condition.unlock()
        }
        try process.run()
        let handle = output.fileHandleForReading
        Thread.detachNewThread { [condition] in
            while true {
                let data = handle.availableData
                condition.lock()
                if data.isEmpty { self.ended = true } else { self.text += String(decoding: data, as: UTF8.self) }
                condition.broadcast()
                condition.unlock()
                // Our end closed here, not when the Process is freed: Foundation's Process outlives
                // its run (see Harness.reap), and the test runner ran out of descriptors that way.
                if data.isEmpty { try? handle.close(); return }
            }
        }
    }

    deinit { stop() }

    var log: String { condition.lock(); defer { condition.unlock() }; return text }
    var isRunning: Bool { process.isRunning }

    /// Sends `signal` (SIGKILL: a peer that dies without a word).
    func send(signal: Int32) { if process.isRunning { kill(process.processIdentifier, signal) } }

    /// Waits (bounded) until the output holds a line starting with `prefix`; returns the rest of that line.
    func value(after prefix: String, timeout: Double = 10) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            for line in text.split(whereSeparator: \.isNewline) {
                let trimmed = line.trimmingCharacters(in: .whitespaces)
                if trimmed.hasPrefix(prefix) { return String(trimmed.dropFirst(prefix.count)) }
            }
            if ended || !condition.wait(until: deadline) { return nil }
        }
    }

    /// Waits (bounded) for the output to contain `needle`.
    func waitFor(_ needle: String, timeout: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while !text.contains(needle) {
            if ended || !condition.wait(until: deadline) { return text.contains(needle) }
        }
        return true
    }

    func type(_ line: String) {
        input.fileHandleForWriting.write(Data(line.utf8))
    }

    /// Ends its standard input (Ctrl-D at a terminal).
    func closeInput() { try? input.fileHandleForWriting.close() }

    /// Waits (bounded) for it to exit on its own.
    func waitForExit(seconds: Double) -> Bool { Harness.waitForExit(process, seconds: seconds) }

    /// CLOCK_MONOTONIC ms when its end was reported (nil while it runs).
    var exitedAtMs: Double? { condition.lock(); defer { condition.unlock() }; return _exitedAtMs }

    /// Its exit status once it exited normally; nil while it runs or when a signal ended it.
    var exitStatus: Int32? {
        guard !process.isRunning, process.terminationReason == .exit else { return nil }
        return process.terminationStatus
    }

    func signal(_ number: Int32) { if process.isRunning { kill(process.processIdentifier, number) } }

    /// Ends it: end of stdin first (both openssl tools and the scripts quit on it), then SIGTERM, then SIGKILL.
    func stop() {
        try? input.fileHandleForWriting.close()
        guard process.isRunning else { Harness.reap(process); return }
        if Harness.waitForExit(process, seconds: 1) { return }
        process.terminate()
        if !Harness.waitForExit(process, seconds: 2) {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// A certificate + key made by `openssl req` for the openssl peer, with the
/// fingerprint as `openssl x509 -fingerprint -sha256` computes it.
struct DtlsTestPeerIdentity {
    let certificatePath: String
    let keyPath: String
    let fingerprint: CertificateFingerprint

    init(in folder: String) throws {
        certificatePath = folder + "/peer-cert.pem"
        keyPath = folder + "/peer-key.pem"
        let made = try Harness.run("/usr/bin/openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                                        "-nodes", "-keyout", keyPath, "-out", certificatePath, "-days", "2", "-subj", "/CN=openssl-peer"], timeout: 30)
        try #require(made.status == 0, "openssl req failed: \(made.stderr)")
        fingerprint = try DtlsTestPeerIdentity.opensslFingerprint(of: certificatePath)
    }

    /// "sha256 Fingerprint=AB:CD:…" from openssl, as a CertificateFingerprint.
    static func opensslFingerprint(of path: String) throws -> CertificateFingerprint {
        let result = try Harness.run("/usr/bin/openssl", ["x509", "-in", path, "-noout", "-fingerprint", "-sha256"], timeout: 30)
        try #require(result.status == 0, "openssl x509 failed: \(result.stderr)")
        let hex = try #require(result.stdout.split(separator: "=").last.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) })
        return try #require(CertificateFingerprint(sdp: "sha-256 " + hex), "unreadable openssl fingerprint")
    }
}

/// Moves datagrams between one of our DtlsTransports and a UDP socket,
/// firing its retransmission timer when due: the event loop ICE will run, in small.
final class DtlsTestPump {
    let transport: DtlsTransport
    let socket: DtlsTestUdpSocket
    private(set) var peer: sockaddr_in?
    private(set) var events: [DtlsEvent] = []
    private(set) var datagramsSent = 0
    private(set) var largestDatagram = 0
    private(set) var timerFirings = 0

    init(_ transport: DtlsTransport, socket: DtlsTestUdpSocket, peer: sockaddr_in? = nil) {
        self.transport = transport
        self.socket = socket
        self.peer = peer
    }

    func deliver(_ output: DtlsOutput) {
        events += output.events
        guard let peer else { return }
        for datagram in output.datagrams {
            socket.send(datagram, to: peer)
            datagramsSent += 1
            largestDatagram = max(largestDatagram, datagram.count)
        }
    }

    var failure: DtlsError? {
        for case .failed(let error) in events { return error }
        return nil
    }

    /// Runs until `done` holds or `seconds` pass (and at most 100 000 turns); returns `done`.
    @discardableResult
    func run(seconds: Double, until done: (DtlsTestPump) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        for _ in 0..<100_000 {
            if done(self) { return true }
            let left = deadline.timeIntervalSinceNow
            if left <= 0 { break }
            let wait = min(left, transport.timeout ?? 0.05, 0.05)
            if let (bytes, from) = socket.receive(timeout: wait) {
                if peer == nil { peer = from }  // a server learns its client from the first datagram
                deliver(transport.receive(bytes))
            }
            if let due = transport.timeout, due <= 0 {
                timerFirings += 1
                deliver(transport.onTimer())
            }
        }
        return done(self)
    }
}

/// Carries datagrams between two of our transports in memory, in rounds,
/// through an optional filter that may drop or change them.
struct DtlsTestWire {
    var eventsA: [DtlsEvent] = []
    var eventsB: [DtlsEvent] = []
    var datagrams: [[UInt8]] = []

    /// `filter(fromA, datagram)` returns the datagram to deliver, or nil to drop it.
    mutating func run(_ a: DtlsTransport, _ b: DtlsTransport, first: DtlsOutput, rounds: Int = 50,
                      filter: (Bool, [UInt8]) -> [UInt8]? = { $1 }) {
        eventsA += first.events
        var toB = first.datagrams
        var toA: [[UInt8]] = []
        for _ in 0..<rounds where !(toA.isEmpty && toB.isEmpty) {
            for datagram in toB {
                datagrams.append(datagram)
                guard let delivered = filter(true, datagram) else { continue }
                let output = b.receive(delivered)
                eventsB += output.events
                toA += output.datagrams
            }
            toB = []
            for datagram in toA {
                datagrams.append(datagram)
                guard let delivered = filter(false, datagram) else { continue }
                let output = a.receive(delivered)
                eventsA += output.events
                toB += output.datagrams
            }
            toA = []
        }
    }
}

extension DtlsEvent {
    var isConnected: Bool { if case .connected = self { return true } else { return false } }
    var isFailure: Bool { if case .failed = self { return true } else { return false } }
}

/// A duration in milliseconds, for the handshake-time lines the tests print.
func dtlsMilliseconds(_ duration: Duration) -> String {
    let (seconds, attoseconds) = duration.components
    return String(format: "%.1f ms", Double(seconds) * 1000 + Double(attoseconds) / 1e15)
}
