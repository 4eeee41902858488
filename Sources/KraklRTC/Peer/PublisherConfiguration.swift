import KraklBase

/// How a publisher gathers, paces and adapts. The video stream's part is `video`; its fields read and
/// write here too (`configuration.maximumBitrate`), by dynamic member lookup.
@dynamicMemberLookup
public struct PublisherConfiguration: Sendable {
    /// Which interface addresses become host candidates.
    public var addresses = IceAddressPolicy()
    /// STUN servers for server-reflexive candidates (none: nothing leaves the host unasked).
    public var stunServers: [TransportAddress] = []
    /// TURN servers to allocate relay candidates on (RFC 8656, UDP to the server).
    public var turnServers: [TurnServer] = []
    /// Relay candidates only (`iceTransportPolicy: "relay"`): nothing but the TURN servers sees our addresses.
    public var relayOnly = false
    /// `turns:` servers' certificates are checked against the CA certificates in this PEM file
    /// only (`--ice-ca`); nil: the system store.
    public var turnCAFile: String?
    public var codecs: [SdpVideoOffer.Codec] = [.vp8, .vp9]
    /// Encoded frames that may wait for the network thread.
    public var frameQueueCapacity = 8
    /// Pacing, repair and bitrate bounds of the video stream.
    public var video = VideoSendConfiguration()
    public var ice = IceConfiguration()
    public var cname: String?
    /// Candidates may trickle after the offer even without STUN servers now (a WHIP server may name
    /// STUN servers in its answer's `Link` headers): the offer then leaves out `a=end-of-candidates`.
    public var trickleLater = false
    /// Who publishes (the join code's identity): the offer's `s=` line and its msid stream id carry it,
    /// which is how a WHIP server learns the tile's label. Nil: "-" and "krakl-screen".
    public var label: String?
    public init() {}

    public subscript<T>(dynamicMember keyPath: WritableKeyPath<VideoSendConfiguration, T>) -> T {
        get { video[keyPath: keyPath] }
        set { video[keyPath: keyPath] = newValue }
    }
}

/// What the publisher tells its owner, on the network thread.
public enum PublisherEvent: Equatable, Sendable {
    /// ICE and DTLS are up and SRTP keys are in place; media flows. Milliseconds since the answer.
    case connected(milliseconds: Double)
    /// Consent expired (RFC 7675) or the selected path died: the session is over.
    case connectionLost(String)
    /// The peer sent DTLS close_notify ("remote ended").
    case remoteClosed
    /// The peer sent RTCP BYE (RFC 3550 §6.6): the session is over. Some SFUs and WHIP servers end a
    /// session this way instead of close_notify. `reason` is the peer's text, control characters removed.
    case remoteBye(reason: String?)
    /// ICE found no path, DTLS failed (wrong fingerprint, no SRTP profile, timeout), or SRTP could not start.
    case failed(String)
    /// ICE found no path and a TURN server refused us: our credentials, or its certificate.
    case relayRefused(RelayRefusal, String)
    /// A server-reflexive candidate to trickle to the peer.
    case localCandidate(IceCandidate)
}
