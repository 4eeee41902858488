import KraklBase
import KraklBackendABI

/// The C entry points a `krakl_host` holds, one per callback of the ABI.
struct HostCallbacks {
    var log: @convention(c) (UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?) -> Void
    var frame: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_frame>?) -> Void
    var event: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<krakl_event>?) -> Void
    var option: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> UnsafePointer<CChar>?
    var checkOptions: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<UnsafePointer<CChar>?>?, Int) -> Int32
    var sourceFound: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void

    /// A `krakl_host` of this ABI's size and version with these callbacks; its host_data is
    /// NULL until the owner (which needs the pointer to exist first) sets it. Never freed by the
    /// host: a backend thread may call through it after destroy().
    func makeHost() -> UnsafeMutablePointer<krakl_host> {
        var value = krakl_host()
        value.struct_size = UInt32(MemoryLayout<krakl_host>.size)
        value.abi_version = UInt32(KRAKL_ABI_MAJOR << 16 | KRAKL_ABI_MINOR)
        value.log = log
        value.frame = frame
        value.event = event
        value.option = option
        value.check_options = checkOptions
        value.source_found = sourceFound
        let host = UnsafeMutablePointer<krakl_host>.allocate(capacity: 1)
        host.initialize(to: value)
        return host
    }
}

/// A `krakl_host` from `makeHost`, held by an owner that is otherwise checked Sendable (HostSlot,
/// the conformance recorder). @unchecked Sendable: C memory never freed, written only before a backend has it.
final class HostTable: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<krakl_host>
    init(_ pointer: UnsafeMutablePointer<krakl_host>) { self.pointer = pointer }
}

extension SourceEvent.Kind {
    /// The kind of a `krakl_event`'s (or an isolated child's event message's) type field.
    init(eventType type: UInt32) {
        switch type {
        case KRAKL_EVENT_SOURCE_ENDED.rawValue: self = .sourceEnded
        case KRAKL_EVENT_FORMAT_CHANGED.rawValue: self = .formatChanged
        case KRAKL_EVENT_ERROR.rawValue: self = .error
        default: self = .unknown(type)
        }
    }
}
