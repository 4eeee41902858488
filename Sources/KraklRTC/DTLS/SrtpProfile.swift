/// The DTLS-SRTP protection profiles this stack offers and can run
/// (RFC 5764 §4.1.2, RFC 7714 §14.2), with the key sizes each needs.
public enum SrtpProfile: UInt16, CaseIterable, Sendable {
    case aes128CmHmacSha1_80 = 0x0001
    case aeadAes128Gcm = 0x0007
    case aeadAes256Gcm = 0x0008

    /// What DTLS offers by default, most preferred first: the AEAD profiles
    /// (RFC 7714), AES-256 first as Chrome and aiortc order them, then
    /// AES-CM for peers without GCM (RFC 5764 §4.1.2 makes it mandatory).
    public static let offered: [SrtpProfile] = [.aeadAes256Gcm, .aeadAes128Gcm, .aes128CmHmacSha1_80]

    /// The name OpenSSL's use_srtp list and `openssl s_server -use_srtp` use.
    public var opensslName: String {
        switch self {
        case .aes128CmHmacSha1_80: return "SRTP_AES128_CM_SHA1_80"
        case .aeadAes128Gcm: return "SRTP_AEAD_AES_128_GCM"
        case .aeadAes256Gcm: return "SRTP_AEAD_AES_256_GCM"
        }
    }

    /// Master key bytes.
    public var keyLength: Int { self == .aeadAes256Gcm ? 32 : 16 }

    /// Bytes protection adds to an RTP packet: the HMAC-SHA1-80 tag, or the GCM tag (RFC 7714 §7.2).
    public var rtpOverhead: Int { self == .aes128CmHmacSha1_80 ? 10 : 16 }

    /// Master salt bytes: 112 bits for AES-CM (RFC 3711), 96 for GCM (RFC 7714).
    public var saltLength: Int {
        switch self {
        case .aes128CmHmacSha1_80: return 14
        case .aeadAes128Gcm, .aeadAes256Gcm: return 12
        }
    }

    /// How many bytes to export from the DTLS master secret: both sides' key and salt.
    public var keyingMaterialLength: Int { 2 * (keyLength + saltLength) }

    init?(opensslName: String) {
        guard let profile = SrtpProfile.allCases.first(where: { $0.opensslName == opensslName }) else { return nil }
        self = profile
    }
}

/// The SRTP master keys a DTLS-SRTP handshake produced, already split by
/// direction: `local` protects what we send, `remote` unprotects what the peer sends.
public struct DtlsSrtpKeys: Equatable, Sendable {
    public let profile: SrtpProfile
    public let localKey: [UInt8]
    public let localSalt: [UInt8]
    public let remoteKey: [UInt8]
    public let remoteSalt: [UInt8]
    /// The exported bytes as RFC 5764 §4.2 lays them out:
    /// client key | server key | client salt | server salt.
    public let keyingMaterial: [UInt8]

    /// Splits exported keying material; `weAreClient` picks which half is ours.
    public init(profile: SrtpProfile, keyingMaterial: [UInt8], weAreClient: Bool) {
        precondition(keyingMaterial.count == profile.keyingMaterialLength, "keying material of the wrong length for \(profile)")
        let k = profile.keyLength, s = profile.saltLength
        let clientKey = Array(keyingMaterial[0..<k])
        let serverKey = Array(keyingMaterial[k..<2 * k])
        let clientSalt = Array(keyingMaterial[2 * k..<2 * k + s])
        let serverSalt = Array(keyingMaterial[2 * k + s..<2 * k + 2 * s])
        self.profile = profile
        self.keyingMaterial = keyingMaterial
        localKey = weAreClient ? clientKey : serverKey
        localSalt = weAreClient ? clientSalt : serverSalt
        remoteKey = weAreClient ? serverKey : clientKey
        remoteSalt = weAreClient ? serverSalt : clientSalt
    }
}
