import COpenSSL
import CSrtp
/// KraklRTC: the agent's own send-only WebRTC stack (issue #6).
/// SDP, ICE/STUN, DTLS-SRTP (OpenSSL + libsrtp2), RTP/RTCP, pacing and
/// bandwidth estimation. Debian 12 packages no WebRTC library, so it lives here.
public enum KraklRTC {}
