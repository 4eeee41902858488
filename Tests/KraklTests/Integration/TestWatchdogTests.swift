import Foundation
import Testing

/// scripts/test-watchdog, which scripts/test (and so CI) runs the suite under, on stand-in test
/// runs: shell scripts that print Swift Testing's event lines. Each case uses a marker of its own
/// for "a stack that outlived the tests", so the watchdog under test never touches the real
/// PipeWire stacks of the suite running beside it.
@Suite(.tags(.integration)) struct TestWatchdogTests {
    static let watchdog = Harness.repoRoot + "/scripts/test-watchdog"

    /// A stand-in run in `folder`: `body` is shell, after a started run and two finished tests.
    static func fakeRun(_ folder: String, _ body: String) throws -> String {
        let path = folder + "/fake-run.sh"
        try """
        echo "◇ Test run started."
        echo "◇ Test quick() started."
        echo "✔ Test quick() passed after 0.1 seconds."
        echo "◇ Test broken(x:) started."
        echo "◇ Test case passing 1 argument x → 1 to broken(x:) started."
        echo "✘ Test broken(x:) recorded an issue at A.swift:1:2: Expectation failed: 1 == 2"
        echo "✘ Test broken(x:) with 1 test case failed after 0.2 seconds with 1 issue."
        \(body)
        """.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func watch(_ folder: String, _ script: String, budget: Double = 60, marker: String) throws -> Harness.Result {
        try Harness.run("/usr/bin/python3", [watchdog, "--budget", "\(budget)", "--slow", "600",
                                             "--leak-marker", marker, "--leak-folders", folder + "/stack.*",
                                             "--", "/bin/bash", script], timeout: budget + 60)
    }

    /// Whether `pid` is a process that has not ended (a zombie has ended: it only waits for a
    /// parent to reap it, which an orphan's new parent may never do here).
    static func alive(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return false }
        return !stat[stat.index(after: close)...].hasPrefix(" Z")
    }

    static func marker() -> String { "KRAKL_WATCHDOG_TEST_" + UUID().uuidString.replacingOccurrences(of: "-", with: "") }

    /// A run that finishes: the output passes through unchanged, the runner's summary stays the
    /// last line (after what it printed later), and its status is the runner's.
    @Test func aFinishedRunEndsWithTheRunnersSummaryAndStatus() throws {
        let folder = try Harness.temporaryDirectory()
        let script = try Self.fakeRun(folder, """
        echo "✘ Test run with 2 tests in 1 suite failed after 0.3 seconds with 1 issue."
        echo "a line the runner printed after its summary"
        exit 1
        """)
        let result = try Self.watch(folder, script, marker: Self.marker())
        #expect(result.status == 1, "\(result.stdout)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.last == "✘ Test run with 2 tests in 1 suite failed after 0.3 seconds with 1 issue.", "\(lines)")
        #expect(lines.contains("a line the runner printed after its summary"))
        #expect(lines.contains("✔ Test quick() passed after 0.1 seconds."))
        #expect(!result.stdout.contains("watchdog:"), "\(result.stdout)")
    }

    /// A run with a test that never ends: past the budget, the watchdog names that test (and not
    /// the finished ones), kills the run with what it started, and ends with the counts, the
    /// unfinished test counted as failed; status 124.
    @Test func aHungTestIsNamedAndTheRunEndsAtTheBudget() throws {
        let folder = try Harness.temporaryDirectory()
        let pidFile = folder + "/sleeper.pid"
        let script = try Self.fakeRun(folder, """
        echo "◇ Test hangsForever() started."
        sleep 600 &
        echo $! > \(pidFile)
        wait
        """)
        let started = Date()
        let result = try Self.watch(folder, script, budget: 3, marker: Self.marker())
        #expect(result.status == 124, "\(result.stdout)")
        // A hang guard (16x the 3 s budget; the script alone would sleep 600 s).
        #expect(Date().timeIntervalSince(started) < 50, "the budget was 3 s")
        #expect(result.stdout.contains("watchdog: the tests ran past their budget of 3 s; 1 not finished:"), "\(result.stdout)")
        #expect(result.stdout.contains("watchdog:   hangsForever(),"), "\(result.stdout)")
        #expect(!result.stdout.contains("watchdog:   quick()"), "\(result.stdout)")
        #expect(result.stdout.split(separator: "\n").last == "1 passed, 2 failed", "\(result.stdout)")
        // What the run started went with it.
        let pid = try #require(Int32(String(contentsOfFile: pidFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        let deadline = Date().addingTimeInterval(10)
        while Self.alive(pid) && Date() < deadline { usleep(20_000) } // the kill is sent; its delivery is polled
        #expect(!Self.alive(pid), "the run's sleep \(pid) outlived the budget's kill")
    }

    /// A run that passes but leaves a stack's process (it carries the stack's marker and the run's
    /// id in its environment, and holds the output pipe) and a stack folder of the run behind: the
    /// watchdog does not wait for the pipe, names both, kills the process, removes the folder and
    /// fails the run (3), with the runner's summary still last. A stack of another run (another id,
    /// or none: started by hand) is left alone.
    @Test func aStackThatOutlivesTheTestsFailsTheRun() throws {
        let folder = try Harness.temporaryDirectory()
        let marker = Self.marker()
        let pidFile = folder + "/leaked.pid", otherPidFile = folder + "/other.pid"
        let script = try Self.fakeRun(folder, """
        mkdir \(folder)/stack.leftover \(folder)/stack.other
        echo "$KRAKL_TEST_RUN" > \(folder)/stack.leftover/test-run
        echo "another-run" > \(folder)/stack.other/test-run
        env \(marker)=\(folder)/stack.leftover sleep 600 &
        echo $! > \(pidFile)
        env -u KRAKL_TEST_RUN \(marker)=\(folder)/stack.other sleep 600 >/dev/null &
        echo $! > \(otherPidFile)
        echo "✔ Test run with 2 tests in 1 suite passed after 0.3 seconds."
        """)
        defer {
            if let other = try? String(contentsOfFile: otherPidFile, encoding: .utf8), let pid = Int32(other.trimmingCharacters(in: .whitespacesAndNewlines)) {
                kill(pid, SIGKILL)
            }
        }
        let result = try Self.watch(folder, script, marker: marker)
        #expect(result.status == 3, "\(result.stdout)")
        #expect(result.stdout.contains("watchdog: PipeWire portal stacks outlived the tests: 1 processes, 1 folders"), "\(result.stdout)")
        #expect(result.stdout.contains("sleep 600"), "\(result.stdout)")
        #expect(result.stdout.split(separator: "\n").last == "✔ Test run with 2 tests in 1 suite passed after 0.3 seconds.", "\(result.stdout)")
        #expect(!FileManager.default.fileExists(atPath: folder + "/stack.leftover"))
        #expect(FileManager.default.fileExists(atPath: folder + "/stack.other"), "another run's stack folder was removed")
        let other = try #require(Int32(String(contentsOfFile: otherPidFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(Self.alive(other), "another run's stack process \(other) was killed")
        let pid = try #require(Int32(String(contentsOfFile: pidFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        let deadline = Date().addingTimeInterval(10)
        while Self.alive(pid) && Date() < deadline { usleep(20_000) } // the kill is sent; its delivery is polled
        #expect(!Self.alive(pid), "the leftover \(pid) was not killed")
    }
}
