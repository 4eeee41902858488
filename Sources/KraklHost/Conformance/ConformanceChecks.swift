import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// The checks themselves, group by group.
final class GroupRunner {
    let path: String
    let options: JSONObject
    let expectEnd: Bool
    let budget: ConformanceBudget
    let logger: BackendLogger
    let channel: ConformanceChannel
    private var reported: Set<String> = []

    init(path: String, options: JSONObject, expectEnd: Bool, budget: ConformanceBudget, logger: @escaping BackendLogger, channel: ConformanceChannel) {
        self.path = path
        self.options = options
        self.expectEnd = expectEnd
        self.budget = budget
        self.logger = logger
        self.channel = channel
    }

    private var optionsText: String { JSON.object(options).serialized }

    private func report(_ outcome: ConformanceOutcome, _ check: String, _ detail: String) {
        reported.insert(check)
        channel.result(outcome, check, detail)
    }

    /// SKIPs every check of the group not reported yet.
    private func skipRest(of group: ConformanceGroup, _ reason: String) {
        for check in group.checks where !reported.contains(check) { report(.skip, check, reason) }
    }

    func run(_ group: ConformanceGroup) {
        channel.check(group.checks[0])
        let library: BackendLibrary
        do throws(HostError) {
            library = try channel.call("dlopen", budget: budget.load) { () throws(HostError) -> BackendLibrary in
                try BackendLibrary.load(path: path, backend: URL(fileURLWithPath: path).lastPathComponent)
            }
        } catch {
            if group == .load { report(.fail, "abi-handshake", error.description) }
            skipRest(of: group, "the library did not load")
            return
        }
        switch group {
        case .load: runLoad(library)
        case .create: runCreate(library)
        case .list: runList(library)
        case .delivery: runDelivery(library)
        case .leaks: runLeaks(library)
        case .end: runEnd(library)
        }
        skipRest(of: group, "not reached")
    }

    private func source(_ library: BackendLibrary, text: String? = nil, quiet: Bool = false) -> DrivenSource {
        DrivenSource(library: library, optionsText: text ?? optionsText, echo: quiet ? nil : logger, channel: channel, budget: budget)
    }

    /// Why create() failed, for a FAIL line.
    private func createFailure(_ status: Int32, _ source: DrivenSource) -> String {
        if let problem = ReturnValue.problem(status, of: "create()") { return problem }
        if status == 0 { return "create() returned 0 but stored no source" }
        return "create() returned \(ReturnValue.name(status)): \(source.recorder.takeLastError() ?? "the backend logged no reason at KRAKL_LOG_ERROR")"
    }

    // MARK: groups

    private func runLoad(_ library: BackendLibrary) {
        report(.pass, "abi-handshake", "\(library.name.isEmpty ? "(unnamed)" : library.name): exports krakl_backend_v1, ABI \(library.abiMajor).\(library.abiMinor)")
        channel.check("table-size")
        if library.name.isEmpty {
            report(.fail, "table-size", "name is NULL or empty")
        } else if library.abiMinor > BackendLibrary.hostVersion.minor {
            report(.pass, "table-size", "table is \(library.declaredSize) bytes; ABI minor \(library.abiMinor) is newer than the agent's \(BackendLibrary.hostVersion.minor), extra members ignored")
        } else {
            report(.pass, "table-size", "table is \(library.declaredSize) bytes (agent knows \(MemoryLayout<krakl_backend>.size)), create/start/stop/destroy present")
        }
    }

    private func runCreate(_ library: BackendLibrary) {
        channel.check("create-destroy")
        let first = source(library)
        let (status, created) = first.create()
        guard created else {
            report(.fail, "create-destroy", createFailure(status, first))
            if first.recorder.problems.beforeStart != nil { report(.fail, "nothing-before-start", first.recorder.problems.beforeStart!) }
            skipRest(of: .create, "create() failed with these options")
            return
        }
        channel.send("created")
        // A source that delivers before start() does so from create() or soon after.
        channel.wait(budget.afterStop)
        first.recorder.observe(for: budget.afterStop)
        first.destroy()
        report(.pass, "create-destroy", "created and destroyed without start")
        let counts = first.recorder.callbackCounts
        if let problem = first.recorder.problems.beforeStart {
            report(.fail, "nothing-before-start", "\(problem) (\(counts.beforeStart) frame/event callback(s) before start()); create() must deliver nothing, delivery begins with start()")
        } else {
            report(.pass, "nothing-before-start", "no frame or event from create() until start()")
        }

        var unknownKey = options
        unknownKey["krakl_conformance_no_such_option"] = .number("1")
        for (check, text) in [("rejects-malformed-options", "{\"width\": 64,"), ("rejects-non-object-options", "[1, 2, 3]"),
                              ("rejects-unknown-option", JSON.object(unknownKey).serialized)] {
            channel.check(check)
            let bad = source(library, text: text, quiet: true)
            let (status, created) = bad.create()
            if created {
                bad.destroy()
                report(.fail, check, "create() accepted \(text)")
            } else if let problem = ReturnValue.problem(status, of: "create()") {
                report(.fail, check, problem)
            } else if status == 0 {
                report(.fail, check, "create() returned 0 but stored no source for \(text)")
            } else {
                report(.pass, check, "create() returned \(ReturnValue.name(status)): \(bad.recorder.takeLastError() ?? "the backend gave no reason")")
            }
        }
    }

    private func runList(_ library: BackendLibrary) {
        channel.check("list-sources")
        guard library.canListSources else {
            report(.pass, "list-sources", "the table has no list_sources (optional; `krakl-agent sources` says the backend cannot list)")
            return
        }
        let recorder = CallbackRecorder(backend: library.name, optionsText: optionsText, echo: logger)
        let table = library.table
        let status = channel.call("list_sources()", budget: budget.list) {
            optionsText.withCString { table.list_sources!($0, recorder.host) }
        }
        let found = recorder.sources
        if let problem = ReturnValue.problem(status, of: "list_sources()") {
            report(.fail, "list-sources", problem)
        } else if status < 0 {
            if let reason = recorder.takeLastError() {
                report(.pass, "list-sources", "list_sources() returned \(ReturnValue.name(status)) after logging: \(reason)")
            } else {
                report(.fail, "list-sources", "list_sources() returned \(ReturnValue.name(status)) without logging why at KRAKL_LOG_ERROR")
            }
        } else if found.isEmpty {
            report(.fail, "list-sources", "list_sources() returned 0 but reported no source: report each through host->source_found, or return a negative errno after logging why")
        } else {
            let names = found.prefix(4).map { "\($0.name) (\($0.description))" }.joined(separator: ", ")
            report(.pass, "list-sources", "\(found.count) source(s): \(names)\(found.count > 4 ? ", ..." : "")")
        }
    }

    /// The delivery group: frames after start(), judged; stop within a second and silent after it;
    /// a restart as good as the first start; the whole run's order and threads; silence after destroy().
    private func runDelivery(_ library: BackendLibrary) {
        channel.check("delivers-frames")
        let driven = source(library)
        var statuses: [(String, Int32)] = []
        guard startDelivering(driven, statuses: &statuses) else { return }
        let stop = checkStop(driven, statuses: &statuses)
        checkRestart(driven, firstStop: stop, statuses: &statuses)
        let recorder = driven.recorder
        let all = recorder.problems
        let total = recorder.frameCount
        judge(recorder, "timestamps-monotonic", all.order, "strictly increasing over \(total) frames, across restart")
        judge(recorder, "callbacks-serial", all.overlap, "frame and event callbacks never overlapped")
        judge(recorder, "callbacks-one-thread", all.threads, "each start()'s frames and events came from one thread")
        judge(recorder, "callbacks-well-formed", all.malformed, "no NULL frame or event, no event of an undefined type")
        let bad = statuses.compactMap { ReturnValue.problem($0.1, of: $0.0) }
        report(bad.isEmpty ? .pass : .fail, "return-values",
               bad.first ?? "create, start, stop returned \(statuses.map { ReturnValue.name($0.1) }.joined(separator: ", ")): 0 or a negative errno")
        checkDestroy(driven)
    }

    /// Without a frame there is nothing to judge: a PASS would say more than was seen.
    private func judge(_ recorder: CallbackRecorder, _ check: String, _ problem: String?, _ fine: String) {
        if let problem { report(.fail, check, problem) }
        else if recorder.frameCount == 0 { report(.skip, check, "no frame arrived to judge") }
        else { report(.pass, check, fine) }
    }

    /// create() and start(), then the first frames judged; false (the rest skipped) when either failed.
    private func startDelivering(_ driven: DrivenSource, statuses: inout [(String, Int32)]) -> Bool {
        let recorder = driven.recorder
        let (createStatus, created) = driven.create()
        statuses.append(("create()", createStatus))
        guard created else {
            report(.fail, "delivers-frames", createFailure(createStatus, driven))
            skipRest(of: .delivery, "create() failed")
            return false
        }
        let startedAt = MonotonicClock.nanoseconds()
        let (startStatus, _) = driven.start()
        statuses.append(("start()", startStatus))
        guard startStatus >= 0 else {
            report(.fail, "delivers-frames", "start() returned \(ReturnValue.name(startStatus)): \(recorder.takeLastError() ?? "the backend gave no reason")")
            skipRest(of: .delivery, "the source did not start")
            return false
        }
        channel.wait(budget.timeout)
        let first = recorder.waitForFirstFrame(timeout: budget.timeout, since: startedAt)
        if first.arrived {
            channel.wait(budget.window)
            recorder.waitForWindow(frames: budget.windowFrames, seconds: budget.window)
        }
        let frames = recorder.frameCount
        let seen = recorder.problems
        if first.arrived {
            report(.pass, "delivers-frames", "\(frames) frames, first after \(String(cFormat: "%.0f", first.delay * 1000)) ms, \(recorder.sizeDescription)")
        } else {
            report(.fail, "delivers-frames", "no frame within \(budget.timeout) s of start()\(first.ended ? " (the source ended first)" : "")")
        }
        judge(recorder, "frames-valid", seen.geometry, "\(frames) frames: format, size, strides, planes readable")
        judge(recorder, "first-frame-whole", seen.firstWhole, "the first frame after start() had damage_count == 0")
        judge(recorder, "damage-inside-frame", seen.damage, "\(recorder.damageRectCount) rectangles checked")
        judge(recorder, "size-changes-announced", seen.shape, "every size or format change followed a matching FORMAT_CHANGED")
        judge(recorder, "timestamps-near-clock", seen.clock, "every timestamp within \(ConformanceBudget.clockAhead / 1_000_000) ms ahead and \(ConformanceBudget.clockBehind / 1_000_000_000) s behind CLOCK_MONOTONIC")
        return true
    }

    /// stop() within a second, and no callback after it returned; the stop's time and the late callbacks so far.
    private func checkStop(_ driven: DrivenSource, statuses: inout [(String, Int32)]) -> (seconds: Double, late: Int) {
        let recorder = driven.recorder
        channel.check("stop-within-1s")
        let stop = driven.stop()
        statuses.append(("stop()", stop.status))
        report(stop.seconds <= 1 ? .pass : .fail, "stop-within-1s",
               stop.seconds <= 1 ? String(cFormat: "stop() took %.1f ms", stop.seconds * 1000) : String(cFormat: "stop() took %.0f ms; it must return within one second", stop.seconds * 1000))

        channel.check("no-frame-after-stop")
        channel.wait(budget.afterStop)
        recorder.observe(for: budget.afterStop)
        let late = recorder.callbackCounts.afterStop
        report(late == 0 ? .pass : .fail, "no-frame-after-stop",
               late == 0 ? "none in the \(Int(budget.afterStop * 1000)) ms after stop() returned" : "\(late) frame/event callback(s) arrived after stop() returned")
        return (stop.seconds, late)
    }

    /// Start again: frames must come back, as good as the first time.
    private func checkRestart(_ driven: DrivenSource, firstStop stop: (seconds: Double, late: Int), statuses: inout [(String, Int32)]) {
        let recorder = driven.recorder
        channel.check("restart")
        let before = recorder.problems
        let framesBefore = recorder.frameCount
        let restartedAt = MonotonicClock.nanoseconds()
        let again = driven.start()
        statuses.append(("start()", again.status))
        var restartProblem: String?
        if again.status < 0 {
            restartProblem = "start() after stop() returned \(ReturnValue.name(again.status)): \(recorder.takeLastError() ?? "the backend gave no reason")"
        } else {
            channel.wait(budget.timeout)
            if !recorder.waitForFirstFrame(timeout: budget.timeout, since: restartedAt).arrived {
                restartProblem = "no frame within \(budget.timeout) s of the second start()"
            }
            let secondStop = driven.stop()
            statuses.append(("stop()", secondStop.status))
            channel.wait(budget.afterStop)
            recorder.observe(for: budget.afterStop)
            let after = recorder.problems
            let lateAgain = recorder.callbackCounts.afterStop - stop.late
            if restartProblem == nil {
                if after.firstWhole != before.firstWhole { restartProblem = after.firstWhole }
                else if after.geometry != before.geometry { restartProblem = after.geometry }
                else if after.damage != before.damage { restartProblem = after.damage }
                else if lateAgain > 0 { restartProblem = "\(lateAgain) callback(s) after the second stop() returned" }
                else if secondStop.seconds > 1 && stop.seconds <= 1 { restartProblem = String(cFormat: "the second stop() took %.0f ms", secondStop.seconds * 1000) }
            }
        }
        let resumed = recorder.frameCount - framesBefore
        report(restartProblem == nil ? .pass : .fail, "restart",
               restartProblem ?? "frames resumed after start() following stop() (\(resumed) frame\(resumed == 1 ? "" : "s"))")
    }

    private func checkDestroy(_ driven: DrivenSource) {
        let recorder = driven.recorder
        channel.check("nothing-after-destroy")
        driven.destroy()
        channel.wait(budget.afterStop)
        recorder.observe(for: budget.afterStop)
        let afterDestroy = recorder.callbackCounts.afterDestroy
        report(afterDestroy == 0 ? .pass : .fail, "nothing-after-destroy",
               afterDestroy == 0 ? "no callback in the \(Int(budget.afterStop * 1000)) ms after destroy() returned"
                   : "\(recorder.problems.afterDestroy ?? "a callback came after destroy()") (\(afterDestroy) callback(s)); join every thread in destroy()")
    }

    /// Threads and file descriptors must come back to where they were after
    /// sources come and go: a backend that leaks either will exhaust the
    /// agent, which connects and disconnects many times in one life.
    private func runLeaks(_ library: BackendLibrary) {
        channel.check("no-leaks")
        func cycle() -> String? {
            let driven = source(library, quiet: true)
            let (status, created) = driven.create()
            guard created else { return createFailure(status, driven) }
            let started = driven.start()
            if started.status >= 0 {
                channel.wait(min(budget.timeout, 2))
                _ = driven.recorder.waitForFirstFrame(timeout: min(budget.timeout, 2), since: 0)
                _ = driven.stop()
            }
            driven.destroy()
            return started.status < 0 ? "start() returned \(ReturnValue.name(started.status))" : nil
        }
        // One cycle first, so one-time set-up (libraries, caches) is not counted.
        if let problem = cycle() {
            report(.fail, "no-leaks", problem)
            return
        }
        let before = (threads: ProcessCounters.threads(), fds: ProcessCounters.openFiles())
        for _ in 0..<10 {
            if let problem = cycle() {
                report(.fail, "no-leaks", problem)
                return
            }
        }
        // Threads may take a moment to be reaped; poll, bounded.
        channel.wait(1)
        var after = (threads: ProcessCounters.threads(), fds: ProcessCounters.openFiles())
        let deadline = MonotonicClock.nanoseconds() + 1_000_000_000
        while (after.threads > before.threads || after.fds > before.fds) && MonotonicClock.nanoseconds() < deadline {
            usleep(10_000)
            after = (ProcessCounters.threads(), ProcessCounters.openFiles())
        }
        if after.threads > before.threads || after.fds > before.fds {
            report(.fail, "no-leaks", "after 10 create/start/stop/destroy cycles: threads \(before.threads) -> \(after.threads), open files \(before.fds) -> \(after.fds)")
        } else {
            report(.pass, "no-leaks", "10 cycles: threads \(before.threads) -> \(after.threads), open files \(before.fds) -> \(after.fds)")
        }
    }

    private func runEnd(_ library: BackendLibrary) {
        channel.check("source-ended")
        let driven = source(library)
        let (status, created) = driven.create()
        guard created else {
            report(.fail, "source-ended", createFailure(status, driven))
            return
        }
        let started = driven.start()
        guard started.status >= 0 else {
            report(.fail, "source-ended", "start() returned \(ReturnValue.name(started.status))")
            driven.destroy()
            return
        }
        channel.wait(budget.timeout)
        guard driven.recorder.waitForEnd(timeout: budget.timeout) else {
            report(.fail, "source-ended", "no SOURCE_ENDED event within \(budget.timeout) s")
            return
        }
        channel.wait(budget.afterStop)
        driven.recorder.observe(for: budget.afterStop)
        let after = driven.recorder.callbackCounts.afterEnd
        let stop = driven.stop()
        driven.destroy()
        if after > 0 {
            report(.fail, "source-ended", "\(after) frame(s) arrived after SOURCE_ENDED")
        } else if stop.seconds > 1 {
            report(.fail, "source-ended", String(cFormat: "stop() after the end took %.0f ms", stop.seconds * 1000))
        } else {
            report(.pass, "source-ended", "SOURCE_ENDED after \(driven.recorder.frameCount) frames (\(driven.recorder.endMessage ?? "no message")), no frame after it")
        }
    }
}

/// Counts of this process's threads and open file descriptors, from /proc.
enum ProcessCounters {
    static func threads() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0 }
    static func openFiles() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0 }
}
