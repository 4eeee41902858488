import FoundationEssentials
import KraklBase
import Glibc

/// The messages of Twilio's room signaling as twilio-video.js speaks them (docs/rooms.md, "Twilio"):
/// TCMP frames ("Twilio Connection Messaging Protocol": hello, welcome, heartbeat, msg, bad, busy,
/// bye) on a WebSocket, and inside `msg` the RSP v2 messages ("Room Signaling Protocol": connect,
/// connected, update, sync, synced, disconnect, disconnected, error, iced). Sans-I/O: text in, typed
/// values out, and the reverse; everything the server sends is checked here, so the driver never
/// touches raw JSON.
public enum TwilioMessages {
    /// TCMP version 2 and RSP version 2, as the SDK sends them.
    static let tcmpVersion = 2
    static let rspVersion = 2
    /// The heartbeat interval we ask for (ms); the server's `welcome` says what it agreed to.
    public static let requestedTimeout = 5000
    /// What we publish: one video track, the screen.
    public static let trackName = "screen"
    /// What `publisher.sdk_version` says: this agent's version of the protocol support.
    static let sdkVersion = "krakl-agent/1"

    // MARK: - Client → server

    /// `hello` with the ICE request as its body (TCMP `body`; RSP `{type:"ice"}`), so the server
    /// answers `iced` with its TURN servers before we connect, as the SDK does.
    static func hello(id: String, token: String, cookie: String?, body: [String: Any]? = nil) -> String {
        var hello: [String: Any] = ["type": "hello", "id": id, "version": tcmpVersion, "timeout": requestedTimeout]
        hello["body"] = body ?? ["type": "ice", "version": 1, "edge": "roaming", "token": token]
        if let cookie { hello["cookie"] = cookie }
        return encode(hello)
    }

    static func msg(_ body: [String: Any]) -> String { encode(["type": "msg", "body": body]) }
    static let heartbeat = encode(["type": "heartbeat"])
    static let bye = encode(["type": "bye"])

    /// Our local participant: one video track, named "screen", enabled, high priority.
    static func participant(revision: Int, trackID: String) -> [String: Any] {
        ["revision": revision, "tracks": [["id": trackID, "kind": "video", "name": trackName, "enabled": true, "priority": "high"]]]
    }

    /// `connect`: the token, the room, our one track, the offer, a subscription to nothing, no
    /// media-signaling channels.
    static func connect(token: String, room: String?, trackID: String, peerConnectionID: String, offer: String,
                        userAgent: String) -> [String: Any] {
        [
            "type": "connect", "version": rspVersion, "name": room as Any? ?? JSONNull(), "token": token, "format": "unified",
            "ice_servers": "acquire",
            "publisher": ["name": "krakl-agent", "sdk_version": sdkVersion, "user_agent": userAgent],
            "participant": participant(revision: 1, trackID: trackID),
            "peer_connections": [["id": peerConnectionID, "description": ["type": "offer", "revision": 1, "sdp": offer]]],
            "subscribe": ["revision": 1, "rules": [["type": "exclude", "all": true]]],
            "media_signaling": [String: Any](),
        ]
    }

    /// `update` carrying a peer connection's state (an answer, our ICE candidates).
    static func update(session: String, trackID: String, peerConnection: [String: Any]) -> [String: Any] {
        ["type": "update", "version": rspVersion, "session": session, "participant": participant(revision: 1, trackID: trackID),
         "peer_connections": [peerConnection]]
    }

    /// `sync` on a new socket after the old one was lost, to resume the same session.
    static func sync(session: String, token: String, room: String?, trackID: String, peerConnectionID: String) -> [String: Any] {
        ["type": "sync", "version": rspVersion, "session": session, "token": token, "name": room as Any? ?? JSONNull(),
         "participant": participant(revision: 1, trackID: trackID), "peer_connections": [["id": peerConnectionID]]]
    }

    static func disconnect(session: String) -> [String: Any] {
        ["type": "disconnect", "version": rspVersion, "session": session]
    }

    /// Our ICE state for one ufrag: every candidate so far (the list is cumulative), a revision
    /// that grows with each change, and `complete` once gathering ended.
    static func ice(ufrag: String, revision: Int, candidates: [(candidate: String, mid: String)], complete: Bool) -> [String: Any] {
        var ice: [String: Any] = ["ufrag": ufrag, "revision": revision,
                                  "candidates": candidates.map { ["candidate": $0.candidate.hasPrefix("candidate:") ? $0.candidate : "candidate:" + $0.candidate,
                                                                  "sdpMid": $0.mid, "sdpMLineIndex": 0, "usernameFragment": ufrag] }]
        if complete { ice["complete"] = true }
        return ice
    }

    static func encode(_ object: [String: Any]) -> String {
        // Only ever called with what the functions above build: JSON-safe by construction.
        try! JSONText.serialize(object, options: [.sortedKeys, .withoutEscapingSlashes])
    }

    // MARK: - Server → client

    /// A TCMP frame from the server.
    public enum Frame: Sendable, Equatable {
        case welcome(negotiatedTimeout: Int)
        case heartbeat
        case message(Rsp)
        case bad(reason: String)
        case busy(retryAfter: Int, keepAlive: Bool, cookie: String?)
        case bye
        /// A type this client does not know: the SDK only reports it (an error event) and goes on.
        case unknown(type: String)
    }

    /// An RSP message from the server, with what the driver uses of it.
    public enum Rsp: Sendable, Equatable {
        case iced(servers: [IceServer])
        case connected(RoomState)
        case synced(RoomState)
        case update(RoomState)
        /// `status: "completed"` is the room ended by its owner (Twilio 53118).
        case disconnected(status: String?)
        case error(code: Int, message: String)
        /// Types the SDK also ignores or only logs (`warning`, media-signaling news).
        case ignored(type: String)
    }

    /// The parts of a connected/synced/update message the driver uses.
    public struct RoomState: Sendable, Equatable {
        public var session: String?
        public var roomSid: String?
        public var roomName: String?
        public var participantSid: String?
        public var identity: String?
        /// `options.session_timeout`, seconds.
        public var sessionTimeout: Double?
        public var peerConnections: [PeerConnection] = []
        /// `published.tracks`: our track ids → the server's track SIDs (and their state).
        public var publishedTracks: [PublishedTrack] = []
        /// Whether `participant` was there at all (a `connected` without it is refused, as the SDK does: 53003).
        public var hasParticipant = false
    }

    public struct PeerConnection: Sendable, Equatable {
        public var id: String
        public var description: Description?
        public var ice: Ice?
    }

    public struct Description: Sendable, Equatable {
        /// "offer", "answer", "create-offer", "close".
        public var type: String
        public var revision: Int
        public var sdp: String?
    }

    public struct Ice: Sendable, Equatable {
        public var ufrag: String?
        public var revision: Int
        public var candidates: [String]
        public var complete: Bool
    }

    public struct PublishedTrack: Sendable, Equatable {
        public var id: String
        public var sid: String?
        public var state: String?
        public var errorCode: Int?
    }

    /// Why a server frame cannot be used (53003 in the SDK's words: an invalid incoming message).
    public struct Malformed: Error, Equatable, Sendable, CustomStringConvertible {
        public let description: String
        init(_ words: String) { description = words }
    }

    /// Caps on what one message may hold, so a hostile server cannot make us hold or walk a huge
    /// structure (the WebSocket already caps a message at 1 MiB).
    static let maximumListLength = 256
    static let maximumStringLength = 256 * 1024

    /// Parses one text frame from the server.
    public static func parseFrame(_ text: String) throws(Malformed) -> Frame {
        guard let any = JSONText.parse(text) else {
            throw Malformed("a frame that is not JSON")
        }
        guard let object = any as? [String: Any] else { throw Malformed("a frame that is not a JSON object") }
        guard let type = object["type"] as? String else { throw Malformed("a frame without a type") }
        switch type {
        case "welcome":
            guard let timeout = integer(object["negotiatedTimeout"]), (100...600_000).contains(timeout) else {
                throw Malformed("a welcome without a usable negotiatedTimeout")
            }
            return .welcome(negotiatedTimeout: timeout)
        case "heartbeat": return .heartbeat
        case "bye": return .bye
        case "bad": return .bad(reason: clip(object["reason"] as? String ?? "no reason given"))
        case "busy":
            return .busy(retryAfter: integer(object["retryAfter"]) ?? -1, keepAlive: object["keepAlive"] as? Bool ?? false,
                         cookie: (object["cookie"] as? String).map { String($0.prefix(4096)) })
        case "msg":
            guard let body = object["body"] as? [String: Any] else { throw Malformed("a msg without an object body") }
            return .message(try parseRsp(body))
        default:
            return .unknown(type: clip(type, 40))
        }
    }

    static func parseRsp(_ body: [String: Any]) throws(Malformed) -> Rsp {
        guard let type = body["type"] as? String else { throw Malformed("a message without a type") }
        switch type {
        case "iced":
            let list = body["ice_servers"] as? [Any] ?? []
            guard list.count <= maximumListLength else { throw Malformed("iced with \(list.count) ICE servers") }
            var servers: [IceServer] = []
            for item in list {
                guard let entry = item as? [String: Any] else { continue }
                let urls = (entry["urls"] as? [Any])?.compactMap { $0 as? String } ?? (entry["urls"] as? String).map { [$0] }
                    ?? (entry["url"] as? String).map { [$0] } ?? []
                for url in urls.prefix(16) {
                    servers.append(IceServer(url: url, username: entry["username"] as? String, credential: entry["credential"] as? String))
                }
            }
            return .iced(servers: servers)
        case "connected": return .connected(try roomState(body))
        case "synced": return .synced(try roomState(body))
        case "update": return .update(try roomState(body))
        case "disconnected": return .disconnected(status: body["status"] as? String)
        case "error":
            let code = integer(body["code"]) ?? 0
            return .error(code: code, message: clip(body["message"] as? String ?? "no message", 300))
        default:
            return .ignored(type: clip(type, 40))
        }
    }

    private static func roomState(_ body: [String: Any]) throws(Malformed) -> RoomState {
        var state = RoomState()
        state.session = try string(body["session"], "session")
        state.roomSid = try string(body["sid"], "sid")
        state.roomName = try string(body["name"], "name")
        if let participant = body["participant"] {
            guard let participant = participant as? [String: Any] else { throw Malformed("participant is not an object") }
            state.hasParticipant = true
            state.participantSid = try string(participant["sid"], "participant.sid")
            state.identity = try string(participant["identity"], "participant.identity")
        }
        if let options = body["options"] as? [String: Any], let timeout = options["session_timeout"] as? Double, timeout.isFinite, timeout > 0 {
            state.sessionTimeout = min(timeout, 3600)
        }
        if let list = body["peer_connections"] {
            guard let list = list as? [Any], list.count <= maximumListLength else { throw Malformed("peer_connections is not a short list") }
            for item in list {
                guard let pc = item as? [String: Any], let id = try string(pc["id"], "peer_connections[].id") else {
                    throw Malformed("a peer connection without an id")
                }
                var connection = PeerConnection(id: id)
                if let description = pc["description"] {
                    guard let description = description as? [String: Any], let type = try string(description["type"], "description.type"),
                          let revision = integer(description["revision"]) else {
                        throw Malformed("a description without type and revision")
                    }
                    connection.description = Description(type: type, revision: revision, sdp: try string(description["sdp"], "description.sdp"))
                }
                if let ice = pc["ice"] as? [String: Any] {
                    let candidates = (ice["candidates"] as? [Any] ?? []).prefix(maximumListLength).compactMap { entry -> String? in
                        ((entry as? [String: Any])?["candidate"] as? String).map { String($0.prefix(1024)) }
                    }
                    connection.ice = Ice(ufrag: ice["ufrag"] as? String, revision: integer(ice["revision"]) ?? 0, candidates: candidates,
                                         complete: ice["complete"] as? Bool ?? false)
                }
                state.peerConnections.append(connection)
            }
        }
        if let published = body["published"] as? [String: Any], let tracks = published["tracks"] as? [Any] {
            guard tracks.count <= maximumListLength else { throw Malformed("published lists \(tracks.count) tracks") }
            for item in tracks {
                guard let track = item as? [String: Any], let id = track["id"] as? String else { continue }
                state.publishedTracks.append(PublishedTrack(id: clip(id, 128), sid: (track["sid"] as? String).map { clip($0, 64) },
                                                            state: track["state"] as? String,
                                                            errorCode: integer((track["error"] as? [String: Any])?["code"])))
            }
        }
        return state
    }

    private static func string(_ value: Any?, _ name: String) throws(Malformed) -> String? {
        guard let value, !(value is JSONNull) else { return nil }
        guard let text = value as? String else { throw Malformed("\(name) is not a string") }
        guard text.utf8.count <= maximumStringLength else { throw Malformed("\(name) is \(text.utf8.count) bytes long") }
        return text
    }

    /// An integer JSON number (JSONText gives every number as a Double; a bool is not one).
    private static func integer(_ value: Any?) -> Int? {
        guard let double = value as? Double else { return nil }
        guard double.isFinite, double == double.rounded(), abs(double) < 1e15 else { return nil }
        return Int(double)
    }

    /// A server's words for a message: printable, one line, short.
    static func clip(_ text: String, _ limit: Int = 200) -> String {
        let printable = String(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.map(Character.init))
        return printable.count > limit ? String(printable.prefix(limit - 1)) + "…" : printable
    }
}
