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
public protocol FrameSink: AnyObject {
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
        fputs("krakl-agent: [\(backend)] \(level.label): \(message)\n", stderr)
    }
}

/// One created backend source: owns the `krakl_host` handed to the
/// backend, the option strings it may read, and the create/start/stop/
/// destroy sequence. Deinit stops and destroys it.
public final class BackendSource {
    public let library: BackendLibrary
    public let backendName: String
    private let context: HostContext
    private var source: OpaquePointer?
    public private(set) var isStarted = false

    /// Calls the backend's create() with `options` (normally a JSON
    /// object's text; conformance also passes bad text on purpose).
    public init(library: BackendLibrary, backendName: String, optionsText: String,
                sink: FrameSink?, logger: @escaping BackendLogger) throws(HostError) {
        self.library = library
        self.backendName = backendName
        context = HostContext(backend: backendName, optionsText: optionsText, sink: sink, logger: logger)
        var created: OpaquePointer?
        context.capturingErrors = true
        defer { context.capturingErrors = false }
        let status = optionsText.withCString { library.table.create!($0, context.host, &created) }
        guard status >= 0, let created else {
            throw .createFailed(backend: backendName, code: status < 0 ? status : -EINVAL,
                                message: context.takeLastError() ?? (status < 0 ? "the backend gave no reason" : "create() returned 0 but no source"))
        }
        source = created
    }

    public convenience init(library: BackendLibrary, backendName: String, options: JSONObject,
                            sink: FrameSink?, logger: @escaping BackendLogger) throws(HostError) {
        try self.init(library: library, backendName: backendName, optionsText: JSON.object(options).serialized,
                      sink: sink, logger: logger)
    }

    deinit { destroy() }

    public func start() throws(HostError) {
        guard let source, !isStarted else { return }
        _ = context.takeLastError()
        context.capturingErrors = true
        defer { context.capturingErrors = false }
        let status = library.table.start!(source)
        guard status >= 0 else {
            throw .startFailed(backend: backendName, code: status, message: context.takeLastError() ?? "the backend gave no reason")
        }
        isStarted = true
    }

    /// Returns the backend's stop() status.
    @discardableResult
    public func stop() -> Int32 {
        guard let source, isStarted else { return 0 }
        isStarted = false
        return library.table.stop!(source)
    }

    public func destroy() {
        guard let source else { return }
        stop()
        library.table.destroy!(source)
        self.source = nil
    }
}

/// The host side of one source, reached from C through `host_data`.
/// Lives exactly as long as its BackendSource, which outlives destroy().
final class HostContext {
    let backend: String
    let host: UnsafeMutablePointer<krakl_host>
    weak var sink: FrameSink?
    let logger: BackendLogger
    /// Options parsed for host->option(); nil when the text is not valid JSON.
    let parsed: Result<JSON, JSONParseError>
    /// C strings handed out by host->option(), kept until destroy.
    private var optionStrings: [String: UnsafeMutablePointer<CChar>] = [:]
    /// What list_sources reported through source_found.
    var found: [(name: String, description: String)] = []
    private let lock = PThreadLock()
    private var lastError: String?
    /// While create() or start() runs, error lines are kept for the
    /// HostError that reports the failure instead of printed twice.
    var capturingErrors: Bool {
        get { lock.withLock { _capturing } }
        set { lock.withLock { _capturing = newValue } }
    }
    private var _capturing = false

    init(backend: String, optionsText: String, sink: FrameSink?, logger: @escaping BackendLogger) {
        self.backend = backend
        self.sink = sink
        self.logger = logger
        var parser = JSONParser(optionsText)
        parsed = Result { () throws(JSONParseError) -> JSON in try parser.parse() }
        host = .allocate(capacity: 1)
        var value = krakl_host()
        value.struct_size = UInt32(MemoryLayout<krakl_host>.size)
        value.abi_version = UInt32(KRAKL_ABI_MAJOR << 16 | KRAKL_ABI_MINOR)
        value.host_data = nil
        value.log = hostLog
        value.frame = hostFrame
        value.event = hostEvent
        value.option = hostOption
        value.check_options = hostCheckOptions
        value.source_found = hostSourceFound
        host.initialize(to: value)
        host.pointee.host_data = Unmanaged.passUnretained(self).toOpaque()
    }

    deinit {
        optionStrings.values.forEach { free($0) }
        host.deallocate()
    }

    static func from(_ data: UnsafeMutableRawPointer?) -> HostContext {
        Unmanaged<HostContext>.fromOpaque(data!).takeUnretainedValue()
    }

    func log(_ level: LogLevel, _ message: String) {
        if level == .error {
            let captured = lock.withLock { () -> Bool in
                lastError = message
                return _capturing
            }
            if captured { return }
        }
        logger(backend, level, message)
    }

    func takeLastError() -> String? {
        lock.withLock {
            defer { lastError = nil }
            return lastError
        }
    }

    func option(_ key: String) -> UnsafePointer<CChar>? {
        guard case .success(.object(let object)) = parsed, let value = object[key] else { return nil }
        return lock.withLock {
            if let existing = optionStrings[key] { return UnsafePointer(existing) }
            let copy = strdup(value.optionText)!
            optionStrings[key] = copy
            return UnsafePointer(copy)
        }
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

private let hostLog: @convention(c) (UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void = { data, level, message in
    HostContext.from(data).log(LogLevel(rawValue: min(max(level, 0), 3))!, message.map { String(cString: $0) } ?? "(null)")
}

private let hostFrame: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_frame>?) -> Void = { data, frame in
    guard let frame else { return }
    HostContext.from(data).sink?.frame(frame)
}

private let hostEvent: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_event>?) -> Void = { data, raw in
    guard let raw else { return }
    // Size rule: read only what the backend wrote.
    let event = copyBySizeRule(raw, declaredSize: Int(raw.pointee.struct_size), as: krakl_event.self)
    let kind: SourceEvent.Kind
    switch event.type {
    case KRAKL_EVENT_SOURCE_ENDED.rawValue: kind = .sourceEnded
    case KRAKL_EVENT_FORMAT_CHANGED.rawValue: kind = .formatChanged
    case KRAKL_EVENT_ERROR.rawValue: kind = .error
    default: kind = .unknown(event.type)
    }
    let context = HostContext.from(data)
    context.sink?.event(SourceEvent(kind: kind, error: event.error, message: event.message.map { String(cString: $0) },
                                    format: event.format, width: Int(event.width), height: Int(event.height)))
}

private let hostOption: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> UnsafePointer<CChar>? = { data, key in
    guard let key else { return nil }
    return HostContext.from(data).option(String(cString: key))
}

private let hostCheckOptions: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UnsafePointer<CChar>?>?, Int) -> Int32 = { data, keys, count in
    let known = (0..<max(count, 0)).compactMap { keys?[$0].map { String(cString: $0) } }
    return HostContext.from(data).checkOptions(known)
}

private let hostSourceFound: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = { data, name, description in
    let context = HostContext.from(data)
    context.found.append((name.map { String(cString: $0) } ?? "", description.map { String(cString: $0) } ?? ""))
}

extension BackendLibrary {
    /// Whether the backend implements list_sources (ABI 1.1, optional).
    public var canListSources: Bool {
        declaredSize >= MemoryLayout<krakl_backend>.offset(of: \krakl_backend.list_sources)! + MemoryLayout<UnsafeRawPointer>.size
            && table.list_sources != nil
    }

    /// The sources the options could select (monitors, windows), as the
    /// backend's list_sources reports them.
    public func listSources(backendName: String, options: JSONObject, logger: @escaping BackendLogger) throws(HostError) -> [(name: String, description: String)] {
        guard canListSources else { return [] }
        let context = HostContext(backend: backendName, optionsText: JSON.object(options).serialized, sink: nil, logger: logger)
        context.capturingErrors = true
        let status = JSON.object(options).serialized.withCString { table.list_sources!($0, context.host) }
        context.capturingErrors = false
        guard status >= 0 else {
            throw .listFailed(backend: backendName, code: status, message: context.takeLastError() ?? "the backend gave no reason")
        }
        return context.found
    }
}
