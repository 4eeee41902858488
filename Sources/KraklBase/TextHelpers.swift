// The few string operations this tree used from Foundation, with Foundation's results for the
// inputs it passes them (FoundationEssentials lacks them; see Threads.swift for why not Foundation).

extension Unicode.Scalar {
    /// Foundation's `CharacterSet.whitespaces`: space, tab and the other space separators
    /// (CoreFoundation's list, which counts U+200B ZERO WIDTH SPACE too).
    public var isSpaceOrTab: Bool {
        switch value {
        case 0x20, 0x09, 0xA0, 0x1680, 0x2000...0x200B, 0x202F, 0x205F, 0x3000: return true
        default: return false
        }
    }

    /// Foundation's `CharacterSet.whitespacesAndNewlines`: `isSpaceOrTab` and the line breaks.
    public var isWhitespaceOrNewline: Bool {
        switch value {
        case 0x0A...0x0D, 0x85, 0x2028, 0x2029: return true
        default: return isSpaceOrTab
        }
    }
}

extension StringProtocol {
    /// The text without the scalars `drop` holds for at either end.
    public func trimming(where drop: (Unicode.Scalar) -> Bool) -> String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !drop($0) }), let last = scalars.lastIndex(where: { !drop($0) }) else { return "" }
        var text = ""
        text.unicodeScalars.append(contentsOf: scalars[first...last])
        return text
    }

    /// `trimmingCharacters(in: .whitespaces)`: spaces and tabs off both ends; line breaks stay.
    public func trimmingSpaces() -> String { trimming(where: \.isSpaceOrTab) }

    /// `trimmingCharacters(in: .whitespacesAndNewlines)`.
    public func trimmingWhitespace() -> String { trimming(where: \.isWhitespaceOrNewline) }

    /// `caseInsensitiveCompare(_:) == .orderedSame` for the ASCII words it compares here (HTTP
    /// field names, auth schemes); other letters compare by their lowercase forms.
    public func equalsIgnoringCase<Other: StringProtocol>(_ other: Other) -> Bool {
        lowercased() == other.lowercased()
    }

    /// `padding(toLength:withPad: " ", startingAt: 0)`: cut to `length` characters, or filled
    /// with spaces up to it.
    public func padded(to length: Int) -> String {
        count >= length ? String(prefix(length)) : String(self) + String(repeating: " ", count: length - count)
    }
}
