import KraklBase
import Foundation
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
/// @unchecked Sendable: every recorded callback is under `condition`, which the checks wait on.
final class CallbackRecorder: @unchecked Sendable {
    let backend: String
    /// Parses the options and answers host->option / host->check_options
    /// exactly as the agent does (its other callbacks are unused).
    private var options: HostContext!
    let host: UnsafeMutablePointer<krakl_host>
    private let echo: BackendLogger?
    private let condition = NSCondition()
    /// The suite's own thread: a callback made from inside start() runs on
    /// it and is not counted as the backend's delivery thread.
    private let controlThread = pthread_self()

    private var phase = DrivenPhase.creating
    private var inFlight = 0
    private(set) var starts = 0
    private var threadsThisStart: [pthread_t] = []
    private var lastThread: pthread_t?
    private var framesThisStart = 0
    private var firstFrameThisStart: UInt64?
    private var expectWhole = false
    private var lastShape: (format: UInt32, width: Int, height: Int)?
    private var announced: (format: UInt32, width: Int, height: Int)?
    private var lastTimestamp: UInt64 = 0
    private var ended = false
    private(set) var endMessage: String?
    private var counts = (frames: 0, events: 0, beforeStart: 0, afterStop: 0, afterEnd: 0, afterDestroy: 0, damageRects: 0)
    private var sizes: Set<String> = []
    private var found: [(name: String, description: String)] = []
    private var lastError: String?
    private var problemsFound = CallbackProblems()

    /// Every recorder made in this process, kept alive for the process's life (see above).
    nonisolated(unsafe) private static var kept: [CallbackRecorder] = []
    private static let keptLock = NSLock()

    /// - Parameters:
    ///   - optionsText: what create() gets (the suite also passes bad text on purpose).
    ///   - echo: where backend log lines go; nil keeps them quiet (expected errors).
    init(backend: String, optionsText: String, echo: BackendLogger?) {
        self.backend = backend
        self.echo = echo
        host = HostCallbacks(log: recorderLog, frame: recorderFrame, event: recorderEvent, option: recorderOption,
                             checkOptions: recorderCheckOptions, sourceFound: recorderSourceFound).makeHost()
        host.pointee.host_data = Unmanaged.passUnretained(self).toOpaque()
        options = HostContext(backend: backend, optionsText: optionsText, sink: nil, logger: { [unowned self] _, level, message in
            self.log(level, message)
        }, contract: nil)
        Self.keptLock.withLock { Self.kept.append(self) }
    }

    static func from(_ data: UnsafeMutableRawPointer?) -> CallbackRecorder {
        Unmanaged<CallbackRecorder>.fromOpaque(data!).takeUnretainedValue()
    }

    // MARK: what the driver tells it

    func set(_ new: DrivenPhase) {
        condition.lock()
        phase = new
        if new == .started {
            starts += 1
            threadsThisStart = []
            framesThisStart = 0
            firstFrameThisStart = nil
            expectWhole = true
            lastShape = nil
            announced = nil
            ended = false
        }
        condition.broadcast()
        condition.unlock()
    }

    // MARK: callbacks (any thread)

    /// Judges the phase and the calling thread, and marks a callback as
    /// running. Returns whether delivery is allowed now.
    private func enter(_ what: String, delivery: Bool) -> (allowed: Bool, hold: UInt32) {
        condition.lock()
        defer { condition.unlock() }
        if phase == .destroyed {
            counts.afterDestroy += 1
            if problemsFound.afterDestroy == nil { problemsFound.afterDestroy = "host->\(what) was called after destroy() returned" }
            return (false, 0)
        }
        guard delivery else { return (true, 0) }
        switch phase {
        case .creating, .created:
            counts.beforeStart += 1
            if problemsFound.beforeStart == nil {
                problemsFound.beforeStart = phase == .creating ? "host->\(what) was called from inside create()" : "host->\(what) was called after create() returned, before start()"
            }
            return (false, 0)
        case .stopped, .destroying:
            counts.afterStop += 1
            if problemsFound.afterStop == nil { problemsFound.afterStop = "host->\(what) was called after stop() returned" }
            return (false, 0)
        case .started, .destroyed:
            break
        }
        let thread = pthread_self()
        if thread != controlThread && !threadsThisStart.contains(thread) {
            threadsThisStart.append(thread)
            if threadsThisStart.count == 2 && problemsFound.threads == nil {
                problemsFound.threads = "after start() #\(starts), host->frame/event came from two different threads: one thread per start() may deliver"
            }
        }
        inFlight += 1
        if inFlight > 1 && problemsFound.overlap == nil {
            problemsFound.overlap = "host->\(what) was called while another frame or event callback for the source was still running (from \(threadsThisStart.count) threads)"
        }
        // Each delivery callback stays open for a moment, so a second thread
        // calling at the same time is caught overlapping it rather than only
        // when the two meet within a few instructions; longer when the
        // calling thread just changed, which is when a second one is active.
        defer { lastThread = thread }
        return (true, lastThread == nil || lastThread == thread ? 1000 : 20_000)
    }

    private func leave() {
        condition.lock()
        inFlight -= 1
        condition.broadcast()
        condition.unlock()
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
        condition.lock()
        defer { condition.broadcast(); condition.unlock() }
        counts.frames += 1
        framesThisStart += 1
        if firstFrameThisStart == nil { firstFrameThisStart = now }
        let label = "frame \(framesThisStart) after start() #\(starts)"
        if ended {
            counts.afterEnd += 1
            if problemsFound.afterEnd == nil { problemsFound.afterEnd = "\(label) came after SOURCE_ENDED" }
        }
        if let geometry {
            if problemsFound.geometry == nil { problemsFound.geometry = "\(label): \(geometry)" }
            return
        }
        let shape = (format: info.format, width: info.width, height: info.height)
        sizes.insert("\(FrameCheck.formatName(shape.format)) \(shape.width)x\(shape.height)")
        if let announced {
            if announced != shape && problemsFound.shape == nil {
                problemsFound.shape = "FORMAT_CHANGED announced \(Self.describe(announced)) but the next frame (\(label)) is \(Self.describe(shape))"
            }
            self.announced = nil
        } else if let last = lastShape, last != shape, problemsFound.shape == nil {
            problemsFound.shape = "\(label) is \(Self.describe(shape)), the previous was \(Self.describe(last)), with no FORMAT_CHANGED event between"
        }
        lastShape = shape
        if expectWhole {
            expectWhole = false
            if info.raw.damage_count != 0 && problemsFound.firstWhole == nil {
                problemsFound.firstWhole = "\(label) names \(info.raw.damage_count) damage rectangle(s); the first frame after start() or FORMAT_CHANGED must have damage_count == 0 (the whole frame)"
            }
        }
        let stamp = info.raw.timestamp_ns
        if stamp <= lastTimestamp && problemsFound.order == nil {
            problemsFound.order = "\(label): timestamp \(stamp) ns is not after the previous \(lastTimestamp) ns"
        }
        lastTimestamp = max(lastTimestamp, stamp)
        if problemsFound.clock == nil {
            if stamp > now + ConformanceBudget.clockAhead {
                problemsFound.clock = "\(label): timestamp \(stamp) ns is \(Self.milliseconds(stamp - now)) ahead of CLOCK_MONOTONIC (\(now) ns when it arrived): stamp frames with clock_gettime(CLOCK_MONOTONIC) at capture"
            } else if now > stamp && now - stamp > ConformanceBudget.clockBehind {
                problemsFound.clock = "\(label): timestamp \(stamp) ns is \(Self.milliseconds(now - stamp)) older than CLOCK_MONOTONIC (\(now) ns) when it arrived: stamp frames with clock_gettime(CLOCK_MONOTONIC) at capture"
            }
        }
        counts.damageRects += info.damage.count
        if problemsFound.damage == nil, let problem = FrameCheck.damageProblem(info) { problemsFound.damage = "\(label): \(problem)" }
    }

    func event(_ event: SourceEvent) {
        let entered = enter("event", delivery: true)
        guard entered.allowed else { return }
        defer { leave() }
        usleep(entered.hold)
        condition.lock()
        defer { condition.broadcast(); condition.unlock() }
        counts.events += 1
        switch event.kind {
        case .sourceEnded:
            ended = true
            endMessage = event.message
        case .formatChanged:
            announced = (event.format, event.width, event.height)
            expectWhole = true
        case .unknown(let type):
            if problemsFound.malformed == nil { problemsFound.malformed = "an event of type \(type), which krakl_backend.h does not define" }
        default:
            break
        }
    }

    /// A callback the header does not allow in any phase (a NULL frame or event).
    func malformed(_ what: String) {
        condition.lock()
        defer { condition.broadcast(); condition.unlock() }
        if problemsFound.malformed == nil { problemsFound.malformed = "\(what): a frame or event must be given" }
    }

    func log(_ level: LogLevel, _ message: String) {
        // After destroy() a line is counted, not shown: a thread left behind may repeat it forever.
        guard enter("log", delivery: false).allowed else { return }
        condition.lock()
        if level == .error { lastError = message }
        condition.unlock()
        echo?(backend, level, message)
    }

    func option(_ key: String) -> UnsafePointer<CChar>? {
        _ = enter("option", delivery: false)
        return options.option(key)
    }

    func checkOptions(_ known: [String]) -> Int32 {
        _ = enter("check_options", delivery: false)
        return options.checkOptions(known)
    }

    func sourceFound(_ name: String, _ description: String) {
        condition.lock()
        found.append((name, description))
        condition.unlock()
    }

    // MARK: what the checks read

    var problems: CallbackProblems { condition.lock(); defer { condition.unlock() }; return problemsFound }
    var frameCount: Int { condition.lock(); defer { condition.unlock() }; return counts.frames }
    var damageRectCount: Int { condition.lock(); defer { condition.unlock() }; return counts.damageRects }
    var sizeDescription: String { condition.lock(); defer { condition.unlock() }; return sizes.sorted().joined(separator: ", ") }
    var sources: [(name: String, description: String)] { condition.lock(); defer { condition.unlock() }; return found }
    var callbackCounts: (beforeStart: Int, afterStop: Int, afterEnd: Int, afterDestroy: Int) {
        condition.lock(); defer { condition.unlock() }
        return (counts.beforeStart, counts.afterStop, counts.afterEnd, counts.afterDestroy)
    }
    var threadCount: Int { condition.lock(); defer { condition.unlock() }; return threadsThisStart.count }

    /// The last error line the backend logged, cleared by reading it.
    func takeLastError() -> String? {
        condition.lock(); defer { condition.unlock() }
        defer { lastError = nil }
        return lastError
    }

    /// Waits (bounded) for the first frame after the last start(), or SOURCE_ENDED.
    /// Returns whether a frame came, and how long after `since` (ns).
    func waitForFirstFrame(timeout: Double, since: UInt64) -> (arrived: Bool, delay: Double, ended: Bool) {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { firstFrameThisStart == nil && !ended }, until: Date().addingTimeInterval(timeout))
        let delay = firstFrameThisStart.map { Double($0 &- since) / 1e9 } ?? 0
        return (firstFrameThisStart != nil, delay, ended)
    }

    /// The observation window: until `frames` frames of this start() came,
    /// `seconds` passed since its first frame, or the source ended.
    func waitForWindow(frames: Int, seconds: Double) {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date(timeIntervalSinceNow: seconds)
        _ = condition.wait(while: { framesThisStart < frames && !ended }, until: deadline)
    }

    func waitForEnd(timeout: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return condition.wait(while: { !ended }, until: Date().addingTimeInterval(timeout))
    }

    /// Watches for `seconds` (an observation window, not a wait for readiness).
    func observe(for seconds: Double) {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { true }, until: Date().addingTimeInterval(seconds))
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
