import KraklBase
import FoundationEssentials
import Glibc

/// One backend as plugins.json lists it.
public struct BackendEntry: Equatable, Sendable {
    public let name: String
    /// Absolute path of the shared library (resolved against the json's folder).
    public let library: String
    public let description: String
    /// Default options, before `--option` overrides.
    public let options: JSONObject
    /// "isolate": run the backend in a child process (true), in the agent (false), or as
    /// `BackendSelection.isolatedByDefault` decides (nil, not given).
    public let isolate: Bool?

    public init(name: String, library: String, description: String, options: JSONObject, isolate: Bool? = nil) {
        self.name = name
        self.library = library
        self.description = description
        self.options = options
        self.isolate = isolate
    }
}

/// plugins.json: which backends exist, where their libraries are, their
/// default options, and which one runs when none is named.
///
///     { "version": 1, "default": "file",
///       "backends": { "file": { "library": "...so", "description": "...", "options": {...} } } }
///
/// `default` is optional: without it the screen decides (the agent's `chooseScreenBackend`: the
/// portal on a Wayland session, X11 with an X display, else `defaultBackend`, the test pattern).
public struct PluginRegistry: Sendable {
    public let path: String
    /// The backend named by `default`, or without one `file` when it is listed, else the first.
    public let defaultBackend: String
    /// Whether plugins.json names its `default` (then it wins over the screen's choice).
    public let defaultIsExplicit: Bool
    public let backends: [BackendEntry]

    public func entry(named name: String) throws(HostError) -> BackendEntry {
        guard let entry = backends.first(where: { $0.name == name }) else {
            throw .unknownBackend(name: name, known: backends.map(\.name), registry: path)
        }
        return entry
    }

    /// The largest registry the host reads: a real one is a few kB, and the whole file is parsed
    /// in memory (a 50 MB one cost 1.5 GB and 11 s before it was rejected).
    public static let maximumFileBytes = 1 << 20

    /// Reads and validates a registry file. Only a regular file of at most `maximumFileBytes` is
    /// read; anything else is refused, before reading, with what it is.
    public static func load(path: String) throws(HostError) -> PluginRegistry {
        try parse(try readRegistryFile(path), path: path)
    }

    private static func readRegistryFile(_ path: String) throws(HostError) -> String {
        func refuse(_ reason: String) -> HostError { .registryUnreadable(path: path, reason: reason) }
        // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then says what it is.
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            switch code {
            case ENOENT, ENOTDIR: throw refuse("no such file")
            case EACCES: throw refuse("permission denied")
            default: throw refuse(String(cString: strerror(code)))
            }
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw refuse(String(cString: strerror(errno))) }
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: throw refuse("it is a directory, not a file")
        case S_IFIFO: throw refuse("it is a FIFO (named pipe), not a regular file")
        case S_IFCHR, S_IFBLK: throw refuse("it is a device, not a regular file")
        case S_IFSOCK: throw refuse("it is a socket, not a regular file")
        default: throw refuse("it is not a regular file")
        }
        guard info.st_size <= maximumFileBytes else {
            throw refuse("it is \(info.st_size) bytes; a registry may be at most \(maximumFileBytes / 1024) KiB")
        }
        // Read at most one byte past the limit: a file that grew since fstat is still caught.
        var bytes = [UInt8](repeating: 0, count: maximumFileBytes + 1)
        var count = 0
        while count < bytes.count {
            let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + count, $0.count - count) }
            if n == 0 { break }
            if n < 0 {
                if errno == EINTR { continue }
                throw refuse(String(cString: strerror(errno)))
            }
            count += n
        }
        guard count <= maximumFileBytes else {
            throw refuse("it is more than \(maximumFileBytes / 1024) KiB; a registry may be at most that")
        }
        // A UTF-8 byte-order mark (editors on some systems write one) is not part of the JSON.
        let start = count >= 3 && bytes[0] == 0xEF && bytes[1] == 0xBB && bytes[2] == 0xBF ? 3 : 0
        guard let text = String(validating: bytes[start..<count], as: UTF8.self) else {
            throw refuse("it is not UTF-8 text")
        }
        return text
    }

    /// Validates registry text; `path` names it in errors and anchors
    /// relative library paths.
    public static func parse(_ text: String, path: String) throws(HostError) -> PluginRegistry {
        var parser = JSONParser(text)
        let root: JSON
        do throws(JSONParseError) {
            root = try parser.parse()
        } catch {
            throw .registryMalformed(path: path, line: error.line, column: error.column, message: error.message)
        }
        func fail(_ at: String, _ message: String) -> HostError {
            let (line, column) = parser.location(ofPath: at) ?? (1, 1)
            // Names and keys come from the file: a NUL cut the printed line short, escapes and bidi
            // overrides would reach the terminal.
            return .registryMalformed(path: path, line: line, column: column, message: BackendText.sanitized(message))
        }
        guard case .object(let top) = root else { throw fail("", "the registry must be a JSON object") }
        for key in top.keys where !["version", "default", "backends"].contains(key) {
            throw fail(key, "unknown member \"\(key)\" (allowed: version, default, backends)")
        }
        guard top["version"] == .number("1") else { throw fail("version", "\"version\" must be 1") }
        guard case .object(let list)? = top["backends"] else { throw fail("backends", "\"backends\" must be an object of name: {library, description, options}") }
        let folder = URL(fileURLWithPath: path).deletingLastPathComponent().path
        var backends: [BackendEntry] = []
        for (name, value) in list.members {
            let at = "backends.\(name)"
            guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" }) else {
                throw fail(at, "backend name \"\(name)\" must be letters, digits, '-' or '_'")
            }
            guard case .object(let fields) = value else { throw fail(at, "backend \"\(name)\" must be an object") }
            for key in fields.keys where !["library", "description", "options", "isolate"].contains(key) {
                throw fail("\(at).\(key)", "unknown member \"\(key)\" in backend \"\(name)\" (allowed: library, description, options, isolate)")
            }
            guard case .string(let library)? = fields["library"], !library.isEmpty else {
                throw fail(fields["library"] == nil ? at : "\(at).library", "backend \"\(name)\" needs \"library\": the path of its .so")
            }
            var description = ""
            if let value = fields["description"] {
                guard case .string(let text) = value else { throw fail("\(at).description", "\"description\" must be a string") }
                description = text
            }
            var options = JSONObject()
            if let value = fields["options"] {
                guard case .object(let object) = value else { throw fail("\(at).options", "\"options\" must be an object") }
                options = object
            }
            var isolate: Bool?
            if let value = fields["isolate"] {
                guard case .bool(let flag) = value else { throw fail("\(at).isolate", "\"isolate\" must be true or false") }
                isolate = flag
            }
            let resolved = library.hasPrefix("/") ? library : URL(fileURLWithPath: folder).appendingPathComponent(library).standardized.path
            backends.append(BackendEntry(name: name, library: resolved, description: description, options: options, isolate: isolate))
        }
        guard !backends.isEmpty else { throw fail("backends", "\"backends\" lists no backend") }
        guard let given = top["default"] else {
            let fallback = backends.contains { $0.name == "file" } ? "file" : backends[0].name
            return PluginRegistry(path: path, defaultBackend: fallback, defaultIsExplicit: false, backends: backends)
        }
        guard case .string(let defaultName) = given else { throw fail("default", "\"default\" must name one of the backends") }
        guard backends.contains(where: { $0.name == defaultName }) else {
            throw fail("default", "\"default\" names \"\(defaultName)\", which is not among the backends (\(backends.map(\.name).joined(separator: ", ")))")
        }
        return PluginRegistry(path: path, defaultBackend: defaultName, defaultIsExplicit: true, backends: backends)
    }

    /// Where plugins.json is when --plugins is not given: $KRAKL_PLUGINS,
    /// then ./plugins.json, then an installed agent's own (PREFIX/lib/krakl-agent/plugins.json
    /// for PREFIX/bin/krakl-agent: before the folders above, so ~/.local/bin/krakl-agent never
    /// reads a ~/plugins.json), then next to the executable or up to four
    /// folders above it (the repository root for a binary in .build/).
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["KRAKL_PLUGINS"], !path.isEmpty { return path }
        let fm = FileManager.default
        if fm.fileExists(atPath: "plugins.json") { return fm.currentDirectoryPath + "/plugins.json" }
        if let installed = InstalledLayout.installedFile("plugins.json") { return installed }
        var folder = URL(fileURLWithPath: InstalledLayout.executable).deletingLastPathComponent()
        for _ in 0..<5 {
            let candidate = folder.appendingPathComponent("plugins.json").path
            if fm.fileExists(atPath: candidate) { return candidate }
            folder.deleteLastPathComponent()
        }
        return "plugins.json"
    }
}

/// Parses `--option key=value`. The value is JSON when it reads as a JSON
/// scalar (30, true, null, "quoted"), otherwise a plain string, so
/// `scene=typing` and `fps=30` both do what one expects.
public func parseOptionAssignment(_ text: String) throws(HostError) -> (key: String, value: JSON) {
    guard let equals = text.firstIndex(of: "="), equals != text.startIndex else {
        throw .invalidOption("--option \(text) is not key=value (for example --option scene=typing)")
    }
    let key = String(text[..<equals])
    guard key.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" || $0 == "-" || $0 == "." }) else {
        throw .invalidOption("--option \(text): the key \"\(key)\" may hold only letters, digits, '_', '-' and '.'")
    }
    let raw = String(text[text.index(after: equals)...])
    var parser = JSONParser(raw)
    if let value = try? parser.parse() {
        switch value {
        case .object, .array:
            throw .invalidOption("--option \(key): objects and arrays are not accepted on the command line; put them in plugins.json")
        default:
            return (key, value)
        }
    }
    return (key, .string(raw))
}

/// A backend chosen for a run: its plugins.json entry, its options with the
/// command line's `--option`s applied, whether it runs isolated, and (in the agent's
/// process only) its loaded library. The one way the agent's commands, the sharing
/// session and the probe pick a backend and make its source.
public struct BackendSelection: Sendable {
    public let entry: BackendEntry
    public let options: JSONObject
    /// The backend runs in a child process (krakl-backend-host); the agent never loads it.
    public let isolated: Bool
    /// The library, loaded into the agent; nil when isolated (a constructor that crashes
    /// or exits must not take the agent down).
    public let library: BackendLibrary?
    public var isolationSettings = IsolationSettings()

    /// Loads the registry at `registryPath` (nil: `PluginRegistry.defaultPath()`), picks `name`
    /// (nil: the registry's default), applies `overrides` in order, decides isolation (`isolate`,
    /// from --isolate/--no-isolate, over the entry's "isolate", over `isolatedByDefault`), and
    /// dlopens the library unless isolated.
    public init(registryPath: String?, name: String?, overrides: [(key: String, value: JSON)], isolate: Bool? = nil) throws(HostError) {
        let registry = try PluginRegistry.load(path: registryPath ?? PluginRegistry.defaultPath())
        entry = try registry.entry(named: name ?? registry.defaultBackend)
        var options = entry.options
        for (key, value) in overrides { options[key] = value }
        self.options = options
        isolated = isolate ?? entry.isolate ?? Self.isolatedByDefault(library: entry.library)
        library = isolated ? nil : try BackendLibrary.load(path: entry.library, backend: entry.name)
    }

    /// Whether a backend runs isolated when neither plugins.json nor the command line says:
    /// yes for a library from outside the project, no for one the agent was built with (a
    /// library in the running executable's own folder, where `swift build` puts the in-tree
    /// backends, or in an installed agent's PREFIX/lib/krakl-agent). Isolation costs at most ~4 % of a core and ~1–2 ms of latency at 1080p with
    /// the whole screen changing, well under 1 % and 0.1 ms when typing (docs/PERFORMANCE.md,
    /// "Isolated mode"); a third-party backend that crashes no longer takes the agent down.
    public static func isolatedByDefault(library: String, executable: String? = nil) -> Bool {
        func folder(_ path: String) -> String {
            URL(fileURLWithPath: path).resolvingSymlinksInPath().deletingLastPathComponent().path
        }
        let running = executable ?? InstalledLayout.executable
        let own = [folder(running), URL(fileURLWithPath: InstalledLayout.libraryFolder(executable: running)).resolvingSymlinksInPath().path]
        return !own.contains(folder(library))
    }

    /// Creates the backend's source (create() runs here, in the agent or in the child).
    public func makeSource(sink: FrameSink, logger: @escaping BackendLogger) throws(HostError) -> any CaptureSource {
        if let library {
            return try BackendSource(library: library, backendName: entry.name, options: options, sink: sink, logger: logger)
        }
        return try IsolatedBackendSource(libraryPath: entry.library, backendName: entry.name, options: options, sink: sink,
                                         logger: logger, settings: isolationSettings)
    }

    /// The sources the options could select, as list_sources reports them; nil when the
    /// backend cannot list (it has no list_sources). Listed in a child process (krakl-backend-host)
    /// even for a backend that captures in the agent's process: a list_sources that crashes or
    /// hangs ends that child, and throws `.backendCrashed` / `.backendHung`, not the agent.
    public func listSources(logger: @escaping BackendLogger) throws(HostError) -> [(name: String, description: String)]? {
        if let library, !library.canListSources { return nil }
        return try IsolatedBackendSource.listSources(libraryPath: entry.library, backendName: entry.name, options: options,
                                                     logger: logger, settings: isolationSettings)
    }
}
