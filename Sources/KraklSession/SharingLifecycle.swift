import KraklBase
import KraklHost
import KraklRTC

/// The life of one sharing session as a pure state machine: no I/O, no
/// clock, no threads (like `IceAgent`). The owner feeds it what happened
/// (`handle(_:)`) and carries out the actions it returns; so every rule of
/// "what happens when" lives here and is unit-tested state by state.
///
///     idle → preparing → joining → sharing ⇄ reconnecting
///              \            \         \           \
///               `------------`---------`-----------`→ leaving(reason) → idle
///
/// - preparing: the capture source is created first, because that is where
///   the person may be asked (the ScreenCast portal dialog); joining a room
///   before they said yes would show an empty tile to everyone.
/// - joining: the offer goes to the room server, the answer comes back, ICE
///   and DTLS connect.
/// - sharing: media flows. A path that stops answering is restarted in place
///   (reconnecting) before it is given up.
/// - leaving: unpublish, leave, stop the source, free everything; the first
///   end reason is kept (a room that ends while we leave because the person
///   stopped does not change why we left).
public struct SharingLifecycle: Sendable {
    public enum State: Equatable, Sendable {
        case idle, preparing, joining, sharing, reconnecting
        case leaving(EndReason)

        /// Lower-case name for status lines and JSON.
        public var name: String {
            switch self {
            case .idle: return "idle"
            case .preparing: return "preparing"
            case .joining: return "joining"
            case .sharing: return "sharing"
            case .reconnecting: return "reconnecting"
            case .leaving: return "leaving"
            }
        }
    }

    public enum Event: Equatable, Sendable {
        /// The person asked to share (a join code was given).
        case connect
        /// The source exists and may capture (permission given).
        case sourceReady
        /// The room answered and the encoder exists: capture and encoding may start while ICE and DTLS
        /// connect, so the first keyframe is ready when they are (see `EarlyFrames`).
        case answered
        /// ICE and DTLS are up (first time, or again after a restart).
        case connected
        /// The person asked to stop.
        case stop
        /// The room server refused or could not be reached while joining.
        case joinFailed(RoomError)
        /// The token expired or is not valid yet (checked before anything is opened).
        case tokenExpired(String)
        /// The room ended on the server's side (event, DTLS close_notify, RTCP BYE).
        case roomEnded(String)
        case replaced(String)
        /// The capture source could not be made or started (no display, permission denied).
        case sourceUnavailable(HostError)
        /// The capture source ended.
        case sourceEnded(String)
        /// The path stopped answering; a restart may save it.
        case connectionInterrupted(String)
        /// The path is gone for good (consent expired, restart failed, no connection in time).
        case connectionLost(String)
        /// No path, and a TURN server refused our credentials or its certificate was not trusted.
        case relayRefused(RelayRefusal, String)
        /// Something on our side failed.
        case failure(String)
        /// Everything the leave action tore down is down.
        case left
    }

    public enum Action: Equatable, Sendable {
        /// Create the capture source (may ask the person) and the encoder.
        case prepareSource
        /// Make the offer, send it to the room server, apply the answer.
        case join
        /// Start capture delivery into the encoder and publisher (at the answer: what is encoded before
        /// the connection is up waits in the publisher from its newest keyframe on).
        case startMedia
        /// Restart ICE through the room driver (WHIP PATCH, Janus configure restart).
        case restartIce
        /// Tear down everything that exists (publisher, driver leave, source, encoder); then send `.left`.
        case leave(EndReason)
        /// The session is over and the machine is idle again: tell the person why.
        case finished(EndReason)
    }

    public private(set) var state: State = .idle

    public init() {}

    /// True between `connect` and `left`.
    public var isActive: Bool { state != .idle }

    /// Applies `event` and returns what to do, in order. Events that do not
    /// apply in the current state (a late answer after stop, a second stop)
    /// return no action and leave the state as it is.
    public mutating func handle(_ event: Event) -> [Action] {
        switch (state, event) {
        case (.idle, .connect):
            state = .preparing
            return [.prepareSource]
        case (.idle, .tokenExpired(let words)):
            // Refused before anything was opened: nothing to leave.
            return [.finished(.tokenExpired(words))]
        case (.idle, _):
            return []

        case (.leaving(let reason), .left):
            state = .idle
            return [.finished(reason)]
        case (.leaving, _):
            return []

        case (.preparing, .sourceReady):
            state = .joining
            return [.join]
        case (.joining, .answered):
            return [.startMedia]
        case (.joining, .connected):
            state = .sharing
            return []
        case (.reconnecting, .connected):
            state = .sharing
            return []
        case (.sharing, .connectionInterrupted):
            state = .reconnecting
            return [.restartIce]
        case (.reconnecting, .connectionInterrupted):
            return []   // a restart is already under way

        case (_, .stop):
            return end(.userStopped)
        case (_, .joinFailed(let error)):
            return end(.joinRefused(error))
        case (_, .tokenExpired(let words)):
            return end(.tokenExpired(words))
        case (_, .roomEnded(let words)):
            return end(.roomEnded(words))
        case (_, .replaced(let words)):
            return end(.replaced(words))
        case (_, .sourceUnavailable(let error)):
            return end(.sourceUnavailable(error))
        case (_, .sourceEnded(let words)):
            return end(.sourceEnded(words))
        case (.joining, .connectionInterrupted(let words)), (_, .connectionLost(let words)):
            return end(.connectionLost(words))
        case (_, .relayRefused(let refusal, let words)):
            return end(.relayRefused(refusal, words))
        case (_, .failure(let words)):
            return end(.failure(words))

        // Out-of-order news (an answer after the session moved on): nothing to do.
        case (_, .connect), (_, .sourceReady), (_, .answered), (_, .connected), (_, .left), (_, .connectionInterrupted):
            return []
        }
    }

    private mutating func end(_ reason: EndReason) -> [Action] {
        state = .leaving(reason)
        return [.leave(reason)]
    }
}
