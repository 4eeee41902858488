import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
import KraklEncoder
import KraklSession
import KraklViewer
import ZeroFill

/// Why the run ends: the first reason given, from any thread (the backend's, the encoder's, a
/// signal on the main thread), wakes the main thread once.
final class RunEnding: Sendable {
    private let ending = Guarded<String?>(nil)

    func finish(_ reason: String) {
        let first: Bool = ending.withLock { ending in
            guard ending == nil else { return false }
            ending = reason
            return true
        }
        // Once: frames after --frames still arrive until stop(), and each need not write a byte.
        if first { ControlPipe.wake() }
    }

    var reason: String? { ending.withLock { $0 } }
}

/// Why a signal ended the run (docs/exit-codes.md: each ends it like SIGTERM, exit 0).
func signalReason(_ number: Int32) -> String {
    switch number {
    case SIGINT: return "interrupted (Ctrl-C)"
    case SIGHUP: return "hung up (SIGHUP: the terminal closed)"
    case SIGQUIT: return "quit (SIGQUIT)"
    case SIGPIPE: return "a reader closed its pipe (SIGPIPE)"
    case SIGTERM: return "terminated (SIGTERM)"
    default: return "signal \(number)"
    }
}

/// The backend the command line names, else the screen's (`chooseScreenBackend`: plugins.json's
/// `default` when it names one, the portal, X11, else the test pattern), its plugins.json options
/// with every --option applied, isolated or loaded; and the choice, for the words about it
/// (`scanning`: worded for reading a join code, not sharing).
func selectedBackend(_ arguments: Arguments, scanning: Bool = false) throws(HostError) -> (selection: BackendSelection, choice: BackendChoice) {
    let choice = chooseScreenBackend(registryPath: arguments.plugins, given: arguments.backend, scanning: scanning)
    let selection = try BackendSelection(registryPath: arguments.plugins, name: choice.name ?? arguments.backend, overrides: arguments.options,
                                         isolate: arguments.isolate)
    return (selection, choice)
}

extension EncoderError {
    /// An output's failure is the agent's exit 23; anything else the encoder's 14.
    var hostError: HostError {
        if let output { return .outputFailed(path: output.path, reason: output.reason) }
        return .encoderFailed(message)
    }
}

/// The recording is created at the first frame (its header needs the size), so its place is
/// checked now: a missing folder or a read-only file fails the run before anything is captured.
func checkRecordingPath(_ path: String) throws(HostError) {
    var info = stat()
    if stat(path, &info) == 0 {
        if (info.st_mode & S_IFMT) == S_IFDIR { throw .outputFailed(path: path, reason: "it is a folder") }
        if access(path, W_OK) != 0 { throw .outputFailed(path: path, reason: String(cString: strerror(errno))) }
        return
    }
    let folder = folderPart(of: path)
    if access(folder.isEmpty ? "." : folder, W_OK) != 0 {
        throw .outputFailed(path: path, reason: "its folder \(folder.isEmpty ? "." : folder): \(String(cString: strerror(errno)))")
    }
}

/// The main job until a publisher exists: capture from the chosen backend
/// and show what arrives. Returns the exit status.
///
/// Signals (through ControlPipe, the agent's one signal mechanism): SIGINT, SIGTERM, SIGHUP,
/// SIGQUIT and SIGPIPE each end the run cleanly (stop, destroy, recording and outputs
/// completed, summary); SIGUSR1 asks for a keyframe. A closed stdout (`krakl-agent | head`)
/// ends the run the same way, since nobody reads the status any more; the summary is then not
/// printed (there is nowhere to print it) but the recording is complete.
func runCapture(_ arguments: Arguments, logger: @escaping BackendLogger) throws(HostError) -> Int32 {
    // Sharing to the viewer shows the real screen when there is one (the same choice as a room's); a
    // recording keeps the registry's default (a file of the test pattern is what tests and benches record).
    let choice = arguments.sharesToViewer ? chooseScreenBackend(registryPath: arguments.plugins, given: arguments.backend) : nil
    let selection = try BackendSelection(registryPath: arguments.plugins, name: choice?.name ?? arguments.backend,
                                         overrides: arguments.options, isolate: arguments.isolate)
    let entry = selection.entry
    if let choice, !choice.why.isEmpty { print("krakl-agent: backend \(entry.name): \(choice.why)") }
    let control = ControlPipe.shared
    control.catchSignals([SIGPIPE, SIGUSR1])
    let ending = RunEnding()
    let run = MediaPath(backend: entry.name, frameLimit: arguments.frames, logger: logger) { event in
        switch event {
        case .sourceEnded(let words): ending.finish("the source ended: \(words)")
        case .frameLimitReached(let count): ending.finish("\(count) frames captured")
        case .encoderFailed(let error): ending.finish(error.output.map { "writing \($0.path) failed" } ?? "the encoder failed")
        case .sourceError: break   // logged by the path; said again in the summary
        }
    }

    // Every output is opened (or its place checked) before the backend is created; the viewer's
    // port too, so a taken one ends the run before any sharing dialog.
    var viewer: ViewerRun?
    if arguments.sharesToViewer {
        do throws(ViewerServerError) { viewer = try ViewerRun(arguments, logger: logger) } catch {
            StandardStream.error("krakl-agent: \(error.description)\n")
            return error.exitStatus
        }
    }
    let outputs = try CaptureOutputs(arguments, path: run, viewer: viewer)
    let source: any CaptureSource
    switch try makeSourceUntilSignalled(selection, sink: run, logger: logger, control: control) {
    case .made(let made):
        source = made
    case .signalled(let number, let seconds):
        outputs.endWhileCreating(signal: number, after: seconds, backend: entry.name)
    }

    let optionText = selection.options.members.map { "\($0.key)=\($0.value.optionText)" }.joined(separator: " ")
    print("krakl-agent: capturing from \(entry.name) [\(optionText)]; Ctrl-C stops")
    if let record = arguments.record {
        let e = arguments.encoder
        print("krakl-agent: recording \(e.codec) at \(e.bitrateKbps) kbit/s, at most \(e.maximumSize.width)x\(e.maximumSize.height) and \(Int(e.maximumFps)) fps, to \(record)")
    }
    run.start()
    do throws(HostError) {
        try source.start()
    } catch {
        run.finish()
        throw error
    }
    viewer?.start()
    let watched = watchUntilEnded(arguments, path: run, viewer: viewer, ending: ending, control: control)
    let reason = ending.reason ?? "stopped"
    if watched.lineOpen { print("") }
    // Viewers are told first (their peers close, the page says sharing ended), then the source stops.
    viewer?.stop(reason: reason)

    // Nothing is added once the stop is asked for: the run takes no more frames and the encoder's
    // outputs are completed before the source is stopped, so a stop() or destroy() that hangs (the
    // watchdog gives up on it after 2 + 3 s) adds no idle refreshes: `--seconds 2` on such a backend
    // left a 5.0 s recording of 61 frames. The summary is printed whatever happened.
    completeEncoderOutputs(run, frameLog: outputs.frameLog)
    var sourceFailure: HostError?
    do throws(HostError) { try source.stop() } catch { sourceFailure = error }
    do throws(HostError) { try source.destroy() } catch { if sourceFailure == nil { sourceFailure = error } }

    let summary = run.statistics.snapshot()
    print("krakl-agent: stopped: \(reason)")
    let encoded = printRunSummary(summary, path: run, record: arguments.record)
    var statsFailure: HostError?
    if let statsFile = outputs.statsFile {
        do throws(EncoderError) {
            try writeStatistics(statsFile, capture: summary, encoder: encoded, steadyRSSKB: watched.steadyRSSKB)
        } catch {
            statsFailure = error.hostError
        }
    }
    return runExitStatus(sourceFailure: sourceFailure, statsFailure: statsFailure, path: run, summary: summary, encoded: encoded,
                         record: arguments.record, backend: entry.name)
}

/// The run's outputs, opened before the backend is created: the statistics file, the frame log,
/// and the encoder with its recording (created at the first frame, its place checked now) or the
/// built-in viewer's feed.
struct CaptureOutputs {
    let statsFile: OutputFile?
    let frameLog: FrameLog?
    private let path: MediaPath

    init(_ arguments: Arguments, path: MediaPath, viewer: ViewerRun?) throws(HostError) {
        self.path = path
        if let record = arguments.record { try checkRecordingPath(record) }
        do throws(EncoderError) {
            statsFile = try arguments.statsJSON.map { (path) throws(EncoderError) in try OutputFile(path: path) }
            let frameLog = try arguments.frameLog.map { (path) throws(EncoderError) in try FrameLog(path: path) }
            self.frameLog = frameLog
            if let record = arguments.record {
                try path.makeEncoder(settings: arguments.encoder, dumpInput: arguments.dumpInput, frameLog: frameLog,
                                     output: .recording({ codec, width, height throws(EncoderError) in
                    if record.lowercased().hasSuffix(".ivf") { return try IVFWriter(path: record, codec: codec, width: width, height: height) }
                    return try WebMWriter(path: record, codec: codec, width: width, height: height)
                }))
            } else if let viewer {
                var settings = arguments.encoder
                // Viewers ask for what they miss (PLI, NACK), as in a room: no idle refresh unless asked for.
                if !arguments.refreshGiven { settings.refreshForReceiversThatAsk() }
                try path.makeEncoder(settings: settings, dumpInput: arguments.dumpInput, frameLog: frameLog,
                                     output: .feeds(steering: FeedSink(viewer.feed), also: []))
                viewer.attach(path)
            }
        } catch {
            throw error.hostError
        }
    }

    /// A signal came while the backend was still inside create() (a sharing dialog, or hung):
    /// nothing was captured. Its thread is left where it is; the process ends now (an isolated
    /// backend's child ends with the agent), with the outputs opened so far completed.
    func endWhileCreating(signal number: Int32, after seconds: Double, backend: String) -> Never {
        print(String(cFormat: "krakl-agent: stopped: %@ while backend %@ was still starting (its create() had not returned after %.1f s); nothing was captured",
                     signalReason(number), backend, seconds))
        completeEncoderOutputs(path, frameLog: frameLog)
        var failure = path.encoderError?.hostError
        if let statsFile {
            do throws(EncoderError) {
                try writeStatistics(statsFile, capture: path.statistics.snapshot(), encoder: path.pipeline?.statistics.summary(), steadyRSSKB: 0)
            } catch { failure = failure ?? error.hostError }
        }
        if let failure { StandardStream.error("krakl-agent: \(failure.description)\n") }
        StandardStream.flushOutput()
        StandardStream.flushError()
        _exit(failure?.exitStatus ?? 0)
    }
}

/// The main thread while the run lasts: a status line a second (unless --quiet), SIGUSR1 as a
/// keyframe request, any other signal, --seconds or a closed stdout as the end. Returns the highest
/// VmRSS sampled once a second after the first (kB), and whether a terminal's status line is left open.
func watchUntilEnded(_ arguments: Arguments, path run: MediaPath, viewer: ViewerRun?, ending: RunEnding,
                     control: ControlPipe) -> (steadyRSSKB: Int, lineOpen: Bool) {
    let isTerminal = isatty(STDOUT_FILENO) == 1
    let second = Duration.seconds(1).inNanoseconds
    let begun = MonotonicClock.nanoseconds()
    let end = arguments.seconds.map { begun + UInt64($0 * 1e9) }
    var nextTick = begun + second
    var printing = !arguments.quiet
    var steadyRSSKB = 0
    var ticks = 0
    while ending.reason == nil {
        let now = MonotonicClock.nanoseconds()
        if let end, now >= end {
            ending.finish("\(arguments.seconds!) seconds elapsed")
            break
        }
        if now >= nextTick {
            nextTick = max(nextTick + second, now + second / 2)
            ticks += 1
            if ticks > 1 { steadyRSSKB = max(steadyRSSKB, currentRSSKB()) }
            if printing {
                var line = statusLine(run.statistics.snapshot(window: true), total: run.statistics.frameCount)
                if let pipeline = run.pipeline { line += " | " + encoderStatus(pipeline.statistics.summary(window: true)) }
                if let viewer { line += " | " + viewer.statusText }
                if isTerminal { print("\r\u{1B}[K" + line, terminator: "") } else { print(line) }
                StandardStream.flushOutput()
                // EPIPE (the reader left) or EIO (the terminal is gone): nobody sees the status any more.
                if StandardStream.outputFailed {
                    printing = false
                    ending.finish("stdout was closed")
                }
            }
            continue
        }
        let deadline = min(nextTick, end ?? .max)
        switch control.wait(timeout: Double(deadline - now) / 1e9) {
        case .signal(SIGUSR1): run.requestKeyframe()
        case .signal(let number): ending.finish(signalReason(number))
        case .timeout: break
        }
    }
    return (steadyRSSKB, isTerminal && printing)
}

/// The summary after a run (what was captured, delivered and encoded); returns the encoder's numbers.
func printRunSummary(_ summary: CaptureStatistics.Snapshot, path run: MediaPath, record: String?) -> EncoderStatistics.Summary? {
    print(String(cFormat: "summary: %d frames in %.1f s (%.1f fps), %@, damage %.1f%% of the frame on average",
                 summary.frames, summary.seconds, summary.fps, summary.lastSize.isEmpty ? "no frames" : summary.lastSize,
                 summary.damageShareMean * 100))
    print(String(cFormat: "delivery latency (capture timestamp to host): p50 %.3f ms, p99 %.3f ms, max %.3f ms",
                 summary.latencyMs.p50, summary.latencyMs.p99, summary.latencyMs.max))
    if summary.invalidFrames > 0 { print("dropped \(summary.invalidFrames) invalid frames from the backend") }
    guard let pipeline = run.pipeline else { return nil }
    let e = pipeline.statistics.summary()
    print(String(cFormat: "encoded: %d frames (%d keyframes, %d refreshes), %.0f kbit/s, encode p50 %.2f ms p99 %.2f ms, active blocks %.1f%%, %d captured frames merged into later ones, %d dropped by rate control",
                 e.frames, e.keyframes, e.refreshFrames, e.bitrateKbps, e.encodeMs.p50, e.encodeMs.p99, e.activeShareMean * 100, e.skippedFrames, e.droppedFrames))
    if e.correctedTimestamps > 0 { print("corrected \(e.correctedTimestamps) backend timestamps (stepped back, jumped or stood still)") }
    if e.coalescedKeyframeRequests > 0 { print("merged \(e.coalescedKeyframeRequests) keyframe requests into earlier ones (at most one keyframe per \(pipeline.settings.keyframeRequestSpacing.inSeconds) s)") }
    if let record {
        let written = pipeline.outputStarted ? record : "none (no frame was encoded)"
        print(String(cFormat: "encoder path CPU: %.2f s (conversion on the capture thread + encoder thread); recording: %@", e.cpuSeconds, written))
    } else {
        print(String(cFormat: "encoder path CPU: %.2f s (conversion on the capture thread + encoder thread); shared to the built-in viewer", e.cpuSeconds))
    }
    return e
}

/// Every failure is said; the exit status is the first of: the backend hung (22), an output
/// failed (23), the encoder failed (14), no usable frame (25), the source reported an error (13).
func runExitStatus(sourceFailure: HostError?, statsFailure: HostError?, path run: MediaPath, summary: CaptureStatistics.Snapshot,
                   encoded: EncoderStatistics.Summary?, record: String?, backend: String) -> Int32 {
    var failures: [HostError] = []
    if let sourceFailure { failures.append(sourceFailure) }
    if let error = run.encoderError {
        failures.append(error.hostError)
        if let output = error.output { StandardStream.error("krakl-agent: \(recordingAfterFailure(output.path, record: record, frames: encoded?.frames ?? 0))\n") }
    }
    if let statsFailure { failures.append(statsFailure) }
    if summary.frames == 0 && summary.invalidFrames > 0 {
        failures.append(.noValidFrames(backend: backend, invalid: summary.invalidFrames))
    }
    for failure in failures { StandardStream.error("krakl-agent: \(failure.description)\n") }
    if let error = run.sourceError {
        StandardStream.error("krakl-agent: the source reported an error: \(error)\n")
    }
    if let decisive = failures.min(by: { $0.recordingPrecedence < $1.recordingPrecedence }) { return decisive.exitStatus }
    return run.sourceError == nil ? ExitCode.done : ExitCode.sourceReportedError
}

/// What is left of the recording when writing `failed` (the recording or another output) stopped
/// the run, in true words: a recording with no frame in it (the disk filled at the first keyframe:
/// a 200 KB file no player reads) is removed, when it is a plain file; else it holds the frames
/// written before the failure (the encoder counts a frame once its writer took it whole).
func recordingAfterFailure(_ failed: String, record: String?, frames: Int) -> String {
    guard let record else { return "capturing stopped when writing \(failed) failed" }
    var info = stat()
    if frames == 0 {
        if lstat(record, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG && unlink(record) == 0 {
            return "capturing stopped when writing \(failed) failed; \(record) held no frame and was removed"
        }
        return "capturing stopped when writing \(failed) failed; \(record) holds no frame"
    }
    return "capturing stopped when writing \(failed) failed; \(record) holds the \(frames) frame\(frames == 1 ? "" : "s") written before that"
}

/// No more frames are taken and the recording (through the encoder) or, without one, the frame
/// log is completed; a failure becomes the run's encoder error.
func completeEncoderOutputs(_ run: MediaPath, frameLog: FrameLog?) {
    run.finish()
    if run.pipeline == nil {
        do throws(EncoderError) { try frameLog?.close() } catch { run.outputFailed(error) }
    }
}

enum SourceMaking {
    case made(any CaptureSource)
    /// A signal came after `seconds` while create() had not returned.
    case signalled(Int32, seconds: Double)
}

/// Creates the source on a thread of its own while the main thread keeps taking signals: create()
/// may wait for a person (the ScreenCast portal's dialog, up to its 900 s budget) or hang, and
/// SIGINT/SIGTERM/SIGHUP must still end the run then (before, only SIGKILL did).
func makeSourceUntilSignalled(_ selection: BackendSelection, sink: FrameSink, logger: @escaping BackendLogger,
                              control: ControlPipe) throws(HostError) -> SourceMaking {
    let outcome = Guarded<Result<any CaptureSource, HostError>?>(nil)
    let begun = MonotonicClock.nanoseconds()
    // A plain pthread, named from inside as BackendCallThread's are (a Foundation Thread's name does
    // not always reach the system thread, which `top -H` and the tests read).
    final class Body { let run: () -> Void; init(_ run: @escaping () -> Void) { self.run = run } }
    let body = Unmanaged.passRetained(Body {
        nameCurrentThread("krakl-create")   // for `top -H`, gdb and the tests: the thread inside create()
        let result: Result<any CaptureSource, HostError>
        do throws(HostError) { result = .success(try selection.makeSource(sink: sink, logger: logger)) } catch { result = .failure(error) }
        outcome.withLock { $0 = result }
        ControlPipe.wake()
    })
    var maker = pthread_t()
    guard pthread_create(&maker, nil, { raw in
        Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue().run()
        return nil
    }, body.toOpaque()) == 0 else {
        body.release()
        return .made(try selection.makeSource(sink: sink, logger: logger))   // no thread to spare: create here, as before
    }
    pthread_detach(maker)
    // Bounded by the create() budget: the watchdog ends the call after it, and the result comes.
    while true {
        if let result = outcome.withLock({ $0 }) { return .made(try result.get()) }
        switch control.wait(timeout: 1) {
        case .signal(SIGUSR1), .signal(SIGPIPE), .timeout: continue   // no keyframe yet; a pipe is judged when printing
        case .signal(let number):
            if let result = outcome.withLock({ $0 }) { return .made(try result.get()) }
            return .signalled(number, seconds: Double(MonotonicClock.nanoseconds() - begun) / 1e9)
        }
    }
}

func statusLine(_ shot: CaptureStatistics.Snapshot, total: Int) -> String {
    String(cFormat: "%6d frames | %5.1f fps | damage %5.1f%% | latency p50 %.2f ms p99 %.2f ms | %@",
           total, shot.fps, shot.damageShareMean * 100, shot.latencyMs.p50, shot.latencyMs.p99, shot.lastSize)
}

func encoderStatus(_ e: EncoderStatistics.Summary) -> String {
    String(cFormat: "enc %5.0f kbit/s p50 %.1f ms | active %4.1f%%", e.bitrateKbps, e.encodeMs.p50, e.activeShareMean * 100)
}

/// The run's numbers for scripts (bench/, tests) to read, into the file opened before capture.
func writeStatistics(_ file: OutputFile, capture: CaptureStatistics.Snapshot, encoder: EncoderStatistics.Summary?, steadyRSSKB: Int) throws(EncoderError) {
    var object: [String: Any] = [
        "captured_frames": capture.frames, "capture_seconds": capture.seconds, "damage_share": capture.damageShareMean,
        "delivery_latency_ms_p50": capture.latencyMs.p50, "delivery_latency_ms_p99": capture.latencyMs.p99,
        "invalid_frames": capture.invalidFrames,
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
        object["corrected_timestamps"] = e.correctedTimestamps
        object["coalesced_keyframe_requests"] = e.coalescedKeyframeRequests
        object["encoder_cpu_seconds"] = e.cpuSeconds
    }
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    object["peak_rss_kb"] = usage.ru_maxrss
    object["steady_rss_kb"] = steadyRSSKB
    let zeroFill = krakl_zero_fill_read_stats()
    object["zero_fill_released_bytes"] = zeroFill.bytes
    object["process_cpu_seconds"] = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    let text = (try? JSONText.serialize(object, options: [.prettyPrinted, .sortedKeys])) ?? "{}"
    try file.write(Array(text.utf8))
    try file.close()
}

/// VmRSS of this process, kB.
func currentRSSKB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
    return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0
}
