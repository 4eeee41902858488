import Glibc
import KraklBackendABI
import Synchronization

/// What an in-tree Swift backend implements. `init` happens in create()
/// (control thread, may block); start/stop bracket frame delivery; the
/// object is released in destroy().
public protocol CaptureSource: AnyObject {
    /// Begins delivery; returns without waiting for a frame.
    func start() throws(BackendError)
    /// Ends delivery; when it returns no callback is running or will run.
    func stop()
}

/// @Sendable: the host may call create() and list_sources() from any thread.
public typealias SourceFactory = @Sendable (BackendHost) throws(BackendError) -> CaptureSource
/// Reports the sources the options could select through `host.sourceFound`.
public typealias SourceLister = @Sendable (BackendHost) throws(BackendError) -> Void

/// One backend per shared library, so one factory per image, set by the entry point before the
/// host can call create(); the table it returns lives as long as the process (the ABI's rule for
/// the pointer `krakl_backend_v1` returns), made on the first call.
private struct Registration: Sendable {
    var factory: SourceFactory?
    var lister: SourceLister?
    /// The table's address (C memory, written once under the lock, never freed).
    var table: UInt = 0
}
private let registration = Mutex(Registration())

/// Fills this library's `krakl_backend` table and returns it. Call it from
/// the `@_cdecl("krakl_backend_v1")` entry point. `name` and `description`
/// are StaticStrings so their C pointers live as long as the process.
public func exportBackend(name: StaticString, description: StaticString, lister: SourceLister? = nil,
                          factory: @escaping SourceFactory) -> UnsafePointer<krakl_backend> {
    var entry = krakl_backend()
    entry.struct_size = UInt32(MemoryLayout<krakl_backend>.size)
    entry.abi_version = UInt32(KRAKL_ABI_MAJOR << 16 | KRAKL_ABI_MINOR)
    entry.name = UnsafeRawPointer(name.utf8Start).assumingMemoryBound(to: CChar.self)
    entry.description = UnsafeRawPointer(description.utf8Start).assumingMemoryBound(to: CChar.self)
    entry.create = { options, host, out in createSource(options, host, out) }
    entry.start = { source in
        guard let box = SourceBox.from(source) else { return -EINVAL }
        do throws(BackendError) {
            try box.source.start()
            return 0
        } catch {
            box.host.log(KRAKL_LOG_ERROR, error.message)
            return error.code
        }
    }
    entry.stop = { source in
        guard let box = SourceBox.from(source) else { return -EINVAL }
        box.source.stop()
        return 0
    }
    entry.destroy = { source in
        guard let source else { return }
        let box = Unmanaged<SourceBox>.fromOpaque(UnsafeRawPointer(source)).takeRetainedValue()
        box.source.stop()
    }
    if lister != nil {
        entry.list_sources = { options, rawHost in
            guard let rawHost, let lister = registration.withLock({ $0.lister }) else { return -EINVAL }
            do throws(BackendError) {
                let host = try BackendHost(rawHost)
                do throws(BackendError) {
                    try lister(host)
                    return 0
                } catch {
                    if !error.alreadyLogged { host.log(KRAKL_LOG_ERROR, error.message) }
                    return error.code
                }
            } catch {
                return error.code
            }
        }
    }
    let address = registration.withLock { state in
        state.factory = factory
        state.lister = lister
        if state.table == 0 { state.table = UInt(bitPattern: UnsafeMutablePointer<krakl_backend>.allocate(capacity: 1)) }
        UnsafeMutablePointer<krakl_backend>(bitPattern: state.table)!.initialize(to: entry)
        return state.table
    }
    return UnsafePointer(UnsafeMutablePointer<krakl_backend>(bitPattern: address)!)
}

/// The opaque `krakl_source*` handed to the host: a retained box holding
/// the Swift source and its host, released by destroy().
private final class SourceBox {
    let source: CaptureSource
    let host: BackendHost
    init(source: CaptureSource, host: BackendHost) { self.source = source; self.host = host }

    static func from(_ pointer: OpaquePointer?) -> SourceBox? {
        pointer.map { Unmanaged<SourceBox>.fromOpaque(UnsafeRawPointer($0)).takeUnretainedValue() }
    }
}

private func createSource(_ options: UnsafePointer<CChar>?, _ rawHost: UnsafePointer<krakl_host>?,
                          _ out: UnsafeMutablePointer<OpaquePointer?>?) -> Int32 {
    guard let rawHost, let out, let factory = registration.withLock({ $0.factory }) else { return -EINVAL }
    let host: BackendHost
    do throws(BackendError) {
        host = try BackendHost(rawHost)
    } catch {
        return error.code // no usable log callback to say why
    }
    do throws(BackendError) {
        let source = try factory(host)
        out.pointee = OpaquePointer(Unmanaged.passRetained(SourceBox(source: source, host: host)).toOpaque())
        return 0
    } catch {
        if !error.alreadyLogged { host.log(KRAKL_LOG_ERROR, error.message) }
        return error.code
    }
}
