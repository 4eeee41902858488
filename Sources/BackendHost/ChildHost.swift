import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost

/// The backend's sink inside the child: frames into the ring, events up the socket.
final class ChildSink: FrameSink, Sendable {
    let ring: FrameRingWriter
    let socket: WireSocket

    init(ring: FrameRingWriter, socket: WireSocket) {
        self.ring = ring
        self.socket = socket
    }

    func frame(_ frame: UnsafePointer<krakl_frame>) { ring.deliver(frame) }

    func event(_ event: SourceEvent) {
        var w = WireWriter(.event)
        switch event.kind {
        case .sourceEnded: w.u32(KRAKL_EVENT_SOURCE_ENDED.rawValue)
        case .formatChanged: w.u32(KRAKL_EVENT_FORMAT_CHANGED.rawValue)
        case .error: w.u32(KRAKL_EVENT_ERROR.rawValue)
        case .unknown(let type): w.u32(type)
        }
        w.i32(event.error)
        w.u32(event.format)
        w.u32(UInt32(clamping: event.width))
        w.u32(UInt32(clamping: event.height))
        w.u32(event.message == nil ? 0 : 1)
        w.text(event.message ?? "")
        socket.send(w)
    }
}

/// krakl-backend-host's work: load the library, then run the agent's commands on one control
/// thread (create, start, stop, destroy, list) while the main thread reads the socket (slot
/// releases at once, commands queued), so a backend blocked in a call never stops releases, and
/// the agent's end (the socket closes) ends this process whatever the backend is doing.
final class ChildHost: Sendable {
    let socket: WireSocket
    let backend: String
    let ring: FrameRingWriter
    let sink: ChildSink
    /// The library and source: the control thread's (claimed in `load`, the first thing it does).
    private struct Control {
        var library: BackendLibrary?
        var source: BackendSource?
    }
    private let control = ThreadConfined(Control())
    /// Commands the main thread read, for the control thread.
    private let commands = Guarded<[(kind: WireKind, text: String)]>([])

    let budgets: CallBudgets
    let logger: BackendLogger

    init(socket: WireSocket, backend: String, slots: Int, waitMilliseconds: Int, budgets: CallBudgets) {
        self.budgets = budgets
        self.socket = socket
        self.backend = backend
        ring = FrameRingWriter(socket: socket, slotCount: slots, waitMilliseconds: waitMilliseconds)
        sink = ChildSink(ring: ring, socket: socket)
        logger = { [socket] _, level, message in
            var w = WireWriter(.log)
            w.i32(level.rawValue)
            w.text(message)
            socket.send(w)
        }
    }

    /// The control thread, first: dlopen()s the library through the agent's own loader and says how it went.
    func load(path: String) {
        control.claim()
        do throws(HostError) {
            let library = try BackendLibrary.load(path: path, backend: backend)
            control.value.library = library
            var w = WireWriter(.ready)
            w.u32(UInt32(library.abiMajor))
            w.u32(UInt32(library.abiMinor))
            w.u32(library.canListSources ? 1 : 0)
            w.text(library.name)
            w.text(library.description)
            socket.send(w)
        } catch {
            var w = WireWriter(.loadFailed)
            switch error {
            case .libraryMissing: w.u32(LoadFailure.missing.rawValue); w.text("")
            case .libraryUnloadable(_, let reason): w.u32(LoadFailure.unloadable.rawValue); w.text(reason)
            case .entrySymbolMissing: w.u32(LoadFailure.entrySymbolMissing.rawValue); w.text("")
            case .abiMismatch(_, let message): w.u32(LoadFailure.abiMismatch.rawValue); w.text(message)
            default: w.u32(LoadFailure.unloadable.rawValue); w.text(error.description)
            }
            socket.send(w)
            _exit(0)
        }
    }

    /// The control thread: one command at a time, in order.
    func runCommands() {
        while true {
            // Waits an hour at a time, as long as it takes.
            guard let (kind, text) = commands.wait(until: Date(timeIntervalSinceNow: 3600), for: { !$0.isEmpty }, then: { queue, done in
                done ? queue.removeFirst() : nil
            }) else { continue }
            perform(kind, text)
        }
    }

    /// The main thread: reads the socket until the agent closes it, then ends the process.
    func readSocket() -> Never {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: WireLimits.maximumOptions + 1024, alignment: 8)
        while true {
            guard case .message(let count, let descriptors) = socket.receive(into: buffer) else { _exit(0) }
            descriptors.forEach { close($0) }
            do throws(WireError) {
                var reader = try WireReader(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                switch reader.kind {
                case .release:
                    let slot = try reader.u32(), generation = try reader.u32()
                    ring.release(slot: slot, generation: generation)
                case .create, .list:
                    enqueue(reader.kind, try reader.text(limit: WireLimits.maximumOptions))
                case .start, .stop, .destroy:
                    enqueue(reader.kind, "")
                default:
                    _exit(ChildExit.notTheAgent)
                }
            } catch {
                _exit(ChildExit.notTheAgent)   // the agent speaks this protocol; anything else is not the agent
            }
        }
    }

    private func enqueue(_ kind: WireKind, _ text: String) {
        commands.change { $0.append((kind, text)) }
    }

    private func reply(_ call: WireKind, ok: Bool, code: Int32, message: String) {
        var w = WireWriter(.reply)
        w.u32(call.rawValue)
        w.u32(ok ? 1 : 0)
        w.i32(code)
        w.text(message)
        socket.send(w)
    }

    /// The in-process watchdog in this process gave up on a call (BackendSource's budgets): the
    /// agent kills this process and reports the hang.
    private func replyHung(_ call: WireKind, _ error: HostError) {
        guard case .backendHung(_, _, let budget) = error else { return reply(call, ok: false, code: -EINVAL, message: error.description) }
        var w = WireWriter(.reply)
        w.u32(call.rawValue)
        w.u32(2)
        w.i32(Int32(clamping: Int(budget * 1000)))
        w.text(error.description)
        socket.send(w)
    }

    private func perform(_ kind: WireKind, _ text: String) {
        guard let library = control.value.library else { return }
        switch kind {
        case .create:
            guard control.value.source == nil else { return reply(.create, ok: false, code: -EBUSY, message: "already created") }
            do throws(HostError) {
                control.value.source = try BackendSource(library: library, backendName: backend, optionsText: text, sink: sink, logger: logger, budgets: budgets)
                reply(.create, ok: true, code: 0, message: "")
            } catch {
                if case .createFailed(_, let code, let message) = error { reply(.create, ok: false, code: code, message: message) }
                else { replyHung(.create, error) }
            }
        case .start:
            guard let source = control.value.source else { return reply(.start, ok: false, code: -EINVAL, message: "not created") }
            do throws(HostError) {
                try source.start()
                reply(.start, ok: true, code: 0, message: "")
            } catch {
                if case .startFailed(_, let code, let message) = error { reply(.start, ok: false, code: code, message: message) }
                else { replyHung(.start, error) }
            }
        case .stop:
            do throws(HostError) {
                try control.value.source?.stop()
                reply(.stop, ok: true, code: 0, message: "")
            } catch {
                replyHung(.stop, error)
            }
        case .destroy:
            do throws(HostError) {
                try control.value.source?.destroy()
                reply(.destroy, ok: true, code: 0, message: "")
            } catch {
                replyHung(.destroy, error)
            }
            // Threads the backend left behind die with the process; nothing runs its atexit handlers.
            _exit(0)
        case .list:
            var parser = JSONParser(text)
            guard case .object(let options)? = try? parser.parse() else {
                return reply(.list, ok: false, code: -EINVAL, message: "options are not a JSON object")
            }
            do throws(HostError) {
                let found = try library.listSources(backendName: backend, options: options, logger: logger)
                for (name, description) in found {
                    var w = WireWriter(.sourceFound)
                    w.text(name)
                    w.text(description)
                    socket.send(w)
                }
                reply(.list, ok: true, code: 0, message: "")
            } catch {
                switch error {
                case .listFailed(_, let code, let message): reply(.list, ok: false, code: code, message: message)
                case .backendHung: replyHung(.list, error)   // the agent reports it as a hang (exit 22), as in its process
                default: reply(.list, ok: false, code: -EINVAL, message: error.description)
                }
            }
        default:
            break
        }
    }
}
