import COpenSSL

/// OpenSSL keeps its errors in a per-thread queue: a stale entry from an
/// earlier call would be blamed on the next one, so every caller clears the
/// queue before a call and drains it right after a failure.
public enum OpenSSLErrors {
    public static func clear() { ERR_clear_error() }

    /// Every queued error as "lib: reason" text, oldest first, joined by "; ";
    /// empties the queue. nil when it was empty.
    public static func drain() -> String? {
        var messages: [String] = []
        var buffer = [CChar](repeating: 0, count: 256)
        // Bounded: OpenSSL's queue holds at most 16 entries.
        for _ in 0..<32 {
            let code = ERR_get_error()
            if code == 0 { break }
            ERR_error_string_n(code, &buffer, buffer.count)
            messages.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return messages.isEmpty ? nil : messages.joined(separator: "; ")
    }

    /// `what` plus whatever OpenSSL queued, for an error message.
    public static func describe(_ what: String) -> String {
        if let detail = drain() { return "\(what): \(detail)" }
        return what
    }
}

/// Why a TLS client context could not be made.
public enum TLSSetupError: Error, CustomStringConvertible {
    case noContext
    /// The CA certificates could not be loaded: from this file, or (nil) from the system store.
    case trustStore(caFile: String?)

    public var description: String {
        switch self {
        case .noContext: return "cannot make an OpenSSL context"
        case .trustStore(let file):
            return "cannot load trusted certificates \(file.map { "from \($0) (it must be a PEM file of CA certificates)" } ?? "from the system store")"
        }
    }
}

/// The one OpenSSL client context of the agent's TLS connections (HTTPS and WSS to rooms, `turns:`
/// relays): TLS 1.2 or newer, the server's certificate verified against the system CA store
/// (Debian: /etc/ssl/certs; OpenSSL also honours SSL_CERT_FILE) or only against the PEM file given.
/// @unchecked Sendable: an SSL_CTX is only read once set up here, which OpenSSL allows from any thread.
public final class TLSClientContext: @unchecked Sendable {
    public let context: OpaquePointer

    public init(caFile: String?) throws(TLSSetupError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else { throw .noContext }
        _ = krakl_ssl_ctx_set_min_tls12(context)
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        let loaded = caFile.map { SSL_CTX_load_verify_locations(context, $0, nil) } ?? SSL_CTX_set_default_verify_paths(context)
        guard loaded == 1 else {
            ERR_clear_error()
            SSL_CTX_free(context)
            throw .trustStore(caFile: caFile)
        }
        self.context = context
    }

    deinit { SSL_CTX_free(context) }

    /// Says which server `ssl` is for: SNI for a name (never for an address, RFC 6066 §3), and the
    /// certificate must be for that name (SSL_set1_host) or that IP address (as an address).
    public static func expect(_ ssl: OpaquePointer, server name: String) {
        if IPLiteral.bytes(name) != nil {
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name)
        } else {
            _ = krakl_ssl_set_tlsext_host_name(ssl, name)
            SSL_set1_host(ssl, name)
        }
    }
}
