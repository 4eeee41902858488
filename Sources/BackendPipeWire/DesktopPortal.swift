import BackendKit
import CSdBus
import Glibc
import KraklBackendABI

/// What the person asked to share, as the portal's SelectSources knows it.
struct PortalRequest {
    /// Bit mask: 1 monitor, 2 window.
    var sourceTypes: UInt32
    /// 1 hidden, 2 embedded, 4 metadata.
    var cursorMode: UInt32
    /// Offered when the portal keeps sessions (version >= 4).
    var restoreToken: String?
    /// Ask for a token that survives the session (persist_mode 2).
    var persist: Bool
}

/// A started screen-cast session: the node to read and the descriptor of
/// the PipeWire connection the portal opened for it.
struct PortalStream {
    let nodeID: UInt32
    let width: Int
    let height: Int
    let fd: Int32
    let restoreToken: String?
    let cursorMode: UInt32
}

/// Filled by a Request's Response signal.
private final class ResponseBox {
    var code: UInt32?
    var results: [String: DBusValue] = [:]
}

/// Set by the session's Closed signal (and read on whichever thread
/// processes the bus).
final class SessionClosedFlag {
    var closed = false
    var onClosed: (() -> Void)?
}

private let responseHandler: sd_bus_message_handler_t = { message, userdata, _ in
    guard let message, let userdata else { return 0 }
    let box = Unmanaged<ResponseBox>.fromOpaque(userdata).takeUnretainedValue()
    let code = DBusReader.next(message)?.uint32 ?? 2
    box.results = DBusReader.next(message)?.dictionary ?? [:]
    box.code = code
    return 0
}

private let closedHandler: sd_bus_message_handler_t = { _, userdata, _ in
    guard let userdata else { return 0 }
    let flag = Unmanaged<SessionClosedFlag>.fromOpaque(userdata).takeUnretainedValue()
    if !flag.closed {
        flag.closed = true
        flag.onClosed?()
    }
    return 0
}

/// A desktop portal interface's client, over sd-bus: ScreenCast (CreateSession, SelectSources,
/// Start, OpenPipeWireRemote) or Camera (AccessCamera, OpenPipeWireRemote).
/// Each Request is answered by a Response signal that is subscribed to before the call (its path
/// is known from our handle_token), with bounded waits. After a screen cast starts the bus is
/// processed on the capture thread (`processPending`) to hear the session's Closed signal.
final class DesktopPortal {
    static let destination = "org.freedesktop.portal.Desktop"
    static let objectPath = "/org/freedesktop/portal/desktop"

    enum Kind: String {
        case screenCast = "ScreenCast", camera = "Camera"
        var interface: String { "org.freedesktop.portal." + rawValue }
        /// What to install when the portal lacks the interface.
        var missingHint: String {
            switch self {
            case .screenCast: return "install a portal backend that can share the screen (xdg-desktop-portal-wlr, -gnome, -kde)"
            case .camera: return "it needs a portal backend with the Access dialog (xdg-desktop-portal-gnome, -kde, -gtk)"
            }
        }
    }
    let kind: Kind
    private var interface: String { kind.interface }
    /// "the ScreenCast portal", "the Camera portal": for messages.
    private var named: String { "the \(kind.rawValue) portal" }

    private var bus: OpaquePointer?
    private let log: (krakl_log_level, String) -> Void
    /// How long a request may wait for its Response (a dialog may be open).
    private let responseTimeout: Double
    /// Method calls themselves answer at once; this bounds a hung portal.
    private let callTimeoutMicroseconds: UInt64 = 10_000_000
    private var senderPart = ""
    private var tokenCounter = 0
    private(set) var sessionHandle: String?
    private var closedSlot: OpaquePointer?
    let closed = SessionClosedFlag()
    private var closedRetained: Unmanaged<SessionClosedFlag>?
    private(set) var version: UInt32 = 0
    private(set) var availableSourceTypes: UInt32 = 0
    private(set) var availableCursorModes: UInt32 = 0

    /// Connects to the session bus and reads the portal's properties.
    init(_ kind: Kind, responseTimeout: Double, log: @escaping (krakl_log_level, String) -> Void) throws(BackendError) {
        self.kind = kind
        self.responseTimeout = responseTimeout
        self.log = log
        let address = String(cString: getenv("DBUS_SESSION_BUS_ADDRESS") ?? strdup(""))
        var opened: OpaquePointer?
        let status = sd_bus_open_user(&opened)
        guard status >= 0, let opened else {
            throw BackendError(-ENXIO, "cannot connect to the D-Bus session bus (\(address.isEmpty ? "DBUS_SESSION_BUS_ADDRESS is not set" : address)): \(String(cString: strerror(-status))); \(named) is reached through it"
                + (kind == .screenCast ? " (or use option node=ID for a PipeWire node directly)" : ""))
        }
        bus = opened
        var unique: UnsafePointer<CChar>?
        guard sd_bus_get_unique_name(opened, &unique) >= 0, let unique else {
            throw BackendError(-ENXIO, "the D-Bus session bus (\(address)) did not accept the connection")
        }
        // ":1.42" -> "1_42", as the portal builds request paths.
        senderPart = String(String(cString: unique).dropFirst().map { $0 == "." ? "_" : $0 })
        version = try property("version")
        guard kind == .screenCast else { return }
        availableSourceTypes = try property("AvailableSourceTypes")
        availableCursorModes = version >= 2 ? try property("AvailableCursorModes") : 0
    }

    deinit { close() }

    /// The bus descriptor, for the capture thread's poll.
    var fd: Int32 { bus.map { sd_bus_get_fd($0) } ?? -1 }

    /// Capture thread: handles whatever arrived (the Closed signal).
    func processPending() {
        guard let bus else { return }
        while sd_bus_process(bus, nil) > 0 {}
    }

    /// Ends the session (Session.Close) and the bus connection.
    func close() {
        guard let bus else { return }
        if let handle = sessionHandle, !closed.closed {
            var message: OpaquePointer?
            if sd_bus_message_new_method_call(bus, &message, Self.destination, handle, "org.freedesktop.portal.Session", "Close") >= 0 {
                var error = sd_bus_error()
                var reply: OpaquePointer?
                _ = sd_bus_call(bus, message, 2_000_000, &error, &reply)
                sd_bus_error_free(&error)
                sd_bus_message_unref(reply)
            }
            sd_bus_message_unref(message)
        }
        sd_bus_slot_unref(closedSlot)
        closedSlot = nil
        closedRetained?.release()
        closedRetained = nil
        sd_bus_flush_close_unref(bus)
        self.bus = nil
    }

    private func property(_ name: String) throws(BackendError) -> UInt32 {
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var value: UInt32 = 0
        let status = sd_bus_get_property_trivial(bus, Self.destination, Self.objectPath, interface, name, &error, CChar(UInt8(ascii: "u")), &value)
        if status >= 0 { return value }
        let errorName = error.name.map { String(cString: $0) } ?? ""
        if errorName == "org.freedesktop.DBus.Error.ServiceUnknown" || errorName == "org.freedesktop.DBus.Error.NameHasNoOwner" {
            throw BackendError(-EOPNOTSUPP, "no desktop portal on the session bus (\(Self.destination) is not there): start xdg-desktop-portal with a backend for this desktop"
                + (kind == .screenCast ? ", or use option node=ID to read a PipeWire node directly" : ""))
        }
        if errorName.hasPrefix("org.freedesktop.DBus.Error.Unknown") || errorName == "org.freedesktop.DBus.Error.InvalidArgs" {
            throw BackendError(-EOPNOTSUPP, "the desktop portal has no \(kind.rawValue) interface: \(kind.missingHint)")
        }
        throw BackendError(-EIO, "could not read \(named)'s \(name): \(Self.describe(&error, status))")
    }

    private static func describe(_ error: inout sd_bus_error, _ status: Int32) -> String {
        if let message = error.message { return String(cString: message) }
        if let name = error.name { return String(cString: name) }
        return String(cString: strerror(-status))
    }

    private func nextToken() -> String {
        tokenCounter += 1
        return "krakl\(getpid())_\(UInt32.random(in: 0...UInt32.max))_\(tokenCounter)"
    }

    /// Calls a portal method that answers through a Request object and
    /// waits (bounded) for its Response. `arguments` appends everything
    /// before the options dictionary.
    private func request(_ method: String, arguments: (OpaquePointer) -> Int32 = { _ in 0 },
                         options: [String: DBusOption]) throws(BackendError) -> [String: DBusValue] {
        guard let bus else { throw BackendError(-ENOTCONN, "the session bus connection is closed") }
        let token = nextToken()
        let expected = "\(Self.objectPath)/request/\(senderPart)/\(token)"
        let box = ResponseBox()
        let retained = Unmanaged.passRetained(box)
        defer { retained.release() }
        var slots: [OpaquePointer?] = []
        defer { slots.forEach { sd_bus_slot_unref($0) } }
        func subscribe(_ path: String) throws(BackendError) {
            var slot: OpaquePointer?
            let status = sd_bus_match_signal(bus, &slot, Self.destination, path, "org.freedesktop.portal.Request", "Response",
                                             responseHandler, retained.toOpaque())
            guard status >= 0 else { throw BackendError(status, "could not subscribe to the portal's answer: \(String(cString: strerror(-status)))") }
            slots.append(slot)
        }
        // Subscribed before the call, so a fast answer cannot be missed.
        try subscribe(expected)

        var message: OpaquePointer?
        defer { sd_bus_message_unref(message) }
        var status = sd_bus_message_new_method_call(bus, &message, Self.destination, Self.objectPath, interface, method)
        var all = options
        all["handle_token"] = .string(token)
        if status >= 0 { status = arguments(message!) }
        if status >= 0 { status = DBusWriter.options(message!, all) }
        guard status >= 0 else { throw BackendError(status, "could not build the portal's \(method) call: \(String(cString: strerror(-status)))") }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        defer { sd_bus_message_unref(reply) }
        status = sd_bus_call(bus, message, callTimeoutMicroseconds, &error, &reply)
        guard status >= 0 else {
            if status == -ETIMEDOUT { throw BackendError(-ETIMEDOUT, "\(named) did not answer \(method) within \(callTimeoutMicroseconds / 1_000_000) s") }
            throw BackendError(-EIO, "\(named) refused \(method): \(Self.describe(&error, status))")
        }
        // Portals older than 0.9 pick their own request path: follow it.
        if let handle = DBusReader.next(reply!)?.string, handle != expected { try subscribe(handle) }

        let deadline = monotonicNanoseconds() + UInt64(responseTimeout * 1e9)
        while box.code == nil {
            status = sd_bus_process(bus, nil)
            if status < 0 { throw BackendError(-EIO, "the session bus connection broke while waiting for the portal's \(method) answer: \(String(cString: strerror(-status)))") }
            if status > 0 { continue }
            if closed.closed { throw BackendError(-EACCES, "sharing was not allowed: the portal closed the session during \(method)") }
            let now = monotonicNanoseconds()
            guard now < deadline else {
                throw BackendError(-ETIMEDOUT, "\(named) gave no answer to \(method) within \(Int(responseTimeout)) s (a dialog left open? option timeout sets the wait)")
            }
            _ = sd_bus_wait(bus, (deadline - now) / 1000)
        }
        switch (box.code!, kind) {
        case (0, _): return box.results
        case (1, .screenCast): throw BackendError(-EACCES, "sharing was not allowed: the screen-sharing request was cancelled or denied (\(method))")
        case (1, .camera): throw BackendError(-EACCES, "the camera was not allowed: the Camera portal's request was denied (the desktop's camera permission for this program says no, or the dialog was cancelled)")
        default: throw BackendError(-EIO, "\(named) could not \(method) (response \(box.code!)): the portal backend failed; its log says why")
        }
    }

    /// CreateSession → SelectSources → Start → OpenPipeWireRemote.
    func start(_ want: PortalRequest) throws(BackendError) -> PortalStream {
        let created = try request("CreateSession", options: ["session_handle_token": .string(nextToken())])
        guard let handle = created["session_handle"]?.string else {
            throw BackendError(-EIO, "\(named) created a session without a handle")
        }
        sessionHandle = handle
        // Closed can come at any time from now on (sharing revoked in the desktop).
        closedRetained = Unmanaged.passRetained(closed)
        let status = sd_bus_match_signal(bus, &closedSlot, Self.destination, handle, "org.freedesktop.portal.Session", "Closed",
                                         closedHandler, closedRetained!.toOpaque())
        if status < 0 { log(KRAKL_LOG_WARNING, "pipewire: cannot follow the portal session's Closed signal: \(String(cString: strerror(-status)))") }

        var selectOptions: [String: DBusOption] = ["types": .uint32(want.sourceTypes), "multiple": .bool(false)]
        if version >= 2 { selectOptions["cursor_mode"] = .uint32(want.cursorMode) }
        if version >= 4 {
            if want.persist { selectOptions["persist_mode"] = .uint32(2) }
            if let token = want.restoreToken { selectOptions["restore_token"] = .string(token) }
        }
        _ = try request("SelectSources", arguments: { DBusWriter.string($0, handle, type: "o") }, options: selectOptions)
        let started = try request("Start", arguments: { m in
            let status = DBusWriter.string(m, handle, type: "o")
            return status < 0 ? status : DBusWriter.string(m, "")
        }, options: [:])
        guard let streams = started["streams"]?.array, let first = streams.first?.structure,
              let node = first.first?.uint32 else {
            throw BackendError(-EIO, "\(named) started without a stream")
        }
        let properties = first.count > 1 ? first[1].dictionary ?? [:] : [:]
        let size = properties["size"]?.structure ?? []
        let width = size.count == 2 ? Int(size[0].int32Value ?? 0) : 0
        let height = size.count == 2 ? Int(size[1].int32Value ?? 0) : 0
        let fd = try openPipeWireRemote(session: handle)
        return PortalStream(nodeID: node, width: width, height: height, fd: fd,
                            restoreToken: started["restore_token"]?.string, cursorMode: want.cursorMode)
    }

    /// The descriptor of a PipeWire connection that sees only what the portal allows: this
    /// session's nodes (ScreenCast, `session` given) or the cameras (Camera, after AccessCamera).
    func openPipeWireRemote(session: String?) throws(BackendError) -> Int32 {
        guard let bus else { throw BackendError(-ENOTCONN, "the session bus connection is closed") }
        var message: OpaquePointer?
        defer { sd_bus_message_unref(message) }
        var status = sd_bus_message_new_method_call(bus, &message, Self.destination, Self.objectPath, interface, "OpenPipeWireRemote")
        if status >= 0, let session { status = DBusWriter.string(message!, session, type: "o") }
        if status >= 0 { status = DBusWriter.options(message!, [:]) }
        guard status >= 0 else { throw BackendError(status, "could not build OpenPipeWireRemote: \(String(cString: strerror(-status)))") }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        defer { sd_bus_message_unref(reply) }
        status = sd_bus_call(bus, message, callTimeoutMicroseconds, &error, &reply)
        guard status >= 0 else { throw BackendError(-EIO, "\(named) refused OpenPipeWireRemote: \(Self.describe(&error, status))") }
        var fd: Int32 = -1
        guard sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "h")), &fd) > 0, fd >= 0 else {
            throw BackendError(-EIO, "\(named)'s OpenPipeWireRemote answer carries no descriptor")
        }
        // The message owns its descriptor; keep a copy of our own.
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 3)
        guard copy >= 0 else { throw BackendError(-errno, "could not keep the PipeWire descriptor: \(String(cString: strerror(errno)))") }
        return copy
    }

    /// Camera: asks for the camera (AccessCamera; the portal may show a dialog, or answer from the
    /// permission it stored for this program). Throws EACCES when it is not allowed.
    func accessCamera() throws(BackendError) {
        precondition(kind == .camera)
        _ = try request("AccessCamera", options: [:])
    }
}

extension DBusValue {
    var int32Value: Int32? {
        switch self {
        case .int32(let v): return v
        case .uint32(let v): return Int32(truncatingIfNeeded: v)
        default: return nil
        }
    }
}
