import Glibc
import KraklBackendABI

/// The host's services as a backend sees them: logging, frame and event
/// delivery, and option look-up. Wraps the `krakl_host` the agent passed to
/// create(); valid until destroy() returns.
/// @unchecked Sendable: it wraps the host's C table, which the ABI lets any backend thread call.
public final class BackendHost: @unchecked Sendable {
    private let raw: UnsafePointer<krakl_host>
    private let data: UnsafeMutableRawPointer?

    /// Checks that the host is new enough for every call this wrapper makes.
    init(_ raw: UnsafePointer<krakl_host>) throws(BackendError) {
        // check_options is the last member this wrapper uses.
        let needed = MemoryLayout<krakl_host>.offset(of: \krakl_host.check_options)! + MemoryLayout<UnsafeRawPointer>.size
        guard Int(raw.pointee.struct_size) >= needed,
              raw.pointee.log != nil, raw.pointee.frame != nil, raw.pointee.event != nil,
              raw.pointee.option != nil, raw.pointee.check_options != nil
        else { throw BackendError(-EINVAL, "the host's krakl_host is smaller than ABI 1.0 or lacks a callback") }
        self.raw = raw
        self.data = raw.pointee.host_data
    }

    public func log(_ level: krakl_log_level, _ message: String) {
        raw.pointee.log(data, Int32(level.rawValue), message)
    }

    /// Hands a frame to the host. The frame and what it points at are
    /// borrowed only for the duration of this call.
    public func deliver(_ frame: UnsafePointer<krakl_frame>) {
        raw.pointee.frame(data, frame)
    }

    public func sendEvent(_ type: krakl_event_type, error: Int32 = 0, message: String? = nil,
                          format: krakl_format = KRAKL_FORMAT_INVALID, width: Int = 0, height: Int = 0) {
        func send(_ text: UnsafePointer<CChar>?) {
            var event = krakl_event()
            event.struct_size = UInt32(MemoryLayout<krakl_event>.size)
            event.type = type.rawValue
            event.error = error
            event.message = text
            event.format = format.rawValue
            event.width = UInt32(width)
            event.height = UInt32(height)
            raw.pointee.event(data, &event)
        }
        if let message { message.withCString(send) } else { send(nil) }
    }

    /// The option's text, or nil when it was not given.
    public func option(_ key: String) -> String? {
        raw.pointee.option(data, key).map { String(cString: $0) }
    }

    /// Reports one source from list_sources (ABI 1.1 hosts; ignored by 1.0 ones).
    public func sourceFound(name: String, description: String) {
        let needed = MemoryLayout<krakl_host>.offset(of: \krakl_host.source_found)! + MemoryLayout<UnsafeRawPointer>.size
        guard Int(raw.pointee.struct_size) >= needed, let found = raw.pointee.source_found else { return }
        found(data, name, description)
    }

    /// Rejects options that are not a JSON object or carry a key not in
    /// `known` (the host logs which one).
    public func checkOptions(known: [String]) throws(BackendError) {
        var cStrings = known.map { strdup($0) }
        defer { cStrings.forEach { free($0) } }
        let status = cStrings.withUnsafeMutableBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: buffer.count) {
                raw.pointee.check_options(data, $0, buffer.count)
            }
        }
        if status < 0 { throw BackendError(status, "options rejected", alreadyLogged: true) }
    }
}
