import FoundationEssentials
@preconcurrency import Glibc
import KraklBase

/// The HTTP rules a WHIP client applies between requests, as pure
/// functions: where a Location leads, whether a hop may be taken, where the
/// token may go, how long Retry-After asks to wait, and what a status means.
public enum WhipHttpRules {
    /// An origin (RFC 6454): scheme, host and port, default ports filled in.
    public struct Origin: Equatable, Sendable {
        public var scheme: String
        public var host: String
        public var port: Int
    }

    public static func origin(of url: URL) -> Origin? {
        guard let scheme = url.scheme?.lowercased(), let host = url.host?.lowercased() else { return nil }
        let port = url.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : -1)
        return Origin(scheme: scheme, host: host, port: port)
    }

    /// `location` resolved against `base` by RFC 3986 §5 (Foundation's
    /// `URL(string:relativeTo:)` passes all of §5.4's examples on Linux; an
    /// empty reference, which §5.4 resolves to the base, is refused here: a
    /// server that sends an empty Location has not told us where its resource is).
    public static func resolve(_ location: String, against base: URL) -> URL? {
        let trimmed = location.trimmingSpaces()
        guard !trimmed.isEmpty, let url = URL(string: trimmed, relativeTo: base)?.absoluteURL,
              let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https", url.host?.isEmpty == false
        else { return nil }
        return url
    }

    /// Why a hop from `from` to `to` may not be taken, or nil when it may:
    /// only http and https, and never from https down to http (the offer and,
    /// on the same origin, the token would travel in clear).
    public static func refusal(from: URL, to: URL) -> String? {
        let fromScheme = from.scheme?.lowercased()
        let toScheme = to.scheme?.lowercased()
        guard toScheme == "http" || toScheme == "https" else { return "not an http(s) URL" }
        if fromScheme == "https" && toScheme == "http" { return "from https down to http" }
        return nil
    }

    /// Whether the Bearer token goes along to `url`: on the endpoint's own origin, or anywhere when the
    /// join code allows it (then still never over plain http when the endpoint was https).
    public static func tokenMayGo(to url: URL, endpoint: URL, acrossOrigins: Bool) -> Bool {
        guard let target = origin(of: url), let home = origin(of: endpoint) else { return false }
        if target == home { return true }
        return acrossOrigins && !(home.scheme == "https" && target.scheme == "http")
    }

    /// Seconds a `Retry-After` value asks for (RFC 9110 §10.2.3: delay-seconds or an HTTP-date),
    /// not below 0; nil when it is neither.
    public static func retryAfterSeconds(_ value: String, now: Date = Date()) -> Double? {
        let text = value.trimmingSpaces()
        if !text.isEmpty, text.allSatisfy(\.isASCIIDigit) { return Double(text.prefix(9)) ?? nil }
        guard let date = httpDate(text, now: now) else { return nil }
        return max(0, date.timeIntervalSince(now))
    }

    /// An HTTP-date in any of its three forms (RFC 9110 §5.6.7): "Sun, 06 Nov 1994 08:49:37 GMT",
    /// "Sunday, 06-Nov-94 08:49:37 GMT" (the year within 80 years before and 20 after `now`, as
    /// DateFormatter took "yy") and "Sun Nov  6 08:49:37 1994"; times are GMT.
    static func httpDate(_ text: String, now: Date) -> Date? {
        let words = text.split(whereSeparator: { $0 == " " || $0 == "," || $0 == "-" }).map { $0.lowercased() }
        let days = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
        let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        guard words.count >= 5, days.contains(where: { words[0].hasPrefix($0) }) else { return nil }
        let day: String, month: String, year: String, time: String
        if words.count == 6, words[5] == "gmt" || words[5] == "utc" {
            (day, month, year, time) = (words[1], words[2], words[3], words[4])
        } else if words.count == 5 {
            (month, day, time, year) = (words[1], words[2], words[3], words[4])
        } else {
            return nil
        }
        let clock = time.split(separator: ":", omittingEmptySubsequences: false)
        guard let monthIndex = months.firstIndex(of: month), let dayNumber = Int32(day), (1...31).contains(dayNumber),
              var yearNumber = Int32(year), year.count == 2 || year.count == 4, clock.count == 3,
              let hour = Int32(clock[0]), let minute = Int32(clock[1]), let second = Int32(clock[2]),
              (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second) else { return nil }
        if year.count == 2 {
            var seconds = time_t(now.timeIntervalSince1970.rounded(.down))
            var today = tm()
            gmtime_r(&seconds, &today)
            let earliest = today.tm_year + 1900 - 80
            yearNumber += earliest - earliest % 100
            if yearNumber < earliest { yearNumber += 100 }
        }
        var parts = tm()
        (parts.tm_year, parts.tm_mon, parts.tm_mday) = (yearNumber - 1900, Int32(monthIndex), dayNumber)
        (parts.tm_hour, parts.tm_min, parts.tm_sec) = (hour, minute, second)
        return Date(timeIntervalSince1970: TimeInterval(timegm(&parts)))
    }

    /// The error a refused or failed request means, judged by status class (servers disagree on
    /// the exact code: 401 or 403 for a bad token, 406 or 415 for an offer they cannot take).
    /// `message` is the server's first line, or the status's standard phrase when the body is empty.
    /// The words for a status the standard table does not name.
    static func statusClass(_ status: Int) -> String {
        switch status {
        case 100..<200: "Informational"
        case 200..<300: "Success"
        case 300..<400: "Redirection"
        case 400..<500: "Client Error"
        case 500..<600: "Server Error"
        default: "Unknown Status"
        }
    }

    public static func error(for response: HTTPResponse) -> RoomError {
        let status = response.status
        var message = response.firstLine
        if message.isEmpty { message = HTTPStatusPhrase.standard(status) ?? Self.statusClass(status) }
        switch status {
        case 401, 403: return .unauthorized(status: status, message: message)
        case 404: return .noSuchRoom(status: status, message: message)
        case 400..<500: return .refused(status: status, message: message)
        case 500..<600: return .serverError(status: status, message: message)
        default: return .badReply("unexpected status \(status) \(message)")
        }
    }
}

