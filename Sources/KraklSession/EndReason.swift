import KraklBase
import KraklHost
import KraklRTC

/// Why a sharing session ended. Typed, so the agent can say it in plain
/// words and map it to an exit status (docs/exit-codes.md) in one place.
public enum EndReason: Equatable, Sendable, CustomStringConvertible {
    /// The person stopped sharing (a key, `krakl-agent stop`, SIGINT/SIGTERM).
    case userStopped
    /// The room ended on the server's side (host ended the meeting, the backend destroyed the room,
    /// we were removed, the server closed our session). The server's words.
    case roomEnded(String)
    /// Another participant with our identity joined the room and the server removed us (Twilio 53205).
    case replaced(String)
    /// The capture source ended (portal session closed, X server gone, file ended).
    case sourceEnded(String)
    /// The network path died and could not be restored (ICE consent expired, restart failed).
    case connectionLost(String)
    /// No path to the room, and a TURN server would not carry us: it refused our credentials, or its
    /// certificate is not trusted. Not a lost connection: new credentials or a CA file mend it.
    case relayRefused(RelayRefusal, String)
    /// The room server did not let us in (or could not be reached) when joining.
    case joinRefused(RoomError)
    /// The join code's token expired or is not valid yet.
    case tokenExpired(String)
    /// The capture source could not be made or started (no display, the sharing dialog was
    /// denied, a broken backend): the host's own typed error, so its exit status is kept.
    case sourceUnavailable(HostError)
    /// Something on our side failed (encoder, DTLS set-up); the message says what.
    case failure(String)

    /// What the person is told, in plain words: the first sentence is the reason, the rest the detail.
    public var description: String {
        switch self {
        case .userStopped: return "You stopped sharing."
        case .roomEnded(let words): return "Sharing was ended by the room: \(words)."
        case .replaced(let words): return "Sharing was ended by the room: \(words)."
        case .sourceEnded(let words): return "The screen source was closed (\(words))."
        case .connectionLost(let words): return "Connection lost (\(words))."
        case .relayRefused(.credentials, let words): return "The TURN relay refused our credentials (\(words))."
        case .relayRefused(.certificate, let words): return "The TURN relay's certificate is not trusted (\(words))."
        case .joinRefused(let error): return "Could not join the room: \(error)."
        case .tokenExpired(let words): return "The join code cannot be used: \(words)."
        case .sourceUnavailable(let error): return "The screen cannot be captured: \(error.description)."
        case .failure(let words): return "Sharing failed: \(words)."
        }
    }

    /// A stable machine-readable name for logs and JSON: "user-stopped", "room-ended", …
    public var name: String {
        switch self {
        case .userStopped: return "user-stopped"
        case .roomEnded: return "room-ended"
        case .replaced: return "replaced"
        case .sourceEnded: return "source-ended"
        case .connectionLost: return "connection-lost"
        case .relayRefused: return "relay-refused"
        case .joinRefused: return "join-refused"
        case .tokenExpired: return "token-expired"
        case .sourceUnavailable: return "source-unavailable"
        case .failure: return "failure"
        }
    }
}
