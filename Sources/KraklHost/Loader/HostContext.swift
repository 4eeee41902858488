import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI
import Synchronization

/// What a backend's `krakl_host` and its `host_data` point to. A slot is never freed: a backend
/// thread that outlives destroy() (or a hung backend) may still call through its host struct,
/// and must find valid memory that says "this source is gone" rather than freed memory. Once
/// its context is detached every callback through it is dropped. Retired slots are reused
/// after `reuseAfter` others retired, so the memory kept is bounded (≈ 100 bytes a slot)
/// however many sources a long-running agent makes; a backend thread that calls on after that
/// many later sources reaches a newer source, whose frame checks still hold.
/// Sendable, checked: the C struct is a HostTable, the context is swapped inside a Mutex.
final class HostSlot: Sendable {
    private let table: HostTable
    var host: UnsafeMutablePointer<krakl_host> { table.pointer }
    private let context = Mutex<HostContext?>(nil)

    static let reuseAfter = 256
    private static let retired = Mutex<[HostSlot]>([])

    private init() {
        table = HostTable(HostCallbacks(log: hostLog, frame: hostFrame, event: hostEvent, option: hostOption,
                                        checkOptions: hostCheckOptions, sourceFound: hostSourceFound).makeHost())
        // Retained for the life of the process (see above); host_data is this slot.
        table.pointer.pointee.host_data = Unmanaged.passRetained(self).toOpaque()
    }

    /// A slot for a new context, not serving it yet (`serve`): a long-retired one, or a new one.
    static func take() -> HostSlot {
        retired.withLock { $0.count > reuseAfter ? $0.removeFirst() : nil } ?? HostSlot()
    }

    /// From now on callbacks through the slot reach `context`.
    func serve(_ context: HostContext) {
        self.context.withLock { $0 = context }
    }

    /// The context, while the source exists.
    var current: HostContext? { context.withLock { $0 } }

    /// Detaches the context (every later callback is dropped) and offers the slot for reuse.
    func retire() {
        context.withLock { $0 = nil }
        HostSlot.retired.withLock { $0.append(self) }
    }

    static func from(_ data: UnsafeMutableRawPointer?) -> HostSlot? {
        data.map { Unmanaged<HostSlot>.fromOpaque($0).takeUnretainedValue() }
    }
}

/// The host side of one source (or one list_sources call): options, the frame contract, the
/// sink, and the error line kept for the HostError that reports a failed call. Backend threads
/// call in through C. Sendable, checked: the sink and the mutable state are in Mutexes, the
/// delivery lock is a `Lock`.
final class HostContext: Sendable {
    let backend: String
    let logger: BackendLogger
    /// Frames and events are checked here; nil for list_sources, which delivers neither.
    let contract: FrameContract?
    let slot: HostSlot
    var host: UnsafeMutablePointer<krakl_host> { slot.host }
    private struct SinkReference {
        weak var sink: FrameSink?
    }
    private let sink: Mutex<SinkReference>
    /// Options parsed for host->option(); a failure when the text is not valid JSON.
    let parsed: Result<JSON, JSONParseError>
    private struct State {
        /// C strings handed out by host->option(), kept until the context goes.
        var optionStrings: [String: OptionString] = [:]
        var found: [(name: String, description: String)] = []
        var lastError: String?
        /// How many of the backend's log lines reach the terminal.
        var logLimit = LogRateLimit()
        var capturing = false
        var dead = false
    }
    private let state = Mutex(State())
    /// Serializes frame and event deliveries: the contract says one at a time, and a backend
    /// that calls from two threads at once must not corrupt the host's state. A `Lock`: the
    /// drain waits for it with a bound (`lock(before:)`), which a Mutex cannot.
    private let delivery = Lock()

    init(backend: String, optionsText: String, sink: FrameSink?, logger: @escaping BackendLogger, contract: FrameContract?) {
        self.backend = backend
        self.logger = logger
        self.contract = contract
        self.sink = Mutex(SinkReference(sink: sink))
        var parser = JSONParser(optionsText)
        parsed = Result { () throws(JSONParseError) -> JSON in try parser.parse() }
        slot = HostSlot.take()
        slot.serve(self)
    }

    deinit { state.withLock { $0.optionStrings.values.forEach { $0.free() } } }

    /// What list_sources reported through source_found.
    var found: [(name: String, description: String)] { state.withLock { $0.found } }

    /// While create() or start() runs, error lines are kept for the HostError that reports the
    /// failure instead of printed twice.
    var capturingErrors: Bool {
        get { state.withLock { $0.capturing } }
        set { state.withLock { $0.capturing = newValue } }
    }

    /// The source hung: its frames, events and log lines are dropped from now on. The context
    /// stays attached (never freed): the hung call may still read its options.
    func markDead() {
        state.withLock { $0.dead = true }
        drainDeliveries()
    }

    /// Waits for a delivery already inside the sink to come out (bounded: the sink never blocks
    /// for long), so that once stop() returned or the source died, the caller may finish what the
    /// sink feeds (the encoder, the recording) without a frame arriving in the middle.
    func drainDeliveries() {
        if delivery.lock(before: Date(timeIntervalSinceNow: 1)) { delivery.unlock() }
    }
    var isDead: Bool { state.withLock { $0.dead } }

    /// destroy() returned: nothing of the backend's may reach the host any more.
    func retire() { slot.retire() }

    func log(_ level: LogLevel, _ message: String) {
        let (captured, dead, admitted) = state.withLock { state -> (Bool, Bool, (shown: Bool, notShownBefore: Int)) in
            if level == .error && !state.dead { state.lastError = message }
            let captured = level == .error && state.capturing
            // Only lines that would be printed spend the budget (a captured create() error is the call's reason).
            let admitted = captured || state.dead ? (shown: false, notShownBefore: 0) : state.logLimit.admit(now: MonotonicClock.nanoseconds())
            return (captured, state.dead, admitted)
        }
        if captured || dead || !admitted.shown { return }
        if admitted.notShownBefore > 0 {
            logger(backend, .warning, "\(admitted.notShownBefore) log lines from the backend were not shown (it logs more than \(Int(LogRateLimit.defaultPerSecond)) a second)")
        }
        logger(backend, level, message)
    }

    func takeLastError() -> String? {
        state.withLock { state in
            defer { state.lastError = nil }
            return state.lastError
        }
    }

    /// Runs one delivery under the delivery lock; a delivery that finds another in progress is
    /// a breach of "never two at once" (counted), and waits its turn.
    private func serialized(_ body: () -> Void) {
        if !delivery.tryLock() {
            contract?.note(.concurrentCallbacks, "two threads delivered frames or events for one source at the same time; the host serializes them")
            delivery.lock()
        }
        defer { delivery.unlock() }
        body()
    }

    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        guard let contract, !isDead else { return }
        let received = MonotonicClock.nanoseconds()
        serialized {
            let sink = self.sink.withLock { $0.sink }
            switch contract.admit(pointer, receivedNs: received) {
            case .drop: return
            case .unchecked: sink?.frame(pointer)
            case .admitted(var frame): withUnsafePointer(to: &frame) { sink?.frame($0) }
            }
        }
    }

    func event(_ event: SourceEvent) {
        guard let contract, !isDead else { return }
        serialized {
            guard contract.admitEvent(event) else { return }
            sink.withLock { $0.sink }?.event(event)
        }
    }

    func sourceFound(name: String, description: String) {
        guard !isDead else { return }
        state.withLock { $0.found.append((name, description)) }
    }

    func option(_ key: String) -> UnsafePointer<CChar>? {
        guard case .success(.object(let object)) = parsed, let value = object[key] else { return nil }
        return state.withLock { state in
            if let existing = state.optionStrings[key] { return existing }
            let copy = OptionString(value.optionText)
            state.optionStrings[key] = copy
            return copy
        }.pointer
    }

    func checkOptions(_ known: [String]) -> Int32 {
        switch parsed {
        case .failure(let error):
            log(.error, "options are not valid JSON (\(error.line):\(error.column): \(error.message))")
            return -EINVAL
        case .success(.object(let object)):
            for key in object.keys where !known.contains(key) {
                log(.error, "unknown option \"\(key)\" for backend \(backend); known options: \(known.joined(separator: ", "))")
                return -EINVAL
            }
            return 0
        case .success(let other):
            log(.error, "options must be a JSON object, not \(other.typeName)")
            return -EINVAL
        }
    }
}

/// One option's value as a C string for host->option() (strdup), held by its address: the
/// context owns it and frees it in its deinit, and nothing writes it after the copy, so the
/// address may pass between the threads a backend calls from.
private struct OptionString: Sendable {
    private let address: UInt
    init(_ text: String) { address = UInt(bitPattern: strdup(text)!) }
    var pointer: UnsafePointer<CChar> { UnsafePointer(bitPattern: address)! }
    func free() { Glibc.free(UnsafeMutableRawPointer(bitPattern: address)) }
}

// The C entry points of krakl_host. Every string a backend passes is read bounded and
// sanitized (BackendText); every callback through a retired slot is dropped.

private let hostLog: @convention(c) (UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void = { data, level, message in
    guard let context = HostSlot.from(data)?.current else { return }
    context.log(LogLevel(rawValue: min(max(level, 0), 3))!, BackendText.read(message) ?? "(null)")
}

private let hostFrame: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_frame>?) -> Void = { data, frame in
    guard let context = HostSlot.from(data)?.current else { return }
    guard let frame else {
        context.contract?.note(.malformedCallback, "ignored host->frame(NULL)")
        return
    }
    context.frame(frame)
}

private let hostEvent: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_event>?) -> Void = { data, raw in
    guard let context = HostSlot.from(data)?.current else { return }
    guard let raw else {
        context.contract?.note(.malformedCallback, "ignored host->event(NULL)")
        return
    }
    // Size rule: read only what the backend wrote.
    let event = copyBySizeRule(raw, declaredSize: Int(raw.pointee.struct_size), as: krakl_event.self)
    context.event(SourceEvent(kind: .init(eventType: event.type), error: event.error, message: BackendText.read(event.message),
                              format: event.format, width: Int(event.width), height: Int(event.height)))
}

private let hostOption: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> UnsafePointer<CChar>? = { data, key in
    guard let key, let context = HostSlot.from(data)?.current else { return nil }
    return context.option(String(cString: key))
}

/// More keys than any backend has options: a larger count is a bogus one, not read.
private let maximumKnownKeys = 4096

private let hostCheckOptions: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UnsafePointer<CChar>?>?, Int) -> Int32 = { data, keys, count in
    guard let context = HostSlot.from(data)?.current else { return -EINVAL }
    guard count >= 0, count <= maximumKnownKeys, count == 0 || keys != nil else {
        context.log(.error, "check_options() was called with \(count) keys\(keys == nil ? " and no array" : ""); pass the array of known option names and its length")
        return -EINVAL
    }
    let known = (0..<count).compactMap { keys?[$0].flatMap { BackendText.read($0) } }
    return context.checkOptions(known)
}

private let hostSourceFound: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = { data, name, description in
    guard let context = HostSlot.from(data)?.current else { return }
    context.sourceFound(name: BackendText.read(name) ?? "", description: BackendText.read(description) ?? "")
}
