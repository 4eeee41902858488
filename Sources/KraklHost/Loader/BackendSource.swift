import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// An event a backend sent, copied out of the borrowed C struct.
public struct SourceEvent: Sendable, Equatable {
    public enum Kind: Sendable, Equatable { case sourceEnded, formatChanged, error, unknown(UInt32) }
    public let kind: Kind
    public let error: Int32
    public let message: String?
    public let format: UInt32
    public let width: Int
    public let height: Int
}

/// Where a source's frames and events go. Both are called on the backend's
/// capture thread; the frame is borrowed until the call returns.
public protocol FrameSink: AnyObject, Sendable {
    func frame(_ frame: UnsafePointer<krakl_frame>)
    func event(_ event: SourceEvent)
}

public enum LogLevel: Int32, Sendable, Comparable {
    case error = 0, warning, info, debug
    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
    var label: String { ["error", "warning", "info", "debug"][Int(rawValue)] }
}

/// Where backend log lines go: (backend name, level, message).
public typealias BackendLogger = @Sendable (String, LogLevel, String) -> Void

/// Writes backend log lines to stderr, hiding levels above `maximum`.
public func stderrLogger(maximum: LogLevel) -> BackendLogger {
    { backend, level, message in
        guard level <= maximum else { return }
        StandardStream.error("krakl-agent: [\(backend)] \(level.label): \(message)\n")
    }
}

/// One created backend source, loaded into this process: owns the `krakl_host` handed to the
/// backend (through a HostContext), the control thread every call into the backend runs on, and
/// the create/start/stop/destroy sequence. Each call has a budget (CallBudgets); a call that
/// overruns throws `.backendHung`, and the source is dead from then on: later calls throw the
/// same error, its callbacks are dropped, and destroy() is never called while stop() still runs.
/// Deinit stops and destroys it, blocking at most the stop and destroy budgets.
public final class BackendSource: CaptureSource {
    public let library: BackendLibrary
    public let backendName: String
    public let budgets: CallBudgets
    private let context: HostContext
    private let calls: BackendCallThread
    /// The control thread's kernel id (set once it ran the backend's create()): for the tests.
    var controlThreadID: pid_t { calls.kernelThreadID }
    /// One control call at a time, whichever thread makes it.
    private let control = Lock()
    private var source: OpaquePointer?
    private var started = false
    private var hung: HostError?

    /// Calls the backend's create() with `options` (normally a JSON object's text; conformance also
    /// passes bad text on purpose). `maximumFrameRate` caps what the host takes from the backend.
    public init(library: BackendLibrary, backendName: String, optionsText: String, sink: FrameSink?,
                logger: @escaping BackendLogger, budgets: CallBudgets = .standard,
                maximumFrameRate: Double = FrameContract.defaultMaximumFrameRate) throws(HostError) {
        self.library = library
        self.backendName = backendName
        self.budgets = budgets
        context = HostContext(backend: backendName, optionsText: optionsText, sink: sink, logger: logger,
                              contract: FrameContract(backend: backendName, logger: logger, maximumFrameRate: maximumFrameRate))
        calls = BackendCallThread(name: "krakl-ctl")
        let create = library.table.create!
        let host = UnsafePointer(context.host)
        context.capturingErrors = true
        let outcome = calls.call(budget: budgets.create) { () -> (status: Int32, created: OpaquePointer?) in
            var created: OpaquePointer?
            let status = optionsText.withCString { create($0, host, &created) }
            return (status, created)
        }
        context.capturingErrors = false
        guard let outcome else {
            context.markDead()
            calls.end()
            throw .backendHung(backend: backendName, call: "create", budgetSeconds: budgets.create.inSeconds)
        }
        guard outcome.status == 0, let created = outcome.created else {
            // A failed create() leaves nothing to destroy (also when it returned a value the ABI
            // does not define: that is a failure too, krakl_backend.h "Return values").
            let reason = context.takeLastError()
            calls.end()
            context.retire()
            switch outcome.status {
            case 0: throw .createFailed(backend: backendName, code: -EINVAL, message: reason ?? "create() returned 0 but no source")
            case ..<0: throw .createFailed(backend: backendName, code: outcome.status, message: reason ?? "the backend gave no reason")
            default: throw .createFailed(backend: backendName, code: outcome.status, message: reason ?? "create() failed")
            }
        }
        source = created
        context.contract?.created()
    }

    public convenience init(library: BackendLibrary, backendName: String, options: JSONObject, sink: FrameSink?,
                            logger: @escaping BackendLogger, budgets: CallBudgets = .standard,
                            maximumFrameRate: Double = FrameContract.defaultMaximumFrameRate) throws(HostError) {
        try self.init(library: library, backendName: backendName, optionsText: JSON.object(options).serialized,
                      sink: sink, logger: logger, budgets: budgets, maximumFrameRate: maximumFrameRate)
    }

    deinit { try? destroy() }

    public var isStarted: Bool { control.withLock { started } }

    /// Whether a call overran its budget (the source is dead).
    public var hungError: HostError? { control.withLock { hung } }

    /// The contract breaches the host repaired or dropped, per kind (for conformance and reports).
    public var violations: [(kind: ContractViolation, count: Int, first: String)] { context.contract?.violations ?? [] }

    public func start() throws(HostError) {
        control.lock()
        defer { control.unlock() }
        if let hung { throw hung }
        guard let source, !started else { return }
        let start = library.table.start!
        context.contract?.starting()
        _ = context.takeLastError()
        context.capturingErrors = true
        let status = calls.call(budget: budgets.start) { start(source) }
        context.capturingErrors = false
        guard let status else { throw died(in: "start", budget: budgets.start) }
        if status == 0 {
            started = true
            return
        }
        let reason = context.takeLastError()
        // A start() that failed may have begun all the same (a positive value says nothing about
        // it); stop() is safe on a source that did not start, so it is called to be sure.
        let stop = library.table.stop!
        if calls.call(budget: budgets.stop, { stop(source) }) == nil {
            hung = .backendHung(backend: backendName, call: "stop", budgetSeconds: budgets.stop.inSeconds)
            context.markDead()
            calls.end()
        }
        context.contract?.stopped()
        throw .startFailed(backend: backendName, code: status,
                           message: reason ?? (status > 0 ? "start() failed" : "the backend gave no reason"))
    }

    public func stop() throws(HostError) {
        control.lock()
        defer { control.unlock() }
        try stopLocked()
    }

    private func stopLocked() throws(HostError) {
        if let hung { throw hung }
        guard let source, started else { return }
        started = false
        let stop = library.table.stop!
        guard let status = calls.call(budget: budgets.stop, { stop(source) }) else {
            throw died(in: "stop", budget: budgets.stop)
        }
        context.contract?.stopped()
        context.drainDeliveries()
        if status > 0 || status < -4095 {
            context.contract?.note(.undefinedReturnValue, "stop() returned \(status), which the ABI does not define (0 or a negative errno)")
        } else if status < 0 {
            // The source is stopped either way (the host delivers nothing more), but the person is told.
            context.logger(backendName, .warning, "stop() reported an error: \(errnoName(status)) (\(String(cString: strerror(-status))))")
        }
    }

    public func destroy() throws(HostError) {
        control.lock()
        defer { control.unlock() }
        if let hung { throw hung }
        guard let source else { return }
        try stopLocked()
        let destroy = library.table.destroy!
        guard calls.call(budget: budgets.destroy, { destroy(source); return true }) != nil else {
            throw died(in: "destroy", budget: budgets.destroy)
        }
        self.source = nil
        calls.end()
        context.retire()
        reportViolations()
    }

    /// Marks the source dead after `call` overran; returns the error every later call throws.
    private func died(in call: String, budget: Duration) -> HostError {
        let error = HostError.backendHung(backend: backendName, call: call, budgetSeconds: budget.inSeconds)
        hung = error
        context.markDead()
        calls.end()
        return error
    }

    /// One line at the end for breaches that went on after their first warning.
    private func reportViolations() {
        let repeated = violations.filter { $0.count > 1 }
        guard !repeated.isEmpty else { return }
        context.logger(backendName, .warning, "contract breaches repaired or dropped by the host: "
                       + repeated.map { "\($0.kind.rawValue) \($0.count)x" }.joined(separator: ", "))
    }
}

extension BackendLibrary {
    /// Whether the backend implements list_sources (ABI 1.1, optional).
    public var canListSources: Bool {
        declaredSize >= MemoryLayout<krakl_backend>.offset(of: \krakl_backend.list_sources)! + MemoryLayout<UnsafeRawPointer>.size
            && table.list_sources != nil
    }

    /// The sources the options could select (monitors, windows), as the backend's list_sources
    /// reports them; the call runs under the `list_sources` budget.
    public func listSources(backendName: String, options: JSONObject, logger: @escaping BackendLogger,
                            budgets: CallBudgets = .standard) throws(HostError) -> [(name: String, description: String)] {
        guard canListSources, let list = table.list_sources else { return [] }
        let text = JSON.object(options).serialized
        let context = HostContext(backend: backendName, optionsText: text, sink: nil, logger: logger, contract: nil)
        let calls = BackendCallThread(name: "krakl-list")
        let host = UnsafePointer(context.host)
        context.capturingErrors = true
        let status = calls.call(budget: budgets.listSources) { text.withCString { list($0, host) } }
        context.capturingErrors = false
        guard let status else {
            context.markDead()
            calls.end()
            throw .backendHung(backend: backendName, call: "list_sources", budgetSeconds: budgets.listSources.inSeconds)
        }
        calls.end()
        context.retire()
        guard status == 0 else {
            throw .listFailed(backend: backendName, code: status, message: context.takeLastError() ?? (status > 0 ? "list_sources() failed" : "the backend gave no reason"))
        }
        return context.found
    }
}
