import CSdBus
import Dispatch
import FoundationEssentials
import Glibc
import KraklBase
import KraklSession

/// Desktop notifications (org.freedesktop.Notifications.Notify on the session bus, through
/// libsystemd's sd-bus like the PipeWire backend's portal client): "sharing started" and "sharing
/// ended, and why". Best effort and bounded: each notification is sent on a work queue with a
/// one-second budget for the whole call, at most a few are in flight (more are dropped), and a bus
/// without a notification server (or no bus at all) is skipped silently. Sharing never waits on it.
final class DesktopNotifier: Sendable {
    /// The longest a notification may take (connecting, Hello, the Notify call), µs.
    static let budgetMicroseconds: UInt64 = 1_000_000
    private static let maximumInFlight = 3

    private let queue = DispatchQueue(label: "krakl-notify")
    private let group = DispatchGroup()
    private struct Sent {
        var inFlight = 0
        /// The server's id of our last notification: the next one replaces it (one entry, not a pile).
        var lastID: UInt32 = 0
    }
    private let sent = Guarded(Sent())

    /// A notifier when a session bus may be there (DBUS_SESSION_BUS_ADDRESS, or $XDG_RUNTIME_DIR/bus,
    /// where sd-bus looks), nil otherwise: nothing is tried, no thread is started.
    static func sessionBus(environment: [String: String] = ProcessInfo.processInfo.environment) -> DesktopNotifier? {
        if environment["KRAKL_NO_NOTIFY"].map({ !$0.isEmpty }) == true { return nil }
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return DesktopNotifier() }
        if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            var info = stat()
            if stat(runtime + "/bus", &info) == 0 && (info.st_mode & S_IFMT) == S_IFSOCK { return DesktopNotifier() }
        }
        return nil
    }

    /// "Your screen is being shared in ROOM as IDENTITY".
    func sharingStarted(room: String?, identity: String) {
        notify(summary: "Sharing your screen", body: "Your screen is being shared in \(room ?? "the room") as \(identity)")
    }

    /// The end, with the reason in the person's words; `shared`: it got as far as sharing.
    func sharingEnded(_ reason: EndReason, shared: Bool) {
        notify(summary: shared ? "Screen sharing ended" : "Screen sharing did not start", body: reason.description)
    }

    /// Any thread; returns at once.
    func notify(summary: String, body: String) {
        let admitted = sent.withLock { sent -> Bool in
            guard sent.inFlight < Self.maximumInFlight else { return false }
            sent.inFlight += 1
            return true
        }
        guard admitted else { return }
        queue.async(group: group) { [self] in
            let replaces = sent.withLock { $0.lastID }
            let id = Self.send(summary: summary, body: body, replaces: replaces)
            sent.withLock { sent in
                if let id { sent.lastID = id }
                sent.inFlight -= 1
            }
        }
    }

    /// Before the process exits: waits (a bounded time) for notifications still on their way.
    func finish() {
        _ = group.wait(timeout: .now() + .microseconds(Int(Self.budgetMicroseconds) * Self.maximumInFlight))
    }

    /// One Notify call on a connection of its own; the server's id, or nil when it did not work.
    private static func send(summary: String, body: String, replaces: UInt32) -> UInt32? {
        var bus: OpaquePointer?
        guard sd_bus_open_user(&bus) >= 0, let bus else { return nil }
        defer { sd_bus_flush_close_unref(bus) }
        _ = sd_bus_set_method_call_timeout(bus, budgetMicroseconds)
        var message: OpaquePointer?
        defer { sd_bus_message_unref(message) }
        var status = sd_bus_message_new_method_call(bus, &message, "org.freedesktop.Notifications", "/org/freedesktop/Notifications",
                                                    "org.freedesktop.Notifications", "Notify")
        guard status >= 0, let message else { return nil }
        // No bus activation: a server that is not running is skipped, not started (and waited for).
        _ = sd_bus_message_set_auto_start(message, 0)
        var replacing = replaces
        var expire: Int32 = -1
        func text(_ value: String) { if status >= 0 { status = value.withCString { sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), $0) } } }
        text("krakl-agent")                                                                              // app_name
        if status >= 0 { status = sd_bus_message_append_basic(message, CChar(UInt8(ascii: "u")), &replacing) } // replaces_id
        text("video-display")                                                                            // app_icon
        text(summary)
        text(body)
        if status >= 0 { status = sd_bus_message_open_container(message, CChar(UInt8(ascii: "a")), "s") } // actions: none
        if status >= 0 { status = sd_bus_message_close_container(message) }
        if status >= 0 { status = sd_bus_message_open_container(message, CChar(UInt8(ascii: "a")), "{sv}") } // hints: none
        if status >= 0 { status = sd_bus_message_close_container(message) }
        if status >= 0 { status = sd_bus_message_append_basic(message, CChar(UInt8(ascii: "i")), &expire) }
        guard status >= 0 else { return nil }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        defer { sd_bus_message_unref(reply) }
        guard sd_bus_call(bus, message, budgetMicroseconds, &error, &reply) >= 0, let reply else { return nil }
        var id: UInt32 = 0
        guard sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "u")), &id) > 0 else { return nil }
        return id
    }
}
