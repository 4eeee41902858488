import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklViewer

/// The home screen's local preview (`v`, docs/home-screen.md): the built-in viewer's server on
/// --listen (127.0.0.1:8990 by default), up from the first `v` until quitting, showing whatever
/// the room session shares (its encoded frames are tee'd here) and saying "nothing is shared
/// right now" between sessions. The room's estimate alone sets the encoder's bitrate; viewers'
/// keyframe requests (VideoFanout rate-limits them) go to the running session.
final class HomeViewer: Sendable {
    static let nothingShared = "Nothing is shared right now: the picture comes back when the agent shares into a room again."

    let server: ViewerServer
    let feed: VideoFeed
    /// The encoded frames of each room session go here too (SharingSession.alsoSendTo): VP8 only,
    /// as the viewer answers browsers and players with VP8 (they all offer it), so a room that
    /// chose VP9 leaves the preview dark rather than sending frames its peers cannot decode. It
    /// may be plugged in in the middle of a session: every session gets the sink, the feed comes later.
    let sink: FeedSink

    /// Binds at once (a taken port throws here, with words for the screen), then serves.
    /// - Parameters:
    ///   - sink: where the sessions' frames already go; it feeds this viewer from now until `stop`.
    ///   - keyframe: asks the running session's encoder for a keyframe; any thread.
    ///   - viewersChanged: a viewer came or went; any thread.
    init(_ arguments: Arguments, sink: FeedSink, logger: @escaping BackendLogger, keyframe: @escaping @Sendable () -> Void,
         viewersChanged: @escaping @Sendable () -> Void) throws(ViewerServerError) {
        let (factory, feed) = makeViewerAnswerer(arguments, logger: logger)
        self.feed = feed
        self.sink = sink
        server = try ViewerServer(listen: arguments.listen, factory: factory, maximumViewers: arguments.maximumViewers,
                                  requireToken: arguments.viewerToken ? true : nil)
        // A viewer's wish for less (or more) is not heeded in a room: the room's receivers decide.
        feed.onBitrate = nil
        feed.onKeyframeRequest = keyframe
        server.endpoint.onViewersChanged = { _, _ in viewersChanged() }
        server.endpoint.setIdle(Self.nothingShared)
        server.start()
        sink.feed = feed
    }

    /// A room session shares (frames flow) or not.
    func sharing(_ yes: Bool) { server.endpoint.setIdle(yes ? nil : Self.nothingShared) }

    /// The URL to open on this machine: for 0.0.0.0 or ::, loopback stands in for "any address".
    var localURL: String {
        server.url.replacing("://THIS-MACHINE:", with: server.http.address.host == "::" ? "://[::1]:" : "://127.0.0.1:")
    }

    var viewerCount: Int { server.endpoint.viewerCount }

    func stop() {
        sink.feed = nil
        server.stop(reason: "the agent quit")
    }
}

/// Opens a URL in the person's browser: `$BROWSER` when set (its first entry, if it is a
/// colon-separated list; words after the program are its arguments), else `xdg-open` when it is
/// installed and there is a display (DISPLAY or WAYLAND_DISPLAY). The child has no terminal
/// (stdin and outputs are /dev/null: the home screen owns the terminal) and a process group of
/// its own; a thread reaps it.
enum BrowserOpener {
    enum Outcome: Equatable {
        /// Started; the program's name.
        case opened(String)
        /// Nothing to open it with; why.
        case notOpened(String)
    }

    static func open(_ url: String, environment: [String: String] = ProcessInfo.processInfo.environment) -> Outcome {
        let argv: [String]
        if let browser = environment["BROWSER"]?.split(separator: ":").first.map(String.init),
           !browser.trimmingSpaces().isEmpty {
            // The words of $BROWSER by the shell's rules, the URL one argument after them.
            argv = ["/bin/sh", "-c", "exec \(browser) \"$1\"", "sh", url]
        } else if let xdgOpen = findProgram("xdg-open", path: environment["PATH"]) {
            let display = [environment["DISPLAY"], environment["WAYLAND_DISPLAY"]].contains { !($0 ?? "").isEmpty }
            guard display else { return .notOpened("no display (DISPLAY and WAYLAND_DISPLAY are not set)") }
            argv = [xdgOpen, url]
        } else {
            return .notOpened("BROWSER is not set and xdg-open is not installed")
        }
        var child = ChildSpawn(executable: argv[0], arguments: argv, descriptors: [0: .devNull, 1: .devNull, 2: .devNull])
        child.detachedSignals = true
        switch child.spawn() {
        case .success(let pid):
            startThread {
                var status: Int32 = 0
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            }
            return .opened(environment["BROWSER"] != nil ? "$BROWSER" : "xdg-open")
        case .failure(let error):
            return .notOpened("the browser could not be started: \(error)")
        }
    }

    static func findProgram(_ name: String, path: String?) -> String? {
        for folder in (path ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":") where !folder.isEmpty {
            let candidate = "\(folder)/\(name)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}
