import FoundationEssentials
import Glibc
import KraklBase
import KraklSession

/// The non-interactive lifecycle's lines (--join without the home screen): the words the agent
/// always printed, or with --log-format json one JSON object a line (time, event, state, reason,
/// numbers), for journald and scripts. Nothing else goes to stdout in JSON mode.
struct LifecycleLog {
    let format: Arguments.LogFormat

    /// A sharing session's numbers over the last second.
    struct Numbers: Encodable {
        var connection: String
        /// The selected candidate pair ("host/udp -> host", "relay/tcp -> host"); nil before one is selected.
        var path: String?
        var rttMs: Double?
        var lossPercent: Double?
        var kbps: Double
        var fps: Double
        var framesSent: Int
        var bytesSent: Int
        var width: Int?
        var height: Int?
    }

    private struct Line: Encodable {
        var time: String
        var event: String
        var state: String?
        var message: String?
        var reason: String?
        var exitStatus: Int32?
        var room: String?
        var identity: String?
        var numbers: Numbers?
    }

    /// One event: `words` are the text line's (after "krakl-agent: "); `error` lines go to stderr in text mode.
    func event(_ event: String, state: SharingLifecycle.State? = nil, _ words: String, reason: EndReason? = nil,
               room: String? = nil, identity: String? = nil, error: Bool = false) {
        switch format {
        case .text:
            if error { StandardStream.error("krakl-agent: \(words)\n") } else { print("krakl-agent: \(words)") }
        case .json:
            write(Line(time: Self.now(), event: event, state: state?.name, message: words, reason: reason?.name,
                       exitStatus: reason?.exitStatus, room: room, identity: identity))
        }
    }

    /// The once-a-second numbers (JSON mode; the text mode has its own status line).
    func numbers(_ numbers: Numbers, state: SharingLifecycle.State) {
        write(Line(time: Self.now(), event: "status", state: state.name, numbers: numbers))
    }

    private func write(_ line: Line) {
        let bytes = ControlProtocol.encode(line)
        print(String(decoding: bytes.dropLast(), as: UTF8.self))
    }

    private static func now() -> String {
        // ISO8601DateFormatter's internet date-time with fractional seconds: UTC, rounded to the millisecond.
        let milliseconds = Int((Date().timeIntervalSince1970 * 1000).rounded())
        var seconds = time_t(milliseconds.quotientAndRemainder(dividingBy: 1000).quotient)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(cFormat: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                      Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), milliseconds % 1000)
    }
}
