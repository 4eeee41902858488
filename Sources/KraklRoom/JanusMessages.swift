import FoundationEssentials
import Glibc

// The parts of Janus's HTTP API (Janus 1.1.x, docs: janus.c and
// plugins/janus_videoroom.c) that a VideoRoom publisher speaks, as Codable
// types. Only what the driver reads is decoded; everything else Janus sends
// is ignored, so a newer Janus adding fields does not break us.

/// A room or participant id: numeric by default in Janus, a string when the
/// server runs with `string_ids = true`. Encoded the way it was given.
enum JanusID: Codable, Equatable, Sendable, CustomStringConvertible {
    case number(UInt64)
    case string(String)

    /// A room as a join code names it: all digits (and fitting 64 bits) is a
    /// numeric room, anything else a string id.
    init(room: String) {
        if !room.isEmpty, room.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let number = UInt64(room) {
            self = .number(number)
        } else {
            self = .string(room)
        }
    }

    init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let number = try? container.decode(UInt64.self) {
            self = .number(number)
        } else {
            self = .string(try container.decode(String.self))
        }
    }

    func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        }
    }

    var description: String {
        switch self {
        case .number(let value): return String(value)
        case .string(let value): return value
        }
    }
}

/// An SDP offer or answer as Janus carries it next to a message.
struct JanusJsep: Codable, Equatable, Sendable {
    var type: String
    var sdp: String
}

/// A trickled candidate, or `completed` for the end of candidates.
struct JanusCandidate: Encodable, Sendable {
    var candidate: String?
    var sdpMid: String?
    var sdpMLineIndex: Int?
    var completed: Bool?
}

/// The `body` of a VideoRoom plugin `message`: one type for the few requests
/// a publisher sends; fields that are nil are left out of the JSON.
struct VideoRoomRequest: Encodable, Sendable {
    var request: String
    var room: JanusID?
    var ptype: String?
    var display: String?
    var pin: String?
    /// `configure` with a restarted offer: Janus 1.1.2 detects the restart
    /// from the offer's new ice-ufrag/pwd and accepts this flag (it acts on
    /// it for subscribers only); sent so the intent is explicit.
    var restart: Bool?

    static func join(room: JanusID, display: String, pin: String?) -> VideoRoomRequest {
        VideoRoomRequest(request: "join", room: room, ptype: "publisher", display: display, pin: pin)
    }

    /// Janus 1.x publishes what the offer describes (our offer has one video
    /// m-section); its `audio`/`video`/`data` flags are deprecated there.
    static let publish = VideoRoomRequest(request: "publish")
    static let restartConfigure = VideoRoomRequest(request: "configure", restart: true)
    static let unpublish = VideoRoomRequest(request: "unpublish")
    static let leave = VideoRoomRequest(request: "leave")
}

/// Every request to Janus: core verbs (`create`, `attach`, `message`,
/// `trickle`, `keepalive`, `detach`, `destroy`) with what they carry.
struct JanusRequest: Encodable, Sendable {
    var janus: String
    var transaction: String
    /// Janus core `token` (token_auth); only when the driver is told to send it.
    var token: String?
    var plugin: String?
    var body: VideoRoomRequest?
    var jsep: JanusJsep?
    var candidate: JanusCandidate?
}

/// Janus's `error` object: a core error code (403, 458, …) and its reason.
struct JanusFailure: Decodable, Equatable, Sendable {
    var code: Int
    var reason: String?
}

/// The VideoRoom's part of an event (`plugindata.data`).
struct VideoRoomData: Decodable, Sendable {
    var videoroom: String?
    var room: JanusID?
    var id: JanusID?
    var errorCode: Int?
    var error: String?
    var configured: String?
    /// "ok" for our own leaving, a participant's id for someone else's.
    var leaving: JanusID?
    var reason: String?
    /// Another participant (or we, in some versions) removed by the host.
    var kicked: JanusID?
    var unpublished: JanusID?

    enum CodingKeys: String, CodingKey {
        case videoroom, room, id, error, configured, leaving, reason, kicked, unpublished
        case errorCode = "error_code"
    }

    init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // Each field on its own: one of unexpected shape must not hide the others.
        videoroom = try? c.decodeIfPresent(String.self, forKey: .videoroom)
        room = try? c.decodeIfPresent(JanusID.self, forKey: .room)
        id = try? c.decodeIfPresent(JanusID.self, forKey: .id)
        errorCode = try? c.decodeIfPresent(Int.self, forKey: .errorCode)
        error = try? c.decodeIfPresent(String.self, forKey: .error)
        configured = try? c.decodeIfPresent(String.self, forKey: .configured)
        leaving = try? c.decodeIfPresent(JanusID.self, forKey: .leaving)
        reason = try? c.decodeIfPresent(String.self, forKey: .reason)
        kicked = try? c.decodeIfPresent(JanusID.self, forKey: .kicked)
        unpublished = try? c.decodeIfPresent(JanusID.self, forKey: .unpublished)
    }
}

struct JanusPluginData: Decodable, Sendable {
    var plugin: String?
    var data: VideoRoomData?
}

/// `data` of a `success` reply to `create` or `attach`: the new id.
struct JanusCreated: Decodable, Sendable {
    var id: UInt64
}

/// Anything Janus sends: a reply to a request (`success`, `ack`, `error`)
/// or an event from the long-poll (`event`, `hangup`, `timeout`,
/// `webrtcup`, `media`, `keepalive`, …).
struct JanusMessage: Decodable, Sendable {
    var janus: String
    var transaction: String?
    var sender: UInt64?
    var data: JanusCreated?
    var error: JanusFailure?
    var plugindata: JanusPluginData?
    var jsep: JanusJsep?
    var reason: String?

    enum CodingKeys: String, CodingKey {
        case janus, transaction, sender, data, error, plugindata, jsep, reason
    }

    init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        janus = try c.decode(String.self, forKey: .janus)
        transaction = try? c.decodeIfPresent(String.self, forKey: .transaction)
        sender = try? c.decodeIfPresent(UInt64.self, forKey: .sender)
        data = try? c.decodeIfPresent(JanusCreated.self, forKey: .data)
        error = try? c.decodeIfPresent(JanusFailure.self, forKey: .error)
        plugindata = try? c.decodeIfPresent(JanusPluginData.self, forKey: .plugindata)
        jsep = try? c.decodeIfPresent(JanusJsep.self, forKey: .jsep)
        reason = try? c.decodeIfPresent(String.self, forKey: .reason)
    }

    /// The VideoRoom data of an `event` (or of a synchronous `success`).
    var videoroom: VideoRoomData? { plugindata?.data }
}

/// What the long-poll returns: an array with `maxev` > 1 (Janus 1.1.2
/// janus_http.c), a single object otherwise; both accepted.
struct JanusEventBatch: Decodable {
    var messages: [JanusMessage]

    init(from decoder: Decoder) throws {
        if var list = try? decoder.unkeyedContainer() {
            var messages: [JanusMessage] = []
            while !list.isAtEnd { messages.append(try list.decode(JanusMessage.self)) }
            self.messages = messages
        } else {
            messages = [try JanusMessage(from: decoder)]
        }
    }
}
