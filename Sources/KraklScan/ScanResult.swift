import FoundationEssentials
import KraklRoom

/// What the QR codes of one picture add up to.
public enum ScanResult: Equatable, Sendable, CustomStringConvertible {
    /// No QR code at all.
    case nothing
    /// Exactly one usable join code (the same code seen more than once counts once).
    case found(Invitation)
    /// Two or more different usable join codes: the agent refuses to guess.
    case conflicting([Invitation])
    /// QR codes, but none usable; each distinct payload's finding, in the order seen.
    case noUsableCode([PayloadFinding])

    /// Judges the payloads zbar found in one picture. Pure: same payloads
    /// and `now`, same result.
    public static func classify(_ payloads: [[UInt8]], now: Date, skew: Duration = .seconds(60)) -> ScanResult {
        guard !payloads.isEmpty else { return .nothing }
        var seen = Set<[UInt8]>()
        var findings: [PayloadFinding] = []
        for payload in payloads where seen.insert(payload).inserted {
            findings.append(PayloadFinding.classify(payload, now: now, skew: skew))
        }
        var usable: [Invitation] = []
        for case .joinCode(let invitation) in findings where !usable.contains(where: { $0.code == invitation.code }) {
            usable.append(invitation)
        }
        switch usable.count {
        case 0: return .noUsableCode(findings)
        case 1: return .found(usable[0])
        default: return .conflicting(usable)
        }
    }

    /// What to tell the person, one finding a line.
    public var description: String {
        switch self {
        case .nothing: return "no QR code found"
        case .found(let invitation): return "found a join code: \(invitation)"
        case .conflicting(let invitations):
            return "found \(invitations.count) different join codes at once; not guessing which one to use (show only one):\n"
                + invitations.map { "  " + Self.listing($0) }.joined(separator: "\n")
        case .noUsableCode(let findings): return findings.map(\.description).joined(separator: "\n")
        }
    }

    /// Room and identity of one code, for the list of conflicting codes.
    static func listing(_ invitation: Invitation) -> String {
        guard let room = invitation.room else { return invitation.description }
        return "room \"\(room)\" as \"\(invitation.identity)\" (\(invitation.code.service.displayName))"
    }
}
