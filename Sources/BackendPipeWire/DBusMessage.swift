import CSdBus
import Glibc

/// A D-Bus value read from a message: enough of the type system for the
/// portal's answers (a{sv} results, a(ua{sv}) streams). Variants are
/// unwrapped; types the portal client never needs read as `.other`.
enum DBusValue {
    case string(String)
    case uint32(UInt32)
    case int32(Int32)
    case bool(Bool)
    case array([DBusValue])
    case structure([DBusValue])
    case dictionary([String: DBusValue])
    case other

    var string: String? { if case .string(let s) = self { return s } else { return nil } }
    var uint32: UInt32? { if case .uint32(let u) = self { return u } else { return nil } }
    var array: [DBusValue]? { if case .array(let a) = self { return a } else { return nil } }
    var structure: [DBusValue]? { if case .structure(let s) = self { return s } else { return nil } }
    var dictionary: [String: DBusValue]? { if case .dictionary(let d) = self { return d } else { return nil } }
}

/// A value for an a{sv} options dictionary the portal client sends.
enum DBusOption {
    case string(String)
    case uint32(UInt32)
    case bool(Bool)
}

private func code(_ c: Character) -> CChar { CChar(c.asciiValue!) }

/// Reading an sd_bus_message with the non-variadic calls
/// (sd_bus_message_peek_type, read_basic, enter/exit_container).
enum DBusReader {
    /// Reads the next complete value; nil at the end of the current container.
    static func next(_ m: OpaquePointer) -> DBusValue? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        guard sd_bus_message_peek_type(m, &type, &contents) > 0 else { return nil }
        switch UInt8(bitPattern: type) {
        case UInt8(ascii: "s"), UInt8(ascii: "o"), UInt8(ascii: "g"):
            var text: UnsafePointer<CChar>?
            guard sd_bus_message_read_basic(m, type, &text) > 0, let text else { return .other }
            return .string(String(cString: text))
        case UInt8(ascii: "u"):
            var value: UInt32 = 0
            return sd_bus_message_read_basic(m, type, &value) > 0 ? .uint32(value) : .other
        case UInt8(ascii: "i"):
            var value: Int32 = 0
            return sd_bus_message_read_basic(m, type, &value) > 0 ? .int32(value) : .other
        case UInt8(ascii: "b"):
            var value: Int32 = 0
            return sd_bus_message_read_basic(m, type, &value) > 0 ? .bool(value != 0) : .other
        case UInt8(ascii: "v"):
            guard sd_bus_message_enter_container(m, type, contents) > 0 else { return .other }
            let inner = next(m) ?? .other
            _ = sd_bus_message_exit_container(m)
            return inner
        case UInt8(ascii: "a"):
            guard sd_bus_message_enter_container(m, type, contents) > 0 else { return .other }
            defer { _ = sd_bus_message_exit_container(m) }
            if let contents, contents.pointee == code("{") {
                var dictionary: [String: DBusValue] = [:]
                var entryType: CChar = 0
                var entryContents: UnsafePointer<CChar>?
                while sd_bus_message_peek_type(m, &entryType, &entryContents) > 0 {
                    guard sd_bus_message_enter_container(m, entryType, entryContents) > 0 else { break }
                    let key = next(m), value = next(m)
                    _ = sd_bus_message_exit_container(m)
                    if let key = key?.string, let value { dictionary[key] = value }
                }
                return .dictionary(dictionary)
            }
            var items: [DBusValue] = []
            while let item = next(m) { items.append(item) }
            return .array(items)
        case UInt8(ascii: "r"), UInt8(ascii: "("):
            guard sd_bus_message_enter_container(m, code("r"), contents) > 0 else { return .other }
            var items: [DBusValue] = []
            while let item = next(m) { items.append(item) }
            _ = sd_bus_message_exit_container(m)
            return .structure(items)
        default:
            _ = sd_bus_message_skip(m, nil)
            return .other
        }
    }
}

/// Building an sd_bus_message with the non-variadic calls.
enum DBusWriter {
    @discardableResult
    static func string(_ m: OpaquePointer, _ value: String, type: Character = "s") -> Int32 {
        value.withCString { sd_bus_message_append_basic(m, code(type), $0) }
    }

    /// An a{sv} dictionary (keys sorted, so messages are reproducible).
    @discardableResult
    static func options(_ m: OpaquePointer, _ options: [String: DBusOption]) -> Int32 {
        var status = sd_bus_message_open_container(m, code("a"), "{sv}")
        for key in options.keys.sorted() where status >= 0 {
            status = sd_bus_message_open_container(m, code("e"), "sv")
            if status >= 0 { status = string(m, key) }
            switch options[key]! {
            case .string(let text):
                if status >= 0 { status = sd_bus_message_open_container(m, code("v"), "s") }
                if status >= 0 { status = string(m, text) }
            case .uint32(var number):
                if status >= 0 { status = sd_bus_message_open_container(m, code("v"), "u") }
                if status >= 0 { status = sd_bus_message_append_basic(m, code("u"), &number) }
            case .bool(let flag):
                var number: Int32 = flag ? 1 : 0
                if status >= 0 { status = sd_bus_message_open_container(m, code("v"), "b") }
                if status >= 0 { status = sd_bus_message_append_basic(m, code("b"), &number) }
            }
            if status >= 0 { status = sd_bus_message_close_container(m) } // v
            if status >= 0 { status = sd_bus_message_close_container(m) } // e
        }
        if status >= 0 { status = sd_bus_message_close_container(m) } // a
        return status
    }
}
