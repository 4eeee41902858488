import FoundationEssentials
import KraklBase
import Glibc

// The session controller's snapshot: what the daemon's `status` replies with and its watch lines
// carry (docs/daemon.md, the control protocol), and what the home screen and `--join` lines show.

/// How the last session ended, kept while the daemon is idle again.
public struct ControlEnd: Codable, Equatable, Sendable {
    /// EndReason.name: "user-stopped", "room-ended", …
    public var reason: String
    /// EndReason.description: what the person is told.
    public var message: String
    /// The status `krakl-agent --join … --once` would have exited with (docs/exit-codes.md).
    public var exitStatus: Int32

    public init(reason: String, message: String, exitStatus: Int32) {
        self.reason = reason
        self.message = message
        self.exitStatus = exitStatus
    }
}

/// A snapshot of the daemon: the lifecycle's state and, while a session runs, its numbers.
public struct ControlStatus: Codable, Equatable, Sendable {
    public var state: String
    public var pid: Int32
    public var room: String?
    public var identity: String?
    public var service: String?
    /// What the room server said of the session: "room RM…, participant PA…, track MT…" (Twilio).
    public var roomDetails: String?
    public var backend: String?
    /// The backend option naming what is captured (`source` or `scene`), when one was given.
    public var source: String?
    /// The size of the pictures sent (nil before the first).
    public var width: Int?
    public var height: Int?
    /// Seconds in the current state (how long joining has taken so far, how long idle).
    public var stateSeconds: Double?
    /// Seconds since the session started sharing (nil before).
    public var sharingSeconds: Double?
    /// The peer connection's state ("connected", …).
    public var connection: String?
    /// The selected candidate pair: types and the protocol that leaves this machine ("host/udp -> host", "relay/tls -> host").
    public var path: String?
    public var rttMs: Double?
    /// Seconds since the room's last RTCP packet (nil before the first): how old `rttMs` is.
    public var silentSeconds: Double?
    public var lossPercent: Double?
    /// Sent over the last second.
    public var kbps: Double?
    public var fps: Double?
    public var framesSent: Int?
    public var bytesSent: Int?
    public var lastEnd: ControlEnd?

    public init(state: String, pid: Int32, lastEnd: ControlEnd? = nil) {
        self.state = state
        self.pid = pid
        self.lastEnd = lastEnd
    }

    /// After this long without an RTCP packet the round-trip time is stale: the room (an SFU that
    /// died, a path that broke) is said to be silent instead. Rooms report every second or so
    /// (Janus and aiortc each about 1 s), so 2 s is two missed reports.
    public static let silenceWorthSaying = 2.0

    /// The round-trip time for people, with the age of the report it came from: "3 ms (0.4 s ago)",
    /// or "no reply from the room for 5 s" once the room has been silent past `silenceWorthSaying`
    /// (the last RTT would read as "connected, rtt 3 ms" for the ~10 s ICE takes to call the
    /// connection lost); "-" before any.
    public var rttWords: String {
        if let silent = silentSeconds, silent > Self.silenceWorthSaying { return String(cFormat: "no reply from the room for %.0f s", silent) }
        guard let rttMs else { return "-" }
        return String(cFormat: "%.0f ms", rttMs) + (silentSeconds.map { String(cFormat: " (%.1f s ago)", $0) } ?? "")
    }
}
