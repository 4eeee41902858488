import COpenSSL

/// The OpenSSL the agent runs with, for `krakl-agent --version` (wraps `OpenSSL_version`).
public enum TLSLibraryVersion {
    public static var openSSL: String { String(cString: OpenSSL_version(Int32(OPENSSL_VERSION))) }
}
