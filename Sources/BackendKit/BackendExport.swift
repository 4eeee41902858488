import Glibc
import KraklBackendABI

/// What an in-tree Swift backend implements. `init` happens in create()
/// (control thread, may block); start/stop bracket frame delivery; the
/// object is released in destroy().
public protocol CaptureSource: AnyObject {
    /// Begins delivery; returns without waiting for a frame.
    func start() throws(BackendError)
    /// Ends delivery; when it returns no callback is running or will run.
    func stop()
}

public typealias SourceFactory = (BackendHost) throws(BackendError) -> CaptureSource
/// Reports the sources the options could select through `host.sourceFound`.
public typealias SourceLister = (BackendHost) throws(BackendError) -> Void

/// One backend per shared library, so one factory per image. Written once
/// by the entry point before the host can call create().
nonisolated(unsafe) private var registeredFactory: SourceFactory?
nonisolated(unsafe) private var registeredLister: SourceLister?
nonisolated(unsafe) private let table = UnsafeMutablePointer<krakl_backend>.allocate(capacity: 1)

/// Fills this library's `krakl_backend` table and returns it. Call it from
/// the `@_cdecl("krakl_backend_v1")` entry point. `name` and `description`
/// are StaticStrings so their C pointers live as long as the process.
public func exportBackend(name: StaticString, description: StaticString, lister: SourceLister? = nil,
                          factory: @escaping SourceFactory) -> UnsafePointer<krakl_backend> {
    registeredFactory = factory
    registeredLister = lister
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
            guard let rawHost, let lister = registeredLister else { return -EINVAL }
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
    table.initialize(to: entry)
    return UnsafePointer(table)
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
    guard let rawHost, let out, let factory = registeredFactory else { return -EINVAL }
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
