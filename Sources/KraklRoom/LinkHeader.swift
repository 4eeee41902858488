/// One link of an HTTP `Link` header field (RFC 8288 §3): a target URI
/// reference and its parameters.
public struct WebLink: Equatable, Sendable {
    /// The URI reference between `<` and `>`, as sent (not resolved).
    public var target: String
    /// Parameters by lowercased name, values unquoted. A parameter given
    /// twice keeps its first value (RFC 8288 §3.3 for `rel`).
    public var parameters: [String: String]

    public init(target: String, parameters: [String: String] = [:]) {
        self.target = target
        self.parameters = parameters
    }

    /// The relation types of `rel` (a space-separated list), lowercased.
    public var relations: [String] {
        (parameters["rel"] ?? "").lowercased().split(separator: " ").map(String.init)
    }
}

/// Parses `Link` header field values (RFC 8288 §3). A server may send one
/// field per link or one comma-joined field, and an HTTP stack may join
/// several fields with commas, so commas are split on only outside `<…>`
/// and quoted strings. A malformed link is skipped, never fatal: the links
/// before and after it still count.
public enum LinkHeader {
    /// Every link in `values` (each one field value), in order.
    public static func parse(_ values: [String]) -> [WebLink] {
        values.flatMap(parse(_:))
    }

    /// Every link in one field value, in order.
    public static func parse(_ value: String) -> [WebLink] {
        var scanner = Scanner(Array(value.unicodeScalars))
        var links: [WebLink] = []
        while true {
            scanner.skip { $0 == " " || $0 == "\t" || $0 == "," }
            guard !scanner.atEnd else { break }
            if let link = scanner.link() {
                links.append(link)
            } else {
                scanner.skipToNextLink()
            }
        }
        return links
    }

    /// The ICE servers of `Link: <url>; rel="ice-server"` links (RFC 9725 §4.6),
    /// with `username` and `credential` when the credential type is a
    /// password (the only type RFC 9725 defines; others cannot be used and
    /// their links are left out). Only stun:, stuns:, turn: and turns: URLs count.
    public static func iceServers(_ values: [String]) -> [IceServer] {
        parse(values).compactMap { link in
            guard link.relations.contains("ice-server") else { return nil }
            let scheme = link.target.prefix { $0 != ":" }.lowercased()
            guard ["stun", "stuns", "turn", "turns"].contains(scheme), link.target.count > scheme.count + 1 else { return nil }
            if let type = link.parameters["credential-type"], type.lowercased() != "password" { return nil }
            return IceServer(url: link.target, username: link.parameters["username"], credential: link.parameters["credential"])
        }
    }

    private struct Scanner {
        let characters: [Unicode.Scalar]
        var index = 0

        init(_ characters: [Unicode.Scalar]) { self.characters = characters }

        var atEnd: Bool { index >= characters.count }
        var current: Unicode.Scalar? { atEnd ? nil : characters[index] }

        mutating func skip(while predicate: (Unicode.Scalar) -> Bool) {
            while let c = current, predicate(c) { index += 1 }
        }

        mutating func skipWhitespace() { skip { $0 == " " || $0 == "\t" } }

        /// `<target>` then `; name[=value]` parameters, up to a comma or the end; nil when malformed.
        mutating func link() -> WebLink? {
            guard current == "<" else { return nil }
            index += 1
            var target = ""
            while let c = current, c != ">" { target.unicodeScalars.append(c); index += 1 }
            guard current == ">" else { return nil }
            index += 1
            var link = WebLink(target: target.trimmingSpaces)
            while true {
                skipWhitespace()
                guard let c = current, c != "," else { return link }
                guard c == ";" else { return nil }
                index += 1
                skipWhitespace()
                var name = ""
                while let c = current, c != "=", c != ";", c != ",", c != " ", c != "\t" { name.unicodeScalars.append(c); index += 1 }
                skipWhitespace()
                var value = ""
                if current == "=" {
                    index += 1
                    skipWhitespace()
                    if current == "\"" {
                        guard let quoted = quotedString() else { return nil }
                        value = quoted
                    } else {
                        while let c = current, c != ";", c != "," { value.unicodeScalars.append(c); index += 1 }
                        value = value.trimmingSpaces
                    }
                }
                let key = name.lowercased()
                // RFC 8288 §3: a trailing `*` marks an RFC 8187 extended value; its plain form is not given.
                if !key.isEmpty, link.parameters[key] == nil { link.parameters[key] = value }
            }
        }

        /// A quoted string (RFC 9110 §5.6.4) starting at `"`, with `\` escapes undone; nil when unterminated.
        mutating func quotedString() -> String? {
            index += 1
            var value = ""
            while let c = current {
                index += 1
                switch c {
                case "\"": return value
                case "\\":
                    guard let escaped = current else { return nil }
                    value.unicodeScalars.append(escaped)
                    index += 1
                default: value.unicodeScalars.append(c)
                }
            }
            return nil
        }

        /// After a malformed link: on to the next comma outside quotes and `<…>`.
        mutating func skipToNextLink() {
            var quoted = false
            var bracketed = false
            while let c = current {
                index += 1
                if quoted {
                    if c == "\\" { index += 1 } else if c == "\"" { quoted = false }
                } else if bracketed {
                    if c == ">" { bracketed = false }
                } else if c == "\"" {
                    quoted = true
                } else if c == "<" {
                    bracketed = true
                } else if c == "," {
                    return
                }
            }
        }
    }
}

extension String {
    fileprivate var trimmingSpaces: String {
        var scalars = Substring(self).unicodeScalars
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }
}
