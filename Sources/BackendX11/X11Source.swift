import BackendKit
import CX11
import Glibc
import KraklBackendABI
import Synchronization

/// The last X protocol error, set by the process-wide error handler. Xlib's
/// default handler exits the process on any protocol error (a window that
/// vanished mid-read, say); capture must report it instead.
/// Atomics: Xlib calls the handler on whichever thread made the failing request.
private let lastXError = Atomic<UInt8>(0)
private let handlersInstalled = Atomic<Bool>(false)

private let xErrorHandler: @convention(c) (OpaquePointer?, UnsafeMutablePointer<XErrorEvent>?) -> Int32 = { _, event in
    lastXError.store(event?.pointee.error_code ?? 1, ordering: .relaxed)
    return 0
}

/// Xlib prints a line and then calls the per-display exit handler below;
/// the message goes through the host's log instead.
private let xIOErrorHandler: @convention(c) (OpaquePointer?) -> Int32 = { _ in 0 }

/// Called instead of exit() when the connection to the X server breaks
/// (libX11 ≥ 1.8). Marks the source lost; the capture thread then reports
/// SOURCE_ENDED and never touches the display again.
private let xIOErrorExit: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, context in
    guard let context else { return }
    Unmanaged<LostFlag>.fromOpaque(context).takeUnretainedValue().mark()
}

/// Set by Xlib's I/O error handler (on whichever thread made the failing call), read by the capture thread.
final class LostFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    func mark() { flag.store(true, ordering: .releasing) }
    var lost: Bool { flag.load(ordering: .acquiring) }
}

/// A rectangle of the X screen being captured, in root-window pixels.
struct CaptureArea: Equatable {
    var x: Int, y: Int, width: Int, height: Int
}

/// One X11 capture source: a display connection, a small MIT-SHM segment
/// that damaged areas are read through, an XDamage object on the root
/// window, and the picture (I420) that only damaged areas are converted into.
final class X11Source: CaptureSource {
    static let options = ["display", "monitor", "region", "cursor", "fps", "shm", "damage"]

    let host: BackendHost
    let fps: Double
    let cursorEnabled: Bool
    private let displayName: String
    private let display: OpaquePointer
    private let root: Window
    private let monitor: String?
    private let region: CaptureArea?
    private var area: CaptureArea
    private let visual: UnsafeMutablePointer<Visual>
    private let depth: Int32
    private var useShm = false
    private var useDamage = false
    /// Where every read lands (in bands of rows) before it is converted
    /// into the picture; nil without MIT-SHM (XGetImage, in the same bands).
    private var scratchShm: SharedSegment?
    private var damage: Damage = 0
    private var damageEventBase: Int32 = 0
    private let lost = LostFlag()
    private var lostRetained: Unmanaged<LostFlag>?

    /// What the screen shows (no cursor), in I420: the host encodes I420,
    /// and a BGRx picture of the screen was 8.3 MB resident at 1080p where
    /// this is 3.1 MB. The cursor is drawn into it only for the length of a
    /// delivery, then the Y, U and V under it are restored.
    private var picture: I420Picture
    /// The clean BGRx of the area under the cursor (`patchRect`, grown to
    /// whole 2×2 chroma blocks): the cursor is blended there and the patch
    /// converted into the picture. Kept up to date from the reads that
    /// cross it, so a pointer that stays put costs no extra read; read
    /// afresh (one small request) when the pointer moves or changes shape.
    private var patchRect: krakl_rect?
    private var patchClean: [UInt8] = []
    private var patchValid = false

    private var thread: PacedThread?
    private var sender = FrameSender()
    private var needWhole = true
    private var cursor = CursorState()
    /// Cursor changes come as events when the server has XInput2 (raw
    /// pointer motion) and XFixes (shape changes), so an idle pointer costs
    /// no round trips; without XInput2 the cursor is polled every frame.
    private var xiOpcode: Int32 = -1
    private var fixesEventBase: Int32 = 0
    private var cursorDirty = true

    init(host: BackendHost) throws(BackendError) {
        self.host = host
        let options = try OptionReader(host: host, known: Self.options)
        fps = try options.number("fps", default: 30, in: 1...240)
        cursorEnabled = try options.bool("cursor", default: true)
        let wantShm = try options.bool("shm", default: true)
        let wantDamage = try options.bool("damage", default: true)
        monitor = options.string("monitor")
        let regionText = options.string("region")
        if monitor != nil && regionText != nil { throw .invalidOption("give either monitor or region, not both") }
        region = try regionText.map { text throws(BackendError) in
            guard let parsed = Self.parseGeometry(text) else {
                throw .invalidOption("option region=\(text) is not valid: use WIDTHxHEIGHT+X+Y, e.g. 800x600+0+0")
            }
            return parsed
        }

        displayName = options.string("display") ?? String(cString: getenv("DISPLAY") ?? strdup(""))
        guard !displayName.isEmpty else {
            throw BackendError(-ENODEV, "no X display given: set option display=:0 or the DISPLAY environment variable")
        }
        Self.installHandlers()
        guard let display = Self.openDisplay(displayName) else {
            throw BackendError(-ENODEV, "cannot open X display \(displayName): is an X server running there, and may this user connect (xhost/XAUTHORITY)?")
        }
        self.display = display
        let screen = XDefaultScreen(display)
        root = XDefaultRootWindow(display)
        visual = XDefaultVisual(display, screen)
        depth = XDefaultDepth(display, screen)
        // Placeholders until the area is known; replaced below.
        picture = I420Picture(width: 1, height: 1)
        area = CaptureArea(x: 0, y: 0, width: 1, height: 1)
        lostRetained = Unmanaged.passRetained(lost)
        XSetIOErrorExitHandler(display, xIOErrorExit, lostRetained!.toOpaque())

        do throws(BackendError) {
            guard depth == 24 || depth == 32, visual.pointee.red_mask == 0xFF0000, visual.pointee.green_mask == 0xFF00,
                  visual.pointee.blue_mask == 0xFF else {
                throw BackendError(-EOPNOTSUPP, "the X screen's visual (depth \(depth)) is not 24/32-bit TrueColor with BGRx pixels; this backend needs one")
            }
            area = try resolveArea()
            useShm = wantShm && XShmQueryExtension(display) != 0
            if wantShm && !useShm { host.log(KRAKL_LOG_WARNING, "the X server has no MIT-SHM (remote display?): reading pixels with XGetImage, which is slower") }
            var errorBase: Int32 = 0
            let haveDamage = XDamageQueryExtension(display, &damageEventBase, &errorBase) != 0
            var fixesError: Int32 = 0
            let haveFixes = XFixesQueryExtension(display, &fixesEventBase, &fixesError) != 0
            useDamage = wantDamage && haveDamage && haveFixes
            if wantDamage && !useDamage { host.log(KRAKL_LOG_WARNING, "the X server has no XDamage/XFixes: capturing the whole area every frame at \(fps) fps") }
            if cursorEnabled && !haveFixes { host.log(KRAKL_LOG_WARNING, "the X server has no XFixes: the cursor is not drawn") }
            allocateBuffers()
            XSelectInput(display, root, Int(StructureNotifyMask))
            if cursorEnabled && haveFixes { followCursorByEvents() }
        } catch {
            // All stored properties are set, so deinit runs and tears down.
            throw error
        }
    }

    deinit { teardown() }

    /// XOpenDisplay, retried while the server is busy: an X server tearing
    /// down the previous client refuses connect() with EAGAIN or resets the
    /// new connection (both seen with Xvfb on quick reconnects). At most 1 s.
    private static func openDisplay(_ name: String) -> OpaquePointer? {
        for attempt in 0..<50 {
            errno = 0
            if let display = XOpenDisplay(name) { return display }
            guard errno == EAGAIN || errno == ECONNRESET else { return nil }
            usleep(useconds_t(min(40_000, 2_000 * (attempt + 1))))
        }
        return nil
    }

    private static func installHandlers() {
        guard handlersInstalled.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        XSetErrorHandler(xErrorHandler)
        XSetIOErrorHandler(xIOErrorHandler)
    }

    /// Asks for XFixes cursor-shape events and XInput2 raw motion on the root
    /// window; leaves `xiOpcode` at -1 (polling) when XInput2 is missing.
    private func followCursorByEvents() {
        XFixesSelectCursorInput(display, root, UInt(XFixesDisplayCursorNotifyMask))
        var opcode: Int32 = 0, event: Int32 = 0, error: Int32 = 0
        var major: Int32 = 2, minor: Int32 = 0
        guard XQueryExtension(display, "XInputExtension", &opcode, &event, &error) != 0,
              XIQueryVersion(display, &major, &minor) == Success else { return }
        var bits = [UInt8](repeating: 0, count: (Int(XI_LASTEVENT) + 7) / 8)
        bits[Int(XI_RawMotion) >> 3] |= UInt8(1 << (Int(XI_RawMotion) & 7))
        let selected = bits.withUnsafeMutableBufferPointer { buffer -> Bool in
            var mask = XIEventMask(deviceid: XIAllMasterDevices, mask_len: Int32(buffer.count), mask: buffer.baseAddress)
            return XISelectEvents(display, root, &mask, 1) == Success
        }
        if selected { xiOpcode = opcode }
    }

    /// list_sources: the whole screen and each XRandR monitor of the display.
    static func listSources(host: BackendHost) throws(BackendError) {
        let source = try X11Source(host: host)
        let screen = source.area
        host.sourceFound(name: "screen", description: "the whole screen, \(screen.width)x\(screen.height) (no monitor option)")
        for (index, monitor) in source.monitors().enumerated() {
            host.sourceFound(name: monitor.name, description: "monitor \(index): \(monitor.area.width)x\(monitor.area.height)+\(monitor.area.x)+\(monitor.area.y) (monitor=\(monitor.name) or monitor=\(index))")
        }
    }

    /// "WxH+X+Y" as in X geometry strings.
    static func parseGeometry(_ text: String) -> CaptureArea? {
        let parts = text.split(whereSeparator: { $0 == "x" || $0 == "+" })
        guard parts.count == 4, text.contains("x"), let w = Int(parts[0]), let h = Int(parts[1]),
              let x = Int(parts[2]), let y = Int(parts[3]), w > 0, h > 0, x >= 0, y >= 0 else { return nil }
        return CaptureArea(x: x, y: y, width: w, height: h)
    }

    /// The monitors XRandR reports, as (name, area).
    func monitors() -> [(name: String, area: CaptureArea)] {
        var count: Int32 = 0
        guard let list = XRRGetMonitors(display, root, 1, &count) else { return [] }
        defer { XRRFreeMonitors(list) }
        return (0..<Int(count)).map { i in
            let m = list[i]
            let name = XGetAtomName(display, m.name).map { text -> String in
                defer { XFree(text) }
                return String(cString: text)
            } ?? "monitor-\(i)"
            return (name, CaptureArea(x: Int(m.x), y: Int(m.y), width: Int(m.width), height: Int(m.height)))
        }
    }

    private func screenSize() -> (width: Int, height: Int) {
        var attributes = XWindowAttributes()
        XGetWindowAttributes(display, root, &attributes)
        return (Int(attributes.width), Int(attributes.height))
    }

    /// The part of the screen the options ask for, checked against the screen.
    private func resolveArea() throws(BackendError) -> CaptureArea {
        let screen = screenSize()
        if let monitor {
            let list = monitors()
            let names = list.enumerated().map { "\($0.offset): \($0.element.name) \($0.element.area.width)x\($0.element.area.height)+\($0.element.area.x)+\($0.element.area.y)" }
            if let index = Int(monitor), list.indices.contains(index) { return list[index].area }
            if let match = list.first(where: { $0.name == monitor }) { return match.area }
            throw BackendError(-ENODEV, "no monitor \"\(monitor)\" on display \(displayName); monitors: \(names.isEmpty ? "none reported" : names.joined(separator: ", "))")
        }
        if let region {
            guard region.x + region.width <= screen.width, region.y + region.height <= screen.height else {
                throw BackendError(-EINVAL, "region \(region.width)x\(region.height)+\(region.x)+\(region.y) lies outside the \(screen.width)x\(screen.height) screen of \(displayName)")
            }
            return region
        }
        return CaptureArea(x: 0, y: 0, width: screen.width, height: screen.height)
    }

    /// The picture for the area's size, and the scratch segment when
    /// MIT-SHM works (else reads fall back to XGetImage).
    private func allocateBuffers() {
        picture = I420Picture(width: area.width, height: area.height)
        patchRect = nil
        patchValid = false
        cursor.forgetPlace()
        guard useShm, scratchShm == nil else { return }
        if let segment = SharedSegment(display: display, bytes: Self.scratchBytes) {
            scratchShm = segment
            return
        }
        useShm = false
        host.log(KRAKL_LOG_WARNING, "the X server could not share memory with this process (remote display?): reading pixels with XGetImage")
    }

    private func releaseShm() {
        scratchShm?.detach(display: display, alive: !lost.lost)
        scratchShm = nil
    }

    private var tornDown = false

    private func teardown() {
        guard !tornDown else { return }
        tornDown = true
        thread?.stop()
        thread = nil
        releaseShm()
        if !lost.lost {
            if damage != 0 { XDamageDestroy(display, damage) }
        }
        damage = 0
        if lost.lost {
            // The I/O error struck inside an Xlib call that still holds the
            // display's lock, so XCloseDisplay would wait for it forever (seen).
            // Close the socket and leave Xlib's few kB of state behind.
            close(XConnectionNumber(display))
        } else {
            XCloseDisplay(display)
        }
        lostRetained?.release()
        lostRetained = nil
    }

    func start() throws(BackendError) {
        guard thread == nil else { throw BackendError(-EBUSY, "the x11 source is already started") }
        guard !lost.lost else { throw BackendError(-ENODEV, "the X display \(displayName) is gone") }
        if useDamage && damage == 0 {
            // One event per drawing operation on the root window, each with
            // its rectangle; the capture thread coalesces them per frame.
            damage = XDamageCreate(display, root, Int32(XDamageReportRawRectangles))
            // The server reports the whole window as damaged on creation; wait
            // for that event now so the first (whole) frame absorbs it rather
            // than a second frame repeating it.
            XSync(display, 0)
        }
        needWhole = true
        // While nothing changes, the thread sleeps on the X connection instead
        // of ticking (unless something must be polled every frame).
        let idleFD: Int32? = useDamage && (!cursorEnabled || xiOpcode >= 0) ? XConnectionNumber(display) : nil
        thread = try PacedThread.started(fps: fps, idleFD: idleFD) { [unowned self] in self.tick() }
    }

    func stop() {
        thread?.stop()
        thread = nil
    }

    // MARK: capture thread

    private var lostMessage: String { "the X display \(displayName) went away (the X server exited or the connection broke)" }

    private func end(_ why: String) -> PacedThread.Step {
        host.sendEvent(KRAKL_EVENT_SOURCE_ENDED, error: -ENODEV, message: why)
        return .end
    }

    private func tick() -> PacedThread.Step {
        if lost.lost { return end(lostMessage) }
        var rects: [krakl_rect] = []
        var resized = resizeSeen
        resizeSeen = false
        drainEvents(damage: &rects, resized: &resized)
        if lost.lost { return end(lostMessage) }
        if resized, !handleResize() { return end("the screen of \(displayName) changed and the captured area no longer fits on it") }
        return capture(damage: rects)
    }

    /// A resize seen while reading, handled at the next tick.
    private var resizeSeen = false

    /// Takes every event that has arrived: damage rectangles (capture-area pixels), a resize of the
    /// root window, cursor changes.
    private func drainEvents(damage rects: inout [krakl_rect], resized: inout Bool) {
        // Read the socket once, then drain what Xlib holds: XPending() per
        // event would try a read (and get EAGAIN) after every one of them.
        var queued = XEventsQueued(display, QueuedAfterReading)
        while queued > 0 {
            var event = XEvent()
            XNextEvent(display, &event)
            queued -= 1
            if queued == 0 { queued = XEventsQueued(display, QueuedAlready) }
            if event.type == damageEventBase + Int32(XDamageNotify) {
                // Raw rectangles: each event carries its area, so collecting
                // damage costs no round trip (no XDamageSubtract + fetch).
                let r = withUnsafePointer(to: &event) { $0.withMemoryRebound(to: XDamageNotifyEvent.self, capacity: 1) { $0.pointee.area } }
                rects.append(krakl_rect(x: Int32(r.x) - Int32(area.x), y: Int32(r.y) - Int32(area.y), width: Int32(r.width), height: Int32(r.height)))
            }
            if event.type == ConfigureNotify && event.xconfigure.window == root { resized = true }
            if event.type == fixesEventBase + Int32(XFixesCursorNotify) { cursorDirty = true }
            if event.type == GenericEvent && event.xcookie.extension == xiOpcode { cursorDirty = true }
        }
    }

    /// Reads what `rects` says changed (or the whole area) and delivers it.
    private func capture(damage rects: [krakl_rect]) -> PacedThread.Step {
        var rects = rects
        let whole = needWhole || !useDamage
        if !whole && !rects.isEmpty {
            rects = TileCoalescer(width: area.width, height: area.height).coalesce(rects)
        }
        let full = krakl_rect(x: 0, y: 0, width: Int32(area.width), height: Int32(area.height))
        // Whole 2×2 chroma blocks: a block converted from some new and some
        // old pixels would be neither picture's (the 32-px tiles are even
        // already; this matters at an odd right or bottom edge and for the cursor).
        var readRects = whole ? [full] : rects.compactMap { $0.evenAligned(width: area.width, height: area.height) }

        var cursorChange: [krakl_rect] = []
        if cursorEnabled && (cursorDirty || xiOpcode < 0 || whole) {
            cursorChange = cursor.update(display: display, area: area).compactMap { $0.evenAligned(width: area.width, height: area.height) }
            cursorDirty = false
        }
        if readRects.isEmpty && cursorChange.isEmpty { return XQLength(display) > 0 ? .next : .idle }
        if lost.lost { return end(lostMessage) }

        let patch = cursorEnabled ? cursor.rect?.evenAligned(width: area.width, height: area.height) : nil
        if !Self.same(patch, patchRect) {
            patchRect = patch
            patchValid = false
            patchClean = [UInt8](repeating: 0, count: patch.map { Int($0.width) * Int($0.height) * 4 } ?? 0)
        }
        lastXError.store(0, ordering: .relaxed)
        for r in readRects { read(r) }
        readRects += readAgain(whole: whole)
        if let patch, !patchValid {
            patchValid = readBands(patch) { band, rows, lineBytes in copyIntoPatch(band, rows, lineBytes) }
        }
        if lost.lost { return end(lostMessage) }
        if case let code = lastXError.load(ordering: .relaxed), code != 0 {
            patchValid = false
            host.sendEvent(KRAKL_EVENT_ERROR, error: -EIO, message: "reading the screen failed with X error \(code); frame skipped")
            return .next
        }

        // Overlaps between read areas and cursor areas are allowed by the ABI.
        let damageOut = whole ? [] : readRects + cursorChange
        let under = drawCursor()
        deliver(damage: damageOut)
        if let under { picture.restore(under.saved, under.rect) }
        needWhole = false
        return .next
    }

    /// A read is many requests (a band each), and the X server may draw between two of them: the
    /// picture then holds two frames' halves. Damage that arrived while reading says where; those
    /// areas are read again, once (a draw during that second read is left to the next tick), and
    /// returned to be delivered as damage with the rest.
    /// Measured (issue 27, 1080p scrolling into a room, 6 rounds): rounds whose received samples
    /// showed one frame's page under the next frame's stamp coded the same scene at a mean
    /// quantizer of 34.8 and 48.0 against 22.8–24.6, received PSNR 34.4 and 31.3 against 36.1–37.8 dB.
    private func readAgain(whole: Bool) -> [krakl_rect] {
        var during: [krakl_rect] = []
        var resized = false
        drainEvents(damage: &during, resized: &resized)
        if resized {
            resizeSeen = true   // the area changes at the next tick; nothing is read again now
            return []
        }
        guard !during.isEmpty else { return [] }
        let again = TileCoalescer(width: area.width, height: area.height).coalesce(during)
            .compactMap { $0.evenAligned(width: area.width, height: area.height) }
        for r in again { read(r) }
        return whole ? [] : again
    }

    private static func same(_ a: krakl_rect?, _ b: krakl_rect?) -> Bool {
        a?.x == b?.x && a?.y == b?.y && a?.width == b?.width && a?.height == b?.height
    }

    /// The scratch segment's size: a band of rows, not a screen. Every read
    /// goes through it (1080p: 34 rows a band, 32 bands for a whole
    /// screen), so reading costs 256 KB of memory however large the damage.
    static let scratchBytes = 256 * 1024

    /// Reads one rectangle (capture-area pixels, even-aligned) of the screen
    /// and converts it into the picture, refreshing the cursor patch where
    /// the two cross.
    private func read(_ r: krakl_rect) {
        readBands(r) { band, rows, lineBytes in
            picture.convert(bgrx: rows, stride: lineBytes, into: band)
            if patchValid { copyIntoPatch(band, rows, lineBytes) }
        }
    }

    /// Reads `r` from the server in bands of an even number of rows that fit
    /// the scratch segment (MIT-SHM) or as many XGetImage requests, handing
    /// each band's BGRx rows to `use` (band, first row, bytes per row).
    /// Returns false when a read failed.
    @discardableResult
    private func readBands(_ r: krakl_rect, _ use: (krakl_rect, UnsafePointer<UInt8>, Int) -> Void) -> Bool {
        let bandRows = max(2, (Self.scratchBytes / (Int(r.width) * 4)) & ~1)
        var row = 0
        while row < Int(r.height) {
            let rows = min(bandRows, Int(r.height) - row)
            let band = krakl_rect(x: r.x, y: r.y + Int32(row), width: r.width, height: Int32(rows))
            let x = Int32(area.x) + band.x, y = Int32(area.y) + band.y
            let shared = useShm ? scratchShm : nil
            let image: UnsafeMutablePointer<XImage>?
            if let shared {
                image = shmRead(segment: shared, x: x, y: y, width: band.width, height: band.height)
            } else {
                image = XGetImage(display, root, x, y, UInt32(band.width), UInt32(band.height), UInt.max, ZPixmap)
            }
            guard let image else { return false }
            if image.pointee.bits_per_pixel == 32, let data = image.pointee.data {
                use(band, UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), Int(image.pointee.bytes_per_line))
            }
            // The scratch segment is not the image's to free.
            if shared != nil { image.pointee.data = nil }
            _ = image.pointee.f.destroy_image(image)
            row += rows
        }
        return true
    }

    /// One XShmGetImage into the start of `segment`; the image is returned
    /// for the caller to read and destroy, nil when the read failed.
    private func shmRead(segment: SharedSegment, x: Int32, y: Int32, width: Int32, height: Int32) -> UnsafeMutablePointer<XImage>? {
        var info = segment.info
        guard let image = XShmCreateImage(display, visual, UInt32(depth), ZPixmap, nil, &info, UInt32(width), UInt32(height)) else { return nil }
        image.pointee.data = info.shmaddr
        if XShmGetImage(display, root, image, x, y, UInt.max) != 0 { return image }
        image.pointee.data = nil
        _ = image.pointee.f.destroy_image(image)
        return nil
    }

    /// The part of a band of BGRx rows that lies in the cursor patch, copied into it.
    private func copyIntoPatch(_ band: krakl_rect, _ rows: UnsafePointer<UInt8>, _ lineBytes: Int) {
        guard let patch = patchRect else { return }
        let x0 = max(band.x, patch.x), x1 = min(band.x + band.width, patch.x + patch.width)
        let y0 = max(band.y, patch.y), y1 = min(band.y + band.height, patch.y + patch.height)
        guard x0 < x1, y0 < y1 else { return }
        let patchStride = Int(patch.width) * 4
        patchClean.withUnsafeMutableBufferPointer { buffer in
            for row in Int(y0)..<Int(y1) {
                memcpy(buffer.baseAddress! + (row - Int(patch.y)) * patchStride + Int(x0 - patch.x) * 4,
                       rows + (row - Int(band.y)) * lineBytes + Int(x0 - band.x) * 4, Int(x1 - x0) * 4)
            }
        }
    }

    /// Draws the pointer into the picture for one delivery: blended over a
    /// copy of the clean patch, which is then converted over the picture's
    /// patch. Returns the picture's Y, U and V it replaced, for `restore`.
    private func drawCursor() -> (rect: krakl_rect, saved: [UInt8])? {
        guard cursorEnabled, patchValid, let patch = patchRect else { return nil }
        let saved = picture.save(patch)
        var work = patchClean
        let patchStride = Int(patch.width) * 4
        work.withUnsafeMutableBufferPointer { buffer in
            cursor.draw(intoPatch: buffer.baseAddress!, stride: patchStride, x: Int(patch.x), y: Int(patch.y))
            picture.convert(bgrx: buffer.baseAddress!, stride: patchStride, into: patch)
        }
        return (patch, saved)
    }

    private func deliver(damage: [krakl_rect]) {
        var frame = krakl_frame()
        frame.format = KRAKL_FORMAT_I420.rawValue
        frame.width = UInt32(area.width)
        frame.height = UInt32(area.height)
        frame.plane_count = 3
        frame.stride = (UInt32(picture.strideY), UInt32(picture.strideUV), UInt32(picture.strideUV), 0)
        frame.plane = (UnsafePointer(picture.y), UnsafePointer(picture.u), UnsafePointer(picture.v), nil)
        sender.send(&frame, timestamp: sender.nextTimestamp(), damage: damage, to: host)
    }

    /// The root window changed size: follow it when capturing the whole
    /// screen or a monitor; returns false when the area no longer fits.
    private func handleResize() -> Bool {
        do throws(BackendError) {
            let newArea = try resolveArea()
            guard newArea != area else { return true }
            area = newArea
            allocateBuffers()
        } catch {
            host.log(KRAKL_LOG_ERROR, error.message)
            return false
        }
        host.sendEvent(KRAKL_EVENT_FORMAT_CHANGED, message: "screen now \(area.width)x\(area.height)",
                       format: KRAKL_FORMAT_I420, width: area.width, height: area.height)
        needWhole = true
        return true
    }
}

/// A System V shared-memory segment attached to the X server (MIT-SHM).
struct SharedSegment {
    var info = XShmSegmentInfo()
    let bytes: Int
    var address: UnsafeMutablePointer<UInt8> { UnsafeMutableRawPointer(info.shmaddr).assumingMemoryBound(to: UInt8.self) }

    /// nil when the segment cannot be made or the server cannot attach it.
    init?(display: OpaquePointer, bytes: Int) {
        self.bytes = bytes
        info.shmid = shmget(IPC_PRIVATE, bytes, IPC_CREAT | 0o600)
        guard info.shmid >= 0 else { return nil }
        guard let address = shmat(info.shmid, nil, 0), address != UnsafeMutableRawPointer(bitPattern: -1) else {
            shmctl(info.shmid, IPC_RMID, nil)
            return nil
        }
        info.shmaddr = address.assumingMemoryBound(to: CChar.self)
        info.readOnly = 0
        lastXErrorReset()
        let attached = XShmAttach(display, &info) != 0
        XSync(display, 0)
        // Removed now: the segment lives until both sides detach, even after a crash.
        shmctl(info.shmid, IPC_RMID, nil)
        guard attached && lastXErrorCode() == 0 else {
            shmdt(address)
            return nil
        }
    }

    mutating func detach(display: OpaquePointer, alive: Bool) {
        if alive { XShmDetach(display, &info) }
        shmdt(info.shmaddr)
    }
}

func lastXErrorReset() { lastXError.store(0, ordering: .relaxed) }
func lastXErrorCode() -> UInt8 { lastXError.load(ordering: .relaxed) }
