import COpenSSL

/// OpenSSL keeps its errors in a per-thread queue: a stale entry from an
/// earlier call would be blamed on the next one, so every caller clears the
/// queue before a call and drains it right after a failure.
enum OpenSSLErrors {
    static func clear() { ERR_clear_error() }

    /// Every queued error as "lib: reason" text, oldest first, joined by "; ";
    /// empties the queue. nil when it was empty.
    static func drain() -> String? {
        var messages: [String] = []
        var buffer = [CChar](repeating: 0, count: 256)
        // Bounded: OpenSSL's queue holds at most 16 entries.
        for _ in 0..<32 {
            let code = ERR_get_error()
            if code == 0 { break }
            ERR_error_string_n(code, &buffer, buffer.count)
            messages.append(String(cString: buffer))
        }
        return messages.isEmpty ? nil : messages.joined(separator: "; ")
    }

    /// `what` plus whatever OpenSSL queued, for an error message.
    static func describe(_ what: String) -> String {
        if let detail = drain() { return "\(what): \(detail)" }
        return what
    }
}
