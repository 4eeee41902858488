import Foundation
import KraklBackendABI
import KraklCore
import KraklEncoder
import KraklScan
import KraklViewer

/// `--scan --camera --preview`: the camera's picture on the built-in viewer's page while a scan
/// looks, so the person can see what the camera sees and aim the code into it. The camera's
/// frames go to the scan's LumaCapture as always and, through a gate of their own, to an encoder
/// whose output the viewer fans out (the viewer run's wiring: ViewerRun, ViewerFeedSink). Gone
/// with the scan.
final class CameraPreview: FrameSink, @unchecked Sendable {
    /// The camera hands over this many pictures a second while previewing (5 without): a
    /// picture to aim by moves smoothly enough at 15, and the scan still looks at most 5 times.
    static let picturesPerSecond = 15

    private let scanning: LumaCapture
    private let gate: FrameGate
    private let viewer: ViewerRun
    private let pipeline: EncoderPipeline

    /// Binds the viewer (a taken port throws here) and makes the encoder; `start` serves.
    init(_ arguments: Arguments, scanning: LumaCapture, logger: @escaping BackendLogger) throws(ViewerServerError) {
        self.scanning = scanning
        gate = FrameGate(backend: "camera preview", logger: logger)
        viewer = try ViewerRun(arguments, logger: logger)
        var settings = arguments.encoder
        settings.refreshForReceiversThatAsk()
        let sink = ViewerFeedSink(viewer.feed)
        do throws(EncoderError) {
            pipeline = try EncoderPipeline(settings: settings, output: { _, _, _ in sink }, onFailure: { error in
                logger("camera preview", .warning, "the preview's encoder failed: \(error.message); the scan goes on")
            })
        } catch {
            // The settings are the agent's own, checked when the arguments were read.
            fatalError("the preview's encoder settings were refused: \(error.message)")
        }
        viewer.attach(pipeline)
    }

    /// Serves the page and opens it where there is a screen; the words to say where it is.
    func start() -> String {
        pipeline.start()
        viewer.server.start()
        let url = viewer.server.url
        switch BrowserOpener.open(url) {
        case .opened(let program): return "the camera's picture is on \(viewer.server.redactedURL) (opened with \(program)): aim the code into it"
        case .notOpened(let why): return "the camera's picture is on \(url) (not opened: \(why)): open it to aim the code"
        }
    }

    func stop() {
        viewer.stop(reason: "the scan ended")
        pipeline.finish()
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        scanning.frame(pointer)
        if let info = gate.admit(pointer) { pipeline.submit(info) }
    }

    func event(_ event: SourceEvent) { scanning.event(event) }
}
