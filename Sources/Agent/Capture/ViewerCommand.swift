import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklSession
import KraklViewer

// The built-in viewer run: `krakl-agent` without a join code shares the screen to its own
// page and WHEP endpoint (Sources/KraklViewer, docs/viewer.md). Capture, encoding, signals
// and the summary are the recording run's (RunCommand.swift); only the output differs.

/// The viewer's WebRTC side: answers each viewer's offer and fans the one encoded stream out to
/// every peer. This is the one place where the answerer is plugged in.
func makeViewerAnswerer(_ arguments: Arguments, logger: @escaping BackendLogger) -> (factory: ViewerPeerFactory, feed: VideoFeed) {
    // ICE-lite peers on the listen address, one fan-out. Without a network loop (cannot happen
    // short of running out of descriptors) every offer gets a 500 that says why.
    do {
        let answerer = try RtcViewerAnswerer(listen: arguments.listen.host)
        return (answerer, answerer)
    } catch {
        logger("viewer", .error, "the viewer's WebRTC answerer could not start: \(error)")
        let unavailable = UnavailableViewerAnswerer(reason: "\(error)")
        return (unavailable, unavailable)
    }
}

/// Stands in when the answerer could not start: every offer gets a clear error, frames are dropped.
final class UnavailableViewerAnswerer: ViewerPeerFactory, VideoFeed {
    let reason: String
    init(reason: String) { self.reason = reason }

    func makePeer(offer: String) throws(ViewerPeerError) -> ViewerPeer {
        throw .failure("the viewer's WebRTC answerer could not start (\(reason)): this agent serves the page and WHEP, but cannot send video to a viewer")
    }
    func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {}
    /// No encoder listens: nothing is ever requested.
    var onKeyframeRequest: (@Sendable () -> Void)? { get { nil } set {} }
    var onBitrate: (@Sendable (Int) -> Void)? { get { nil } set {} }
}

/// The viewer for one run: bound before the backend is made (a taken port ends the run before
/// any sharing dialog), serving from `start` until `stop`.
final class ViewerRun: Sendable {
    let server: ViewerServer
    let feed: VideoFeed

    init(_ arguments: Arguments, logger: @escaping BackendLogger) throws(ViewerServerError) {
        let (factory, feed) = makeViewerAnswerer(arguments, logger: logger)
        self.feed = feed
        server = try ViewerServer(listen: arguments.listen, factory: factory, maximumViewers: arguments.maximumViewers,
                                  requireToken: arguments.viewerToken ? true : nil)
    }

    /// A viewer that joins gets a keyframe at once (the feed's own feedback is the path's).
    func attach(_ path: MediaPath) {
        server.endpoint.onViewersChanged = { [weak path] count, event in
            print("krakl-agent: \(event); \(count) watching")
            if event.hasSuffix("joined") { path?.requestKeyframe() }
        }
    }

    func start() {
        server.start()
        let tokenNote = server.token == nil ? "" : " (the token after # is the permission to watch: share it only with viewers)"
        print("krakl-agent: sharing to the built-in viewer: open \(server.url)\(tokenNote)")
        if server.http.address.host == "0.0.0.0" || server.http.address.host == "::" {
            print("krakl-agent: listening on every address of this machine: put one of them in place of THIS-MACHINE")
        }
    }

    var statusText: String { "viewers \(server.endpoint.viewerCount)/\(server.endpoint.policy.maximumViewers)" }

    func stop(reason: String) { server.stop(reason: reason) }
}
