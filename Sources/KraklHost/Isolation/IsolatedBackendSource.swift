import KraklBase
import FoundationEssentials
import Glibc
import KraklBackendABI

/// Limits and budgets of isolated mode (docs/backend-guide.md, "Isolated mode").
public struct IsolationSettings: Sendable {
    /// Frame buffers in the shared ring (2...8).
    public var slots = 3
    /// How long the backend's frame call may wait for a free buffer before the frame is dropped
    /// (the child is told whole milliseconds).
    public var frameWait: Duration = .milliseconds(20)
    /// The budgets of the calls, as in the agent's process (CallBudgets): the child runs them with
    /// them and reports an overrun; the agent waits `grace` longer before it kills a child that
    /// did not even answer. Either way the call throws HostError.backendHung and the child dies.
    public var budgets: CallBudgets = {
        // destroy() frees what create() made, which the child's exit frees anyway: the agent
        // waits 2 s, not 5, so a run whose backend hangs there still ends soon after a SIGTERM.
        var budgets = CallBudgets.standard
        budgets.destroy = min(budgets.destroy, .seconds(2))
        return budgets
    }()
    public var grace: Duration = .milliseconds(500)
    /// Loading the library (its constructors).
    public var loadBudget: Duration = .seconds(10)
    /// krakl-backend-host to run (nil: $KRAKL_BACKEND_HOST, or next to the running executable).
    public var executable: String?

    public init() {}
}

/// A backend run in a child process (krakl-backend-host) that dlopens it, so a backend that
/// crashes, exits or hangs ends its source, never the agent. Frames come through a shared ring
/// (one copy, in the child); this class hands the sink a krakl_frame pointing into its mapping,
/// on its reader thread, and releases the slot when the sink returns. Everything the child sends
/// is checked as hostile input: a message that breaks the protocol kills the child.
///
/// The child ending while started becomes a `.sourceEnded` event to the sink whose message says
/// why ("the backend crashed: SIGSEGV") and whose error is -EPIPE. Afterwards create and start
/// throw `.backendCrashed`, stop throws it once, destroy only cleans up. A call that overruns its
/// budget kills the child and throws `.backendHung`. Do not call the source from its sink's
/// callbacks (they run on the thread that reads the child's replies).
public final class IsolatedBackendSource: CaptureSource, Sendable {
    public let backendName: String
    public let libraryPath: String
    /// What the child's ready message said (0, 0, false until it came).
    public var abiMajor: Int { state.withLock { $0.abiMajor } }
    public var abiMinor: Int { state.withLock { $0.abiMinor } }
    public var canListSources: Bool { state.withLock { $0.canListSources } }
    /// The child's pid (for tests and diagnostics).
    public var processID: pid_t { process.pid }
    /// This end of the socket (tests check it is closed after destroy).
    var socketDescriptor: Int32 { socket.fd }

    private let settings: IsolationSettings
    private let socket: WireSocket
    private let process: BackendHostProcess
    private weak let sink: FrameSink?
    private let logger: BackendLogger

    private enum Loaded { case ready, failed(HostError) }
    private struct Reply {
        let call: WireKind
        let ok: Bool
        let code: Int32
        let message: String
        /// The child's watchdog gave up on the call; `code` is its budget in milliseconds.
        var hung = false
    }

    /// Replies, the load result and the child's end.
    private struct State {
        var loaded: Loaded?
        var abiMajor = 0
        var abiMinor = 0
        var canListSources = false
        var awaiting: WireKind?
        var reply: Reply?
        var end: ChildEnd?
        var expectingExit = false
        var endReported = false
        var created = false
        var destroyed = false
        var found: [(name: String, description: String)] = []
        var dropped = 0
        var invalid = 0
        var lateFrames = 0
        var tornDown = false
        var reader: pthread_t?
    }
    private let state = Guarded(State())

    /// Whether frames and events go to the sink. Held while the sink runs (deliberately: it
    /// changes only under this lock, so when stop() returns no callback is running).
    private let delivery = Guarded(false)

    /// The ring as mapped here: the reader thread's (claimed as it starts; other threads trap).
    private let mapped = ThreadConfined<(generation: UInt32, base: UnsafeMutableRawPointer, size: Int, slots: Int, slotSize: Int)?>(nil)

    /// Frames the child dropped because every buffer was in use, and invalid frames it did not pass on.
    public var droppedFrames: Int { state.withLock { $0.dropped } }
    public var invalidFrames: Int { state.withLock { $0.invalid } }

    /// Starts krakl-backend-host for `libraryPath` and waits until the library loaded.
    private init(libraryPath: String, backendName: String, sink: FrameSink?, logger: @escaping BackendLogger,
                 settings: IsolationSettings) throws(HostError) {
        self.backendName = backendName
        self.libraryPath = libraryPath
        self.settings = settings
        self.sink = sink
        self.logger = logger
        guard access(libraryPath, F_OK) == 0 else { throw .libraryMissing(backend: backendName, path: libraryPath) }
        guard let (mine, theirs) = WireSocket.pair() else {
            throw .libraryUnloadable(path: libraryPath, reason: "isolated mode: cannot make a socket pair: \(String(cString: strerror(errno)))")
        }
        do throws(HostError) {
            process = try BackendHostProcess(executable: settings.executable ?? BackendHostProcess.executablePath(),
                                             arguments: [libraryPath, backendName, "\(min(max(settings.slots, 2), Int(WireLimits.maximumSlots)))",
                                                         "\(max(0, Int(settings.frameWait.inMilliseconds.rounded())))",
                                                         [settings.budgets.create, settings.budgets.start, settings.budgets.stop,
                                                          settings.budgets.destroy, settings.budgets.listSources].map { "\($0.inSeconds)" }.joined(separator: ",")],
                                             socket: theirs.fd)
        } catch {
            mine.close()
            theirs.close()
            throw error
        }
        theirs.close()
        socket = mine
        guard let thread = startThread(joinable: true, { [self] in readLoop() }) else {
            teardown()
            throw .libraryUnloadable(path: libraryPath, reason: "isolated mode: cannot start a thread")
        }
        state.withLock { $0.reader = thread }
        let deadline = Date().addingTimeInterval(settings.loadBudget.inSeconds)
        let (result, ended) = state.wait(until: deadline, for: { $0.loaded != nil || $0.end != nil }) { state, _ in (state.loaded, state.end) }
        switch result {
        case .ready?: return
        case .failed(let error)?:
            teardown()
            throw error
        case nil:
            if ended == nil { process.kill(because: .killedAfterHang("dlopen")) }
            teardown()
            if let ended { throw .backendCrashed(backend: backendName, reason: ended.reason + " while its library was loaded") }
            throw .backendHung(backend: backendName, call: "dlopen", budgetSeconds: settings.loadBudget.inSeconds)
        }
    }

    /// Loads the backend in a child process and calls its create() with `optionsText`.
    public convenience init(libraryPath: String, backendName: String, optionsText: String, sink: FrameSink?,
                            logger: @escaping BackendLogger, settings: IsolationSettings = IsolationSettings()) throws(HostError) {
        guard optionsText.utf8.count <= WireLimits.maximumOptions else {
            throw .createFailed(backend: backendName, code: -E2BIG,
                                message: "the options are \(optionsText.utf8.count) bytes; isolated mode passes at most \(WireLimits.maximumOptions)")
        }
        try self.init(libraryPath: libraryPath, backendName: backendName, sink: sink, logger: logger, settings: settings)
        var w = WireWriter(.create)
        w.text(optionsText, limit: WireLimits.maximumOptions)
        do throws(HostError) {
            let answer = try call(.create, w, budget: settings.budgets.create)
            guard answer.ok else {
                throw HostError.createFailed(backend: backendName, code: answer.code != 0 ? answer.code : -EINVAL,
                                             message: answer.message.isEmpty ? "the backend gave no reason" : answer.message)
            }
            state.withLock { $0.created = true }
        } catch {
            try? destroy()
            throw error
        }
    }

    public convenience init(libraryPath: String, backendName: String, options: JSONObject, sink: FrameSink?,
                            logger: @escaping BackendLogger, settings: IsolationSettings = IsolationSettings()) throws(HostError) {
        try self.init(libraryPath: libraryPath, backendName: backendName, optionsText: JSON.object(options).serialized,
                      sink: sink, logger: logger, settings: settings)
    }

    /// The sources the options could select, as the backend's list_sources reports them, listed
    /// in a child process of its own; nil when the backend cannot list.
    public static func listSources(libraryPath: String, backendName: String, options: JSONObject, logger: @escaping BackendLogger,
                                   settings: IsolationSettings = IsolationSettings()) throws(HostError) -> [(name: String, description: String)]? {
        let lister = try IsolatedBackendSource(libraryPath: libraryPath, backendName: backendName, sink: nil, logger: logger, settings: settings)
        defer { try? lister.destroy() }
        guard lister.canListSources else { return nil }
        var w = WireWriter(.list)
        w.text(JSON.object(options).serialized, limit: WireLimits.maximumOptions)
        let answer = try lister.call(.list, w, budget: settings.budgets.listSources)
        guard answer.ok else { throw .listFailed(backend: backendName, code: answer.code != 0 ? answer.code : -EINVAL, message: answer.message) }
        return lister.state.withLock { $0.found }
    }

    deinit {
        try? destroy()
        teardown()
    }

    // MARK: - CaptureSource

    public func start() throws(HostError) {
        let (ready, ended) = state.withLock { ($0.created && !$0.destroyed && $0.end == nil, $0.end) }
        if let ended {
            state.withLock { $0.endReported = true }
            throw .backendCrashed(backend: backendName, reason: ended.reason)
        }
        guard ready, !delivery.withLock({ $0 }) else { return }
        // Frames may come before start() returns (the ABI allows it): delivery is on from here.
        delivery.withLock { $0 = true }
        do throws(HostError) {
            let answer = try call(.start, WireWriter(.start), budget: settings.budgets.start)
            guard answer.ok else {
                delivery.withLock { $0 = false }
                throw HostError.startFailed(backend: backendName, code: answer.code != 0 ? answer.code : -EINVAL,
                                            message: answer.message.isEmpty ? "the backend gave no reason" : answer.message)
            }
        } catch {
            delivery.withLock { $0 = false }
            throw error
        }
    }

    public func stop() throws(HostError) {
        let alive = state.withLock { $0.created && !$0.destroyed && $0.end == nil }
        guard alive else {
            delivery.withLock { $0 = false }
            if let crashed = crashError(once: true) { throw crashed }
            return
        }
        guard delivery.withLock({ $0 }) else { return }
        // The reader turns delivery off when it reads the reply, after every frame sent before it.
        _ = try call(.stop, WireWriter(.stop), budget: settings.budgets.stop)
        delivery.withLock { $0 = false }
    }

    public func destroy() throws(HostError) {
        let first = state.withLock { state -> Bool in defer { state.destroyed = true }; return !state.destroyed }
        guard first else { return }
        var failure: HostError?
        if state.withLock({ $0.end == nil }) {
            if delivery.withLock({ $0 }) {
                do throws(HostError) { _ = try call(.stop, WireWriter(.stop), budget: settings.budgets.stop) } catch { failure = error }
                delivery.withLock { $0 = false }
            }
            if failure == nil {
                state.withLock { $0.expectingExit = true }
                do throws(HostError) { _ = try call(.destroy, WireWriter(.destroy), budget: settings.budgets.destroy) } catch {
                    if case .backendHung = error { failure = error }
                }
            }
        }
        delivery.withLock { $0 = false }
        teardown()
        if let failure { throw failure }
    }

    // MARK: - Calls

    /// Sends a command and waits for its reply within `budget`; a child that dies meanwhile is
    /// `.backendCrashed`, one that overruns is killed and `.backendHung`.
    private func call(_ kind: WireKind, _ message: WireWriter, budget: Duration) throws(HostError) -> Reply {
        let gone = state.withLock { state -> ChildEnd? in
            if let end = state.end { return end }
            state.awaiting = kind
            state.reply = nil
            return nil
        }
        if let gone { throw .backendCrashed(backend: backendName, reason: gone.reason) }
        socket.send(message)   // a dead child shows as its end, read below
        let (answer, ended, expectingExit) = state.wait(until: Date().addingTimeInterval((budget + settings.grace).inSeconds),
                                                        for: { $0.reply != nil || $0.end != nil }) { state, _ in
            let answer = state.reply, ended = state.end
            state.awaiting = nil
            state.reply = nil
            if answer == nil && ended != nil && !state.expectingExit { state.endReported = true }
            return (answer, ended, state.expectingExit)
        }
        let name = kind == .list ? "list_sources" : "\(kind)"   // the ABI's names, as in the agent's process
        if let answer, !answer.hung { return answer }
        if let answer {
            // The child's own watchdog gave up on the backend; a thread of it is stuck for good.
            throw killHung(name, budgetSeconds: Double(answer.code) / 1000)
        }
        if let ended {
            if expectingExit { return Reply(call: kind, ok: true, code: 0, message: "") }
            throw .backendCrashed(backend: backendName, reason: ended.reason + " in \(name)()")
        }
        throw killHung(name, budgetSeconds: budget.inSeconds)
    }

    /// Kills the child of a call that hung and waits (bounded) for the reader to see it go; the
    /// error to throw. Nothing of a hung source may reach the sink after the call returns.
    private func killHung(_ call: String, budgetSeconds: Double) -> HostError {
        delivery.withLock { $0 = false }
        process.kill(because: .killedAfterHang(call))
        state.wait(until: Date().addingTimeInterval(5), for: { $0.end != nil }) { state, _ in state.endReported = true }
        return .backendHung(backend: backendName, call: call, budgetSeconds: budgetSeconds)
    }

    /// `.backendCrashed` when the child died on its own; with `once`, only the first time.
    private func crashError(once: Bool) -> HostError? {
        state.withLock { state in
            guard let end = state.end, !state.expectingExit else { return nil }
            if case .killedAfterHang = end { return nil }   // already reported as backendHung
            if once && state.endReported { return nil }
            state.endReported = true
            return .backendCrashed(backend: backendName, reason: end.reason)
        }
    }

    /// Ends the child (if still there), the reader thread, the mapping and the socket. Idempotent;
    /// never called on the reader thread.
    private func teardown() {
        let (first, expectingExit) = state.withLock { state in
            defer { state.tornDown = true }
            return (!state.tornDown, state.expectingExit)
        }
        guard first else { return }
        // After a destroy reply the child exits by itself; give it a moment, then make sure.
        let alive = state.wait(until: Date().addingTimeInterval(expectingExit ? 1 : 0), for: { $0.end != nil }) { state, _ in state.end == nil }
        if alive { process.kill(because: .killedForProtocol("it did not exit when the agent let go of it")) }
        if let reader = state.withLock({ $0.reader }) {
            // The reader ends on the socket's end of file (the child died) and reaps it; shutdown
            // makes sure even if a grandchild of the backend still holds the child's end.
            shutdown(socket.fd, Int32(SHUT_RDWR))
            pthread_join(reader, nil)
            state.withLock { $0.reader = nil }
        } else {
            process.reap(grace: 1)
        }
        socket.close()
    }

    // MARK: - The reader thread

    private func readLoop() {
        mapped.claim()
        nameCurrentThread("krakl-isolated")
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: WireLimits.maximumChildMessage + 64, alignment: 8)
        let scratch = Scratch()
        defer {
            buffer.deallocate()
            scratch.deallocate()
        }
        while true {
            switch socket.receive(into: buffer) {
            case .closed:
                return childGone(problem: nil)
            case .truncated:
                return childGone(problem: "a message larger than \(WireLimits.maximumChildMessage) bytes")
            case .message(let count, let descriptors):
                var unused = descriptors
                do throws(WireError) {
                    var reader = try WireReader(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                    try handle(&reader, descriptors: &unused, scratch: scratch)
                } catch {
                    unused.forEach { close($0) }
                    return childGone(problem: error.description)
                }
                unused.forEach { close($0) }
            }
        }
    }

    /// The krakl_frame (and its damage and cursor) handed to the sink: the reader thread's memory,
    /// rewritten for each frame.
    private struct Scratch {
        let frame = UnsafeMutablePointer<krakl_frame>.allocate(capacity: 1)
        let rects = UnsafeMutablePointer<krakl_rect>.allocate(capacity: WireLimits.maximumRects)
        let cursor = UnsafeMutablePointer<krakl_cursor>.allocate(capacity: 1)

        func deallocate() {
            frame.deallocate()
            rects.deallocate()
            cursor.deallocate()
        }
    }

    private func handle(_ r: inout WireReader, descriptors: inout [Int32], scratch: Scratch) throws(WireError) {
        switch r.kind {
        case .frame:
            try deliverFrame(try FrameMessage(reading: &r), into: scratch)
        case .ring:
            let generation = try r.u32(), slots = try r.u32(), slotSize = try r.u64()
            try r.finish()
            guard descriptors.count == 1 else { throw WireError("a ring message with \(descriptors.count) descriptors") }
            try mapRing(fd: descriptors.removeFirst(), generation: generation, slots: slots, slotSize: slotSize)
        case .log:
            let level = try r.i32(), text = try r.text()
            try r.finish()
            logger(backendName, LogLevel(rawValue: min(max(level, 0), 3))!, text)
        case .event:
            let type = try r.u32(), error = try r.i32(), format = try r.u32(), width = try r.u32(), height = try r.u32()
            let hasMessage = try r.u32(), text = try r.text()
            try r.finish()
            let event = SourceEvent(kind: .init(eventType: type), error: error, message: hasMessage != 0 ? text : nil, format: format,
                                    width: Int(width), height: Int(height))
            delivery.withLock { delivering in if delivering { sink?.event(event) } }
        case .reply:
            let call = try r.u32(), ok = try r.u32(), code = try r.i32(), text = try r.text()
            try r.finish()
            try state.change { (state) throws(WireError) in
                guard let awaiting = state.awaiting, awaiting.rawValue == call, state.reply == nil else {
                    throw WireError("a reply to \(call) that was not asked for")
                }
                if awaiting == .stop { delivery.withLock { $0 = false } }
                guard ok <= 2 else { throw WireError("reply status \(ok)") }
                state.reply = Reply(call: awaiting, ok: ok == 1, code: code, message: text, hung: ok == 2)
            }
        case .ready:
            let major = try r.u32(), minor = try r.u32(), lists = try r.u32()
            _ = try r.text()
            _ = try r.text()
            try r.finish()
            try state.change { (state) throws(WireError) in
                guard state.loaded == nil else { throw WireError("a second ready message") }
                state.abiMajor = Int(major)
                state.abiMinor = Int(minor)
                state.canListSources = lists != 0
                state.loaded = .ready
            }
        case .loadFailed:
            let raw = try r.u32(), text = try r.text()
            try r.finish()
            let error: HostError
            switch LoadFailure(rawValue: raw) {
            case .missing?: error = .libraryMissing(backend: backendName, path: libraryPath)
            case .unloadable?: error = .libraryUnloadable(path: libraryPath, reason: text)
            case .entrySymbolMissing?: error = .entrySymbolMissing(path: libraryPath)
            case .abiMismatch?: error = .abiMismatch(path: libraryPath, message: text)
            case nil: throw WireError("load failure \(raw)")
            }
            state.change { $0.loaded = .failed(error) }
        case .sourceFound:
            let name = try r.text(), description = try r.text()
            try r.finish()
            let accepted = state.withLock { state -> Bool in
                guard state.found.count < 4096 else { return false }
                state.found.append((name, description))
                return true
            }
            guard accepted else { throw WireError("more than 4096 sources") }
        case .invalidFrame:
            deliverInvalid(try InvalidFrame(reading: &r), into: scratch)
        case .create, .start, .stop, .destroy, .list, .release:
            throw WireError("a \(r.kind) message from the child")
        }
    }

    /// Maps a new ring read-only, after checking that its size is what the message says and is
    /// sealed against shrinking (so a read can never fault on a truncated file).
    private func mapRing(fd: Int32, generation: UInt32, slots: UInt32, slotSize: UInt64) throws(WireError) {
        defer { close(fd) }
        let largest = SlotLayout(format: KRAKL_FORMAT_BGRX.rawValue, width: FrameCheck.maximumSide, height: FrameCheck.maximumSide)!.slotSize
        guard (2...WireLimits.maximumSlots).contains(slots), slotSize > 0, slotSize % 4096 == 0, slotSize <= UInt64(largest) else {
            throw WireError("a ring of \(slots) slots of \(slotSize) bytes")
        }
        guard mapped.value.map({ generation &- $0.generation < 1 << 31 && generation != $0.generation }) ?? true else {
            throw WireError("ring generation \(generation) after \(mapped.value!.generation)")
        }
        let size = Int(slots) * Int(slotSize)
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, Int(info.st_size) == size else {
            throw WireError("a ring file that is not \(size) bytes")
        }
        let seals = fcntl(fd, 1034 /* F_GET_SEALS */)
        guard seals >= 0, seals & 2 /* F_SEAL_SHRINK */ != 0 else { throw WireError("a ring file that may shrink (not sealed)") }
        guard let base = mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0), base != MAP_FAILED else {
            throw WireError("a ring that cannot be mapped: \(String(cString: strerror(errno)))")
        }
        unmapRing()
        mapped.value = (generation, base, size, Int(slots), Int(slotSize))
    }

    private func unmapRing() {
        if let ring = mapped.value { munmap(ring.base, ring.size) }
        mapped.value = nil
    }

    /// Checks every field against the mapping, builds the krakl_frame in this process's memory
    /// (pointers into the mapping), hands it to the sink, and releases the slot.
    private func deliverFrame(_ m: FrameMessage, into scratch: Scratch) throws(WireError) {
        let (frame, rects, cursor) = (scratch.frame, scratch.rects, scratch.cursor)
        guard let ring = mapped.value, m.generation == ring.generation else { throw WireError("a frame for ring generation \(m.generation)") }
        guard Int(m.slot) < ring.slots else { throw WireError("a frame in slot \(m.slot) of \(ring.slots)") }
        let width = Int(m.width), height = Int(m.height)
        guard (1...FrameCheck.maximumSide).contains(width), (1...FrameCheck.maximumSide).contains(height),
              let geometry = FrameCheck.planeGeometry(format: m.format, width: width, height: height),
              Int(m.planeCount) == geometry.count else {
            throw WireError("a \(m.width)x\(m.height) frame of format \(m.format) with \(m.planeCount) planes")
        }
        let slotBase = ring.base + Int(m.slot) * ring.slotSize
        var value = krakl_frame()
        value.struct_size = UInt32(MemoryLayout<krakl_frame>.size)
        value.format = m.format
        value.width = m.width
        value.height = m.height
        value.plane_count = m.planeCount
        var planePointers: [UnsafePointer<UInt8>?] = Array(repeating: nil, count: Int(KRAKL_MAX_PLANES))
        var strides: [UInt32] = Array(repeating: 0, count: Int(KRAKL_MAX_PLANES))
        for (index, plane) in geometry.enumerated() {
            let stride = UInt64(m.strides[index]), offset = m.offsets[index]
            // offset + stride × (rows − 1) + rowBytes ≤ slot size, without overflow (each term is bounded).
            guard stride >= UInt64(plane.rowBytes), stride <= UInt64(ring.slotSize), offset <= UInt64(ring.slotSize),
                  offset + stride * UInt64(plane.rows - 1) + UInt64(plane.rowBytes) <= UInt64(ring.slotSize) else {
                throw WireError("plane \(index) (offset \(offset), stride \(stride)) outside its slot")
            }
            planePointers[index] = UnsafePointer((slotBase + Int(offset)).assumingMemoryBound(to: UInt8.self))
            strides[index] = UInt32(stride)
        }
        _ = withUnsafeMutableBytes(of: &value.plane) { $0.bindMemory(to: UnsafePointer<UInt8>?.self).update(from: planePointers) }
        _ = withUnsafeMutableBytes(of: &value.stride) { $0.bindMemory(to: UInt32.self).update(from: strides) }
        value.timestamp_ns = m.timestamp
        value.sequence = m.sequence
        for (index, r) in m.damage.enumerated() {
            rects[index] = r
            if m.damageUnchecked { continue }   // the backend's own wrong damage, for the sink's gate
            guard r.x >= 0, r.y >= 0, r.width > 0, r.height > 0, Int(r.x) + Int(r.width) <= width, Int(r.y) + Int(r.height) <= height else {
                throw WireError("damage (\(r.x),\(r.y) \(r.width)x\(r.height)) outside the \(width)x\(height) frame")
            }
        }
        value.damage_count = UInt32(m.damage.count)
        value.damage = m.damage.isEmpty ? nil : UnsafePointer(rects)
        if m.damageNull {
            value.damage_count = m.damageNullCount
            value.damage = nil
        }
        if let c = m.cursor {
            var pixels: UnsafePointer<UInt8>?
            if let offset = c.pixelsOffset {
                let w = UInt64(c.width), h = UInt64(c.height), stride = UInt64(c.stride)
                guard (1...UInt64(WireLimits.maximumCursorSide)).contains(w), (1...UInt64(WireLimits.maximumCursorSide)).contains(h),
                      stride >= w * 4, stride <= UInt64(WireLimits.maximumCursorSide * 4), offset <= UInt64(ring.slotSize),
                      offset + stride * (h - 1) + w * 4 <= UInt64(ring.slotSize) else {
                    throw WireError("a cursor image outside its slot")
                }
                pixels = UnsafePointer((slotBase + Int(offset)).assumingMemoryBound(to: UInt8.self))
            }
            cursor.pointee = krakl_cursor(struct_size: UInt32(MemoryLayout<krakl_cursor>.size), visible: c.visible, x: c.x, y: c.y,
                                          hotspot_x: c.hotspotX, hotspot_y: c.hotspotY, width: c.width, height: c.height,
                                          stride: c.stride, pixels: pixels, serial: c.serial)
            value.cursor = UnsafePointer(cursor)
        } else {
            value.cursor = nil
        }
        frame.pointee = value
        if m.dropped > 0 { state.withLock { $0.dropped += Int(m.dropped) } }
        let late = delivery.withLock { delivering -> Bool in
            if delivering { sink?.frame(UnsafePointer(frame)) }
            return !delivering
        }
        if late {
            let first = state.withLock { state -> Bool in state.lateFrames += 1; return state.lateFrames == 1 }
            if first { logger(backendName, .warning, "dropped a frame delivered outside start()…stop() (the backend is misbehaving)") }
        }
        var w = WireWriter(.release)
        w.u32(m.slot)
        w.u32(m.generation)
        socket.send(w)
    }

    /// Rebuilds the header of a frame whose pixels the child could not copy, with every plane
    /// NULL, and hands it to the sink, whose gate rejects, logs and counts it as in the agent's
    /// process. Only a header that fails the same checks here reaches the sink.
    private func deliverInvalid(_ m: InvalidFrame, into scratch: Scratch) {
        let frame = scratch.frame
        state.withLock { $0.invalid += 1 }
        var value = krakl_frame()
        value.struct_size = m.structSize
        value.format = m.format
        value.width = m.width
        value.height = m.height
        value.plane_count = m.planeCount
        // Every plane NULL: whatever a frame gate forgives, it cannot use pixels at NULL.
        value.plane = (nil, nil, nil, nil)
        _ = withUnsafeMutableBytes(of: &value.stride) { $0.bindMemory(to: UInt32.self).update(from: m.strides.prefix(Int(KRAKL_MAX_PLANES))) }
        value.timestamp_ns = m.timestamp
        value.sequence = m.sequence
        value.damage_count = 0
        value.damage = nil
        value.cursor = nil
        frame.pointee = value
        let pointer = UnsafePointer(frame)
        guard FrameCheck.geometryProblem(pointer) != nil || FrameCheck.damageProblem(FrameInfo(pointer)) != nil else { return }
        delivery.withLock { delivering in if delivering { sink?.frame(pointer) } }
    }

    /// The child is gone (or broke the protocol, then it is killed first): reap it, tell waiting
    /// calls, and tell the sink when it was delivering, no call is waiting, and nobody asked the
    /// child to exit.
    private func childGone(problem: String?) {
        if let problem { process.kill(because: .killedForProtocol(problem)) }
        let ended = process.reap(grace: 1)
        unmapRing()
        let expected = state.change { state -> Bool in
            state.end = ended
            // A call still waiting for its reply reports the death itself (start throws, and so on). One
            // whose reply already came returns success and reports nothing, so a child that answered
            // start() and then broke the protocol before the caller's thread woke must be reported here,
            // or the source would never end.
            return state.expectingExit || (state.awaiting != nil && state.reply == nil)
        }
        guard !expected else { return }
        delivery.withLock { delivering in
            guard delivering else { return }
            delivering = false
            sink?.event(SourceEvent(kind: .sourceEnded, error: -EPIPE, message: ended.sentence, format: 0, width: 0, height: 0))
        }
    }
}
