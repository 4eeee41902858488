@preconcurrency import Glibc

/// A value `String(cFormat:)` can print: numbers through the C library's printf conversions,
/// strings through `%@`.
public protocol CFormatArgument {
    /// This value printed by one conversion specification, e.g. "%5.1f" or "%@".
    func cFormatted(_ specification: String) -> String
}

extension CFormatArgument where Self: CVarArg {
    public func cFormatted(_ specification: String) -> String {
        var capacity = 64
        while true {
            var buffer = [CChar](repeating: 0, count: capacity)
            let length = withVaList([self]) { vsnprintf(&buffer, capacity, specification, $0) }
            precondition(length >= 0, "bad conversion \(specification)")
            if Int(length) < capacity { return String(decoding: buffer.prefix(Int(length)).map { UInt8(bitPattern: $0) }, as: UTF8.self) }
            capacity = Int(length) + 1
        }
    }
}

extension Int: CFormatArgument {}
extension Int32: CFormatArgument {}
extension Int64: CFormatArgument {}
extension UInt: CFormatArgument {}
extension UInt8: CFormatArgument {}
extension UInt16: CFormatArgument {}
extension UInt32: CFormatArgument {}
extension UInt64: CFormatArgument {}
extension Double: CFormatArgument {}

extension String: CFormatArgument {
    public func cFormatted(_ specification: String) -> String {
        precondition(specification == "%@", "a string prints only as %@, not \(specification)")
        return self
    }
}

extension Substring: CFormatArgument {
    public func cFormatted(_ specification: String) -> String { String(self).cFormatted(specification) }
}

extension String {
    /// The text `String(format:)` made for the same format and arguments: each numeric conversion
    /// is the C library's own (what Foundation's formatting hands numbers to, in the C locale),
    /// `%@` takes a string as it is, `%%` is a percent sign. Traps on a format its arguments do not
    /// fit (too few, or a string for a numeric conversion): formats here are literals.
    public init(cFormat format: String, _ arguments: any CFormatArgument...) {
        let bytes = Array(format.utf8)
        var text = ""
        var remaining = arguments.makeIterator()
        var index = 0, literalStart = 0
        while index < bytes.count {
            guard bytes[index] == UInt8(ascii: "%") else {
                index += 1
                continue
            }
            text += String(decoding: bytes[literalStart..<index], as: UTF8.self)
            var end = index + 1
            while end < bytes.count, !Self.conversions.contains(bytes[end]) { end += 1 }
            precondition(end < bytes.count, "a format ends inside a conversion: \(format)")
            if bytes[end] == UInt8(ascii: "%") {
                text += "%"
            } else {
                guard let argument = remaining.next() else { preconditionFailure("too few arguments for \(format)") }
                text += argument.cFormatted(String(decoding: bytes[index...end], as: UTF8.self))
            }
            index = end + 1
            literalStart = index
        }
        text += String(decoding: bytes[literalStart...], as: UTF8.self)
        self = text
    }

    private static let conversions = Set("diouxXeEfFgGaAcsp@%".utf8)
}
