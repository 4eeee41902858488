import Foundation
@testable import KraklBase
@testable import KraklRoom
import Testing

/// The helpers that replaced Foundation-only APIs in the agent's modules (issue 27: the agent maps
/// FoundationEssentials alone) give Foundation's own results: this process may import Foundation,
/// so each is checked against the API it replaced.
@Suite("Foundation-free helpers match Foundation", .tags(.unit))
struct FoundationFreeTests {
    static let numbers: [Double] = [0, 1, -2.5, 0.1, 1.0 / 3, 123_456_789.123, 1e21, 1e-7, 0.05, 0.15, 0.25, 2.675, 1.005, 999.95,
                                    99.95, 9.995, -0.04, -0.05, 59.5, 0.5, 1.5, 2.5, 1e15, 29.97003, 1234.5]

    @Test func cFormatIsStringFormat() {
        for format in ["%.1f", "%.2f", "%.0f", "%.3f", "%.4f", "%5.1f", "%4.1f", "%5.0f", "%g", "%.1f %%", "summary %.1f s (%.1f%%)"] {
            for number in Self.numbers {
                #expect(String(cFormat: format, number, number) == String(format: format, number, number), "\(format) \(number)")
            }
        }
        for number in [0, 1, -1, 7, 42, 123_456, -99_999, 2_147_483_647] {
            for format in ["%d", "%6d", "%02d", "%x", "%02x", "%08x"] {
                #expect(String(cFormat: format, number) == String(format: format, number), "\(format) \(number)")
            }
        }
        #expect(String(cFormat: "krakl-%llu-%08x", UInt64(1_234_567_890_123), UInt32(0xDEAD_BEEF))
                == String(format: "krakl-%llu-%08x", UInt64(1_234_567_890_123), UInt32(0xDEAD_BEEF)))
        #expect(String(cFormat: "%@ | %@ as \"%@\" | %5.0f kbit/s", "50%d", "b", "é", 1234.5)
                == String(format: "%@ | %@ as \"%@\" | %5.0f kbit/s", "50%d", "b", "é", 1234.5))
    }

    @Test func trimmingIsTrimmingCharacters() {
        for text in ["  a b  ", "\t\na\r\n", "\u{200B}x\u{3000}", "\u{85}y\u{2028}", "", "   ", "\u{A0}z\u{A0}", "é\u{301} ", " \r\n", "[::1]", "[]", "a\u{FEFF}"] {
            #expect(text.trimmingSpaces() == text.trimmingCharacters(in: .whitespaces), "\(text.debugDescription)")
            #expect(text.trimmingWhitespace() == text.trimmingCharacters(in: .whitespacesAndNewlines), "\(text.debugDescription)")
            #expect(text.trimming(where: { $0 == "[" || $0 == "]" }) == text.trimmingCharacters(in: CharacterSet(charactersIn: "[]")))
        }
        for scalar in (0..<0x3100).compactMap(Unicode.Scalar.init) {
            #expect(scalar.isSpaceOrTab == CharacterSet.whitespaces.contains(scalar), "U+\(String(scalar.value, radix: 16))")
            #expect(scalar.isWhitespaceOrNewline == CharacterSet.whitespacesAndNewlines.contains(scalar), "U+\(String(scalar.value, radix: 16))")
        }
    }

    @Test func jsonTextIsJSONSerialization() throws {
        func foundation(_ value: Any) -> Any {
            if value is JSONNull { return NSNull() }
            if let object = value as? [String: Any] { return object.mapValues(foundation) }
            if let array = value as? [Any] { return array.map(foundation) }
            return value
        }
        let objects: [[String: Any]] = [
            ["b": 1, "a": [1, 2.5, ["x": JSONNull(), "y": [Any]()]], "c": [String: Any](), "d": [Any](), "e": "s/t\u{8}\u{c}\u{1f}\u{7f}\"\\é"],
            ["type": "connect", "version": 2, "name": JSONNull(), "ice_servers": "acquire", "sdpMid": "0", "sdpMLineIndex": 0,
             "usernameFragment": "u", "peer_connections": [["id": "x", "description": ["type": "offer", "revision": 1, "sdp": "v=0\r\n"]]],
             "media_signaling": [String: Any](), "user_agent": "krakl/1 (Linux)", "enabled": true],
            ["encode_ms_p50": 1.25, "encode_ms_p99": 3.0, "peak_rss_kb": 51_234, "fps": 29.97003, "zero_fill_released_bytes": UInt64(123),
             "a10": 1, "a9": 2, "A_b": 3, "a_B": 4, "ab": 5, "a": 6, "_x": 7, "x1y": 8, "x01y": 9, "big": 1e21, "small": 1e-7],
        ]
        let pairs: [(JSONText.Options, JSONSerialization.WritingOptions)] = [
            ([.sortedKeys], [.sortedKeys]), ([.sortedKeys, .withoutEscapingSlashes], [.sortedKeys, .withoutEscapingSlashes]),
            ([.prettyPrinted, .sortedKeys], [.prettyPrinted, .sortedKeys]),
        ]
        for object in objects {
            for (ours, theirs) in pairs {
                let expected = String(decoding: try JSONSerialization.data(withJSONObject: foundation(object), options: theirs), as: UTF8.self)
                #expect(try JSONText.serialize(object, options: ours) == expected)
            }
        }
        #expect(throws: JSONText.Unwritable.self) { try JSONText.serialize(["x": Double.nan]) }
        let parsed = JSONText.parse(#"{"a": [1, 2.5, null, true, "s"], "b": {"c": -3}}"#) as? [String: Any]
        #expect((parsed?["a"] as? [Any])?.count == 5)
        #expect(((parsed?["a"] as? [Any])?[2]) is JSONNull)
        #expect(((parsed?["b"] as? [String: Any])?["c"]) as? Double == -3)
    }

    @Test func folderPartIsDeletingLastPathComponent() {
        for path in ["dir/a.webm", "a.webm", "/a.webm", "/", "a/b/c", "a//b", "a/b/", "/tmp/x/", ""] {
            #expect(folderPart(of: path) == (path as NSString).deletingLastPathComponent, "\(path)")
        }
    }

    @Test func httpDatesAsDateFormatterReadThem() {
        let now = Date()
        for text in ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "Friday, 31-Dec-99 23:59:59 GMT",
                     "Tuesday, 29-Feb-28 23:59:59 GMT", "Wed Feb 29 12:00:00 2024", "Sun, 06 Nov 1994 25:49:37 GMT", "soon"] {
            var expected: Date?
            for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] where expected == nil {
                let formatter = DateFormatter()
                formatter.locale = Locale(identifier: "en_US_POSIX")
                formatter.timeZone = TimeZone(identifier: "GMT")
                formatter.dateFormat = format
                expected = formatter.date(from: text)
            }
            #expect(WhipHttpRules.httpDate(text, now: now) == expected, "\(text)")
        }
    }

    @Test func localTimeIsDateFormatterInThisZone() {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss zzz"
        formatter.timeZone = .current   // as LocalTime set it (left unset, TZ=UTC prints "UTC", set "GMT")
        for seconds in stride(from: 1_700_000_000.0, to: 1_760_000_000.0, by: 5_000_000.0) {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(LocalTime.format(date) == formatter.string(from: date))
        }
        // What DateFormatter printed with the process's zone set to each (TZ=... runs of the loop above).
        #expect(LocalTime.zoneName(abbreviation: "CET", offset: 3600, zone: "Europe/Berlin") == "GMT+1")
        #expect(LocalTime.zoneName(abbreviation: "IST", offset: 19_800, zone: "Asia/Kolkata") == "GMT+5:30")
        #expect(LocalTime.zoneName(abbreviation: "EDT", offset: -14_400, zone: "America/New_York") == "EDT")
        #expect(LocalTime.zoneName(abbreviation: "CST", offset: 28_800, zone: "Asia/Shanghai") == "GMT+8")
        #expect(LocalTime.zoneName(abbreviation: "BST", offset: 3600, zone: "Europe/London") == "GMT+1")
        #expect(LocalTime.zoneName(abbreviation: "GMT", offset: 0, zone: "Europe/London") == "GMT")
        #expect(LocalTime.zoneName(abbreviation: "UTC", offset: 0, zone: "Etc/UTC") == "UTC")
        #expect(LocalTime.zoneName(abbreviation: "UTC", offset: 0, zone: "UTC") == "GMT")
        #expect(LocalTime.zoneName(abbreviation: "HST", offset: -36_000, zone: "America/Adak") == "HAST")
        #expect(LocalTime.zoneName(abbreviation: "HST", offset: -36_000, zone: "Pacific/Honolulu") == "HST")
        #expect(LocalTime.zoneName(abbreviation: "AST", offset: -14_400, zone: "America/Halifax") == "AST")
        #expect(LocalTime.zoneName(abbreviation: "MST", offset: -25_200, zone: "America/Whitehorse") == "GMT-7")
    }

    @Test func conditionWaitsUntilItsDeadline() {
        let condition = Condition()
        condition.lock()
        let started = Date()
        #expect(!condition.wait(until: Date(timeIntervalSinceNow: 0.05)))
        #expect(Date().timeIntervalSince(started) >= 0.04)
        #expect(condition.wait(while: { false }, until: .distantFuture))
        condition.unlock()
        let lock = Lock()
        #expect(lock.tryLock())
        #expect(!lock.lock(before: Date(timeIntervalSinceNow: 0.02)))
        lock.unlock()
    }

    /// Sources/ builds krakl-agent, its backends and krakl-backend-host: one `import Foundation`
    /// anywhere there maps libFoundation and ICU into the agent again (FoundationEssentials is fine).
    @Test func noModuleOfTheAgentImportsFoundation() throws {
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(atPath: sources.path)).compactMap { $0 as? String }.filter { $0.hasSuffix(".swift") }
        #expect(files.count > 100)
        let banned: Set<Substring> = ["Foundation", "FoundationNetworking", "FoundationXML", "FoundationInternationalization"]
        for file in files {
            let text = try String(contentsOfFile: sources.appendingPathComponent(file).path, encoding: .utf8)
            for line in text.split(separator: "\n") {
                let words = line.split(separator: " ")
                if let at = words.firstIndex(of: "import"), at + 1 < words.count, banned.contains(words[at + 1]) {
                    Issue.record("\(file): \(line)")
                }
            }
        }
    }
}
