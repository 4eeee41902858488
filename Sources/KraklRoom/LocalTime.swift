import FoundationEssentials
import KraklBase
@preconcurrency import Glibc

/// Times and spans for messages a person reads: the token's expiry is
/// shown in this computer's time zone, with how far away it is, so a
/// wrong clock is easy to spot.
enum LocalTime {
    /// "2025-03-01 14:03:05 EST", in this computer's time zone: what DateFormatter wrote for
    /// "yyyy-MM-dd HH:mm:ss zzz" in en_US_POSIX (whose short zone names are the US ones, UTC
    /// and GMT; elsewhere "GMT+1", "GMT+5:30"), from the C library's zone data instead of ICU's.
    static func format(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        guard localtime_r(&seconds, &parts) != nil else { return "\(date)" }
        let day = String(cFormat: "%04d-%02d-%02d %02d:%02d:%02d", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                         Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
        let abbreviation = parts.tm_zone.map { String(cString: $0) } ?? ""
        return day + " " + zoneName(abbreviation: abbreviation, offset: parts.tm_gmtoff, zone: localZoneName)
    }

    /// ICU's short specific zone name in English for the zone named `zone` (a tz database name):
    /// the US abbreviations where the offset is theirs, "UTC" for UTC, otherwise the offset from GMT.
    static func zoneName(abbreviation: String, offset: Int, zone: String) -> String {
        let american = ["EST": -5, "EDT": -4, "CST": -6, "CDT": -5, "MST": -7, "MDT": -6, "PST": -8, "PDT": -7,
                        "AKST": -9, "AKDT": -8, "HST": -10, "HDT": -9, "AST": -4, "ADT": -3]
        // Yukon and Mexico's Pacific coast say MST in the C library's data but are not US time in ICU's.
        let notUS = ["America/Dawson", "America/Whitehorse", "Canada/Yukon", "America/Hermosillo", "America/Mazatlan", "Mexico/BajaSur"]
        if let hours = american[abbreviation], hours * 3600 == offset, !notUS.contains(zone) {
            // The Aleutians' Hawaii-Aleutian time is HAST/HADT in ICU; Honolulu's is HST.
            if abbreviation.hasPrefix("H"), ["America/Adak", "US/Aleutian"].contains(zone) { return "HA" + abbreviation.dropFirst() }
            return abbreviation
        }
        // ICU calls the zone named "UTC" GMT, and Etc/UTC (Debian's default) UTC.
        if abbreviation == "UTC" && offset == 0 { return zone == "UTC" ? "GMT" : "UTC" }
        guard offset != 0 else { return "GMT" }
        let size = abs(offset) / 60
        let hours = "GMT" + (offset < 0 ? "-" : "+") + "\(size / 60)"
        return size % 60 == 0 ? hours : hours + String(cFormat: ":%02d", size % 60)
    }

    /// The local zone's name as Foundation found it: $TZ, else where /etc/localtime links to.
    private static var localZoneName: String {
        if let zone = getenv("TZ") { return String(String(cString: zone).drop { $0 == ":" }) }
        var target = [CChar](repeating: 0, count: 4096)
        let length = readlink("/etc/localtime", &target, target.count - 1)
        guard length > 0 else { return "" }
        let path = String(decoding: target.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return path.split(separator: "zoneinfo/", maxSplits: 1).last.map(String.init) ?? path
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
