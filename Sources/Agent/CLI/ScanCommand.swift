import FoundationEssentials
import Glibc
import KraklRoom
import KraklBase
import KraklHost
import KraklScan
import KraklViewer

// `krakl-agent --qr FILE [--scan-only]`: the join code from a picture.
// Exit statuses 45–49 (docs/exit-codes.md); an expired or unusable code
// exits like the same code given to --join (39–43).

/// Reads the QR codes in the picture at `path` and judges them. Returns the
/// join code's text when there is one to join with (never with
/// `scanOnly`, which prints its summary instead), and the exit status for
/// when there is not (0 after a summary).
func runQRFile(path: String, scanOnly: Bool, now: Date = Date()) -> (code: String?, status: Int32) {
    switch judgeQRFile(path: path, now: now) {
    case .failure(let failure):
        for line in failure.lines { StandardStream.error("krakl-agent: \(line)\n") }
        return (nil, failure.status)
    case .success(let found):
        if scanOnly {
            print(found.invitation.summary(now: now))
            return (nil, 0)
        }
        print("krakl-agent: \(path): \(found.words)")
        return (found.invitation.code.text, 0)
    }
}

/// Why a picture gave no join code: what to say (a line each) and the exit status.
struct QRFileFailure: Error {
    let lines: [String]
    let status: Int32
    var message: String { lines.joined(separator: "; ") }
}

/// The join code in the picture at `path`, or why there is none (the daemon's connect --qr uses it too).
func judgeQRFile(path: String, now: Date = Date()) -> Result<(invitation: Invitation, words: String), QRFileFailure> {
    let image: GrayImage
    do throws(ImageFileError) {
        image = try ImageFile.readGray(path: path)
    } catch {
        return .failure(QRFileFailure(lines: [error.description], status: error.exitStatus))
    }
    let result = ScanResult.classify(QRScanner().scan(image), now: now)
    switch result {
    case .nothing:
        return .failure(QRFileFailure(lines: ["no QR code found in \(path) (\(image.width)x\(image.height) pixels)"], status: ExitCode.qrNoCode))
    case .found(let invitation):
        return .success((invitation, "\(result)"))
    case .conflicting:
        return .failure(QRFileFailure(lines: ["\(path): \(result)"], status: ExitCode.qrSeveralCodes))
    case .noUsableCode(let findings):
        // The most useful status: a code that was meant for us beats a foreign QR.
        var status = ExitCode.qrNotAJoinCode
        for finding in findings {
            switch finding {
            case .expired(let error): status = error.exitStatus
            case .unusableJoinCode(let error) where status == ExitCode.qrNotAJoinCode: status = error.exitStatus
            default: break
            }
        }
        return .failure(QRFileFailure(lines: findings.map { "\(path): \($0)" }, status: status))
    }
}

/// The daemon's connect --qr: the join code's text, or what to tell the client.
func readQRFile(path: String) -> Result<String, QRFileFailure> {
    judgeQRFile(path: path).map { $0.invitation.code.text }
}

// `krakl-agent --scan`: the join code from a QR code on the screen. Any
// backend's frames feed a LumaCapture (one luma picture, updated where the
// frame changed); zbar looks at what changed at most every 200 ms.
// Exit statuses: 50 nothing within --scan-timeout, 51 the source ended
// first, 0 after Ctrl-C; a found code joins (or prints with --scan-only).

/// How a screen scan waits and speaks (ScreenScanJob: for an owner on an EventLoop).
protocol ScanHost: AnyObject, Sendable {
    /// Waits up to `seconds` for a changed frame (`wake`) or a reason to stop; true: stop scanning.
    func wait(_ seconds: Double) -> Bool
    /// Any thread: a frame changed.
    func wake()
    /// Something worth a line of its own (a code found, a foreign QR code, why scanning ended).
    func say(_ line: String)
    /// Once a second: how far scanning got.
    func progress(_ line: String)
}

/// The scan itself: the first usable join code on the screen (or, with --camera, in a camera's
/// view), or nil and the exit status (50 nothing within --scan-timeout, 51 the source ended first,
/// 56 no such camera, 0 stopped).
func scanScreen(_ arguments: Arguments, logger: @escaping BackendLogger, host: ScanHost) throws(HostError) -> (Invitation?, Int32) {
    let opened: ScanSource
    switch try ScanSource.open(arguments, logger: logger, host: host) {
    case .opened(let source): opened = source
    case .noCamera(let status): return (nil, status)
    }
    defer { opened.preview?.stop() }
    try opened.source.start()
    defer { try? opened.source.destroy() }   // a hung stop or destroy is given up after its budget
    var watch = ScanWatch(arguments, capture: opened.capture, host: host)
    return watch.run()
}

/// What a scan looks at: the screen's backend, or a camera's (with its preview, when asked for),
/// feeding one LumaCapture; created, not yet started.
struct ScanSource {
    let capture: LumaCapture
    let source: any CaptureSource
    let preview: CameraPreview?

    enum Opening {
        case opened(ScanSource)
        /// No such camera: said to the host; the exit status.
        case noCamera(Int32)
    }

    static func open(_ arguments: Arguments, logger: @escaping BackendLogger, host: ScanHost) throws(HostError) -> Opening {
        guard let camera = arguments.camera else {
            let (selection, choice) = try selectedBackend(arguments, scanning: true)
            let capture = LumaCapture(backend: selection.entry.name, logger: logger, onChange: { [weak host] in host?.wake() })
            let source = try selection.makeSource(sink: capture, logger: logger)
            let what = choice.name == selection.entry.name ? (choice.label ?? selection.entry.name) : selection.entry.name
            if arguments.backend == nil, !choice.why.isEmpty { host.say("backend \(selection.entry.name): \(choice.why)") }
            host.say("scanning the \(what) screen for a join code (at most \(Int(arguments.scanTimeout)) s; Ctrl-C stops)…")
            return .opened(ScanSource(capture: capture, source: source, preview: nil))
        }
        let selection = try CameraScan.selection(arguments, camera: camera)
        let capture = LumaCapture(backend: selection.entry.name, logger: logger, onChange: { [weak host] in host?.wake() })
        var preview: CameraPreview?
        if arguments.preview {
            // Without the preview the scan goes on: it is an aid, not the scan.
            do throws(ViewerServerError) { preview = try CameraPreview(arguments, scanning: capture, logger: logger) } catch {
                host.say("no preview: \(error.description)")
            }
        }
        let source: any CaptureSource
        do throws(HostError) {
            source = try selection.makeSource(sink: preview ?? capture, logger: logger)
        } catch {
            preview?.stop()
            guard let words = CameraScan.noCamera(error) else { throw error }
            host.say(words)
            return .noCamera(CameraScan.noCameraStatus)
        }
        host.say("scanning \(camera.isEmpty ? "the camera" : "camera \"\(camera)\"") for a join code (at most \(Int(arguments.scanTimeout)) s; Ctrl-C stops)…")
        if let preview { host.say("preview: " + preview.start()) }
        return .opened(ScanSource(capture: capture, source: source, preview: preview))
    }
}

/// The scan's loop on the caller's thread: when to look (after a change, spaced by zbar's cost),
/// what to say about what was found, progress once a second, and the end (a code, the time limit,
/// the source's end, a stop). Times are CLOCK_MONOTONIC milliseconds.
struct ScanWatch {
    private let arguments: Arguments
    private let capture: LumaCapture
    private let host: ScanHost
    private let camera: Bool
    // A camera's pictures may show the code light on dark (a page in dark mode); zbar 0.23 reads a
    // mirrored code (a front camera's picture) as it is (krakl-bench scan --camera: 10 of 10).
    private let scanner: QRScanner
    private let started: Double
    private var nextScan: Double
    private var nextProgress: Double
    private var changeSeenAt: Double?
    private var firstPictureAt: Double?
    private var hinted = false
    private var reported = Set<String>()

    init(_ arguments: Arguments, capture: LumaCapture, host: ScanHost) {
        self.arguments = arguments
        self.capture = capture
        self.host = host
        camera = arguments.camera != nil
        scanner = QRScanner(invertedToo: camera)
        started = MonotonicClock.milliseconds()
        nextScan = started
        nextProgress = started + 1000
    }

    mutating func run() -> (Invitation?, Int32) {
        while true {
            let now = MonotonicClock.milliseconds()
            if firstPictureAt == nil && capture.progress.frames > 0 { firstPictureAt = now }
            if now - started >= arguments.scanTimeout * 1000 {
                host.say("no join code found within \(Int(arguments.scanTimeout)) s (\(capture.progress.frames) frames looked at)")
                return (nil, ExitCode.scanTimedOut)
            }
            // A source that ended may have shown the code in its last frames: they get their look first.
            let ended = capture.sourceEnded
            if let ended, !capture.hasChanges {
                host.say("the \(camera ? "camera" : "screen") source ended before a join code was found: \(ended)")
                return (nil, ExitCode.scanSourceEnded)
            }
            if camera && !hinted && now - started >= CameraScan.hintAfter * 1000 {
                hinted = true
                host.say(CameraScan.hint)
            }
            // A change is looked at 100 ms after it was first seen: a picture drawn in pieces (X11
            // XPutImage sends a large image in strips) is then whole, where a look at the first strip
            // found nothing and put the next look a whole-picture scan's budget away (up to 1.3 s at 4K).
            if capture.hasChanges && changeSeenAt == nil { changeSeenAt = now }
            if let seen = changeSeenAt, now >= max(nextScan, seen + 100) || ended != nil {
                changeSeenAt = nil
                if let invitation = look(now) { return (invitation, 0) }
            }
            if now >= nextProgress { sayProgress(now) }
            // Until the next look is due, the next progress line, a stop, or (when a look is due but
            // nothing changed) the next changed frame, which wakes this wait through the host.
            let due = changeSeenAt.map { max(nextScan, $0 + 100) } ?? (MonotonicClock.milliseconds() >= nextScan ? nextProgress : nextScan)
            let wait = max(0.005, (min(due, nextProgress) - MonotonicClock.milliseconds()) / 1000)
            if host.wait(wait) {
                host.say("scanning stopped")
                return (nil, 0)
            }
        }
    }

    /// One look at what changed: a usable join code, or nil after saying what else was seen.
    private mutating func look(_ now: Double) -> Invitation? {
        let (payloads, _) = capture.scan(with: scanner)
        // At most every 200 ms, and zbar busy at most 15 % of the time: a screen that changes
        // whole every frame (a video) makes every look a whole-picture scan (~50 ms at 1080p,
        // ~200 ms at 4K), so those come less often (with the luma conversion of every frame,
        // measured 13.5 % of a core at 1080p and 26 % at 4K with a 20 % share; krakl-bench scan);
        // a code drawn on a quiet screen is a small changed region, scanned within 200 ms.
        let took = MonotonicClock.milliseconds() - now
        nextScan = now + max(200, took / 0.15)
        switch ScanResult.classify(payloads, now: Date()) {
        case .nothing:
            break
        case .found(let invitation):
            let end = MonotonicClock.milliseconds()
            if let firstPictureAt, camera {
                host.say(String(cFormat: "found a join code after %.1f s (%.2f s after the camera's first picture)",
                                (end - started) / 1000, (end - firstPictureAt) / 1000))
            } else {
                host.say(String(cFormat: "found a join code after %.1f s", (end - started) / 1000))
            }
            return invitation
        case .conflicting(let list):
            let line = "\(ScanResult.conflicting(list)); show only one"
            if reported.insert(line).inserted { host.say(line) }
        case .noUsableCode(let findings):
            for finding in findings {
                let line = "\(finding)" + (finding.isExpired ? "; still looking for a fresh code" : "; still looking")
                if reported.insert("\(finding)").inserted { host.say(line) }
            }
        }
        return nil
    }

    private mutating func sayProgress(_ now: Double) {
        nextProgress = now + 1000
        if camera {
            let view = capture.sourceDescription ?? "the camera (no picture yet)"
            host.progress(String(cFormat: "looking at %@… %.0f s, %d pictures looked at", view, (now - started) / 1000, capture.progress.frames))
        } else {
            host.progress(String(cFormat: "scanning the screen for a join code… %.0f s, %d frames looked at", (now - started) / 1000, capture.progress.frames))
        }
    }
}

extension PayloadFinding {
    var isExpired: Bool { if case .expired = self { return true } else { return false } }
}
