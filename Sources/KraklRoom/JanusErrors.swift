import FoundationEssentials

/// Janus's error codes (janus 1.1.2 apierror.h and janus_videoroom.c) as
/// `RoomError`s, keeping the server's own words for the person.
enum JanusErrors {
    /// A core `error` reply (`{"janus":"error","error":{code,reason}}`) to `step`.
    static func core(_ failure: JanusFailure, step: String) -> RoomError {
        let words = "\(step): \(failure.reason ?? "error \(failure.code)")"
        switch failure.code {
        case 403, 405:  // unauthorized (token_auth / api secret), plugin not allowed for this token
            return .unauthorized(status: failure.code, message: words)
        case 458, 459:  // no such session / handle: it expired or the server restarted
            return .refused(status: failure.code, message: words + " (the Janus session is gone)")
        case 460:       // plugin not found: this Janus has no VideoRoom
            return .refused(status: failure.code, message: words + " (this Janus server has no VideoRoom plugin)")
        case 472, 490:  // not accepting sessions, unknown error
            return .serverError(status: failure.code, message: words)
        default:
            return .refused(status: failure.code, message: words)
        }
    }

    /// A VideoRoom `error_code` in an event's data.
    static func videoRoom(code: Int, error: String?, step: String) -> RoomError {
        let words = "\(step): \(error ?? "VideoRoom error \(code)")"
        switch code {
        case 426:       // no such room
            return .noSuchRoom(status: code, message: words)
        case 433:       // unauthorized: wrong pin, not in the room's allowed list, kicked
            return .unauthorized(status: code, message: words)
        case 432:       // the room's publisher slots are all taken
            return .refused(status: code, message: words + " (the room is full)")
        case 499:
            return .serverError(status: code, message: words)
        default:
            return .refused(status: code, message: words)
        }
    }

    /// An HTTP reply that is not a 200 (Janus answers API errors with 200 and
    /// a JSON error; other statuses come from the HTTP layer or a proxy).
    static func http(_ response: HTTPResponse, step: String) -> RoomError {
        let line = response.firstLine
        let words = "\(step): HTTP \(response.status)" + (line.isEmpty ? "" : " \(line)")
        switch response.status {
        case 300..<400:
            return .badReply(words + " (a redirect; the Janus API does not redirect: check the code's URL)")
        case 401, 403:
            return .unauthorized(status: response.status, message: words)
        case 404:
            return .noSuchRoom(status: 404, message: words + " (no Janus API at this URL, or the session is gone)")
        case 429, 500..<600:
            return .serverError(status: response.status, message: words)
        default:
            return .refused(status: response.status, message: words)
        }
    }
}
