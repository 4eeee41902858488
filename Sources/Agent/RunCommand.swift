import Foundation
import KraklBackendABI
import KraklCore

/// Receives frames on the backend's thread: checks them, counts them,
/// and wakes the main thread when the run should end.
final class CaptureRun: FrameSink, @unchecked Sendable {
    let statistics = CaptureStatistics()
    let frameLimit: Int?
    let logger: BackendLogger
    let backend: String
    private let condition = NSCondition()
    private var finishReason: String?
    private var reportedInvalid = false
    private(set) var sourceError: String?

    init(backend: String, frameLimit: Int?, logger: @escaping BackendLogger) {
        self.backend = backend
        self.frameLimit = frameLimit
        self.logger = logger
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let received = DispatchTime.now().uptimeNanoseconds
        let problem = FrameCheck.geometryProblem(pointer) ?? FrameCheck.damageProblem(FrameInfo(pointer))
        if let problem {
            statistics.recordInvalid()
            if !reportedInvalid {
                reportedInvalid = true
                logger(backend, .error, "dropped an invalid frame (the backend is misbehaving): \(problem)")
            }
            return
        }
        statistics.record(FrameInfo(pointer), receivedNs: received)
        if let frameLimit, statistics.frameCount >= frameLimit { finish("\(frameLimit) frames captured") }
    }

    func event(_ event: SourceEvent) {
        switch event.kind {
        case .sourceEnded:
            finish("the source ended: \(event.message ?? "no reason given")")
        case .formatChanged:
            logger(backend, .info, "format changed to \(FrameCheck.formatName(event.format)) \(event.width)x\(event.height)")
        case .error:
            condition.lock()
            sourceError = "\(event.message ?? "unspecified error") (\(errnoName(event.error)))"
            condition.unlock()
            logger(backend, .error, event.message ?? "error \(event.error)")
        case .unknown(let type):
            logger(backend, .debug, "ignored unknown event type \(type)")
        }
    }

    func finish(_ reason: String) {
        condition.lock()
        if finishReason == nil { finishReason = reason }
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until the run finishes or `deadline`; returns the reason, or nil on timeout.
    func wait(until deadline: Date) -> String? {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { finishReason == nil }, until: deadline)
        return finishReason
    }
}

/// The main job until a publisher exists: capture from the chosen backend
/// and show what arrives. Returns the exit status.
func runCapture(_ arguments: Arguments, logger: @escaping BackendLogger) throws(AgentError) -> Int32 {
    let registry = try PluginRegistry.load(path: arguments.plugins ?? PluginRegistry.defaultPath())
    let entry = try registry.entry(named: arguments.backend ?? registry.defaultBackend)
    var options = entry.options
    for (key, value) in arguments.options { options[key] = value }
    let library = try BackendLibrary.load(path: entry.library, backend: entry.name)
    let run = CaptureRun(backend: entry.name, frameLimit: arguments.frames, logger: logger)
    let source = try BackendSource(library: library, backendName: entry.name, options: options, sink: run, logger: logger)

    // Ctrl-C and SIGTERM stop the run cleanly (stop, destroy, summary).
    var signalSources: [DispatchSourceSignal] = []
    for number in [SIGINT, SIGTERM] {
        signal(number, SIG_IGN)
        let handler = DispatchSource.makeSignalSource(signal: number, queue: .global())
        handler.setEventHandler { run.finish(number == SIGINT ? "interrupted (Ctrl-C)" : "terminated (SIGTERM)") }
        handler.resume()
        signalSources.append(handler)
    }

    let optionText = options.members.map { "\($0.key)=\($0.value.optionText)" }.joined(separator: " ")
    print("krakl-agent: capturing from \(entry.name) [\(optionText)]; Ctrl-C stops")
    try source.start()
    let isTerminal = isatty(STDOUT_FILENO) == 1
    let end = arguments.seconds.map { Date().addingTimeInterval($0) } ?? .distantFuture
    var reason: String?
    while reason == nil {
        let tick = min(end, Date().addingTimeInterval(1))
        reason = run.wait(until: tick)
        if reason == nil && Date() >= end { reason = "\(arguments.seconds!) seconds elapsed" }
        if !arguments.quiet && reason == nil {
            let line = statusLine(run.statistics.snapshot(window: true), total: run.statistics.frameCount)
            if isTerminal { print("\r\u{1B}[K" + line, terminator: "") ; fflush(stdout) } else { print(line) }
        }
    }
    if isTerminal && !arguments.quiet { print("") }
    source.stop()
    source.destroy()
    signalSources.forEach { $0.cancel() }

    let summary = run.statistics.snapshot()
    print("krakl-agent: stopped: \(reason!)")
    print(String(format: "summary: %d frames in %.1f s (%.1f fps), %@, damage %.1f%% of the frame on average",
                 summary.frames, summary.seconds, summary.fps, summary.lastSize.isEmpty ? "no frames" : summary.lastSize,
                 summary.damageShareMean * 100))
    print(String(format: "delivery latency (capture timestamp to host): p50 %.3f ms, p99 %.3f ms, max %.3f ms",
                 summary.latencyMs.p50, summary.latencyMs.p99, summary.latencyMs.max))
    if summary.invalidFrames > 0 { print("dropped \(summary.invalidFrames) invalid frames from the backend") }
    if let error = run.sourceError {
        fputs("krakl-agent: the source reported an error: \(error)\n", stderr)
        return 13
    }
    return 0
}

func statusLine(_ shot: CaptureStatistics.Snapshot, total: Int) -> String {
    String(format: "%6d frames | %5.1f fps | damage %5.1f%% | latency p50 %.2f ms p99 %.2f ms | %@",
           total, shot.fps, shot.damageShareMean * 100, shot.latencyMs.p50, shot.latencyMs.p99, shot.lastSize)
}
