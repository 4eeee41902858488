import Testing
@testable import KraklBase
@testable import KraklHost

@Suite("JSON and option parsing", .tags(.unit))
struct JSONTests {
    func parse(_ text: String) throws(JSONParseError) -> JSON {
        var parser = JSONParser(text)
        return try parser.parse()
    }

    @Test func parsesWhatRFC8259Allows() throws {
        let value = try parse(#"{"a": [1, -2.5e3, true, false, null], "b": "x\u00e9\ud83d\ude00\n\"", "c": {}}"#)
        guard case .object(let object) = value else { Issue.record("not an object"); return }
        #expect(object.keys == ["a", "b", "c"])
        #expect(object["a"] == .array([.number("1"), .number("-2.5e3"), .bool(true), .bool(false), .null]))
        #expect(object["b"] == .string("xé😀\n\""))
        #expect(try parse(value.serialized) == value, "serialize and parse back")
    }

    @Test(arguments: [
        ("{\"a\": 1,}", 1, 9, "expected a member name"),
        ("{\"a\": 1 \"b\": 2}", 1, 8, "expected ',' or '}'"),
        ("[1, 2", 1, 6, "expected ',' or ']'"),
        ("{\"a\": 01}", 1, 7, "leading zeros"),
        ("{\"a\": 1, \"a\": 2}", 1, 10, "duplicate member \"a\""),
        ("\"\\x\"", 1, 2, "unknown escape"),
        ("{\n\n  \"é\": tru}", 3, 8, "expected 'true'"),
        ("\"\\ud800\"", 1, 8, "unpaired surrogate"),
        ("1 2", 1, 3, "unexpected text after"),
        ("", 1, 1, "ends where a value was expected"),
    ])
    func reportsLineAndColumn(text: String, line: Int, column: Int, message: String) {
        do {
            _ = try parse(text)
            Issue.record("accepted \(text)")
        } catch {
            #expect(error.line == line && error.column == column, "\(text): \(error)")
            #expect(error.message.contains(message), "\(error.message)")
        }
    }

    @Test func nestingIsBounded() {
        #expect(throws: JSONParseError.self) { try parse(String(repeating: "[", count: 100_000)) }
    }

    @Test func optionValuesAreJSONScalarsOrStrings() throws {
        #expect(try parseOptionAssignment("fps=30") == ("fps", .number("30")))
        #expect(try parseOptionAssignment("scene=typing") == ("scene", .string("typing")))
        #expect(try parseOptionAssignment("cursor=true") == ("cursor", .bool(true)))
        #expect(try parseOptionAssignment("path=/tmp/a=b.y4m") == ("path", .string("/tmp/a=b.y4m")))
        #expect(try parseOptionAssignment("name=\"30\"") == ("name", .string("30")))
        #expect(try parseOptionAssignment("empty=") == ("empty", .string("")))
        #expect(throws: HostError.self) { try parseOptionAssignment("=1") }
    }
}
