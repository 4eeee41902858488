import COpenSSL

/// The few OpenSSL one-shot digests the packet layer needs.
enum OpenSSLDigest {
    /// HMAC-SHA1 (STUN MESSAGE-INTEGRITY, RFC 8489 §14.5). Wraps `HMAC(EVP_sha1(), ...)`.
    static func hmacSHA1(key: [UInt8], data: [UInt8]) -> [UInt8] {
        // Empty arrays may have no storage; OpenSSL wants a pointer even for zero bytes.
        let keyStorage = key.isEmpty ? [0] : key, dataStorage = data.isEmpty ? [0] : data
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o in
            HMAC(EVP_sha1(), keyStorage, Int32(key.count), dataStorage, data.count, o.baseAddress, &length)
        }
        precondition(ok != nil && length == 20, "OpenSSL HMAC-SHA1 failed")
        return Array(out.prefix(Int(length)))
    }

    /// A message digest by its SDP/IANA name ("md5", "sha-1", "sha-256", ...). Wraps `EVP_Digest`.
    static func digest(_ data: [UInt8], algorithm: String) -> [UInt8]? {
        let md: OpaquePointer?
        switch algorithm.lowercased() {
        case "md5": md = EVP_md5()
        case "sha-1": md = EVP_sha1()
        case "sha-224": md = EVP_sha224()
        case "sha-256": md = EVP_sha256()
        case "sha-384": md = EVP_sha384()
        case "sha-512": md = EVP_sha512()
        default: return nil
        }
        let dataStorage = data.isEmpty ? [0] : data
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o in
            EVP_Digest(dataStorage, data.count, o.baseAddress, &length, md, nil)
        }
        return ok == 1 ? Array(out.prefix(Int(length))) : nil
    }
}
