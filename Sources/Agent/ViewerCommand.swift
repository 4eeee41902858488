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

/// The backend that shows "the screen" when none is named, and why it was chosen: the PipeWire
/// portal on a Wayland session, X11 when there is an X display, else the registry's default
/// (the file backend's test pattern in the repository's plugins.json).
struct BackendChoice {
    var name: String?
    var why: String
}

func chooseScreenBackend(registryPath: String?, given: String?, environment: [String: String] = ProcessInfo.processInfo.environment) -> BackendChoice {
    if let given { return BackendChoice(name: given, why: "as asked (--backend)") }
    // An unreadable registry is reported by the selection that follows, with its own status.
    guard let registry = try? PluginRegistry.load(path: registryPath ?? PluginRegistry.defaultPath()) else { return BackendChoice(name: nil, why: "") }
    func usable(_ name: String) -> Bool {
        guard let entry = try? registry.entry(named: name) else { return false }
        return FileManager.default.fileExists(atPath: entry.library)
    }
    if let wayland = environment["WAYLAND_DISPLAY"], !wayland.isEmpty, usable("pipewire") {
        return BackendChoice(name: "pipewire", why: "a Wayland session (WAYLAND_DISPLAY=\(wayland)): the screen through the ScreenCast portal")
    }
    if let display = environment["DISPLAY"], !display.isEmpty, usable("x11") {
        return BackendChoice(name: "x11", why: "an X display (DISPLAY=\(display)): the X11 screen")
    }
    return BackendChoice(name: registry.defaultBackend,
                         why: "no Wayland session or X display with its backend: the registry's default (\(registry.defaultBackend))")
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
