import KraklBase
import Glibc
import KraklBackendABI
import Synchronization

/// A backend shared library, loaded and checked against the ABI. Loaded at
/// most once per path and never unloaded: a library with Swift code in it
/// cannot be dlclose()d safely (its runtime metadata stays registered), and
/// a C backend gains nothing from it either.
/// @unchecked Sendable: immutable after loading; the table's C function pointers may be called from any thread (the ABI's rule).
public final class BackendLibrary: @unchecked Sendable {
    public let path: String
    /// The backend's table, copied by the size rule: min(its size, ours)
    /// bytes into a zeroed struct, so members it lacks read as NULL.
    public let table: krakl_backend
    /// struct_size the backend declared.
    public let declaredSize: Int
    public let abiMajor: Int
    public let abiMinor: Int
    public let name: String
    public let description: String

    /// Smallest table a 1.0 backend can have: through `destroy`.
    public static let minimumTableSize = MemoryLayout<krakl_backend>.offset(of: \krakl_backend.destroy)! + MemoryLayout<UnsafeRawPointer>.size
    public static let hostVersion = (major: Int(KRAKL_ABI_MAJOR), minor: Int(KRAKL_ABI_MINOR))

    /// The libraries loaded so far, by path; a load holds the lock from lookup to insertion.
    private static let loaded = Mutex<[String: BackendLibrary]>([:])

    private init(path: String, table: krakl_backend, declaredSize: Int) {
        self.path = path
        self.table = table
        self.declaredSize = declaredSize
        abiMajor = Int(table.abi_version >> 16)
        abiMinor = Int(table.abi_version & 0xFFFF)
        // Shown to people (`backends`, conformance, log prefixes): sanitized like all backend text.
        name = BackendText.read(table.name) ?? ""
        description = BackendText.read(table.description) ?? ""
    }

    /// dlopen()s `path` (RTLD_NOW | RTLD_LOCAL: unresolved symbols fail
    /// here, not mid-capture; one backend's symbols never leak into
    /// another's), finds the entry symbol and checks the table.
    public static func load(path: String, backend: String) throws(HostError) -> BackendLibrary {
        try loaded.withLock { loaded throws(HostError) -> BackendLibrary in
            if let library = loaded[path] { return library }
            guard access(path, F_OK) == 0 else { throw .libraryMissing(backend: backend, path: path) }
            guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else {
                throw .libraryUnloadable(path: path, reason: dlerror().map { String(cString: $0) } ?? "unknown dlopen error")
            }
            guard let symbol = dlsym(handle, KRAKL_BACKEND_ENTRY_SYMBOL) else {
                for major in 2...9 where dlsym(handle, "krakl_backend_v\(major)") != nil {
                    throw .abiMismatch(path: path, message: "built for backend ABI \(major).x (exports krakl_backend_v\(major)); this agent speaks \(hostVersion.major).\(hostVersion.minor): use a newer krakl-agent or rebuild the backend against this agent's krakl_backend.h")
                }
                throw .entrySymbolMissing(path: path)
            }
            let entry = unsafeBitCast(symbol, to: krakl_backend_entry_fn.self)
            guard let raw = entry() else {
                throw .abiMismatch(path: path, message: "krakl_backend_v1() returned NULL; the backend refused to load (see its log above)")
            }
            let declared = Int(raw.pointee.struct_size)
            let version = raw.pointee.abi_version
            guard Int(version >> 16) == hostVersion.major else {
                throw .abiMismatch(path: path, message: "declares backend ABI \(version >> 16).\(version & 0xFFFF) but exports krakl_backend_v1; this agent speaks \(hostVersion.major).\(hostVersion.minor): rebuild the backend against this agent's krakl_backend.h")
            }
            guard declared >= minimumTableSize else {
                throw .abiMismatch(path: path, message: "malformed backend table: struct_size is \(declared) bytes, ABI 1.0 needs at least \(minimumTableSize); set struct_size = sizeof(krakl_backend)")
            }
            let table = copyBySizeRule(raw, declaredSize: declared, as: krakl_backend.self)
            let missing = [("create", table.create == nil), ("start", table.start == nil), ("stop", table.stop == nil), ("destroy", table.destroy == nil)]
                .filter(\.1).map(\.0)
            guard missing.isEmpty else {
                throw .abiMismatch(path: path, message: "malformed backend table: \(missing.joined(separator: ", ")) is NULL")
            }
            let library = BackendLibrary(path: path, table: table, declaredSize: declared)
            loaded[path] = library
            return library
        }
    }
}

/// The ABI's size rule: copies min(declared, ours) bytes of an ABI struct
/// into a zeroed one, so members the writer did not have read as 0/NULL
/// and members we do not know are ignored.
func copyBySizeRule<T>(_ source: UnsafeRawPointer, declaredSize: Int, as type: T.Type) -> T {
    let size = MemoryLayout<T>.size
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: MemoryLayout<T>.alignment)
    defer { buffer.deallocate() }
    memset(buffer, 0, size)
    memcpy(buffer, source, min(max(declaredSize, 0), size))
    return buffer.load(as: T.self)
}
