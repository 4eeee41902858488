import KraklBase
import Glibc

/// The child's side of the pipe to the parent (fd 3): one line per step, so
/// the parent knows which check and which backend call were running when
/// the process crashed or hung.
///
///     check NAME              the check the following steps belong to
///     call WHAT BUDGET        entering a backend call (e.g. "stop()") allowed BUDGET s
///     return WHAT             the call returned
///     wait SECONDS            a bounded wait (frames, an observation window)
///     result OUTCOME NAME DETAIL
///     created                 create() with the given options worked
///     done                    the group finished
public final class ConformanceChannel {
    public static let descriptor: Int32 = 3
    let fd: Int32

    init(fd: Int32) { self.fd = fd }

    func send(_ line: String) {
        let bytes = Array((ConformanceText.safe(line) + "\n").utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            // The parent is gone: nobody is left to report to.
            if n <= 0 { _exit(2) }
            offset += n
        }
    }

    func check(_ name: String) { send("check \(name)") }
    func wait(_ seconds: Double) { send("wait \(seconds)") }
    func result(_ outcome: ConformanceOutcome, _ check: String, _ detail: String) { send("result \(outcome.rawValue) \(check) \(detail)") }

    @discardableResult
    func call<T, E: Error>(_ what: String, budget: Double, _ body: () throws(E) -> T) throws(E) -> T {
        send("call \(what) \(budget)")
        defer { send("return \(what)") }
        return try body()
    }
}

public enum ConformanceOutcome: String, Sendable { case pass = "PASS", fail = "FAIL", skip = "SKIP" }

enum ConformanceText {
    /// Backend text (log lines, error messages) on one line, without
    /// control characters: it goes through a line protocol and to a terminal.
    static func safe(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { scalar in
            scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) ? " " : scalar
        }))
    }
}
