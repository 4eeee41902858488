import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import KraklRTC
import KraklViewer

/// The viewer's WebRTC side (the seam in Sources/KraklViewer/ViewerPeer.swift): each WHEP offer gets an
/// answering `Publisher` (ICE-lite: the viewer's server sits on host candidates, and the browser does
/// the checking) on one network loop shared by all viewers, fed by one `VideoFanout`.
public final class RtcViewerAnswerer: ViewerPeerFactory, VideoFeed, Sendable {
    public let configuration: PublisherConfiguration
    public let fanout: VideoFanout
    private let loop: EventLoop

    /// - Parameters:
    ///   - listen: the viewer's HTTP address: host candidates on that address only (any address of
    ///     this machine, loopback included, when it is 0.0.0.0 or ::).
    ///   - playoutDelay: asked of browsers that offer the playout-delay extension (docs/viewer.md);
    ///     nil: Chromium's own jitter buffer decides.
    public init(listen host: String, floorBitrate: Int = 300_000, playoutDelay: PlayoutDelay? = RtcViewerAnswerer.environmentPlayoutDelay()) throws {
        var configuration = PublisherConfiguration()
        if let ip = IPAddress(host), host != "0.0.0.0", host != "::" {
            configuration.addresses = IceAddressPolicy(allowed: [ip])
        } else {
            configuration.addresses = IceAddressPolicy(includeLoopback: true)
        }
        configuration.label = "krakl-screen"
        configuration.playoutDelay = playoutDelay
        self.configuration = configuration
        fanout = VideoFanout(floorBitrate: floorBitrate)
        loop = try EventLoop(name: "krakl-viewers")
        loop.start()
    }

    deinit { loop.stop(timeout: .seconds(2)) }

    /// `KRAKL_VIEWER_PLAYOUT_DELAY` (`PlayoutDelay.setting`): unset is 0,0, which measured best
    /// (docs/PERFORMANCE.md, the viewer).
    public static func environmentPlayoutDelay(_ environment: [String: String] = ProcessInfo.processInfo.environment) -> PlayoutDelay? {
        let (delay, problem) = PlayoutDelay.reading(environment["KRAKL_VIEWER_PLAYOUT_DELAY"])
        if let problem { StandardStream.error("krakl-agent: warning: KRAKL_VIEWER_PLAYOUT_DELAY: \(problem)\n") }
        return delay
    }

    public func makePeer(offer: String) throws(ViewerPeerError) -> ViewerPeer {
        let publisher: Publisher
        do {
            publisher = try Publisher(answering: offer, configuration: configuration, iceLite: true, loop: loop)
        } catch {
            switch error {
            case .offer(let error):
                if case .malformedLine = error { throw .malformedOffer(error.description) }
                throw .unacceptableOffer(error.description)
            case .transport(let error):
                throw .failure("\(error)")
            }
        }
        let peer = RtcViewerPeer(publisher, fanout: fanout)
        fanout.add(publisher)
        publisher.start()
        return peer
    }

    public func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {
        fanout.send(frame: frame, keyframe: keyframe, captureNanoseconds: captureNanoseconds, width: width, height: height)
    }

    public var onKeyframeRequest: (@Sendable () -> Void)? {
        get { fanout.onKeyframeRequest }
        set { fanout.onKeyframeRequest = newValue }
    }

    public var onBitrate: (@Sendable (Int) -> Void)? {
        get { fanout.onBitrate }
        set { fanout.onBitrate = newValue }
    }
}

/// One viewer: its answering publisher, taken out of the fan-out when it ends either way.
public final class RtcViewerPeer: ViewerPeer, Sendable {
    public let publisher: Publisher
    private weak let fanout: VideoFanout?
    private let closedHandler = Guarded<(@Sendable (String) -> Void)?>(nil)

    public init(_ publisher: Publisher, fanout: VideoFanout) {
        self.publisher = publisher
        self.fanout = fanout
        publisher.onClosed = { [weak self] reason in
            guard let self else { return }
            self.fanout?.remove(self.publisher)
            self.closedHandler.withLock { $0 }?(reason)
        }
    }

    public var answer: String { publisher.answerSDP ?? "" }

    public func addRemoteCandidates(sdpFragment: String) throws(ViewerPeerError) {
        for line in sdpFragment.split(whereSeparator: \.isNewline) where line.hasPrefix("a=candidate:") {
            do {
                publisher.addRemoteCandidate(try IceCandidate(parsing: String(line)))
            } catch {
                throw .malformedFragment("\(error)")
            }
        }
    }

    /// WHEP's ICE restart: the viewer's new credentials and candidates in, ours out (RFC 9725 §4.3.2's
    /// sdpfrag, the shape of a WHIP server's answer; `WhipSdpFragment` reads and writes both). The
    /// answer ends with `a=end-of-candidates`: an ICE-lite side has all its candidates at once.
    public func restartIce(sdpFragment: String) throws(ViewerPeerError) -> String {
        let theirs = WhipSdpFragment(parsing: sdpFragment)
        guard let ufrag = theirs.iceUfrag, let pwd = theirs.icePwd else {
            throw .malformedFragment("an ICE restart needs a=ice-ufrag and a=ice-pwd")
        }
        var candidates: [IceCandidate] = []
        for line in theirs.candidates {
            do { candidates.append(try IceCandidate(parsing: line)) } catch { throw .malformedFragment("\(error)") }
        }
        guard let ours = publisher.restartIce(remote: IceCredentials(ufrag: ufrag, pwd: pwd), candidates: candidates) else {
            throw .failure("the viewer's peer connection has ended; make a new session (POST the offer again)")
        }
        return WhipSdpFragment(iceUfrag: ours.credentials.ufrag, icePwd: ours.credentials.pwd, mediaLine: theirs.mediaLine,
                               mid: theirs.mid ?? publisher.remoteOffer?.mid, candidates: ours.candidates.map(\.sdpValue),
                               endOfCandidates: true).body
    }

    public func close() {
        fanout?.remove(publisher)
        publisher.close()
    }

    public var onClosed: (@Sendable (String) -> Void)? {
        get { closedHandler.withLock { $0 } }
        set { closedHandler.withLock { $0 = newValue } }
    }

    public var stats: ViewerPeerStats {
        let s = publisher.stats
        let state = s.state == "checking" ? "connecting" : s.state
        return ViewerPeerStats(state: state, bytesSent: s.bytesSent, roundTripMilliseconds: s.roundTripMilliseconds,
                               iceRestarts: s.iceRestarts, dtlsHandshakes: s.dtlsHandshakes)
    }
}
