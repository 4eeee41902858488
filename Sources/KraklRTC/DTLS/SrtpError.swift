import CSrtp

/// Why libsrtp refused a session or a packet.
public enum SrtpError: Error, Equatable, Sendable, CustomStringConvertible {
    /// srtp_init or srtp_create failed, or the key material has the wrong length.
    case setup(String)
    /// The packet is too short or not RTP/RTCP version 2; libsrtp was not called.
    case malformed(String)
    /// The authentication tag did not verify (tampered, or the wrong key).
    case authenticationFailed
    /// The packet index was seen before or is older than the replay window.
    case replayed
    /// Any other libsrtp status, by name.
    case library(String)

    init(status: srtp_err_status_t) {
        switch status {
        case srtp_err_status_auth_fail: self = .authenticationFailed
        case srtp_err_status_replay_fail, srtp_err_status_replay_old: self = .replayed
        default: self = .library(SrtpError.name(of: status))
        }
    }

    static func name(of status: srtp_err_status_t) -> String {
        let names = ["ok", "fail", "bad_param", "alloc_fail", "dealloc_fail", "init_fail", "terminus",
                     "auth_fail", "cipher_fail", "replay_fail", "replay_old", "algo_fail", "no_such_op",
                     "no_ctx", "cant_check", "key_expired", "socket_err", "signal_err", "nonce_bad",
                     "read_fail", "write_fail", "parse_err", "encode_err", "semaphore_err", "pfkey_err",
                     "bad_mki", "pkt_idx_old", "pkt_idx_adv"]
        let index = Int(status.rawValue)
        return "srtp_err_status_" + (index < names.count ? names[index] : "\(index)")
    }

    public var description: String {
        switch self {
        case .setup(let text): return "SRTP set-up failed: \(text)"
        case .malformed(let text): return "not an RTP/RTCP packet: \(text)"
        case .authenticationFailed: return "SRTP authentication failed (tampered packet or wrong key)"
        case .replayed: return "SRTP replay: packet index already seen or too old"
        case .library(let name): return "libsrtp error \(name)"
        }
    }
}
