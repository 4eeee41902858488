import Foundation
import Glibc
import Testing

/// Runs a test inside a network namespace of its own (docs/testing.md, "Network namespaces"), for
/// in-process code that must reach a server living there: Janus's HTTP API
/// listens on 127.0.0.1 *inside* the namespace, and a test runner cannot
/// move itself into one. So the test runs twice:
///
/// - outside (the normal run): `enter` makes the namespace, starts this same
///   test binary again inside it (`ip netns exec NS <runner> --testing-library
///   swift-testing --filter Suite/test()`), relays its output, records a
///   failure when the child failed, runs `cleanup`, and returns nil;
/// - inside (the child, told by the environment): `enter` returns where it is,
///   and the test body runs.
///
/// ```
/// @Test func something() throws {
///     guard let inside = try InNamespace.enter(suite: "MySuite") else { return }
///     // here: inside the namespace; inside.folder is scratch space
/// }
/// ```
enum InNamespace {
    static let namespaceVariable = "KRAKL_TEST_NAMESPACE"
    static let folderVariable = "KRAKL_TEST_NAMESPACE_FOLDER"

    /// Where the child runs: the namespace's name and a scratch folder the
    /// outer test made (and may clean up after the child, e.g. stop a server).
    struct Inside {
        let namespace: String
        let folder: String
    }

    /// Set in the child process only.
    static var inside: Inside? {
        let environment = ProcessInfo.processInfo.environment
        guard let namespace = environment[namespaceVariable], let folder = environment[folderVariable] else { return nil }
        return Inside(namespace: namespace, folder: folder)
    }

    /// The test runner binary (this process).
    static var runner: String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? Harness.buildDir + "/krakl-agentPackageTests.xctest"
    }

    /// Inside: returns where the test runs. Outside: runs `suite/test` in a
    /// child inside a fresh namespace and returns nil (also, after printing
    /// SKIP, when namespaces cannot be made here).
    /// - Parameters:
    ///   - suite: the test's suite type name.
    ///   - test: the test function's name as `#function` gives it.
    ///   - timeout: seconds for the whole child run.
    ///   - cleanup: run outside after the child ended, with the namespace still there.
    static func enter(suite: String, test: String = #function, timeout: Double = 300,
                      cleanup: ((RtcTestNamespace, String) -> Void)? = nil) throws -> Inside? {
        if let inside { return inside }
        guard let namespace = try RtcTestNamespace() else { return nil }
        let folder = try Harness.temporaryDirectory()
        defer { cleanup?(namespace, folder) }
        let filter = NSRegularExpression.escapedPattern(for: "\(suite)/\(test)")
        let (program, arguments) = namespace.command(runner, ["--testing-library", "swift-testing", "--filter", filter])
        let started = Date()
        let result = try Harness.run(program, arguments, timeout: timeout, environment: [
            namespaceVariable: namespace.name, folderVariable: folder, "NO_COLOR": "1",
        ])
        // The child's own lines, so its measurements and failures show in this run's log.
        for line in (result.stdout + result.stderr).split(whereSeparator: \.isNewline) {
            print("  [in \(namespace.name)] \(line)")
        }
        let output = result.stdout + result.stderr
        #expect(!result.timedOut, "\(suite)/\(test) did not finish inside the namespace within \(Int(timeout)) s")
        #expect(output.contains("Test run with 1 test"),
                "the child ran no test for the filter \(filter) (renamed?); its output is above")
        if result.status != 0 {
            let failures = output.split(whereSeparator: \.isNewline).filter { $0.contains("✘") || $0.contains("recorded an issue") }.map(String.init)
            let seconds = String(format: "%.1f", Date().timeIntervalSince(started))
            let summary = "\(suite)/\(test) failed inside the namespace (status \(result.status), \(seconds) s):\n"
                + failures.prefix(20).joined(separator: "\n")
            Issue.record(Comment(rawValue: summary))
        }
        return nil
    }
}
