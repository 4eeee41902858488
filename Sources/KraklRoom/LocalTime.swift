import Foundation

/// Times and spans for messages a person reads: the token's expiry is
/// shown in this computer's time zone, with how far away it is, so a
/// wrong clock is easy to spot.
enum LocalTime {
    /// "2025-03-01 14:03:05 CET".
    static func format(_ date: Date, timeZone: TimeZone = .current) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = timeZone
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss zzz"
        return formatter.string(from: date)
    }

    /// A span of time, rounded to what matters at its size: "42 s",
    /// "5 min 3 s", "3 h 20 min", "2 days 4 h". Negative spans read as their size.
    static func span(_ interval: TimeInterval) -> String {
        guard interval.isFinite else { return "forever" }
        let seconds = Int(min(abs(interval), 1e15).rounded())
        let (days, hours, minutes, rest) = (seconds / 86400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60)
        if days > 0 { return hours > 0 ? "\(days) day\(days == 1 ? "" : "s") \(hours) h" : "\(days) day\(days == 1 ? "" : "s")" }
        if hours > 0 { return minutes > 0 ? "\(hours) h \(minutes) min" : "\(hours) h" }
        if minutes > 0 { return rest > 0 ? "\(minutes) min \(rest) s" : "\(minutes) min" }
        return "\(rest) s"
    }
}
