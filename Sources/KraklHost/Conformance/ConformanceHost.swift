import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// Where a source the suite drives is in its life. Which host callbacks the
/// header allows depends on it: frames and events only between start() and
/// the return of stop(), anything at all only until destroy() returns.
enum DrivenPhase { case creating, created, started, stopped, destroying, destroyed }

/// The contract problems the callbacks showed, the first of each kind (with
/// the frame it was seen on), for the checks to report.
struct CallbackProblems {
    var geometry: String?
    var damage: String?
    var firstWhole: String?
    var shape: String?
    var order: String?
    var clock: String?
    var overlap: String?
    var threads: String?
    var beforeStart: String?
    var afterStop: String?
    var afterDestroy: String?
    var afterEnd: String?
    /// host->frame(NULL), host->event(NULL), an event type the header does not define.
    var malformed: String?
}

/// The suite's own `krakl_host` for one source, and the record of every
/// callback the backend made through it. The suite judges the backend as
/// its raw callbacks show it, not through BackendSource: the agent's host
/// repairs or drops what breaks the contract (late frames, partial first
/// frames), which would hide exactly what conformance must report.
///
/// Never freed: a backend that calls after destroy() (a thread left
/// behind) must find a live host, so the suite can report it and survive.
final class CallbackRecorder: Sendable {
    let backend: String
    private let table: HostTable
    var host: UnsafeMutablePointer<krakl_host> { table.pointer }
    private let echo: BackendLogger?
    /// The suite's own thread: a callback made from inside start() runs on
    /// it and is not counted as the backend's delivery thread.
    private let controlThread = pthread_self()

    /// Every recorded callback; the checks wait on it.
    private struct Record {
        /// Parses the options and answers host->option / host->check_options
        /// exactly as the agent does (its other callbacks are unused). Set in init.
        var options: HostContext?
        var phase = DrivenPhase.creating
        var inFlight = 0
        var starts = 0
        var threadsThisStart: [pthread_t] = []
        var lastThread: pthread_t?
        var framesThisStart = 0
        var firstFrameThisStart: UInt64?
        var expectWhole = false
        var lastShape: (format: UInt32, width: Int, height: Int)?
        var announced: (format: UInt32, width: Int, height: Int)?
        var lastTimestamp: UInt64 = 0
        var ended = false
        var endMessage: String?
        var counts = (frames: 0, events: 0, beforeStart: 0, afterStop: 0, afterEnd: 0, afterDestroy: 0, damageRects: 0)
        var sizes: Set<String> = []
        var found: [(name: String, description: String)] = []
        var lastError: String?
        var problemsFound = CallbackProblems()
    }
    private let record = Guarded(Record())

    /// Every recorder made in this process, kept alive for the process's life (see above).
    private static let kept = Guarded<[CallbackRecorder]>([])

    /// - Parameters:
    ///   - optionsText: what create() gets (the suite also passes bad text on purpose).
    ///   - echo: where backend log lines go; nil keeps them quiet (expected errors).
    init(backend: String, optionsText: String, echo: BackendLogger?) {
        self.backend = backend
        self.echo = echo
        table = HostTable(HostCallbacks(log: recorderLog, frame: recorderFrame, event: recorderEvent, option: recorderOption,
                                        checkOptions: recorderCheckOptions, sourceFound: recorderSourceFound).makeHost())
        table.pointer.pointee.host_data = Unmanaged.passUnretained(self).toOpaque()
        let options = HostContext(backend: backend, optionsText: optionsText, sink: nil, logger: { [unowned self] _, level, message in
            self.log(level, message)
        }, contract: nil)
        record.withLock { $0.options = options }
        Self.kept.withLock { $0.append(self) }
    }

    static func from(_ data: UnsafeMutableRawPointer?) -> CallbackRecorder {
        Unmanaged<CallbackRecorder>.fromOpaque(data!).takeUnretainedValue()
    }

    /// start() calls so far.
    var starts: Int { record.withLock { $0.starts } }
    /// SOURCE_ENDED's message after the last start().
    var endMessage: String? { record.withLock { $0.endMessage } }

    // MARK: what the driver tells it

    func set(_ new: DrivenPhase) {
        record.change { r in
            r.phase = new
            if new == .started {
                r.starts += 1
                r.threadsThisStart = []
                r.framesThisStart = 0
                r.firstFrameThisStart = nil
                r.expectWhole = true
                r.lastShape = nil
                r.announced = nil
                r.ended = false
            }
        }
    }

    // MARK: callbacks (any thread)

    /// Judges the phase and the calling thread, and marks a callback as
    /// running. Returns whether delivery is allowed now.
    private func enter(_ what: String, delivery: Bool) -> (allowed: Bool, hold: UInt32) {
        record.withLock { r in
            if r.phase == .destroyed {
                r.counts.afterDestroy += 1
                if r.problemsFound.afterDestroy == nil { r.problemsFound.afterDestroy = "host->\(what) was called after destroy() returned" }
                return (false, 0)
            }
            guard delivery else { return (true, 0) }
            switch r.phase {
            case .creating, .created:
                r.counts.beforeStart += 1
                if r.problemsFound.beforeStart == nil {
                    r.problemsFound.beforeStart = r.phase == .creating ? "host->\(what) was called from inside create()" : "host->\(what) was called after create() returned, before start()"
                }
                return (false, 0)
            case .stopped, .destroying:
                r.counts.afterStop += 1
                if r.problemsFound.afterStop == nil { r.problemsFound.afterStop = "host->\(what) was called after stop() returned" }
                return (false, 0)
            case .started, .destroyed:
                break
            }
            let thread = pthread_self()
            if thread != controlThread && !r.threadsThisStart.contains(thread) {
                r.threadsThisStart.append(thread)
                if r.threadsThisStart.count == 2 && r.problemsFound.threads == nil {
                    r.problemsFound.threads = "after start() #\(r.starts), host->frame/event came from two different threads: one thread per start() may deliver"
                }
            }
            r.inFlight += 1
            if r.inFlight > 1 && r.problemsFound.overlap == nil {
                r.problemsFound.overlap = "host->\(what) was called while another frame or event callback for the source was still running (from \(r.threadsThisStart.count) threads)"
            }
            // Each delivery callback stays open for a moment, so a second thread
            // calling at the same time is caught overlapping it rather than only
            // when the two meet within a few instructions; longer when the
            // calling thread just changed, which is when a second one is active.
            defer { r.lastThread = thread }
            return (true, r.lastThread == nil || r.lastThread == thread ? 1000 : 20_000)
        }
    }

    private func leave() {
        record.change { $0.inFlight -= 1 }
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let now = MonotonicClock.nanoseconds()
        let entered = enter("frame", delivery: true)
        guard entered.allowed else { return }
        defer { leave() }
        usleep(entered.hold)
        let geometry = FrameCheck.geometryProblem(pointer)
        let info = FrameInfo(pointer)
        if geometry == nil { FrameCheck.touchPixels(info) }
        record.change { r in
            r.counts.frames += 1
            r.framesThisStart += 1
            if r.firstFrameThisStart == nil { r.firstFrameThisStart = now }
            let label = "frame \(r.framesThisStart) after start() #\(r.starts)"
            if r.ended {
                r.counts.afterEnd += 1
                if r.problemsFound.afterEnd == nil { r.problemsFound.afterEnd = "\(label) came after SOURCE_ENDED" }
            }
            if let geometry {
                if r.problemsFound.geometry == nil { r.problemsFound.geometry = "\(label): \(geometry)" }
                return
            }
            let shape = (format: info.format, width: info.width, height: info.height)
            r.sizes.insert("\(FrameCheck.formatName(shape.format)) \(shape.width)x\(shape.height)")
            if let announced = r.announced {
                if announced != shape && r.problemsFound.shape == nil {
                    r.problemsFound.shape = "FORMAT_CHANGED announced \(Self.describe(announced)) but the next frame (\(label)) is \(Self.describe(shape))"
                }
                r.announced = nil
            } else if let last = r.lastShape, last != shape, r.problemsFound.shape == nil {
                r.problemsFound.shape = "\(label) is \(Self.describe(shape)), the previous was \(Self.describe(last)), with no FORMAT_CHANGED event between"
            }
            r.lastShape = shape
            if r.expectWhole {
                r.expectWhole = false
                if info.raw.damage_count != 0 && r.problemsFound.firstWhole == nil {
                    r.problemsFound.firstWhole = "\(label) names \(info.raw.damage_count) damage rectangle(s); the first frame after start() or FORMAT_CHANGED must have damage_count == 0 (the whole frame)"
                }
            }
            let stamp = info.raw.timestamp_ns
            if stamp <= r.lastTimestamp && r.problemsFound.order == nil {
                r.problemsFound.order = "\(label): timestamp \(stamp) ns is not after the previous \(r.lastTimestamp) ns"
            }
            r.lastTimestamp = max(r.lastTimestamp, stamp)
            if r.problemsFound.clock == nil {
                if stamp > now + ConformanceBudget.clockAhead {
                    r.problemsFound.clock = "\(label): timestamp \(stamp) ns is \(Self.milliseconds(stamp - now)) ahead of CLOCK_MONOTONIC (\(now) ns when it arrived): stamp frames with clock_gettime(CLOCK_MONOTONIC) at capture"
                } else if now > stamp && now - stamp > ConformanceBudget.clockBehind {
                    r.problemsFound.clock = "\(label): timestamp \(stamp) ns is \(Self.milliseconds(now - stamp)) older than CLOCK_MONOTONIC (\(now) ns) when it arrived: stamp frames with clock_gettime(CLOCK_MONOTONIC) at capture"
                }
            }
            r.counts.damageRects += info.damage.count
            if r.problemsFound.damage == nil, let problem = FrameCheck.damageProblem(info) { r.problemsFound.damage = "\(label): \(problem)" }
        }
    }

    func event(_ event: SourceEvent) {
        let entered = enter("event", delivery: true)
        guard entered.allowed else { return }
        defer { leave() }
        usleep(entered.hold)
        record.change { r in
            r.counts.events += 1
            switch event.kind {
            case .sourceEnded:
                r.ended = true
                r.endMessage = event.message
            case .formatChanged:
                r.announced = (event.format, event.width, event.height)
                r.expectWhole = true
            case .unknown(let type):
                if r.problemsFound.malformed == nil { r.problemsFound.malformed = "an event of type \(type), which krakl_backend.h does not define" }
            default:
                break
            }
        }
    }

    /// A callback the header does not allow in any phase (a NULL frame or event).
    func malformed(_ what: String) {
        record.change { r in
            if r.problemsFound.malformed == nil { r.problemsFound.malformed = "\(what): a frame or event must be given" }
        }
    }

    func log(_ level: LogLevel, _ message: String) {
        // After destroy() a line is counted, not shown: a thread left behind may repeat it forever.
        guard enter("log", delivery: false).allowed else { return }
        if level == .error { record.withLock { $0.lastError = message } }
        echo?(backend, level, message)
    }

    func option(_ key: String) -> UnsafePointer<CChar>? {
        _ = enter("option", delivery: false)
        return record.withLock { $0.options }!.option(key)
    }

    func checkOptions(_ known: [String]) -> Int32 {
        _ = enter("check_options", delivery: false)
        return record.withLock { $0.options }!.checkOptions(known)
    }

    func sourceFound(_ name: String, _ description: String) {
        record.withLock { $0.found.append((name, description)) }
    }

    // MARK: what the checks read

    var problems: CallbackProblems { record.withLock { $0.problemsFound } }
    var frameCount: Int { record.withLock { $0.counts.frames } }
    var damageRectCount: Int { record.withLock { $0.counts.damageRects } }
    var sizeDescription: String { record.withLock { $0.sizes.sorted().joined(separator: ", ") } }
    var sources: [(name: String, description: String)] { record.withLock { $0.found } }
    var callbackCounts: (beforeStart: Int, afterStop: Int, afterEnd: Int, afterDestroy: Int) {
        record.withLock { ($0.counts.beforeStart, $0.counts.afterStop, $0.counts.afterEnd, $0.counts.afterDestroy) }
    }
    var threadCount: Int { record.withLock { $0.threadsThisStart.count } }

    /// The last error line the backend logged, cleared by reading it.
    func takeLastError() -> String? {
        record.withLock { r in
            defer { r.lastError = nil }
            return r.lastError
        }
    }

    /// Waits (bounded) for the first frame after the last start(), or SOURCE_ENDED.
    /// Returns whether a frame came, and how long after `since` (ns).
    func waitForFirstFrame(timeout: Double, since: UInt64) -> (arrived: Bool, delay: Double, ended: Bool) {
        record.wait(until: Date().addingTimeInterval(timeout), for: { $0.firstFrameThisStart != nil || $0.ended }) { r, _ in
            let delay = r.firstFrameThisStart.map { Double($0 &- since) / 1e9 } ?? 0
            return (r.firstFrameThisStart != nil, delay, r.ended)
        }
    }

    /// The observation window: until `frames` frames of this start() came,
    /// `seconds` passed since its first frame, or the source ended.
    func waitForWindow(frames: Int, seconds: Double) {
        record.wait(until: Date(timeIntervalSinceNow: seconds), for: { $0.framesThisStart >= frames || $0.ended }) { _, _ in }
    }

    func waitForEnd(timeout: Double) -> Bool {
        record.wait(until: Date().addingTimeInterval(timeout), for: { $0.ended }) { _, done in done }
    }

    /// Watches for `seconds` (an observation window, not a wait for readiness).
    func observe(for seconds: Double) {
        record.wait(until: Date().addingTimeInterval(seconds), for: { _ in false }) { _, _ in }
    }

    private static func describe(_ shape: (format: UInt32, width: Int, height: Int)) -> String {
        "\(shape.width)x\(shape.height) \(FrameCheck.formatName(shape.format))"
    }

    private static func milliseconds(_ nanoseconds: UInt64) -> String {
        nanoseconds >= 10_000_000_000 ? "\(nanoseconds / 1_000_000_000) s" : "\(nanoseconds / 1_000_000) ms"
    }
}

private let recorderLog: @convention(c) (UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void = { data, level, message in
    CallbackRecorder.from(data).log(LogLevel(rawValue: min(max(level, 0), 3))!, message.map { String(cString: $0) } ?? "(null)")
}

private let recorderFrame: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_frame>?) -> Void = { data, frame in
    guard let frame else {
        CallbackRecorder.from(data).malformed("host->frame(NULL)")
        return
    }
    CallbackRecorder.from(data).frame(frame)
}

private let recorderEvent: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_event>?) -> Void = { data, raw in
    guard let raw else {
        CallbackRecorder.from(data).malformed("host->event(NULL)")
        return
    }
    let event = copyBySizeRule(raw, declaredSize: Int(raw.pointee.struct_size), as: krakl_event.self)
    CallbackRecorder.from(data).event(SourceEvent(kind: .init(eventType: event.type), error: event.error, message: event.message.map { String(cString: $0) },
                                                  format: event.format, width: Int(event.width), height: Int(event.height)))
}

private let recorderOption: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> UnsafePointer<CChar>? = { data, key in
    guard let key else { return nil }
    return CallbackRecorder.from(data).option(String(cString: key))
}

private let recorderCheckOptions: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UnsafePointer<CChar>?>?, Int) -> Int32 = { data, keys, count in
    let known = (0..<max(count, 0)).compactMap { keys?[$0].map { String(cString: $0) } }
    return CallbackRecorder.from(data).checkOptions(known)
}

private let recorderSourceFound: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = { data, name, description in
    CallbackRecorder.from(data).sourceFound(name.map { String(cString: $0) } ?? "", description.map { String(cString: $0) } ?? "")
}
