/// A certificate fingerprint as SDP carries it (`a=fingerprint:sha-256 AB:CD:…`,
/// RFC 8122). Only sha-256 is produced; parsing accepts any algorithm name so
/// that an answer using another hash fails with a clear mismatch, not a parse error.
public struct CertificateFingerprint: Equatable, Hashable, Sendable, CustomStringConvertible {
    /// Lower-case hash name as SDP spells it, e.g. "sha-256".
    public let algorithm: String
    public let bytes: [UInt8]

    public init(algorithm: String = "sha-256", bytes: [UInt8]) {
        self.algorithm = algorithm.lowercased()
        self.bytes = bytes
    }

    /// Parses the value of an `a=fingerprint:` attribute, "sha-256 AB:CD:…"
    /// (hex in either case). nil when it is not of that form.
    public init?(sdp value: String) {
        let parts = value.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 2 else { return nil }
        var bytes: [UInt8] = []
        for pair in parts[1].split(separator: ":", omittingEmptySubsequences: false) {
            guard pair.count == 2, let byte = UInt8(pair, radix: 16) else { return nil }
            bytes.append(byte)
        }
        guard !bytes.isEmpty else { return nil }
        self.init(algorithm: String(parts[0]), bytes: bytes)
    }

    /// Upper-case hex with colons, "AB:CD:…".
    public var hex: String {
        bytes.map { byte in
            let text = String(byte, radix: 16, uppercase: true)
            return text.count == 1 ? "0" + text : text
        }.joined(separator: ":")
    }

    /// "sha-256 AB:CD:…", the value of `a=fingerprint:`.
    public var sdpValue: String { "\(algorithm) \(hex)" }

    /// The first and last three bytes, for error messages and logs.
    public var short: String {
        let all = hex.split(separator: ":")
        guard all.count > 8 else { return "\(algorithm) \(hex)" }
        return "\(algorithm) \(all.prefix(3).joined(separator: ":"))…\(all.suffix(3).joined(separator: ":"))"
    }

    public var description: String { sdpValue }
}
