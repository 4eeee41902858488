import Foundation
import KraklBackendABI

/// `krakl-agent conformance LIB.so`: the checks every backend must pass,
/// run through the same loader and host the agent uses. One line per check
/// (PASS / FAIL / SKIP with the reason); any FAIL fails the run.
public final class ConformanceSuite {
    public enum Outcome: String { case pass = "PASS", fail = "FAIL", skip = "SKIP" }

    let path: String
    let options: JSONObject
    let expectEnd: Bool
    let timeout: Double
    let output: (String) -> Void
    let logger: BackendLogger
    public private(set) var results: [(outcome: Outcome, check: String, detail: String)] = []

    /// - Parameters:
    ///   - options: passed to create() in every check (except the bad-option ones, which add to them).
    ///   - expectEnd: the options make the source end by itself; check SOURCE_ENDED.
    ///   - timeout: how long to wait for a first frame or the end.
    public init(path: String, options: JSONObject, expectEnd: Bool, timeout: Double,
                logger: @escaping BackendLogger, output: @escaping (String) -> Void) {
        self.path = path
        self.options = options
        self.expectEnd = expectEnd
        self.timeout = timeout
        self.logger = logger
        self.output = output
    }

    public var failed: Int { results.filter { $0.outcome == .fail }.count }

    private func report(_ outcome: Outcome, _ check: String, _ detail: String) {
        results.append((outcome, check, detail))
        output("\(outcome.rawValue)  \(check)\(detail.isEmpty ? "" : ": \(detail)")")
    }

    private func check(_ name: String, _ body: () -> (Outcome, String)) {
        let (outcome, detail) = body()
        report(outcome, name, detail)
    }

    /// Runs every check; returns true when none failed.
    @discardableResult
    public func run() -> Bool {
        let library: BackendLibrary
        do throws(HostError) {
            library = try BackendLibrary.load(path: path, backend: URL(fileURLWithPath: path).lastPathComponent)
        } catch {
            report(.fail, "abi-handshake", error.description)
            for name in Self.laterChecks { report(.skip, name, "the library did not load") }
            return false
        }
        report(.pass, "abi-handshake", "\(library.name.isEmpty ? "(unnamed)" : library.name): exports krakl_backend_v1, ABI \(library.abiMajor).\(library.abiMinor)")
        check("table-size") {
            if library.name.isEmpty { return (.fail, "name is NULL or empty") }
            if library.abiMinor > BackendLibrary.hostVersion.minor {
                return (.pass, "table is \(library.declaredSize) bytes; ABI minor \(library.abiMinor) is newer than the agent's \(BackendLibrary.hostVersion.minor), extra members ignored")
            }
            return (.pass, "table is \(library.declaredSize) bytes (agent knows \(MemoryLayout<krakl_backend>.size)), create/start/stop/destroy present")
        }

        let name = library.name.isEmpty ? "backend" : library.name
        var created = false
        check("create-destroy") {
            do throws(HostError) {
                let source = try BackendSource(library: library, backendName: name, options: options, sink: nil, logger: logger)
                try source.destroy()
                created = true
                return (.pass, "created and destroyed without start")
            } catch {
                return (.fail, error.description)
            }
        }
        guard created else {
            for name in Self.laterChecks.dropFirst(2) { report(.skip, name, "create() failed with these options") }
            return false
        }

        var unknownKey = options
        unknownKey["krakl_conformance_no_such_option"] = .number("1")
        for (check, text) in [("rejects-malformed-options", "{\"width\": 64,"), ("rejects-non-object-options", "[1, 2, 3]"),
                              ("rejects-unknown-option", JSON.object(unknownKey).serialized)] {
            self.check(check) {
                do throws(HostError) {
                    let source = try BackendSource(library: library, backendName: name, optionsText: text, sink: nil, logger: { _, _, _ in })
                    try? source.destroy()
                    return (.fail, "create() accepted \(text)")
                } catch {
                    guard case .createFailed(_, let code, let message) = error else { return (.fail, error.description) }
                    return (.pass, "create() returned \(errnoName(code)): \(message)")
                }
            }
        }

        runDeliveryChecks(library: library, name: name)
        runLeakCheck(library: library, name: name)
        runEndCheck(library: library, name: name)
        output("conformance: \(results.filter { $0.outcome == .pass }.count) passed, \(failed) failed, \(results.filter { $0.outcome == .skip }.count) skipped")
        return failed == 0
    }

    static let laterChecks = ["table-size", "create-destroy", "rejects-malformed-options", "rejects-non-object-options",
                              "rejects-unknown-option", "delivers-frames", "frames-valid", "timestamps-monotonic",
                              "damage-inside-frame", "callbacks-serial", "stop-within-1s", "no-frame-after-stop",
                              "restart", "no-leaks", "source-ended"]

    private func runDeliveryChecks(library: BackendLibrary, name: String) {
        let sink = RecordingSink()
        let source: BackendSource
        do throws(HostError) {
            source = try BackendSource(library: library, backendName: name, options: options, sink: sink, logger: logger)
            try source.start()
        } catch {
            report(.fail, "delivers-frames", error.description)
            for check in ["frames-valid", "timestamps-monotonic", "damage-inside-frame", "callbacks-serial", "stop-within-1s", "no-frame-after-stop", "restart"] {
                report(.skip, check, "the source did not start")
            }
            return
        }
        let firstRun = sink.waitForFrames(5, quietPeriod: 1.0, timeout: timeout)
        check("delivers-frames") {
            firstRun.frames > 0
                ? (.pass, "\(firstRun.frames) frames, first after \(String(format: "%.0f", firstRun.firstFrameDelay * 1000)) ms, \(sink.sizeDescription)")
                : (.fail, "no frame within \(timeout) s of start()\(firstRun.ended ? " (the source ended first)" : "")")
        }
        let stopTime = measure { _ = try? source.stop() }
        sink.stopped()
        let late = sink.observe(for: 0.3).afterStop

        // Start again: frames must come back, timestamps keep increasing.
        var restartDetail = ""
        var restarted = false
        do throws(HostError) {
            sink.resume()
            try source.start()
            let second = sink.waitForFrames(sink.frameCount + 1, quietPeriod: 0, timeout: timeout)
            restarted = second.frames > firstRun.frames
            restartDetail = restarted ? "frames resumed after start() following stop()" : "no frame within \(timeout) s of the second start()"
        } catch {
            restartDetail = error.description
        }
        let secondStop = measure { _ = try? source.stop() }
        sink.stopped()
        let lateAgain = sink.observe(for: 0.1).afterStop
        // The host drops late frames and repairs timestamps and overlapping deliveries before
        // the sink sees them; it counts what it did.
        let dropped = source.violations.first { $0.kind == .frameAfterStop }?.count ?? 0
        let hostSaw = Dictionary(source.violations.map { ($0.kind, $0.first) }, uniquingKeysWith: { first, _ in first })
        try? source.destroy()

        let problems = sink.problems
        check("frames-valid") {
            problems.geometry.map { (.fail, $0) } ?? (.pass, "\(sink.frameCount) frames: format, size, strides, planes readable")
        }
        check("timestamps-monotonic") { (problems.timestamp ?? hostSaw[.timestamps]).map { (.fail, $0) } ?? (.pass, "strictly increasing CLOCK_MONOTONIC ns, across restart") }
        check("damage-inside-frame") { problems.damage.map { (.fail, $0) } ?? (.pass, "\(sink.damageRectCount) rectangles checked") }
        check("callbacks-serial") { (problems.overlap ?? hostSaw[.concurrentCallbacks]).map { (.fail, $0) } ?? (.pass, "frame and event callbacks never overlapped") }
        check("stop-within-1s") {
            let worst = max(stopTime, secondStop)
            return worst <= 1.0 ? (.pass, String(format: "stop() took %.1f ms at most", worst * 1000))
                : (.fail, String(format: "stop() took %.0f ms", worst * 1000))
        }
        check("no-frame-after-stop") {
            late + lateAgain + dropped == 0 ? (.pass, "none in the 300 ms after stop() returned")
                : (.fail, "\(late + lateAgain + dropped) frame(s) arrived after stop() returned")
        }
        check("restart") { (restarted ? .pass : .fail, restartDetail) }
    }

    /// Threads and file descriptors must come back to where they were after
    /// sources come and go: a backend that leaks either will exhaust the
    /// agent, which connects and disconnects many times in one life.
    private func runLeakCheck(library: BackendLibrary, name: String) {
        // One cycle first, so one-time set-up (libraries, caches) is not counted.
        func cycle() throws(HostError) {
            let sink = RecordingSink()
            let source = try BackendSource(library: library, backendName: name, options: options, sink: sink, logger: { _, _, _ in })
            try source.start()
            _ = sink.waitForFrames(1, quietPeriod: 0, timeout: min(timeout, 2))
            try source.stop()
            try source.destroy()
        }
        check("no-leaks") {
            do throws(HostError) {
                try cycle()
                let before = (threads: ProcessCounters.threads(), fds: ProcessCounters.openFiles())
                for _ in 0..<10 { try cycle() }
                // Threads may take a moment to be reaped; poll, bounded.
                var after = (threads: ProcessCounters.threads(), fds: ProcessCounters.openFiles())
                let deadline = Date().addingTimeInterval(1)
                while (after.threads > before.threads || after.fds > before.fds) && Date() < deadline {
                    usleep(10_000)
                    after = (ProcessCounters.threads(), ProcessCounters.openFiles())
                }
                if after.threads > before.threads || after.fds > before.fds {
                    return (.fail, "after 10 create/start/stop/destroy cycles: threads \(before.threads) -> \(after.threads), open files \(before.fds) -> \(after.fds)")
                }
                return (.pass, "10 cycles: threads \(before.threads) -> \(after.threads), open files \(before.fds) -> \(after.fds)")
            } catch {
                return (.fail, error.description)
            }
        }
    }

    private func runEndCheck(library: BackendLibrary, name: String) {
        guard expectEnd else {
            report(.skip, "source-ended", "not asked to end: pass --expect-end with options that make the source end (e.g. --option frames=30)")
            return
        }
        check("source-ended") {
            let sink = RecordingSink()
            do throws(HostError) {
                let source = try BackendSource(library: library, backendName: name, options: options, sink: sink, logger: logger)
                try source.start()
                guard sink.waitForEnd(timeout: timeout) else {
                    try source.destroy()
                    return (.fail, "no SOURCE_ENDED event within \(timeout) s")
                }
                let after = sink.observe(for: 0.3).afterEnd
                let stopTime = measure { _ = try? source.stop() }
                try source.destroy()
                if after > 0 { return (.fail, "\(after) frame(s) arrived after SOURCE_ENDED") }
                if stopTime > 1 { return (.fail, String(format: "stop() after the end took %.0f ms", stopTime * 1000)) }
                return (.pass, "SOURCE_ENDED after \(sink.frameCount) frames (\(sink.endMessage ?? "no message")), no frame after it")
            } catch {
                return (.fail, error.description)
            }
        }
    }

    private func measure(_ body: () -> Void) -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        body()
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    }
}

/// Counts of this process's threads and open file descriptors, from /proc.
enum ProcessCounters {
    static func threads() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0 }
    static func openFiles() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0 }
}

/// A FrameSink that checks each frame as it arrives and lets the suite wait
/// for frames or the end without sleeping in steps.
final class RecordingSink: FrameSink {
    struct Problems {
        var geometry: String?
        var timestamp: String?
        var damage: String?
        var overlap: String?
    }

    private let condition = NSCondition()
    private var inCallback = false
    private(set) var frameCount = 0
    private(set) var damageRectCount = 0
    private var firstFrameTime: UInt64?
    private let createdTime = DispatchTime.now().uptimeNanoseconds
    private var lastTimestamp: UInt64 = 0
    private var lastFrameTime: UInt64 = 0
    private var accepting = true
    private var lateFrames = 0
    private var ended = false
    private var framesAfterEnd = 0
    private(set) var endMessage: String?
    private var sizes: Set<String> = []
    private var _problems = Problems()

    var problems: Problems { condition.lock(); defer { condition.unlock() }; return _problems }
    var sizeDescription: String { condition.lock(); defer { condition.unlock() }; return sizes.sorted().joined(separator: ", ") }

    /// Marks callbacks as running; a second one entering meanwhile is an overlap.
    private func enter() {
        condition.lock()
        if inCallback && _problems.overlap == nil { _problems.overlap = "two callbacks for one source ran at the same time" }
        inCallback = true
        condition.unlock()
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        enter()
        let now = DispatchTime.now().uptimeNanoseconds
        let geometry = FrameCheck.geometryProblem(pointer)
        let info = geometry == nil ? FrameInfo(pointer) : nil
        if let info { FrameCheck.touchPixels(info) }
        condition.lock()
        defer {
            inCallback = false
            condition.broadcast()
            condition.unlock()
        }
        if !accepting { lateFrames += 1 }
        if ended { framesAfterEnd += 1 }
        frameCount += 1
        lastFrameTime = now
        if firstFrameTime == nil { firstFrameTime = now }
        if let geometry {
            if _problems.geometry == nil { _problems.geometry = "frame \(frameCount): \(geometry)" }
            return
        }
        guard let info else { return }
        sizes.insert("\(FrameCheck.formatName(info.format)) \(info.width)x\(info.height)")
        let stamp = info.raw.timestamp_ns
        if _problems.timestamp == nil {
            if stamp <= lastTimestamp {
                _problems.timestamp = "frame \(frameCount): timestamp \(stamp) ns is not after the previous \(lastTimestamp) ns"
            } else if stamp > now + 1_000_000_000 || now - stamp > 10_000_000_000 {
                _problems.timestamp = "frame \(frameCount): timestamp \(stamp) ns is not near CLOCK_MONOTONIC now (\(now) ns): use clock_gettime(CLOCK_MONOTONIC)"
            }
        }
        lastTimestamp = max(lastTimestamp, stamp)
        damageRectCount += info.damage.count
        if _problems.damage == nil, let problem = FrameCheck.damageProblem(info) { _problems.damage = "frame \(frameCount): \(problem)" }
    }

    func event(_ event: SourceEvent) {
        enter()
        condition.lock()
        if event.kind == .sourceEnded {
            ended = true
            endMessage = event.message
        }
        inCallback = false
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until `count` frames arrived, or at least one arrived and
    /// `quietPeriod` passed since the last, or the source ended, or the
    /// timeout. Returns the count and the delay to the first frame.
    func waitForFrames(_ count: Int, quietPeriod: Double, timeout: Double) -> (frames: Int, firstFrameDelay: Double, ended: Bool) {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while frameCount < count && !ended {
            if frameCount > 0 && quietPeriod > 0
                && Double(DispatchTime.now().uptimeNanoseconds - lastFrameTime) / 1e9 >= quietPeriod { break }
            let wake = quietPeriod > 0 ? min(deadline, Date().addingTimeInterval(quietPeriod / 4)) : deadline
            if !condition.wait(until: wake) && Date() >= deadline { break }
        }
        let delay = firstFrameTime.map { Double($0 - createdTime) / 1e9 } ?? 0
        return (frameCount, delay, ended)
    }

    func waitForEnd(timeout: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return condition.wait(while: { !ended }, until: Date().addingTimeInterval(timeout))
    }

    func stopped() { condition.lock(); accepting = false; lateFrames = 0; condition.unlock() }
    func resume() { condition.lock(); accepting = true; ended = false; condition.unlock() }

    /// Watches for `seconds` (an observation window, not a wait for
    /// readiness) and returns the frames that came after stop() returned
    /// and after SOURCE_ENDED.
    func observe(for seconds: Double) -> (afterStop: Int, afterEnd: Int) {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { true }, until: Date().addingTimeInterval(seconds))
        return (lateFrames, framesAfterEnd)
    }
}
