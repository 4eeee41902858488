/// The seam between the viewer's HTTP side (this module) and the WebRTC
/// answerer (KraklRTC). The viewer only needs these few calls, so the
/// answerer can change inside without touching the server, and tests can
/// run every HTTP and WHEP rule against a fake.

/// Makes one WebRTC peer per viewer from the viewer's offer.
public protocol ViewerPeerFactory: AnyObject, Sendable {
    /// Answers a viewer's recvonly offer (the whole SDP of a WHEP POST).
    /// Called on the HTTP server's thread; must not block for long (host
    /// candidates only, or ICE-lite: the answer is complete at once).
    func makePeer(offer: String) throws(ViewerPeerError) -> ViewerPeer
}

/// One viewer's peer connection (the server's thread calls it; it ends on its own network thread).
public protocol ViewerPeer: AnyObject, Sendable {
    /// The answer SDP, complete (non-trickle: every candidate in it).
    var answer: String { get }
    /// The viewer's trickled candidates (an `application/trickle-ice-sdpfrag` body, RFC 8840).
    func addRemoteCandidates(sdpFragment: String) throws(ViewerPeerError)
    /// The viewer restarted ICE (RFC 9725 §4.3.2): `sdpFragment` has its new `a=ice-ufrag`/`a=ice-pwd`
    /// and candidates. Returns the answer fragment: our new credentials and our candidates. The
    /// session goes on (DTLS, media); only ICE starts over. Must not block for long (server thread).
    func restartIce(sdpFragment: String) throws(ViewerPeerError) -> String
    /// Ends the peer (DTLS close_notify); `onClosed` is not called for a close asked for here.
    func close()
    /// The peer ended by itself (consent expired, DTLS closed, failed); any thread, once.
    var onClosed: (@Sendable (String) -> Void)? { get set }
    /// For status lines and `GET /status`.
    var stats: ViewerPeerStats { get }
}

extension ViewerPeer {
    /// A peer that cannot restart ICE: the player gets 501 and may POST a new offer.
    public func restartIce(sdpFragment: String) throws(ViewerPeerError) -> String {
        throw .notImplemented("ICE restarts are not supported by this viewer's peer; make a new session (POST the offer again)")
    }
}

/// What the status line shows of one viewer.
public struct ViewerPeerStats: Sendable, Equatable {
    /// "new", "connecting", "connected", "closed", …
    public var state: String
    public var bytesSent: Int
    public var roundTripMilliseconds: Double?
    /// ICE restarts the viewer did, and DTLS handshakes completed (1 per session: a restart keeps DTLS).
    public var iceRestarts: Int
    public var dtlsHandshakes: Int

    public init(state: String, bytesSent: Int = 0, roundTripMilliseconds: Double? = nil, iceRestarts: Int = 0, dtlsHandshakes: Int = 0) {
        self.state = state
        self.bytesSent = bytesSent
        self.roundTripMilliseconds = roundTripMilliseconds
        self.iceRestarts = iceRestarts
        self.dtlsHandshakes = dtlsHandshakes
    }
}

/// Why an offer got no peer; each maps to one HTTP status (WhepEndpoint).
public enum ViewerPeerError: Error, Equatable, CustomStringConvertible {
    /// Not an SDP offer we can read (400).
    case malformedOffer(String)
    /// A readable offer we cannot serve: no recvonly video, no codec in common, no DTLS fingerprint (406).
    case unacceptableOffer(String)
    /// A trickled fragment we cannot read (400).
    case malformedFragment(String)
    /// The feature is not there (yet) on this side (501).
    case notImplemented(String)
    /// Something on our side failed: sockets, certificates (500).
    case failure(String)

    public var description: String {
        switch self {
        case .malformedOffer(let why): return "the offer is not a usable SDP offer: \(why)"
        case .unacceptableOffer(let why): return "the offer cannot be served: \(why)"
        case .malformedFragment(let why): return "the ICE fragment is not usable: \(why)"
        case .notImplemented(let why): return why
        case .failure(let why): return "the viewer's peer could not be made: \(why)"
        }
    }

    /// The HTTP status of a refused offer or fragment.
    public var httpStatus: Int {
        switch self {
        case .malformedOffer, .malformedFragment: return 400
        case .unacceptableOffer: return 406
        case .notImplemented: return 501
        case .failure: return 500
        }
    }
}
