/// JSON's null among `Any` values (where JSONSerialization had NSNull).
public struct JSONNull: Sendable, Equatable {
    public init() {}
}

/// JSON text for and from plain Swift values ([String: Any], [Any], String, Bool, integers,
/// Double, JSONNull, nil), byte for byte what JSONSerialization wrote for the same options:
/// messages to servers and the stats files keep their form (issue 27 dropped Foundation).
public enum JSONText {
    public struct Options: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let prettyPrinted = Options(rawValue: 1)
        public static let sortedKeys = Options(rawValue: 2)
        public static let withoutEscapingSlashes = Options(rawValue: 4)
    }

    /// What cannot be JSON: a value of another type, or a number that is not finite.
    public struct Unwritable: Error, Equatable {
        public let description: String
    }

    public static func serialize(_ value: Any, options: Options = []) throws(Unwritable) -> String {
        var writer = Writer(options: options)
        try writer.write(value)
        return writer.text
    }

    /// The text's value as plain Swift values: objects [String: Any], arrays [Any], strings,
    /// Bools, every number a Double, null JSONNull(); nil when it is not JSON (a duplicate member
    /// name counts as not JSON here).
    public static func parse(_ text: String) -> Any? {
        var parser = JSONParser(text)
        return (try? parser.parse())?.plainValue
    }

    /// The order JSONSerialization's `.sortedKeys` gave (a case-insensitive, numeric comparison):
    /// "_" before digits before letters, digit runs by their value, letters ignoring case; ties
    /// (keys equal but for case or leading zeros) as ICU broke them. Exact for keys of ASCII letters, digits and punctuation.
    public static func keyPrecedes(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        var i = 0, j = 0
        while i < x.count, j < y.count {
            if isDigit(x[i]), isDigit(y[j]) {
                let (startX, startY) = (i, j)
                while i < x.count, isDigit(x[i]) { i += 1 }
                while j < y.count, isDigit(y[j]) { j += 1 }
                let runX = x[startX..<i].drop { $0 == UInt8(ascii: "0") }, runY = y[startY..<j].drop { $0 == UInt8(ascii: "0") }
                if runX.count != runY.count { return runX.count < runY.count }
                if !runX.elementsEqual(runY) { return runX.lexicographicallyPrecedes(runY) }
                continue
            }
            let (rankX, rankY) = (rank(x[i]), rank(y[j]))
            if rankX != rankY { return rankX < rankY }
            i += 1
            j += 1
        }
        if (x.count - i) != (y.count - j) { return (x.count - i) < (y.count - j) }
        // Equal but for leading zeros or case: the shorter first, then lowercase before uppercase.
        if x.count != y.count { return x.count < y.count }
        return x.map(swapCase).lexicographicallyPrecedes(y.map(swapCase))
    }

    private static func swapCase(_ byte: UInt8) -> UInt8 {
        switch byte {
        case 0x41...0x5A, 0x61...0x7A: return byte ^ 0x20
        default: return byte
        }
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }

    /// Punctuation (by byte), then digits, then letters without case, then non-ASCII bytes.
    private static func rank(_ byte: UInt8) -> Int {
        switch byte {
        case 0x30...0x39: return 0x100 + Int(byte)
        case 0x41...0x5A: return 0x200 + Int(byte + 0x20)
        case 0x61...0x7A: return 0x200 + Int(byte)
        case 0x80...: return 0x300 + Int(byte)
        default: return Int(byte)
        }
    }

    private struct Writer {
        let options: Options
        var text = ""
        var indent = 0

        init(options: Options) { self.options = options }

        private var pretty: Bool { options.contains(.prettyPrinted) }

        mutating func write(_ value: Any) throws(Unwritable) {
            switch value {
            case let text as String: writeString(text)
            case let flag as Bool: text += flag ? "true" : "false"
            case let number as Double: try writeDouble(number)
            case let number as Float: try writeDouble(Double(number), description: number.description)
            case let number as any BinaryInteger: text += "\(number)"
            case is JSONNull: text += "null"
            case let object as [String: Any]: try writeObject(object)
            case let array as [Any]: try writeArray(array)
            default:
                // An Optional that arrived wrapped in Any: nil is null, as NSNull was.
                let mirror = Mirror(reflecting: value)
                guard mirror.displayStyle == .optional else { throw Unwritable(description: "\(type(of: value)) is not a JSON value") }
                if let wrapped = mirror.children.first?.value { try write(wrapped) } else { text += "null" }
            }
        }

        /// Swift's shortest round-trip form without a trailing ".0", as JSONSerialization wrote.
        private mutating func writeDouble(_ number: Double, description: String? = nil) throws(Unwritable) {
            guard number.isFinite else { throw Unwritable(description: "\(number) is not a JSON number") }
            var form = description ?? number.description
            if form.hasSuffix(".0") { form.removeLast(2) }
            text += form
        }

        private mutating func writeString(_ string: String) {
            text += JSON.quote(string, asJSONSerialization: true, escapingSlashes: !options.contains(.withoutEscapingSlashes))
        }

        private mutating func writeArray(_ array: [Any]) throws(Unwritable) {
            text += "["
            open()
            for (index, element) in array.enumerated() {
                separate(first: index == 0)
                try write(element)
            }
            close()
            text += "]"
        }

        private mutating func writeObject(_ object: [String: Any]) throws(Unwritable) {
            text += "{"
            open()
            let keys = options.contains(.sortedKeys) ? object.keys.sorted(by: JSONText.keyPrecedes) : Array(object.keys)
            for (index, key) in keys.enumerated() {
                separate(first: index == 0)
                writeString(key)
                text += pretty ? " : " : ":"
                try write(object[key]!)
            }
            close()
            text += "}"
        }

        private mutating func open() {
            guard pretty else { return }
            text += "\n"
            indent += 2
        }

        private mutating func separate(first: Bool) {
            if !first { text += pretty ? ",\n" : "," }
            if pretty { text += String(repeating: " ", count: indent) }
        }

        private mutating func close() {
            guard pretty else { return }
            text += "\n"
            indent -= 2
            text += String(repeating: " ", count: indent)
        }
    }
}

extension JSON {
    /// This value as plain Swift values (see `JSONText.parse`).
    public var plainValue: Any {
        switch self {
        case .null: return JSONNull()
        case .bool(let flag): return flag
        case .number(let text): return Double(text) ?? Double.nan
        case .string(let text): return text
        case .array(let items): return items.map(\.plainValue)
        case .object(let object):
            var dictionary: [String: Any] = [:]
            for member in object.members { dictionary[member.key] = member.value.plainValue }
            return dictionary
        }
    }
}
