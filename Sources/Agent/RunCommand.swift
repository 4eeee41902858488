import Foundation
import KraklBackendABI
import KraklCore
import KraklEncoder
import ZeroFill

/// Receives frames on the backend's thread: checks them, counts them,
/// and wakes the main thread when the run should end.
final class CaptureRun: FrameSink, @unchecked Sendable {
    let statistics = CaptureStatistics()
    let frameLimit: Int?
    let logger: BackendLogger
    let backend: String
    private let condition = NSCondition()
    private var finishReason: String?
    private(set) var sourceError: String?
    private(set) var encoderError: String?
    /// Set before start(); receives every checked frame.
    var pipeline: EncoderPipeline?

    private let gate: FrameGate

    init(backend: String, frameLimit: Int?, logger: @escaping BackendLogger) {
        gate = FrameGate(backend: backend, logger: logger)
        self.backend = backend
        self.frameLimit = frameLimit
        self.logger = logger
    }

    func encoderFailed(_ error: EncoderError) {
        condition.lock()
        encoderError = error.message
        condition.unlock()
        finish("the encoder failed")
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let received = DispatchTime.now().uptimeNanoseconds
        guard let info = gate.admit(pointer) else {
            statistics.recordInvalid()
            return
        }
        statistics.record(info, receivedNs: received)
        pipeline?.submit(info)
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

/// The backend the command line names (or the registry's default), its
/// plugins.json options with every --option applied, isolated or loaded.
func selectedBackend(_ arguments: Arguments) throws(HostError) -> BackendSelection {
    try BackendSelection(registryPath: arguments.plugins, name: arguments.backend, overrides: arguments.options, isolate: arguments.isolate)
}

/// The main job until a publisher exists: capture from the chosen backend
/// and show what arrives. Returns the exit status.
func runCapture(_ arguments: Arguments, logger: @escaping BackendLogger) throws(HostError) -> Int32 {
    let selection = try selectedBackend(arguments)
    let (entry, options) = (selection.entry, selection.options)
    let run = CaptureRun(backend: entry.name, frameLimit: arguments.frames, logger: logger)
    if let record = arguments.record {
        do throws(EncoderError) {
            run.pipeline = try EncoderPipeline(settings: arguments.encoder, dumpInput: arguments.dumpInput, output: { codec, width, height throws(EncoderError) in
                if record.hasSuffix(".ivf") { return try IVFWriter(path: record, codec: codec, width: width, height: height) }
                return try WebMWriter(path: record, codec: codec, width: width, height: height)
            }, onFailure: { run.encoderFailed($0) })
        } catch {
            throw .encoderFailed(error.message)
        }
    }
    let source: any CaptureSource = try selection.makeSource(sink: run, logger: logger)

    // Ctrl-C and SIGTERM stop the run cleanly (stop, destroy, summary).
    var signalSources: [DispatchSourceSignal] = []
    for number in [SIGINT, SIGTERM, SIGUSR1] {
        signal(number, SIG_IGN)
        let handler = DispatchSource.makeSignalSource(signal: number, queue: .global())
        handler.setEventHandler {
            switch number {
            case SIGUSR1: run.pipeline?.requestKeyframe()
            case SIGINT: run.finish("interrupted (Ctrl-C)")
            default: run.finish("terminated (SIGTERM)")
            }
        }
        handler.resume()
        signalSources.append(handler)
    }

    let optionText = options.members.map { "\($0.key)=\($0.value.optionText)" }.joined(separator: " ")
    print("krakl-agent: capturing from \(entry.name) [\(optionText)]; Ctrl-C stops")
    if let record = arguments.record {
        let e = arguments.encoder
        print("krakl-agent: recording \(e.codec) at \(e.bitrateKbps) kbit/s, at most \(e.maximumSize.width)x\(e.maximumSize.height) and \(Int(e.maximumFps)) fps, to \(record)")
    }
    run.pipeline?.start()
    do throws(HostError) {
        try source.start()
    } catch {
        run.pipeline?.finish()
        throw error
    }
    let isTerminal = isatty(STDOUT_FILENO) == 1
    let end = arguments.seconds.map { Date().addingTimeInterval($0) } ?? .distantFuture
    var reason: String?
    var steadyRSSKB = 0   // highest VmRSS sampled once a second after the first second
    var ticks = 0
    while reason == nil {
        let tick = min(end, Date().addingTimeInterval(1))
        reason = run.wait(until: tick)
        if reason == nil && Date() >= end { reason = "\(arguments.seconds!) seconds elapsed" }
        ticks += 1
        if ticks > 1 { steadyRSSKB = max(steadyRSSKB, currentRSSKB()) }
        if !arguments.quiet && reason == nil {
            var line = statusLine(run.statistics.snapshot(window: true), total: run.statistics.frameCount)
            if let pipeline = run.pipeline { line += " | " + encoderStatus(pipeline.statistics.summary(window: true)) }
            if isTerminal { print("\r\u{1B}[K" + line, terminator: "") ; fflush(stdout) } else { print(line) }
        }
    }
    if isTerminal && !arguments.quiet { print("") }
    // A backend that crashed (isolated) or hung ends the run with its status, after the outputs are finalized.
    var sourceFailure: HostError?
    do throws(HostError) {
        try source.stop()
        try source.destroy()
    } catch {
        sourceFailure = error
    }
    run.pipeline?.finish()
    signalSources.forEach { $0.cancel() }

    let summary = run.statistics.snapshot()
    print("krakl-agent: stopped: \(reason!)")
    print(String(format: "summary: %d frames in %.1f s (%.1f fps), %@, damage %.1f%% of the frame on average",
                 summary.frames, summary.seconds, summary.fps, summary.lastSize.isEmpty ? "no frames" : summary.lastSize,
                 summary.damageShareMean * 100))
    print(String(format: "delivery latency (capture timestamp to host): p50 %.3f ms, p99 %.3f ms, max %.3f ms",
                 summary.latencyMs.p50, summary.latencyMs.p99, summary.latencyMs.max))
    if summary.invalidFrames > 0 { print("dropped \(summary.invalidFrames) invalid frames from the backend") }
    if let pipeline = run.pipeline, let record = arguments.record {
        let e = pipeline.statistics.summary()
        print(String(format: "encoded: %d frames (%d keyframes, %d refreshes), %.0f kbit/s, encode p50 %.2f ms p99 %.2f ms, active blocks %.1f%%, %d captured frames merged into later ones, %d dropped by rate control",
                     e.frames, e.keyframes, e.refreshFrames, e.bitrateKbps, e.encodeMs.p50, e.encodeMs.p99, e.activeShareMean * 100, e.skippedFrames, e.droppedFrames))
        print(String(format: "encoder path CPU: %.2f s (conversion on the capture thread + encoder thread); recording: %@", e.cpuSeconds, record))
    }
    if let path = arguments.frameLog, let pipeline = run.pipeline { writeFrameLog(path, pipeline.statistics.allFrames) }
    if let path = arguments.statsJSON { writeStatistics(path, capture: summary, encoder: run.pipeline?.statistics.summary(), steadyRSSKB: steadyRSSKB) }
    if let sourceFailure {
        fputs("krakl-agent: \(sourceFailure.description)\n", stderr)
        return sourceFailure.exitStatus
    }
    if let error = run.encoderError {
        fputs("krakl-agent: encoding failed: \(error)\n", stderr)
        return 14
    }
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

func encoderStatus(_ e: EncoderStatistics.Summary) -> String {
    String(format: "enc %5.0f kbit/s p50 %.1f ms | active %4.1f%%", e.bitrateKbps, e.encodeMs.p50, e.activeShareMean * 100)
}

/// The run's numbers for scripts (bench/, tests) to read.
func writeStatistics(_ path: String, capture: CaptureStatistics.Snapshot, encoder: EncoderStatistics.Summary?, steadyRSSKB: Int) {
    var object: [String: Any] = [
        "captured_frames": capture.frames, "capture_seconds": capture.seconds, "damage_share": capture.damageShareMean,
        "delivery_latency_ms_p50": capture.latencyMs.p50, "delivery_latency_ms_p99": capture.latencyMs.p99,
    ]
    if let e = encoder {
        object["encoded_frames"] = e.frames
        object["keyframes"] = e.keyframes
        object["refresh_frames"] = e.refreshFrames
        object["encoded_bytes"] = e.bytes
        object["encoded_seconds"] = e.seconds
        object["bitrate_kbps"] = e.bitrateKbps
        object["encode_ms_p50"] = e.encodeMs.p50
        object["encode_ms_p99"] = e.encodeMs.p99
        object["encode_ms_max"] = e.encodeMs.max
        object["active_share"] = e.activeShareMean
        object["skipped_frames"] = e.skippedFrames
        object["dropped_frames"] = e.droppedFrames
        object["encoder_cpu_seconds"] = e.cpuSeconds
    }
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    object["peak_rss_kb"] = usage.ru_maxrss
    object["steady_rss_kb"] = steadyRSSKB
    let zeroFill = krakl_zero_fill_read_stats()
    object["zero_fill_released_bytes"] = zeroFill.bytes
    object["process_cpu_seconds"] = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]) {
        _ = FileManager.default.createFile(atPath: path, contents: data)
    }
}

/// Per-frame numbers as CSV, one line per encoded frame.
func writeFrameLog(_ path: String, _ frames: [EncoderStatistics.Frame]) {
    let start = frames.first?.timestampNs ?? 0
    var text = "time_ms,bytes,keyframe,refresh,active_share,encode_ms\n"
    for f in frames {
        text += String(format: "%.1f,%d,%d,%d,%.4f,%.3f\n", Double(f.timestampNs - start) / 1e6, f.bytes, f.keyframe ? 1 : 0,
                       f.refresh ? 1 : 0, f.activeShare, Double(f.encodeNs) / 1e6)
    }
    _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8))
}

/// VmRSS of this process, kB.
func currentRSSKB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
    return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0
}
