import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
import KraklEncoder
import KraklScan
import KraklSession
import KraklViewer

/// `--scan --camera --preview`: the camera's picture on the built-in viewer's page while a scan
/// looks, so the person can see what the camera sees and aim the code into it. The camera's
/// frames go to the scan's LumaCapture as always and, through a media path of their own, to an
/// encoder whose output the viewer fans out (the viewer run's wiring: ViewerRun, MediaPath). Gone
/// with the scan.
final class CameraPreview: FrameSink, Sendable {
    /// The camera hands over this many pictures a second while previewing (5 without): a
    /// picture to aim by moves smoothly enough at 15, and the scan still looks at most 5 times.
    static let picturesPerSecond = 15

    private let scanning: LumaCapture
    private let viewer: ViewerRun
    private let path: MediaPath

    /// Binds the viewer (a taken port throws here) and makes the encoder; `start` serves.
    init(_ arguments: Arguments, scanning: LumaCapture, logger: @escaping BackendLogger) throws(ViewerServerError) {
        self.scanning = scanning
        viewer = try ViewerRun(arguments, logger: logger)
        // The camera's end and errors are the scan's to judge (they reach it through `event`).
        path = MediaPath(backend: "camera preview", logger: logger) { event in
            if case .encoderFailed(let error) = event {
                logger("camera preview", .warning, "the preview's encoder failed: \(error.message); the scan goes on")
            }
        }
        var settings = arguments.encoder
        settings.refreshForReceiversThatAsk()
        do throws(EncoderError) {
            try path.makeEncoder(settings: settings, output: .feeds(steering: FeedSink(viewer.feed), also: []))
        } catch {
            // The settings are the agent's own, checked when the arguments were read.
            fatalError("the preview's encoder settings were refused: \(error.message)")
        }
        viewer.attach(path)
    }

    /// Serves the page and opens it where there is a screen; the words to say where it is.
    func start() -> String {
        path.start()
        viewer.server.start()
        let url = viewer.server.url
        switch BrowserOpener.open(url) {
        case .opened(let program): return "the camera's picture is on \(viewer.server.redactedURL) (opened with \(program)): aim the code into it"
        case .notOpened(let why): return "the camera's picture is on \(url) (not opened: \(why)): open it to aim the code"
        }
    }

    func stop() {
        viewer.stop(reason: "the scan ended")
        path.finish()
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        scanning.frame(pointer)
        path.frame(pointer)
    }

    func event(_ event: SourceEvent) { scanning.event(event) }
}
