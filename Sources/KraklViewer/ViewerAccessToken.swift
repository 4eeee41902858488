import FoundationEssentials
import KraklBase
import Glibc

/// The secret a viewer must show on a non-loopback address (a screen is
/// private): 192 random bits, base64url. It is printed once, in the viewer's
/// URL fragment (browsers do not send fragments to servers or in Referer),
/// and comes back as `Authorization: Bearer`. Logs only ever get `shortened`.
public struct ViewerAccessToken: Sendable, CustomStringConvertible, CustomReflectable {
    /// The whole token; for the printed URL and nothing else.
    public let value: String

    /// A fresh token from the system's cryptographic generator (getrandom(2)).
    public init() {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<24).map { _ in UInt8.random(in: 0...255, using: &generator) }
        value = Data(bytes).base64EncodedString().replacing("+", with: "-")
            .replacing("/", with: "_").replacing("=", with: "")
    }

    /// A given token (tests); at least 22 base64url characters (128 bits).
    public init?(value: String) {
        guard value.count >= 22, value.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { return nil }
        self.value = value
    }

    /// Its first 4 characters: enough to tell two apart in a log, useless to an attacker.
    public var shortened: String { String(value.prefix(4)) + "…" }
    public var description: String { shortened }
    public var customMirror: Mirror { Mirror(self, children: ["token": shortened]) }

    /// Whether an `Authorization` header carries this token as a Bearer token. The comparison
    /// takes the same time wherever the first difference is (it reads every byte).
    public func accepts(authorization: String?) -> Bool {
        guard let authorization else { return false }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].equalsIgnoringCase("Bearer") else { return false }
        return Self.constantTimeEqual(Array(parts[1].trimmingSpaces().utf8), Array(value.utf8))
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        // The length of the token is no secret (it is fixed); its bytes are.
        var difference = UInt8(a.count == b.count ? 0 : 1)
        for index in 0..<b.count { difference |= (index < a.count ? a[index] : 0) ^ b[index] }
        return difference == 0
    }
}
