import CSrtp
import FoundationEssentials
import KraklBase
import Glibc

/// libsrtp wants srtp_init exactly once per process before anything else.
/// It runs its crypto self-tests (24–30 ms measured here), so `KraklRTC.prepare()`
/// calls it at start-up; otherwise the first SRTP session does, inside the first connect.
enum SrtpLibrary {
    /// A global's lazy initialiser runs once, thread-safely.
    private static let status: srtp_err_status_t = srtp_init()

    static func initialise() throws(SrtpError) {
        guard status == srtp_err_status_ok else { throw SrtpError.setup("srtp_init: \(SrtpError.name(of: status))") }
    }
}

/// One direction of SRTP/SRTCP with one master key, over libsrtp2.
/// An outbound session protects everything we send (RTP and RTCP, any
/// SSRC); an inbound one unprotects what the peer sends. A packet that
/// fails authentication or replay checks is dropped and counted, never
/// thrown at the caller's loop: on the network that is routine.
///
/// Thread-safe: a lock serialises calls, so RTP from a pacer thread and
/// RTCP from the network loop may share one outbound session.
public final class SrtpSession {
    public enum Direction: Sendable { case outbound, inbound }

    /// Packet counts since creation.
    public struct Counters: Equatable, Sendable {
        public var rtpProtected = 0
        public var rtcpProtected = 0
        public var rtpUnprotected = 0
        public var rtcpUnprotected = 0
        public var authenticationFailures = 0
        public var replays = 0
        public var malformed = 0
        /// Other libsrtp refusals (unknown SSRC for a specific-SSRC policy, cipher errors).
        public var otherDrops = 0
    }

    public let profile: SrtpProfile
    public let direction: Direction
    private var session: srtp_t?
    private let lock = Lock()
    private var counts = Counters()
    private var lastDrop: SrtpError?

    /// Room libsrtp may write after the payload: tag + MKI (SRTP_MAX_TAG_LEN +
    /// SRTP_MAX_MKI_LEN), plus the 4-byte SRTCP index.
    private static let trailerRoom = 16 + 128 + 4

    /// Creates the libsrtp session (srtp_create) for `profile` with a master
    /// key and salt. `replayWindow` (inbound) is how many packet indices back
    /// are still accepted; 1024 tolerates the reordering that NACK
    /// retransmissions cause. Outbound sessions allow re-protecting a sequence
    /// number (allow_repeat_tx) so a NACKed packet can be sent again as it was.
    public init(profile: SrtpProfile, key: [UInt8], salt: [UInt8], direction: Direction, replayWindow: Int = 1024) throws(SrtpError) {
        try SrtpLibrary.initialise()
        guard key.count == profile.keyLength, salt.count == profile.saltLength else {
            throw SrtpError.setup("\(profile.opensslName) needs a \(profile.keyLength)-byte key and \(profile.saltLength)-byte salt, got \(key.count) and \(salt.count)")
        }
        guard (64...32_767).contains(replayWindow) else {
            throw SrtpError.setup("replay window \(replayWindow) outside 64...32767")
        }
        self.profile = profile
        self.direction = direction
        var policy = srtp_policy_t()
        switch profile {
        case .aes128CmHmacSha1_80:
            srtp_crypto_policy_set_rtp_default(&policy.rtp)
            srtp_crypto_policy_set_rtcp_default(&policy.rtcp)
        case .aeadAes128Gcm:
            srtp_crypto_policy_set_aes_gcm_128_16_auth(&policy.rtp)
            srtp_crypto_policy_set_aes_gcm_128_16_auth(&policy.rtcp)
        case .aeadAes256Gcm:
            srtp_crypto_policy_set_aes_gcm_256_16_auth(&policy.rtp)
            srtp_crypto_policy_set_aes_gcm_256_16_auth(&policy.rtcp)
        }
        policy.ssrc.type = direction == .outbound ? ssrc_any_outbound : ssrc_any_inbound
        policy.window_size = UInt(replayWindow)
        policy.allow_repeat_tx = direction == .outbound ? 1 : 0
        var master = key + salt
        defer { master.withUnsafeMutableBytes { _ = memset($0.baseAddress!, 0, $0.count) } }
        var created: srtp_t?
        let status = master.withUnsafeMutableBufferPointer { buffer -> srtp_err_status_t in
            policy.key = buffer.baseAddress
            return srtp_create(&created, &policy)
        }
        guard status == srtp_err_status_ok, let created else {
            throw SrtpError.setup("srtp_create: \(SrtpError.name(of: status))")
        }
        session = created
    }

    /// The session that protects what we send, from a DTLS-SRTP handshake's keys.
    public convenience init(sending keys: DtlsSrtpKeys) throws(SrtpError) {
        try self.init(profile: keys.profile, key: keys.localKey, salt: keys.localSalt, direction: .outbound)
    }

    /// The session that unprotects what the peer sends, from a DTLS-SRTP handshake's keys.
    public convenience init(receiving keys: DtlsSrtpKeys) throws(SrtpError) {
        try self.init(profile: keys.profile, key: keys.remoteKey, salt: keys.remoteSalt, direction: .inbound)
    }

    deinit {
        if let session { srtp_dealloc(session) }
    }

    public var counters: Counters { lock.lock(); defer { lock.unlock() }; return counts }
    /// Why the last packet was dropped, for logs.
    public var lastDropReason: SrtpError? { lock.lock(); defer { lock.unlock() }; return lastDrop }

    /// An RTP packet → SRTP (srtp_protect). Throws only for a packet that is
    /// not RTP or for a libsrtp failure, which on an outbound session means a bug.
    public func protect(rtp packet: [UInt8]) throws(SrtpError) -> [UInt8] {
        precondition(direction == .outbound, "protect on an inbound SRTP session")
        if let problem = SrtpSession.rtpProblem(packet) { throw SrtpError.malformed(problem) }
        let result = try run(packet, grow: true) { session, pointer, length in srtp_protect(session, pointer, length) }
        lock.lock(); counts.rtpProtected += 1; lock.unlock()
        return result
    }

    /// An RTCP compound packet → SRTCP (srtp_protect_rtcp, adds the index and tag).
    public func protect(rtcp packet: [UInt8]) throws(SrtpError) -> [UInt8] {
        precondition(direction == .outbound, "protect on an inbound SRTP session")
        if let problem = SrtpSession.rtcpProblem(packet) { throw SrtpError.malformed(problem) }
        let result = try run(packet, grow: true) { session, pointer, length in srtp_protect_rtcp(session, pointer, length) }
        lock.lock(); counts.rtcpProtected += 1; lock.unlock()
        return result
    }

    /// SRTP → RTP (srtp_unprotect), or nil when the packet is dropped
    /// (malformed, authentication failure, replay); drops are counted.
    public func unprotect(srtp packet: [UInt8]) -> [UInt8]? {
        precondition(direction == .inbound, "unprotect on an outbound SRTP session")
        if let problem = SrtpSession.rtpProblem(packet) { return drop(.malformed(problem)) }
        do throws(SrtpError) {
            let result = try run(packet, grow: false) { session, pointer, length in srtp_unprotect(session, pointer, length) }
            lock.lock(); counts.rtpUnprotected += 1; lock.unlock()
            return result
        } catch {
            return drop(error)
        }
    }

    /// SRTCP → RTCP (srtp_unprotect_rtcp), or nil when dropped and counted.
    public func unprotect(srtcp packet: [UInt8]) -> [UInt8]? {
        precondition(direction == .inbound, "unprotect on an outbound SRTP session")
        if let problem = SrtpSession.rtcpProblem(packet) { return drop(.malformed(problem)) }
        do throws(SrtpError) {
            let result = try run(packet, grow: false) { session, pointer, length in srtp_unprotect_rtcp(session, pointer, length) }
            lock.lock(); counts.rtcpUnprotected += 1; lock.unlock()
            return result
        } catch {
            return drop(error)
        }
    }

    // MARK: -

    /// Copies the packet into a buffer with room for libsrtp's trailer, runs
    /// `call` on it under the lock, and returns the bytes it left.
    private func run(_ packet: [UInt8], grow: Bool,
                     _ call: (srtp_t, UnsafeMutableRawPointer, UnsafeMutablePointer<Int32>) -> srtp_err_status_t) throws(SrtpError) -> [UInt8] {
        var buffer = packet
        buffer.append(contentsOf: repeatElement(0, count: grow ? SrtpSession.trailerRoom : 0))
        var length = Int32(packet.count)
        lock.lock()
        let status = buffer.withUnsafeMutableBytes { call(session!, $0.baseAddress!, &length) }
        lock.unlock()
        guard status == srtp_err_status_ok else { throw SrtpError(status: status) }
        guard length >= 0, Int(length) <= buffer.count else { throw SrtpError.library("length \(length) out of range") }
        buffer.removeSubrange(Int(length)...)
        return buffer
    }

    private func drop(_ error: SrtpError) -> [UInt8]? {
        lock.lock()
        defer { lock.unlock() }
        switch error {
        case .authenticationFailed: counts.authenticationFailures += 1
        case .replayed: counts.replays += 1
        case .malformed: counts.malformed += 1
        default: counts.otherDrops += 1
        }
        lastDrop = error
        return nil
    }

    /// What is wrong with an RTP packet's fixed header, CSRC list and
    /// extension (RFC 3550 §5.1), or nil. libsrtp trusts these lengths.
    static func rtpProblem(_ packet: [UInt8]) -> String? {
        guard packet.count >= 12 else { return "\(packet.count) bytes is shorter than an RTP header" }
        guard packet[0] >> 6 == 2 else { return "RTP version \(packet[0] >> 6), not 2" }
        var header = 12 + 4 * Int(packet[0] & 0x0f)
        if packet[0] & 0x10 != 0 {
            guard packet.count >= header + 4 else { return "RTP header extension past the end" }
            header += 4 + 4 * (Int(packet[header + 2]) << 8 | Int(packet[header + 3]))
        }
        guard packet.count >= header else { return "RTP header of \(header) bytes in a \(packet.count)-byte packet" }
        return nil
    }

    static func rtcpProblem(_ packet: [UInt8]) -> String? {
        guard packet.count >= 8 else { return "\(packet.count) bytes is shorter than an RTCP header" }
        guard packet[0] >> 6 == 2 else { return "RTCP version \(packet[0] >> 6), not 2" }
        return nil
    }
}
