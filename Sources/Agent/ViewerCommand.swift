import Foundation
import KraklCore
import KraklEncoder
import KraklViewer

// The built-in viewer run: `krakl-agent` without a join code shares the screen to its own
// page and WHEP endpoint (Sources/KraklViewer, docs/viewer.md). Capture, encoding, signals
// and the summary are the recording run's (RunCommand.swift); only the output differs.

/// The viewer's WebRTC side: answers each viewer's offer and fans the one encoded stream out to
/// every peer. This is the one place where the answerer is plugged in.
func makeViewerAnswerer(_ arguments: Arguments, logger: @escaping BackendLogger) -> (factory: ViewerPeerFactory, feed: ViewerVideoFeed) {
    // The answerer (KraklRTC, issue 14 part 1): ICE-lite peers on the listen address, one fan-out.
    // Without a network loop (cannot happen short of running out of descriptors) every offer gets a 501.
    do {
        let answerer = try RtcViewerAnswerer(listen: arguments.listen.host)
        return (answerer, answerer)
    } catch {
        logger("viewer", .error, "the viewer's WebRTC answerer could not start: \(error)")
        let pending = PendingViewerAnswerer()
        return (pending, pending)
    }
}

/// Stands in for the answerer until it exists: every offer gets a clear 501, frames are dropped.
final class PendingViewerAnswerer: ViewerPeerFactory, ViewerVideoFeed {
    static let message = "the viewer's WebRTC answerer is not built yet (issue 14 part 1): this agent serves the page and WHEP, but cannot send video to a viewer"

    func makePeer(offer: String) throws(ViewerPeerError) -> ViewerPeer { throw .notImplemented(Self.message) }
    func send(frame: [UInt8], keyframe: Bool, captureNanoseconds: UInt64, width: Int, height: Int) {}
    var onKeyframeRequest: (() -> Void)?
    var onBitrate: ((Int) -> Void)?
}

/// The encoder's output goes to every viewer.
final class ViewerFeedSink: EncodedFrameSink {
    let feed: ViewerVideoFeed
    init(_ feed: ViewerVideoFeed) { self.feed = feed }

    func write(_ frame: EncodedFrame) throws(EncoderError) {
        feed.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs, width: frame.width, height: frame.height)
    }

    func finish() throws(EncoderError) {}
}

/// The viewer for one run: bound before the backend is made (a taken port ends the run before
/// any sharing dialog), serving from `start` until `stop`.
final class ViewerRun {
    let server: ViewerServer
    let feed: ViewerVideoFeed

    init(_ arguments: Arguments, logger: @escaping BackendLogger) throws(ViewerServerError) {
        let (factory, feed) = makeViewerAnswerer(arguments, logger: logger)
        self.feed = feed
        server = try ViewerServer(listen: arguments.listen, factory: factory, maximumViewers: arguments.maximumViewers,
                                  requireToken: arguments.viewerToken ? true : nil)
    }

    /// Connects the encoder both ways (keyframes for new viewers and on request, bitrate from the weakest).
    func attach(_ pipeline: EncoderPipeline) {
        feed.onKeyframeRequest = { [weak pipeline] in pipeline?.requestKeyframe() }
        feed.onBitrate = { [weak pipeline] bps in pipeline?.setBitrate(kbps: max(bps / 1000, 1)) }
        server.endpoint.onViewersChanged = { [weak pipeline] count, event in
            print("krakl-agent: \(event); \(count) watching")
            if event.hasSuffix("joined") { pipeline?.requestKeyframe() }
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
