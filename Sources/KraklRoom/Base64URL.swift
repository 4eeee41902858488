import FoundationEssentials

/// Base64url without padding (RFC 4648 §5, as JWS compact serialization
/// uses it, RFC 7515 §2).
enum Base64URL {
    /// The bytes `text` encodes, or nil when it has a character outside the
    /// base64url alphabet (padding included: JWTs have none) or an
    /// impossible length.
    static func decode<S: StringProtocol>(_ text: S) -> Data? {
        var standard = ""
        standard.reserveCapacity(text.utf8.count + 3)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                standard.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: "-"): standard += "+"
            case UInt8(ascii: "_"): standard += "/"
            default: return nil
            }
        }
        // A lone sixth of a byte left over cannot come from any input.
        guard standard.utf8.count % 4 != 1 else { return nil }
        standard += String(repeating: "=", count: (4 - standard.utf8.count % 4) % 4)
        return Data(base64Encoded: standard)
    }
}
