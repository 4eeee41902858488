import Dispatch
import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
import KraklEncoder

/// What a media path tells its owner; on the backend's capture thread or the encoder thread.
public enum MediaPathEvent: Sendable {
    /// The backend says its source ended (the window closed, the portal stream went away).
    case sourceEnded(String)
    /// The backend reported an error ("message (ERRNO)"); it was logged, and the source may go on.
    case sourceError(String)
    /// The frame limit given at `init` was reached (said once; frames go on until the source stops).
    case frameLimitReached(Int)
    /// The encoder or one of its outputs failed (said once); nothing more is encoded.
    case encoderFailed(EncoderError)
}

/// Source → gate → encoder → outputs, with the receivers' feedback: the one wiring of the media,
/// for a room (`SharingSession`), the built-in viewer and recordings (`krakl-agent` without a join
/// code) and the camera's preview. It is the backend's `FrameSink`: each frame is checked
/// (`FrameGate`), counted (`statistics`) and handed to the encoder; the source's end and errors
/// and the encoder's failure reach the owner as `MediaPathEvent`s. Where the encoded frames go is
/// `Output`: a recording's writer, or network feeds, the first of which steers the encoder (its
/// keyframe requests and bitrate estimates are wired here, weakly: the encoder's output holds the feed).
///
/// Threads: `frame` and `event` on the backend's capture thread; the encoder's own thread behind
/// `pipeline`; everything else from any thread.
/// Sendable, checked: what changes after `init` is in `state`; frames pass on the capture and encoder threads only.
public final class MediaPath: FrameSink, Sendable {
    /// Where the encoded frames go.
    public enum Output {
        /// A file: the factory makes its writer once the first picture's codec and size are known.
        case recording(EncoderPipeline.OutputFactory)
        /// Network receivers: `steering`'s feed asks for keyframes and sets the bitrate; `also` only
        /// receive (the home screen's local viewer beside a room, which the room's estimate governs).
        case feeds(steering: FeedSink, also: [any EncodedFrameSink & Sendable])
    }

    public let backend: String
    /// Every frame the backend handed over, valid or not.
    public let statistics = CaptureStatistics()
    private let frameLimit: Int?
    private let logger: BackendLogger
    private let onEvent: @Sendable (MediaPathEvent) -> Void
    private let gate: FrameGate
    private struct State: Sendable {
        var pipeline: EncoderPipeline?
        var closed = false
        var limitSaid = false
        var sourceError: String?
        var encoderError: EncoderError?
    }
    private let state = Guarded(State())

    /// - Parameters:
    ///   - backend: the backend's name, for log lines.
    ///   - frameLimit: say `.frameLimitReached` once this many frames were captured (`--frames`).
    ///   - onEvent: the source's end and errors, the limit, the encoder's failure; must not block.
    public init(backend: String, frameLimit: Int? = nil, logger: @escaping BackendLogger, onEvent: @escaping @Sendable (MediaPathEvent) -> Void) {
        self.backend = backend
        self.frameLimit = frameLimit
        self.logger = logger
        self.onEvent = onEvent
        gate = FrameGate(backend: backend, logger: logger)
    }

    /// The encoder, once made.
    public var pipeline: EncoderPipeline? { state.withLock { $0.pipeline } }
    /// The first error the source reported, if any.
    public var sourceError: String? { state.withLock { $0.sourceError } }
    /// The encoder's failure, if it failed.
    public var encoderError: EncoderError? { state.withLock { $0.encoderError } }

    /// Makes the encoder, its output and the feedback wiring; frames captured from now on are
    /// encoded once `start` is called. Once per path.
    @discardableResult
    public func makeEncoder(settings: EncoderSettings, dumpInput: String? = nil, frameLog: FrameLog? = nil,
                            output: Output) throws(EncoderError) -> EncoderPipeline {
        let factory: EncoderPipeline.OutputFactory
        var steering: (any VideoFeed)?
        switch output {
        case .recording(let makeWriter):
            factory = makeWriter
        case .feeds(let sink, let also):
            let sinks: [any EncodedFrameSink & Sendable] = [sink] + also
            let out: any EncodedFrameSink = sinks.count == 1 ? sink : EncodedFrameTee(sinks)
            factory = { _, _, _ in out }
            steering = sink.feed
        }
        let backend = self.backend, logger = self.logger
        let pipeline = try EncoderPipeline(settings: settings, dumpInput: dumpInput, frameLog: frameLog, output: factory,
                                           onFailure: { [weak self] error in self?.encoderFailed(error) },
                                           onWarning: { logger(backend, .warning, $0) })
        if let steering { steer(pipeline, by: steering) }
        state.withLock { $0.pipeline = pipeline }
        return pipeline
    }

    /// The receivers' feedback to the encoder: keyframes for what they lost or when they arrive,
    /// the bitrate from their estimate. Weak: the encoder's output holds the feed.
    private func steer(_ pipeline: EncoderPipeline, by feed: any VideoFeed) {
        feed.onKeyframeRequest = { [weak pipeline] in pipeline?.requestKeyframe() }
        feed.onBitrate = { [weak pipeline] bps in pipeline?.setBitrate(kbps: max(bps / 1000, 1)) }
    }

    /// Starts the encoder's thread (before the source starts, so no frame waits).
    public func start() { pipeline?.start() }

    /// Any thread: a keyframe as soon as the encoder can (a viewer joined, SIGUSR1); rate-limited there.
    public func requestKeyframe() { pipeline?.requestKeyframe() }

    /// No more frames are taken (a backend that overran its stop() may still call), and the encoder's
    /// outputs are completed; a failure there is an `.encoderFailed` event. The source is stopped
    /// after this, so a stop() that hangs adds nothing to a recording.
    public func finish() {
        state.withLock { $0.closed = true }
        pipeline?.finish()
    }

    private func encoderFailed(_ error: EncoderError) {
        let first = state.withLock { state -> Bool in
            guard state.encoderError == nil else { return false }
            state.encoderError = error
            return true
        }
        if first { onEvent(.encoderFailed(error)) }
    }

    /// An output that failed outside the encoder (a frame log completed without a recording).
    public func outputFailed(_ error: EncoderError) { encoderFailed(error) }

    // MARK: - FrameSink, on the backend's capture thread

    public func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let received = DispatchTime.now().uptimeNanoseconds
        let (closed, pipeline) = state.withLock { ($0.closed, $0.pipeline) }
        guard !closed else { return }
        guard let info = gate.admit(pointer) else {
            statistics.recordInvalid()
            return
        }
        statistics.record(info, receivedNs: received)
        pipeline?.submit(info)
        if let frameLimit, statistics.frameCount >= frameLimit {
            let first = state.withLock { state -> Bool in defer { state.limitSaid = true }; return !state.limitSaid }
            if first { onEvent(.frameLimitReached(frameLimit)) }
        }
    }

    public func event(_ event: SourceEvent) {
        switch event.kind {
        case .sourceEnded:
            onEvent(.sourceEnded(event.message ?? "the backend gave no reason"))
        case .formatChanged:
            logger(backend, .info, "format changed to \(FrameCheck.formatName(event.format)) \(event.width)x\(event.height)")
        case .error:
            let words = "\(event.message ?? "unspecified error") (\(errnoName(event.error)))"
            state.withLock { if $0.sourceError == nil { $0.sourceError = words } }
            logger(backend, .error, words)
            onEvent(.sourceError(words))
        case .unknown(let type):
            logger(backend, .debug, "ignored unknown event type \(type)")
        }
    }
}

/// One encoder's output to several sinks, in order (the room's publisher first). A sink that
/// fails does not keep the frame from the others; the first failure is passed on.
final class EncodedFrameTee: EncodedFrameSink, Sendable {
    let sinks: [any EncodedFrameSink & Sendable]
    init(_ sinks: [any EncodedFrameSink & Sendable]) { self.sinks = sinks }

    func write(_ frame: EncodedFrame) throws(EncoderError) {
        var failure: EncoderError?
        for sink in sinks {
            do throws(EncoderError) { try sink.write(frame) } catch { failure = failure ?? error }
        }
        if let failure { throw failure }
    }

    func finish() throws(EncoderError) {
        var failure: EncoderError?
        for sink in sinks {
            do throws(EncoderError) { try sink.finish() } catch { failure = failure ?? error }
        }
        if let failure { throw failure }
    }
}
