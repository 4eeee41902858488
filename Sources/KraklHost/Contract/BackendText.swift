import KraklBase
import Glibc

/// Text a backend hands the host (log lines, event messages, error messages, source names,
/// its name and description) made safe to print: a backend is someone else's code, and raw
/// escape sequences in its text could retitle, clear or rewrite the person's terminal, or
/// forge lines that look like the agent's own.
public enum BackendText {
    /// Longest text kept from one backend string; the rest is counted, not copied, so a
    /// runaway log line cannot cost the host memory or the terminal a screenful.
    public static let maximumBytes = 4096

    /// Reads a NUL-terminated C string the backend passed, at most `maximumBytes` of it (plus a
    /// note of how much more there was), and sanitizes it.
    public static func read(_ pointer: UnsafePointer<CChar>?) -> String? {
        guard let pointer else { return nil }
        // strnlen: the scan itself stays bounded for a string without its NUL within reach.
        let length = strnlen(pointer, maximumBytes + 1)
        let bytes = UnsafeRawBufferPointer(start: pointer, count: min(length, maximumBytes))
        var text = sanitized(String(decoding: bytes, as: UTF8.self))
        if length > maximumBytes { text += "… (cut at \(maximumBytes) bytes)" }
        return text
    }

    /// Printable UTF-8 is kept; control characters (C0, DEL, C1, which includes the one-byte CSI)
    /// become `\xNN`, and the Unicode controls that reorder or hide text (bidi overrides and
    /// isolates) become `\u{NNNN}`. Bytes that are not UTF-8 were already replaced by U+FFFD.
    public static func sanitized(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            let value = scalar.value
            if value < 0x20 || (0x7F...0x9F).contains(value) {
                out.append(contentsOf: hex(value).unicodeScalars)
            } else if (0x202A...0x202E).contains(value) || (0x2066...0x2069).contains(value) || value == 0x200E || value == 0x200F {
                out.append(contentsOf: "\\u{\(String(value, radix: 16))}".unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return String(out)
    }

    private static func hex(_ value: UInt32) -> String {
        let digits = Array("0123456789abcdef")
        return "\\x" + String(digits[Int(value >> 4)]) + String(digits[Int(value & 0xF)])
    }
}
