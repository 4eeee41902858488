/// A JSON value as written: numbers keep their text so that options reach
/// a backend exactly as the person typed them.
public indirect enum JSON: Equatable, Sendable {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([JSON])
    case object(JSONObject)

    /// The text a backend gets from `host->option()`: strings unquoted,
    /// everything else as JSON.
    public var optionText: String {
        if case .string(let text) = self { return text }
        return serialized
    }

    public var serialized: String {
        switch self {
        case .null: return "null"
        case .bool(let value): return value ? "true" : "false"
        case .number(let text): return text
        case .string(let text): return JSON.quote(text)
        case .array(let items): return "[" + items.map(\.serialized).joined(separator: ",") + "]"
        case .object(let object):
            return "{" + object.members.map { JSON.quote($0.key) + ":" + $0.value.serialized }.joined(separator: ",") + "}"
        }
    }

    static func quote(_ text: String) -> String { quote(text, asJSONSerialization: false) }

    /// `text` as a JSON string. `asJSONSerialization`: also "/" as "\/" (unless `escapingSlashes`
    /// is false) and backspace and form feed as "\b" and "\f", which is how JSONSerialization
    /// wrote them (`JSONText`); otherwise those stay as they are or as "\u00XX".
    static func quote(_ text: String, asJSONSerialization: Bool, escapingSlashes: Bool = true) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "/" where asJSONSerialization && escapingSlashes: out += "\\/"
            case "\u{08}" where asJSONSerialization: out += "\\b"
            case "\u{0C}" where asJSONSerialization: out += "\\f"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    public var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "true/false"
        case .number: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }
}

/// A JSON object with its members in written order (order matters for
/// `krakl-agent backends`, which lists backends as the file does).
public struct JSONObject: Equatable, Sendable {
    public var members: [(key: String, value: JSON)]

    public init(_ members: [(key: String, value: JSON)] = []) { self.members = members }

    public subscript(key: String) -> JSON? {
        get { members.first { $0.key == key }?.value }
        set {
            if let index = members.firstIndex(where: { $0.key == key }) {
                if let newValue { members[index].value = newValue } else { members.remove(at: index) }
            } else if let newValue {
                members.append((key, newValue))
            }
        }
    }

    public var keys: [String] { members.map(\.key) }

    public static func == (a: JSONObject, b: JSONObject) -> Bool {
        a.members.count == b.members.count && zip(a.members, b.members).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }
}

/// A parse error at a position in the text.
public struct JSONParseError: Error, Equatable {
    public let line: Int
    public let column: Int
    public let message: String
}

/// A strict RFC 8259 parser that remembers where every object member's
/// value starts, so errors about content (not only syntax) can point at a
/// line and column too.
public struct JSONParser {
    private let bytes: [UInt8]
    private var index = 0
    private var depth = 0
    /// "a.b.c" member path -> offset of its value.
    public private(set) var offsets: [String: Int] = [:]

    public init(_ text: String) { bytes = Array(text.utf8) }

    /// Parses the whole text as one JSON value.
    public mutating func parse() throws(JSONParseError) -> JSON {
        skipSpace()
        let value = try parseValue(path: "")
        skipSpace()
        guard index == bytes.count else { throw error("unexpected text after the JSON value") }
        return value
    }

    /// Line and column (1-based, columns in characters) of a byte offset.
    public func location(of offset: Int) -> (line: Int, column: Int) {
        var line = 1, lineStart = 0
        for i in 0..<min(offset, bytes.count) where bytes[i] == 0x0A {
            line += 1
            lineStart = i + 1
        }
        let column = String(decoding: bytes[lineStart..<min(offset, bytes.count)], as: UTF8.self).count + 1
        return (line, column)
    }

    public func location(ofPath path: String) -> (line: Int, column: Int)? {
        offsets[path].map(location(of:))
    }

    private func error(_ message: String, at offset: Int? = nil) -> JSONParseError {
        let (line, column) = location(of: offset ?? index)
        return JSONParseError(line: line, column: column, message: message)
    }

    private mutating func skipSpace() {
        while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
    }

    private var current: UInt8? { index < bytes.count ? bytes[index] : nil }

    private mutating func parseValue(path: String) throws(JSONParseError) -> JSON {
        guard let byte = current else { throw error("the text ends where a value was expected") }
        switch byte {
        case UInt8(ascii: "{"): return try parseObject(path: path)
        case UInt8(ascii: "["): return try parseArray(path: path)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default:
            throw error("unexpected character '\(String(decoding: [byte], as: UTF8.self))' where a value was expected")
        }
    }

    private mutating func literal(_ word: String) throws(JSONParseError) {
        let expected = Array(word.utf8)
        guard index + expected.count <= bytes.count, Array(bytes[index..<(index + expected.count)]) == expected else {
            throw error("expected '\(word)'")
        }
        index += expected.count
    }

    private mutating func nest() throws(JSONParseError) {
        depth += 1
        if depth > 64 { throw error("nesting deeper than 64 levels") }
    }

    private mutating func parseObject(path: String) throws(JSONParseError) -> JSON {
        try nest()
        index += 1
        var object = JSONObject()
        skipSpace()
        if current == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return .object(object)
        }
        while true {
            skipSpace()
            let keyOffset = index
            guard current == UInt8(ascii: "\"") else { throw error("expected a member name in double quotes") }
            let key = try parseString()
            if object[key] != nil { throw error("duplicate member \"\(key)\"", at: keyOffset) }
            skipSpace()
            guard current == UInt8(ascii: ":") else { throw error("expected ':' after member name \"\(key)\"") }
            index += 1
            skipSpace()
            let memberPath = path.isEmpty ? key : path + "." + key
            offsets[memberPath] = index
            object.members.append((key, try parseValue(path: memberPath)))
            let afterValue = index // a missing comma is reported where it belongs
            skipSpace()
            if current == UInt8(ascii: ",") { index += 1; continue }
            if current == UInt8(ascii: "}") { index += 1; break }
            throw error("expected ',' or '}' after an object member", at: afterValue)
        }
        depth -= 1
        return .object(object)
    }

    private mutating func parseArray(path: String) throws(JSONParseError) -> JSON {
        try nest()
        index += 1
        var items: [JSON] = []
        skipSpace()
        if current == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array(items)
        }
        while true {
            skipSpace()
            items.append(try parseValue(path: path + "[\(items.count)]"))
            let afterValue = index
            skipSpace()
            if current == UInt8(ascii: ",") { index += 1; continue }
            if current == UInt8(ascii: "]") { index += 1; break }
            throw error("expected ',' or ']' after an array element", at: afterValue)
        }
        depth -= 1
        return .array(items)
    }

    private mutating func parseNumber() throws(JSONParseError) -> String {
        let start = index
        func digits() -> Int {
            let from = index
            while let c = current, c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") { index += 1 }
            return index - from
        }
        if current == UInt8(ascii: "-") { index += 1 }
        let intStart = index
        let intDigits = digits()
        guard intDigits > 0 else { throw error("expected a digit") }
        if intDigits > 1 && bytes[intStart] == UInt8(ascii: "0") { throw error("numbers must not have leading zeros", at: intStart) }
        if current == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { throw error("expected a digit after '.'") }
        }
        if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
            index += 1
            if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { throw error("expected a digit in the exponent") }
        }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    private mutating func parseString() throws(JSONParseError) -> String {
        let start = index
        index += 1
        var run = index // start of a run of plain bytes
        var text = ""
        func flush(_ end: Int) { text += String(decoding: bytes[run..<end], as: UTF8.self) }
        while true {
            guard let byte = current else { throw error("unterminated string", at: start) }
            if byte == UInt8(ascii: "\"") {
                flush(index)
                index += 1
                return text
            }
            if byte < 0x20 { throw error("control character in a string (escape it as \\u00XX)") }
            if byte != UInt8(ascii: "\\") { index += 1; continue }
            flush(index)
            index += 1
            guard let escape = current else { throw error("unterminated string", at: start) }
            index += 1
            switch escape {
            case UInt8(ascii: "\""): text += "\""
            case UInt8(ascii: "\\"): text += "\\"
            case UInt8(ascii: "/"): text += "/"
            case UInt8(ascii: "b"): text += "\u{08}"
            case UInt8(ascii: "f"): text += "\u{0C}"
            case UInt8(ascii: "n"): text += "\n"
            case UInt8(ascii: "r"): text += "\r"
            case UInt8(ascii: "t"): text += "\t"
            case UInt8(ascii: "u"):
                var code = try hex4()
                if (0xD800..<0xDC00).contains(code) {
                    guard current == UInt8(ascii: "\\"), index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "u") else {
                        throw error("unpaired surrogate in \\u escape")
                    }
                    index += 2
                    let low = try hex4()
                    guard (0xDC00..<0xE000).contains(low) else { throw error("unpaired surrogate in \\u escape") }
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(code) {
                    throw error("unpaired surrogate in \\u escape")
                }
                text.unicodeScalars.append(Unicode.Scalar(code)!)
            default:
                throw error("unknown escape '\\\(String(decoding: [escape], as: UTF8.self))'", at: index - 2)
            }
            run = index
        }
    }

    private mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw error("expected four hex digits after \\u") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw error("expected four hex digits after \\u")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }
}
