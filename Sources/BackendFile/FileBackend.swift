import BackendKit
import FrameStamp
import Glibc
import KraklBackendABI

/// Test patterns that behave like real screen work, and Y4M playback.
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "file",
        description: "Test-pattern scenes (static, typing, scrolling, video) and Y4M file playback, with exact damage"
    ) { host throws(BackendError) in try FileSource(host: host) })
}

/// One file-backend source: options parsed in create(), a paced capture
/// thread between start() and stop().
final class FileSource: CaptureSource {
    static let options = ["scene", "width", "height", "fps", "frames", "path", "loop", "speed", "seed"]

    let host: BackendHost
    let producer: FrameProducer
    let fps: Double
    /// Frame intervals to run before reporting the source ended (0: forever).
    let frameLimit: Int
    private var thread: PacedThread?
    private var intervals = 0
    private var sender = FrameSender()
    private var needWhole = true
    private var ended = false

    init(host: BackendHost) throws(BackendError) {
        self.host = host
        let options = try OptionReader(host: host, known: Self.options)
        frameLimit = try options.integer("frames", default: 0, in: 0...100_000_000)
        if let path = options.string("path") {
            for key in ["scene", "width", "height", "speed", "seed"] where host.option(key) != nil {
                throw .invalidOption("option \(key) does not apply when playing a file (path=\(path)); remove it")
            }
            let reader: Y4MReader
            do throws(Y4MReader.Failure) { reader = try Y4MReader(path: path) } catch { throw BackendError(error.code, error.message) }
            fps = try options.number("fps", default: reader.fps, in: 1...240)
            producer = Y4MProducer(reader: reader, loop: try options.bool("loop", default: false))
        } else {
            if host.option("loop") != nil { throw .invalidOption("option loop only applies with path=FILE.y4m") }
            let scene = try options.choice("scene", default: "typing", from: SceneName.allCases.map(\.rawValue))
            let width = try options.integer("width", default: 1280, in: 320...7680)
            let height = try options.integer("height", default: 720, in: 240...4320)
            fps = try options.number("fps", default: 30, in: 1...240)
            let speed = try options.integer("speed", default: 8, in: 1...256)
            let seed = try options.integer("seed", default: 1, in: 0...Int.max)
            producer = PatternProducer(scene: SceneName(rawValue: scene)!, width: width, height: height,
                                       speed: speed, seed: UInt64(seed))
        }
    }

    func start() throws(BackendError) {
        guard thread == nil else { throw BackendError(-EBUSY, "the file source is already started") }
        if ended { producer.rewind() }
        intervals = 0
        needWhole = true
        ended = false
        thread = try PacedThread.started(fps: fps) { [unowned self] in self.tick() }
    }

    func stop() {
        thread?.stop()
        thread = nil
    }

    /// One frame interval, on the capture thread.
    private func tick() -> PacedThread.Step {
        if frameLimit > 0 && intervals >= frameLimit { return end("played \(frameLimit) frame intervals") }
        intervals += 1
        let now = sender.nextTimestamp()
        switch producer.next(whole: needWhole, sequence: sender.sequence, timestampNs: now) {
        case .unchanged:
            return .next
        case .ended(let why):
            return end(why)
        case .failed(let why):
            host.sendEvent(KRAKL_EVENT_ERROR, error: -EIO, message: why)
            return end(why)
        case .changed(let damage):
            var frame = krakl_frame()
            producer.describe(&frame)
            sender.send(&frame, timestamp: now, damage: damage, to: host)
            needWhole = false
            return .next
        }
    }

    private func end(_ why: String) -> PacedThread.Step {
        ended = true
        host.sendEvent(KRAKL_EVENT_SOURCE_ENDED, message: why)
        return .end
    }
}
