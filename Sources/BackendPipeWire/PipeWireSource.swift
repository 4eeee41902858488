import BackendKit
import CPipeWire
import Glibc
import KraklBackendABI
import Synchronization

/// One PipeWire capture source. create() (this init) goes through the
/// ScreenCast portal (or, with option `node`, straight to a node on the
/// default PipeWire socket), connects a pw_stream to the node and starts
/// its pw_thread_loop: everything that can fail, fails here. Buffers are
/// read on that loop's thread from then on into a picture of our own
/// (only damaged areas are copied), so start() can hand over the current
/// picture at once and stop() only has to stop delivering. The session
/// bus is watched on the same thread, so frames and events (format
/// changes, the end of the session) come from one thread.
///
/// With option `camera` it reads a camera instead (a join code held up to
/// it, `krakl-agent --scan --camera`): through the Camera portal when the
/// session has one (option `via`), else the camera's node on the default
/// socket; its YUY2/NV12/I420 pictures converted to I420 and handed over
/// whole, at most `fps` a second (5: what a scan looks at).
final class PipeWireSource: CaptureSource {
    static let options = ["source", "cursor", "restore", "node", "timeout", "camera", "fps", "via"]

    let host: BackendHost
    private var portal: DesktopPortal?
    private var threadLoop: OpaquePointer?
    private var loop: UnsafeMutablePointer<pw_loop>?
    private var context: OpaquePointer?
    private var core: OpaquePointer?
    private var registry: OpaquePointer?
    private var stream: OpaquePointer?
    private var busSource: UnsafeMutablePointer<spa_source>?
    private var kickSource: UnsafeMutablePointer<spa_source>?
    private let coreHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let registryHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let streamHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let coreEvents = UnsafeMutablePointer<pw_core_events>.allocate(capacity: 1)
    private let registryEvents = UnsafeMutablePointer<pw_registry_events>.allocate(capacity: 1)
    private let streamEvents = UnsafeMutablePointer<pw_stream_events>.allocate(capacity: 1)
    private var me: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    /// What is being read, for messages.
    private var nodeID: UInt32 = 0
    private var what = "the PipeWire node"
    private var cursorMeta = false

    // Registry look-up (control thread waits, loop thread fills).
    private var syncSeq: Int32 = -1
    private var syncDone = false
    private(set) var nodes: [PipeWireNode] = []
    private var coreFailure: String?

    // Loop thread state: read or written on PipeWire's loop thread (its callbacks), or by the control
    // thread holding the loop's lock; each entry point checks which (`checkLoopState`).
    /// The control thread holding the loop's lock through `lockLoop` (0: none).
    private let lockHolder = Atomic<UInt>(0)
    private var delivering = false
    private var ended = false
    private var endReported = false
    private var endMessage = ""
    private var tearingDown = false
    private var streamingSeen = false
    private var negotiated: (format: krakl_format, width: Int, height: Int)?
    private var picture: UnsafeMutablePointer<UInt8>?
    private var pictureSize = (width: 0, height: 0)
    private var pictureFormat = KRAKL_FORMAT_INVALID
    private var pictureOrigin = (x: 0, y: 0)
    private var havePicture = false
    /// The picture missed the last buffer, which went to the host straight
    /// from PipeWire's memory: the next copy must be of the whole buffer.
    private var pictureStale = false
    /// Set while a buffer is being processed that goes to the host as it
    /// is (most of it changed, no cursor to draw in): its pixels and stride.
    private var direct: (pixels: UnsafeRawPointer, stride: Int)?
    /// Damage of buffers dropped (older than the newest, or corrupted), in
    /// buffer pixels, still to be copied from the next good buffer.
    private var pendingDamage: [krakl_rect] = []
    private var pendingWhole = true
    /// Damage since the last delivered frame, in picture pixels.
    private var deliveryDamage: [krakl_rect] = []
    private var deliveryWhole = true
    private var lastDelivered: (format: krakl_format, width: Int, height: Int)?
    private var cursor = CursorOverlay()
    private var sender = FrameSender()
    private var regions = [spa_region](repeating: spa_region(), count: 16)

    // Camera mode (option camera; loop thread once created).
    private var camera: PipeWireNode?
    /// Nanoseconds between the pictures handed over (option fps).
    private var cameraInterval: UInt64 = 200_000_000
    private var nextCameraPicture: UInt64 = 0
    private var cameraFormat: UInt32 = 0
    private var cameraRate = ""
    private var cameraPicture = CameraPicture()
    /// The size the last FORMAT_CHANGED announced (nil: none yet).
    private var cameraAnnounced: (width: Int, height: Int)?

    /// A source; with `listOnly`, only connected and with the registry read (list_sources).
    init(host: BackendHost, listOnly: Bool = false) throws(BackendError) {
        self.host = host
        let options = try OptionReader(host: host, known: Self.options)
        let sourceKind = try options.choice("source", default: "monitor", from: ["monitor", "window", "any"])
        let cursorMode = try options.choice("cursor", default: "embedded", from: ["hidden", "embedded", "metadata"])
        let restore = try options.bool("restore", default: true)
        let timeout = try options.number("timeout", default: 60, in: 1...600)
        let node = options.string("node")
        if let node, node.isEmpty { throw .invalidOption("option node is empty: give a node id (a number) or a node.name") }
        let wantedCamera = options.string("camera")
        let fps = try options.number("fps", default: 5, in: 0.1...120)
        cameraInterval = UInt64(1e9 / fps)
        if wantedCamera != nil && node != nil { throw .invalidOption("options camera and node both name a node: give one") }
        // How a camera is reached: the Camera portal when the session has one (auto), only it, or
        // the user's PipeWire directly.
        let via = try options.choice("via", default: "auto", from: ["auto", "portal", "pipewire"])

        coreHook.initialize(to: spa_hook())
        registryHook.initialize(to: spa_hook())
        streamHook.initialize(to: spa_hook())
        coreEvents.initialize(to: pw_core_events())
        registryEvents.initialize(to: pw_registry_events())
        streamEvents.initialize(to: pw_stream_events())

        var portalFD: Int32 = -1
        if node == nil && wantedCamera == nil && !listOnly {
            let portal = try DesktopPortal(.screenCast, responseTimeout: timeout) { [host] level, message in host.log(level, message) }
            self.portal = portal
            let started = try startPortal(portal, source: sourceKind, cursor: cursorMode, restore: restore)
            portalFD = started.fd
            nodeID = started.nodeID
            cursorMeta = started.cursorMode == 4
            what = "the screen-cast node \(started.nodeID)"
        } else {
            cursorMeta = cursorMode == "metadata"
        }
        if wantedCamera != nil && !listOnly && via != "pipewire" {
            portalFD = try openCameraPortal(timeout: timeout, required: via == "portal")
        }

        pw_init(nil, nil)
        guard let threadLoop = pw_thread_loop_new("krakl-pipewire", nil) else {
            if portalFD >= 0 { close(portalFD) }
            throw BackendError(-ENOMEM, "could not create a PipeWire loop")
        }
        self.threadLoop = threadLoop
        loop = pw_thread_loop_get_loop(threadLoop)
        guard let context = pw_context_new(loop, nil, 0) else {
            if portalFD >= 0 { close(portalFD) }
            throw BackendError(-ENOMEM, "could not create a PipeWire context")
        }
        self.context = context
        guard pw_thread_loop_start(threadLoop) == 0 else {
            if portalFD >= 0 { close(portalFD) }
            throw BackendError(-EAGAIN, "could not start the PipeWire thread")
        }
        lockLoop()
        defer { unlockLoop() }
        try connect(portalFD: portalFD)
        try listNodes(timeout: min(timeout, 10))
        if listOnly { return }
        if wantedCamera != nil && portal != nil { waitForACamera(timeout: min(timeout, 3)) }
        if let wantedCamera {
            let camera = try PipeWireNode.camera(wantedCamera, among: nodes)
            self.camera = camera
            nodeID = camera.id
            what = "camera \(camera.label)"
            host.log(KRAKL_LOG_INFO, "pipewire: reading \(what)")
        } else if let node {
            try resolve(node)
        } else if !nodes.contains(where: { $0.id == nodeID }) {
            throw BackendError(-ENODEV, "the portal's node \(nodeID) is not visible on its PipeWire connection")
        }
        try connectStream()
        watchBus()
    }

    deinit { teardown() }

    // MARK: control thread: portal, connection, look-up

    /// Runs the portal's session and keeps its restore token.
    private func startPortal(_ portal: DesktopPortal, source: String, cursor: String, restore: Bool) throws(BackendError) -> PortalStream {
        let wanted: UInt32 = source == "monitor" ? 1 : source == "window" ? 2 : 3
        let types = wanted & portal.availableSourceTypes
        guard types != 0 else {
            let offered = [(1, "monitor"), (2, "window"), (4, "virtual")].filter { portal.availableSourceTypes & UInt32($0.0) != 0 }.map(\.1)
            throw BackendError(-EOPNOTSUPP, "the ScreenCast portal cannot share a \(source) (it offers: \(offered.isEmpty ? "nothing" : offered.joined(separator: ", "))); set option source")
        }
        let modes: [String: UInt32] = ["hidden": 1, "embedded": 2, "metadata": 4]
        var mode = modes[cursor]!
        let available = portal.availableCursorModes
        if portal.version >= 2 && available & mode == 0 {
            // Fall back to what draws the pointer anyway, else hide it.
            let fallback: UInt32 = cursor == "metadata" ? (available & 2 != 0 ? 2 : 1) : cursor == "embedded" ? (available & 4 != 0 ? 4 : 1) : (available & 1 != 0 ? 1 : 2)
            let name = modes.first { $0.value == fallback }!.key
            host.log(KRAKL_LOG_WARNING, "pipewire: the portal has no cursor mode \"\(cursor)\" (it offers \(modes.filter { available & $0.value != 0 }.keys.sorted().joined(separator: ", "))); using \"\(name)\"")
            mode = fallback
        }
        let store = RestoreTokenStore(kind: source)
        if !restore { store.forget() }
        let token = restore && portal.version >= 4 ? store.load() : nil
        if let token {
            host.log(KRAKL_LOG_INFO, "pipewire: offering the stored restore token (\(token.shortenedToken)) from \(store.path)")
        }
        let started = try portal.start(PortalRequest(sourceTypes: types, cursorMode: mode, restoreToken: token,
                                                     persist: restore && portal.version >= 4))
        if restore, let new = started.restoreToken {
            do throws(BackendError) {
                try store.save(new)
                host.log(KRAKL_LOG_INFO, "pipewire: stored a new restore token (\(new.shortenedToken)) in \(store.path)")
            } catch {
                host.log(KRAKL_LOG_WARNING, "pipewire: \(error.message); the portal will ask again next time")
            }
        } else if restore && token != nil {
            store.forget() // used up: the portal gave no new one
        }
        host.log(KRAKL_LOG_INFO, "pipewire: the portal shares node \(started.nodeID) (\(started.width)x\(started.height))")
        return started
    }

    /// Asks the Camera portal for the camera and returns the descriptor of the PipeWire
    /// connection it opens (one that shows the cameras only), or -1 to read PipeWire directly
    /// when there is no Camera portal and it is not `required`. A denial is EACCES either way.
    private func openCameraPortal(timeout: Double, required: Bool) throws(BackendError) -> Int32 {
        let portal: DesktopPortal
        do {
            portal = try DesktopPortal(.camera, responseTimeout: timeout) { [host] level, message in host.log(level, message) }
        } catch let error where !required && (error.code == -EOPNOTSUPP || error.code == -ENXIO) {
            // The usual case outside a sandbox: no portal, or one without the Access backend the
            // Camera interface needs (xdg-desktop-portal exports it only then).
            host.log(KRAKL_LOG_INFO, "pipewire: no Camera portal (\(error.message)); reading the cameras on PipeWire directly")
            return -1
        }
        self.portal = portal
        try portal.accessCamera()
        let fd = try portal.openPipeWireRemote(session: nil)
        host.log(KRAKL_LOG_INFO, "pipewire: the Camera portal allowed the camera; reading it through the portal's PipeWire connection")
        return fd
    }

    /// Loop locked. On the Camera portal's connection the session manager grants the cameras
    /// after we connect (WirePlumber's access-portal), so they may show up after the first sync:
    /// wait, bounded, for one.
    private func waitForACamera(timeout: Double) {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while !nodes.contains(where: \.isCamera) && coreFailure == nil && monotonicNanoseconds() < deadline {
            _ = pw_thread_loop_timed_wait(threadLoop, 1)
        }
    }

    /// Loop locked. Connects to PipeWire: the portal's descriptor, or the default socket.
    private func connect(portalFD: Int32) throws(BackendError) {
        coreEvents.pointee.version = UInt32(PW_VERSION_CORE_EVENTS)
        coreEvents.pointee.done = { data, id, seq in
            let me = Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue()
            if id == UInt32(PW_ID_CORE) && seq == me.syncSeq { me.syncDone = true; pw_thread_loop_signal(me.threadLoop, false) }
        }
        coreEvents.pointee.error = { data, id, _, res, message in
            let me = Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue()
            let text = message.map { String(cString: $0) } ?? String(cString: strerror(-res))
            if id == UInt32(PW_ID_CORE) {
                me.coreFailure = res == -EPIPE ? "the connection to PipeWire broke (PipeWire exited?)" : "PipeWire reported: \(text)"
                pw_thread_loop_signal(me.threadLoop, false)
                me.end(me.coreFailure!)
            }
        }
        if portalFD >= 0 {
            core = pw_context_connect_fd(context, portalFD, nil, 0)
            guard core != nil else {
                let code = errno
                throw BackendError(-ECONNREFUSED, "could not connect to PipeWire through the portal's descriptor: \(String(cString: strerror(code))); is PipeWire running?")
            }
        } else {
            core = pw_context_connect(context, nil, 0)
            guard core != nil else {
                let code = errno
                let folder = [getenv("PIPEWIRE_RUNTIME_DIR"), getenv("XDG_RUNTIME_DIR")].compactMap { $0 }.first.map { String(cString: $0) } ?? "(no XDG_RUNTIME_DIR)"
                let name = getenv("PIPEWIRE_REMOTE").map { String(cString: $0) } ?? "pipewire-0"
                throw BackendError(-ECONNREFUSED, "PipeWire is not running: cannot connect to \(name.hasPrefix("/") ? name : folder + "/" + name) (\(String(cString: strerror(code)))); start pipewire (and wireplumber) for this user")
            }
        }
        _ = krakl_pw_core_add_listener(core, coreHook, coreEvents, me)
    }

    /// Loop locked. Lists the nodes PipeWire shows us (bounded wait), and
    /// keeps the registry to hear when ours goes away.
    private func listNodes(timeout: Double) throws(BackendError) {
        registryEvents.pointee.version = UInt32(PW_VERSION_REGISTRY_EVENTS)
        registryEvents.pointee.global = { data, id, _, type, _, props in
            let me = Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue()
            guard let type, String(cString: type) == "PipeWire:Interface:Node" else { return }
            func value(_ key: String) -> String? { krakl_pw_dict_lookup(props, key).map { String(cString: $0) } }
            let name = value("node.name") ?? ""
            me.nodes.append(PipeWireNode(id: id, name: name, mediaClass: value("media.class") ?? "", role: value("media.role") ?? "",
                                         description: value("node.description") ?? value("node.nick") ?? name, api: value("device.api") ?? ""))
            pw_thread_loop_signal(me.threadLoop, false)   // waitForACamera
        }
        registryEvents.pointee.global_remove = { data, id in
            let me = Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue()
            me.nodes.removeAll { $0.id == id }
            if id == me.nodeID && me.stream != nil {
                me.end(me.camera == nil ? "\(me.what) went away (the screen cast was stopped)" : "\(me.what) went away (unplugged?)")
            }
        }
        registry = krakl_pw_core_get_registry(core)
        guard registry != nil else { throw BackendError(-ENOMEM, "could not read PipeWire's registry") }
        krakl_pw_registry_add_listener(registry, registryHook, registryEvents, me)
        syncDone = false
        syncSeq = krakl_pw_core_sync(core, 0)
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while !syncDone && coreFailure == nil && monotonicNanoseconds() < deadline {
            _ = pw_thread_loop_timed_wait(threadLoop, 1)
        }
        if let coreFailure { throw BackendError(-ECONNREFUSED, "PipeWire is not usable: \(coreFailure)") }
        guard syncDone else { throw BackendError(-ETIMEDOUT, "PipeWire did not answer within \(Int(timeout)) s") }
    }

    /// Loop locked. Finds option `node` (an id or a node.name) among the video nodes.
    private func resolve(_ node: String) throws(BackendError) {
        let video = nodes.filter(\.isVideo)
        let match = UInt32(node).flatMap { id in nodes.first { $0.id == id } } ?? nodes.first { $0.name == node }
        guard let match else {
            let list = video.map { "\($0.id) (\($0.name), \($0.mediaClass))" }
            throw BackendError(-ENODEV, "no PipeWire node \(node); video nodes: \(list.isEmpty ? "none" : list.joined(separator: ", "))")
        }
        guard match.isVideo else {
            throw BackendError(-ENODEV, "PipeWire node \(node) (\(match.name)) is \(match.mediaClass.isEmpty ? "not a media node" : match.mediaClass), not a video source")
        }
        nodeID = match.id
        what = "PipeWire node \(match.id) (\(match.name))"
    }

    /// Loop locked. Creates the stream and connects it to `nodeID`.
    private func connectStream() throws(BackendError) {
        streamEvents.pointee.version = UInt32(PW_VERSION_STREAM_EVENTS)
        streamEvents.pointee.state_changed = { data, _, state, error in
            Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue().stateChanged(state, error.map { String(cString: $0) })
        }
        streamEvents.pointee.param_changed = { data, id, param in
            Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue().paramChanged(id, param)
        }
        streamEvents.pointee.process = { data in
            Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue().process()
        }
        guard let stream = pw_stream_new(core, "krakl-agent", camera == nil ? krakl_pw_stream_properties() : krakl_pw_camera_stream_properties()) else {
            throw BackendError(-ENOMEM, "could not create a PipeWire stream")
        }
        self.stream = stream
        pw_stream_add_listener(stream, streamHook, streamEvents, me)
        var buffer = [UInt8](repeating: 0, count: 1024)
        var params = [UnsafePointer<spa_pod>?](repeating: nil, count: 1)
        let count = buffer.withUnsafeMutableBufferPointer {
            camera == nil ? krakl_pw_format_params($0.baseAddress, UInt32($0.count), &params)
                : krakl_pw_camera_format_params($0.baseAddress, UInt32($0.count), &params)
        }
        let flags = pw_stream_flags(PW_STREAM_FLAG_AUTOCONNECT.rawValue | PW_STREAM_FLAG_MAP_BUFFERS.rawValue)
        let status = pw_stream_connect(stream, SPA_DIRECTION_INPUT, nodeID, flags, &params, count)
        guard status >= 0 else { throw BackendError(status, "could not connect to \(what): \(String(cString: strerror(-status)))") }
    }

    /// Loop locked. The bus (the session's Closed signal) and the wake-up
    /// start() uses are served by the loop thread.
    private func watchBus() {
        kickSource = krakl_pw_loop_add_event(loop, { data, _ in
            Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue().kicked()
        }, me)
        guard let portal, portal.fd >= 0 else { return }
        portal.closed.onClosed = { [unowned self] in self.end("the portal session was closed (sharing was stopped in the desktop)") }
        busSource = krakl_pw_loop_add_io(loop, portal.fd, { data, _, _ in
            Unmanaged<PipeWireSource>.fromOpaque(data!).takeUnretainedValue().portal?.processPending()
        }, me)
        // Messages that arrived during create() are already buffered.
        _ = krakl_pw_loop_signal_event(loop, kickSource)
    }

    /// list_sources: the cameras (with option camera; none is ENODEV with the words create() gives),
    /// else the portal's screen (what no option shares, as X11's "screen") and every video source
    /// (what option node takes). The portal's own node shows only while it casts, so without the
    /// first entry a stack with no other video node listed nothing (conformance's list-sources).
    static func listSources(host: BackendHost) throws(BackendError) {
        let cameras = host.option("camera") != nil
        let source = try PipeWireSource(host: host, listOnly: true)
        if cameras && !source.nodes.contains(where: \.isCamera) { throw PipeWireNode.noCamera }
        if !cameras { host.sourceFound(name: "portal", description: "the screen or window picked in the ScreenCast portal's dialog (no node option)") }
        for node in source.nodes.sorted(by: { $0.id < $1.id }) where cameras ? node.isCamera : node.mediaClass == "Video/Source" {
            let kind = node.isCamera ? "camera" : "video source"
            host.sourceFound(name: "\(node.id)", description: "\(kind) \"\(node.description)\" (\(node.name)\(node.api.isEmpty ? "" : ", " + node.api))")
        }
    }

    // MARK: control thread: start/stop/destroy

    /// Takes the loop's lock on the control thread (callbacks run with it held: none runs meanwhile).
    private func lockLoop() {
        guard let threadLoop else { return }
        pw_thread_loop_lock(threadLoop)
        lockHolder.store(UInt(pthread_self()), ordering: .relaxed)
    }

    private func unlockLoop() {
        guard let threadLoop else { return }
        lockHolder.store(0, ordering: .relaxed)
        pw_thread_loop_unlock(threadLoop)
    }

    /// Traps unless this is PipeWire's loop thread or the control thread holding the loop's lock:
    /// where the loop state may be touched.
    @inline(__always)
    private func checkLoopState() {
        guard let threadLoop else { return }
        precondition(pw_thread_loop_in_thread(threadLoop) || lockHolder.load(ordering: .relaxed) == UInt(pthread_self()),
                     "PipeWire loop state touched off its thread without the loop's lock")
    }

    func start() throws(BackendError) {
        guard threadLoop != nil else { throw BackendError(-EINVAL, "the pipewire source was not created") }
        lockLoop()
        defer { unlockLoop() }
        checkLoopState()
        guard !delivering else { throw BackendError(-EBUSY, "the pipewire source is already started") }
        delivering = true
        endReported = false
        deliveryWhole = true
        // The loop thread delivers the current picture (or the end) at once.
        _ = krakl_pw_loop_signal_event(loop, kickSource)
    }

    func stop() {
        guard threadLoop != nil else { return }
        // Callbacks run with the loop locked: once we hold it, none is running.
        lockLoop()
        checkLoopState()
        delivering = false
        unlockLoop()
    }

    private func teardown() {
        if let threadLoop {
            lockLoop()
            checkLoopState()
            tearingDown = true
            delivering = false
            if let busSource { krakl_pw_loop_destroy_source(loop, busSource) }
            if let kickSource { krakl_pw_loop_destroy_source(loop, kickSource) }
            busSource = nil
            kickSource = nil
            if let stream { pw_stream_destroy(stream) }
            stream = nil
            if let registry { krakl_pw_proxy_destroy(UnsafeMutableRawPointer(registry)) }
            registry = nil
            if let core { pw_core_disconnect(core) }
            core = nil
            unlockLoop()
            pw_thread_loop_stop(threadLoop)
        }
        if let context { pw_context_destroy(context) }
        context = nil
        if let threadLoop { pw_thread_loop_destroy(threadLoop) }
        threadLoop = nil
        portal?.closed.onClosed = nil
        portal?.close()
        portal = nil
        picture?.deallocate()
        picture = nil
        cameraPicture.free()
        for hook in [coreHook, registryHook, streamHook] { hook.deallocate() }
        coreEvents.deallocate()
        registryEvents.deallocate()
        streamEvents.deallocate()
    }

    // MARK: loop thread

    private func end(_ message: String) {
        guard !tearingDown else { return }
        if !ended {
            ended = true
            endMessage = message
            host.log(KRAKL_LOG_INFO, "pipewire: \(message)")
        }
        if delivering && !endReported {
            endReported = true
            host.sendEvent(KRAKL_EVENT_SOURCE_ENDED, error: -ENODEV, message: endMessage)
        }
    }

    /// start() asked for the current picture (or bus messages are waiting).
    private func kicked() {
        checkLoopState()
        portal?.processPending()
        if ended { end(endMessage); return }
        if camera != nil { deliverCamera(); return }
        deliver()
    }

    /// A camera buffer: converted and handed over when the next picture is due (the rest are
    /// returned unread: a scan looks at most `fps` times a second, and converting every one of a
    /// camera's 30 would cost more than the scan itself).
    private func readCamera(_ buffer: UnsafeMutablePointer<spa_buffer>) {
        guard let negotiated else { return }
        let now = monotonicNanoseconds()
        guard delivering, now >= nextCameraPicture else { return }
        guard let planes = CameraPicture.planes(of: buffer, format: cameraFormat, width: negotiated.width, height: negotiated.height) else {
            host.sendEvent(KRAKL_EVENT_ERROR, error: -EIO, message: "a PipeWire buffer from \(what) is smaller than its format says; picture skipped")
            return
        }
        guard cameraPicture.convert(planes, format: cameraFormat, width: negotiated.width, height: negotiated.height) else { return }
        // On the rate's grid (a camera's pictures come every 33 ms: from `now` on, jitter of a
        // millisecond would turn 5 a second into 4.3), unless the camera paused.
        nextCameraPicture = nextCameraPicture == 0 || now - nextCameraPicture > cameraInterval ? now + cameraInterval : nextCameraPicture + cameraInterval
        havePicture = true
        deliverCamera()
    }

    /// Hands over the camera's picture, whole; a new size is announced first (before the first
    /// picture too: its message names the camera, its size, format and rate, for the person).
    private func deliverCamera() {
        guard delivering, !ended, havePicture, var frame = cameraPicture.frame() else { return }
        let size = (width: cameraPicture.width, height: cameraPicture.height)
        if cameraAnnounced == nil || cameraAnnounced! != size {
            host.sendEvent(KRAKL_EVENT_FORMAT_CHANGED,
                           message: "\(what): \(size.width)x\(size.height), \(cameraRate), \(CameraPicture.name(cameraFormat))",
                           format: KRAKL_FORMAT_I420, width: size.width, height: size.height)
            cameraAnnounced = size
        }
        sender.send(&frame, timestamp: sender.nextTimestamp(), damage: [], to: host)
    }

    private func stateChanged(_ state: pw_stream_state, _ error: String?) {
        checkLoopState()
        guard !tearingDown else { return }
        switch state {
        case PW_STREAM_STATE_STREAMING:
            streamingSeen = true
        case PW_STREAM_STATE_ERROR:
            end("the PipeWire stream from \(what) failed: \(error ?? "no reason given")")
        case PW_STREAM_STATE_UNCONNECTED:
            end("the PipeWire stream from \(what) was disconnected\(error.map { ": \($0)" } ?? "")")
        default:
            break
        }
    }

    private func paramChanged(_ id: UInt32, _ param: UnsafePointer<spa_pod>?) {
        checkLoopState()
        guard id == SPA_PARAM_Format.rawValue, let param, let stream else { return }
        var format: UInt32 = 0, width: UInt32 = 0, height: UInt32 = 0
        guard krakl_pw_parse_format(param, &format, &width, &height) == 0 else { return }
        if camera != nil {
            guard CameraPicture.layout(format, width: Int(width)) != nil else {
                end("\(what) negotiated video format \(CameraPicture.name(format)), which this backend cannot read")
                return
            }
            var num: UInt32 = 0, denom: UInt32 = 1
            _ = krakl_pw_parse_framerate(param, &num, &denom)
            cameraFormat = format
            // No Foundation in a backend: whole rates as they are, others to a tenth.
            cameraRate = num == 0 || denom == 0 ? "a variable rate"
                : num % denom == 0 ? "\(num / denom) fps" : "\(Double(Int(Double(num) / Double(denom) * 10)) / 10) fps"
            negotiated = (KRAKL_FORMAT_I420, Int(width), Int(height))
            host.log(KRAKL_LOG_INFO, "pipewire: \(what) sends \(width)x\(height) \(CameraPicture.name(format)) at \(cameraRate)")
            requestBuffers(stream, cursorMeta: false)
            return
        }
        let mapped: krakl_format
        switch format {
        case SPA_VIDEO_FORMAT_BGRx.rawValue: mapped = KRAKL_FORMAT_BGRX
        case SPA_VIDEO_FORMAT_BGRA.rawValue: mapped = KRAKL_FORMAT_BGRA
        case SPA_VIDEO_FORMAT_RGBx.rawValue: mapped = KRAKL_FORMAT_RGBX
        case SPA_VIDEO_FORMAT_RGBA.rawValue: mapped = KRAKL_FORMAT_RGBA
        default:
            end("\(what) negotiated video format \(format), which this backend cannot read")
            return
        }
        negotiated = (mapped, Int(width), Int(height))
        pendingWhole = true
        host.log(KRAKL_LOG_DEBUG, "pipewire: \(what) sends \(width)x\(height) format \(format)")
        requestBuffers(stream, cursorMeta: cursorMeta)
    }

    /// Once the format is fixed: the buffers and metadata we read (krakl_pw_buffer_params).
    private func requestBuffers(_ stream: OpaquePointer, cursorMeta: Bool) {
        var buffer = [UInt8](repeating: 0, count: 2048)
        var params = [UnsafePointer<spa_pod>?](repeating: nil, count: 8)
        let count = buffer.withUnsafeMutableBufferPointer { krakl_pw_buffer_params($0.baseAddress, UInt32($0.count), &params, cursorMeta) }
        _ = pw_stream_update_params(stream, &params, count)
    }

    /// The damage a buffer carries, in buffer pixels; nil: the whole frame.
    private func damage(of buffer: UnsafeMutablePointer<spa_buffer>) -> [krakl_rect]? {
        let count = regions.withUnsafeMutableBufferPointer { krakl_pw_buffer_damage(buffer, $0.baseAddress, Int32($0.count)) }
        guard count > 0 && Int(count) <= regions.count else { return nil }
        return regions[0..<Int(count)].map {
            krakl_rect(x: $0.position.x, y: $0.position.y, width: Int32(clamping: $0.size.width), height: Int32(clamping: $0.size.height))
        }
    }

    /// A buffer whose pixels will not be copied (older than the newest, or
    /// corrupted): its damage is carried to the next good one.
    private func absorb(_ buffer: UnsafeMutablePointer<spa_buffer>) {
        if let rects = damage(of: buffer) { pendingDamage += rects } else { pendingWhole = true }
    }

    private func process() {
        checkLoopState()
        guard let stream, !tearingDown else { return }
        var newest: UnsafeMutablePointer<pw_buffer>?
        while let next = pw_stream_dequeue_buffer(stream) {
            if let older = newest {
                absorb(older.pointee.buffer)
                pw_stream_queue_buffer(stream, older)
            }
            newest = next
        }
        guard let newest else { return }
        defer { pw_stream_queue_buffer(stream, newest) }
        let buffer = newest.pointee.buffer!
        if krakl_pw_buffer_corrupted(buffer) {
            absorb(buffer)
            return
        }
        if camera != nil {
            readCamera(buffer)
            return
        }
        if let negotiated, buffer.pointee.n_datas > 0, let data = buffer.pointee.datas, let chunk = data.pointee.chunk,
           let base = data.pointee.data, chunk.pointee.size > 0 {
            copyPixels(buffer, base: UnsafeRawPointer(base), maxSize: Int(data.pointee.maxsize), chunk: chunk.pointee, negotiated: negotiated)
        }
        if cursorMeta && havePicture {
            var meta = krakl_pw_cursor()
            if krakl_pw_buffer_cursor(buffer, &meta) {
                deliveryDamage += cursor.update(meta, originX: pictureOrigin.x, originY: pictureOrigin.y,
                                                pictureWidth: pictureSize.width, pictureHeight: pictureSize.height)
            }
        }
        deliver()
    }

    /// Copies the buffer's changed areas (all of it when needed) into the picture.
    private func copyPixels(_ buffer: UnsafeMutablePointer<spa_buffer>, base: UnsafeRawPointer, maxSize: Int, chunk: spa_chunk,
                            negotiated: (format: krakl_format, width: Int, height: Int)) {
        let stride = chunk.stride > 0 ? Int(chunk.stride) : negotiated.width * 4
        var crop = krakl_rect(x: 0, y: 0, width: Int32(negotiated.width), height: Int32(negotiated.height))
        var region = spa_region()
        if krakl_pw_buffer_crop(buffer, &region),
           let clipped = krakl_rect(x: region.position.x, y: region.position.y, width: Int32(clamping: region.size.width),
                                    height: Int32(clamping: region.size.height)).clipped(width: negotiated.width, height: negotiated.height) {
            crop = clipped
        }
        let offset = Int(chunk.offset) % max(maxSize, 1)
        let needed = offset + stride * Int(crop.y + crop.height - 1) + Int(crop.x + crop.width) * 4
        guard stride >= negotiated.width * 4 || stride >= Int(crop.x + crop.width) * 4, needed <= maxSize else {
            if delivering { host.sendEvent(KRAKL_EVENT_ERROR, error: -EIO, message: "a PipeWire buffer is smaller than its format says; frame skipped") }
            return
        }
        let width = Int(crop.width), height = Int(crop.height)
        if picture == nil || width != pictureSize.width || height != pictureSize.height || negotiated.format != pictureFormat {
            picture?.deallocate()
            picture = .allocate(capacity: width * height * 4)
            pictureSize = (width, height)
            pictureFormat = negotiated.format
            pendingWhole = true
            cursor.forgetPlace()
        }
        if Int(crop.x) != pictureOrigin.x || Int(crop.y) != pictureOrigin.y {
            pictureOrigin = (Int(crop.x), Int(crop.y))
            pendingWhole = true
        }
        var rects: [krakl_rect] = []
        if !pendingWhole, let own = damage(of: buffer) {
            for r in pendingDamage + own {
                let moved = krakl_rect(x: r.x - crop.x, y: r.y - crop.y, width: r.width, height: r.height)
                if let inside = moved.clipped(width: width, height: height) { rects.append(inside) }
            }
        } else {
            pendingWhole = true
        }
        let whole = krakl_rect(x: 0, y: 0, width: Int32(width), height: Int32(height))
        if pendingWhole { rects = [whole] }
        let source = base + offset + Int(crop.y) * stride + Int(crop.x) * 4
        // When most of the screen changed (scrolling, video) copying it into
        // our picture costs more than everything else the backend does, so
        // such a buffer goes to the host as it is, valid until process()
        // returns it to PipeWire. Not with a cursor to draw in (that would
        // write into the compositor's buffer).
        let changed = rects.reduce(0) { $0 + Int($1.width) * Int($1.height) }
        if delivering && !cursorMeta && changed * 4 >= width * height * 3 {
            direct = (UnsafeRawPointer(source), stride)
            pictureStale = true
        } else {
            let picture = picture!
            for r in pictureStale ? [whole] : rects {
                for row in Int(r.y)..<Int(r.y + r.height) {
                    memcpy(picture + row * width * 4 + Int(r.x) * 4, source + row * stride + Int(r.x) * 4, Int(r.width) * 4)
                }
            }
            pictureStale = false
        }
        if pendingWhole { deliveryWhole = true } else { deliveryDamage += rects }
        pendingWhole = false
        pendingDamage = []
        havePicture = true
    }

    /// Hands the picture to the host when something changed since the last delivery.
    private func deliver() {
        defer { direct = nil }  // only ever valid inside process()
        guard delivering, !ended, havePicture, let picture, deliveryWhole || !deliveryDamage.isEmpty else { return }
        // Outside a buffer (start() asking for the current picture) a stale
        // picture is not sent; the next buffer is copied whole instead.
        if pictureStale && direct == nil { return }
        let current = (format: pictureFormat, width: pictureSize.width, height: pictureSize.height)
        if let last = lastDelivered, last.format != current.format || last.width != current.width || last.height != current.height {
            host.sendEvent(KRAKL_EVENT_FORMAT_CHANGED, message: "\(what) is now \(current.width)x\(current.height)",
                           format: current.format, width: current.width, height: current.height)
            deliveryWhole = true
        }
        let stride = direct?.stride ?? current.width * 4
        let under = cursorMeta && direct == nil ? cursor.draw(into: picture, stride: stride,
                                                              redFirst: pictureFormat == KRAKL_FORMAT_RGBX || pictureFormat == KRAKL_FORMAT_RGBA) : nil
        var frame = krakl_frame()
        frame.format = current.format.rawValue
        frame.width = UInt32(current.width)
        frame.height = UInt32(current.height)
        frame.plane_count = 1
        frame.stride.0 = UInt32(stride)
        frame.plane.0 = direct?.pixels.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(picture)
        sender.send(&frame, timestamp: sender.nextTimestamp(), damage: deliveryWhole ? [] : deliveryDamage, to: host)
        if let under { cursor.restore(under, into: picture, stride: stride) }
        lastDelivered = current
        deliveryWhole = false
        deliveryDamage = []
    }
}
