import KraklBase
import KraklBackendABI

/// A way a backend broke the delivery contract of krakl_backend.h that the host repaired or
/// dropped. Each kind is warned about once per source and counted; conformance reads them.
public enum ContractViolation: String, CaseIterable, Sendable {
    case frameInCreate = "frame-in-create"
    case frameBeforeStart = "frame-before-start"
    case frameAfterStop = "frame-after-stop"
    case eventOutsideDelivery = "event-outside-delivery"
    case concurrentCallbacks = "concurrent-callbacks"
    case overRate = "over-rate"
    case partialFirstFrame = "partial-first-frame"
    case unannouncedFormatChange = "unannounced-format-change"
    case announcedFormatNeverCame = "announced-format-never-came"
    case timestamps = "timestamps"
    case undefinedReturnValue = "undefined-return-value"
    /// `host->frame(NULL)`, `host->event(NULL)`, an event of a type the header does not define.
    case malformedCallback = "malformed-callback"
}

/// The host's side of the frame contract, for one source: frames only between start() and the
/// return of stop(), a delivery rate the host can take, the first frame after start() (and after
/// a format change) fully damaged, and timestamps that go forward near CLOCK_MONOTONIC now. A
/// frame that breaks a rule is dropped or repaired here, so the encoder, the recording and RTP
/// downstream see a sane stream whatever the backend does; each kind of breach is warned about
/// once and counted. Frame geometry (sizes, strides, damage inside the frame) stays FrameGate's.
/// Its state is under one lock: backend threads enter it from C, the control thread moves the phase.
public final class FrameContract: Sendable {
    public enum Phase: Sendable { case creating, created, delivering, stopped }

    /// What to hand the sink for one frame.
    public enum Verdict {
        /// Nothing: the frame was dropped (and counted).
        case drop
        /// The backend's frame as it is: its geometry is unsound and the sink's FrameGate reports it.
        case unchecked
        /// A copy of the header with the host's timestamp and damage.
        case admitted(krakl_frame)
    }

    /// The most frames a second the host takes from one backend (no encoder runs above 120 fps; a
    /// backend that floods is cut here, before any per-frame work).
    public static let defaultMaximumFrameRate = Double(KRAKL_MAX_FRAME_RATE)
    /// Backend timestamps further ahead of CLOCK_MONOTONIC now than this are replaced.
    public static let maximumAheadNs: UInt64 = 1_000_000_000
    /// Backend timestamps further behind now than this are replaced.
    public static let maximumBehindNs: UInt64 = 10_000_000_000

    private let backend: String
    private let logger: BackendLogger
    // Rate cap: a token bucket refilled at `rate` a second, holding at most `burst`.
    private let rate: Double
    private let burst: Double

    private struct State {
        var phase = Phase.creating
        var counts: [ContractViolation: Int] = [:]
        var firstDetail: [ContractViolation: String] = [:]
        var tokens: Double
        var refilledNs: UInt64 = 0
        var lastTimestamp: UInt64 = 0
        var needsFullDamage = true
        var lastShape: (format: UInt32, width: UInt32, height: UInt32)?
        var announced: (format: UInt32, width: UInt32, height: UInt32)?
    }
    private let state: Guarded<State>

    public init(backend: String, logger: @escaping BackendLogger, maximumFrameRate: Double = FrameContract.defaultMaximumFrameRate) {
        self.backend = backend
        self.logger = logger
        rate = max(1, maximumFrameRate)
        burst = max(4, rate / 8)
        state = Guarded(State(tokens: burst))
    }

    // MARK: the control thread's side

    /// create() returned: frames are still refused until start().
    public func created() { state.withLock { $0.phase = .created } }

    /// start() is being called: deliveries are allowed from here on (also from inside start(),
    /// from any thread), and the next frame is treated as fully damaged whatever it says.
    public func starting() {
        state.withLock { state in
            state.phase = .delivering
            state.needsFullDamage = true
            state.lastShape = nil
            state.announced = nil
        }
    }

    /// stop() returned (or start() failed): later deliveries are dropped until the next start().
    public func stopped() { state.withLock { $0.phase = .stopped } }

    public var currentPhase: Phase { state.withLock { $0.phase } }

    /// How often each kind of breach happened, and what the first one was.
    public var violations: [(kind: ContractViolation, count: Int, first: String)] {
        state.withLock { state in
            ContractViolation.allCases.compactMap { kind in state.counts[kind].map { (kind, $0, state.firstDetail[kind] ?? "") } }
        }
    }

    /// Records a breach; the first of its kind is logged as a warning with `detail`.
    public func note(_ kind: ContractViolation, _ detail: @autoclosure () -> String) {
        let first = state.withLock { state -> String? in
            state.counts[kind, default: 0] += 1
            guard state.counts[kind] == 1 else { return nil }
            let text = detail()
            state.firstDetail[kind] = text
            return text
        }
        if let first { logger(backend, .warning, "\(first) (the backend breaks its contract; further ones are counted, not logged)") }
    }

    // MARK: the capture thread's side

    /// Whether an event may be passed on now; an event outside start()…stop() is dropped.
    public func admitEvent(_ event: SourceEvent) -> Bool {
        let phase = currentPhase
        guard phase == .delivering else {
            note(.eventOutsideDelivery, "dropped an event delivered \(Self.placeName(phase)) (events may come only between start() and the return of stop())")
            return false
        }
        if case .unknown(let type) = event.kind {
            note(.malformedCallback, "ignored an event of type \(type), which krakl_backend.h does not define")
            return false
        }
        if event.kind == .formatChanged {
            state.withLock { state in
                state.needsFullDamage = true
                state.announced = (event.format, UInt32(clamping: event.width), UInt32(clamping: event.height))
            }
        }
        return true
    }

    /// Decides what becomes of one frame. `receivedNs` is CLOCK_MONOTONIC now.
    public func admit(_ pointer: UnsafePointer<krakl_frame>, receivedNs: UInt64) -> Verdict {
        let (phase, over) = state.withLock { state -> (Phase, Bool) in
            var over = false
            if state.phase == .delivering {
                // Token bucket, in whole nanoseconds so a clock that does not move costs nothing.
                if state.refilledNs == 0 { state.refilledNs = receivedNs }
                if receivedNs > state.refilledNs {
                    state.tokens = min(burst, state.tokens + Double(receivedNs - state.refilledNs) / 1e9 * rate)
                    state.refilledNs = receivedNs
                }
                if state.tokens >= 1 { state.tokens -= 1 } else { over = true }
            }
            return (state.phase, over)
        }
        switch phase {
        case .delivering: break
        case .creating:
            note(.frameInCreate, "dropped a frame delivered inside create() (frames may come only between start() and the return of stop())")
            return .drop
        case .created:
            note(.frameBeforeStart, "dropped a frame delivered before start() (frames may come only between start() and the return of stop())")
            return .drop
        case .stopped:
            note(.frameAfterStop, "dropped a frame delivered after stop() returned (no callback may run after stop() returns)")
            return .drop
        }
        if over {
            note(.overRate, "dropped frames beyond \(Int(rate)) a second (the backend delivers faster than the host takes frames)")
            return .drop
        }
        guard FrameCheck.geometryProblem(pointer) == nil else { return .unchecked }
        var frame = copyBySizeRule(pointer, declaredSize: Int(pointer.pointee.struct_size), as: krakl_frame.self)
        frame.struct_size = UInt32(MemoryLayout<krakl_frame>.size)
        var notes: [(ContractViolation, String)] = []
        state.withLock { state in
            let shape = (frame.format, frame.width, frame.height)
            if let expected = state.announced {
                state.announced = nil
                if expected != shape {
                    notes.append((.announcedFormatNeverCame, "a FORMAT_CHANGED event announced \(Self.describe(expected)) but the next frame is \(Self.describe(shape))"))
                }
            } else if let last = state.lastShape, last != shape {
                state.needsFullDamage = true
                notes.append((.unannouncedFormatChange, "the frame changed from \(Self.describe(last)) to \(Self.describe(shape)) without a FORMAT_CHANGED event; treated as one (whole frame damaged)"))
            }
            state.lastShape = shape
            if state.needsFullDamage {
                state.needsFullDamage = false
                if frame.damage_count != 0 {
                    frame.damage_count = 0
                    frame.damage = nil
                    if notes.isEmpty {
                        notes.append((.partialFirstFrame, "the first frame after start() named \(pointer.pointee.damage_count) damage rectangle(s); the host treats it as fully damaged, as the contract requires"))
                    }
                }
            }
            let stamp = frame.timestamp_ns
            let problem: String?
            if stamp <= state.lastTimestamp {
                problem = "timestamp \(stamp) ns is not after the previous frame's \(state.lastTimestamp) ns"
            } else if stamp > receivedNs && stamp - receivedNs > Self.maximumAheadNs {
                problem = "timestamp \(stamp) ns is \((stamp - receivedNs) / 1_000_000) ms ahead of CLOCK_MONOTONIC now"
            } else if receivedNs > stamp && receivedNs - stamp > Self.maximumBehindNs {
                problem = "timestamp \(stamp) ns is \((receivedNs - stamp) / 1_000_000) ms behind CLOCK_MONOTONIC now"
            } else {
                problem = nil
            }
            // A frame cannot have been captured after it arrived: a small lead (under the limit) is
            // taken as clock skew and clamped to the receive time, so no time downstream is in the future.
            var chosen = problem == nil ? min(stamp, receivedNs) : receivedNs
            if chosen <= state.lastTimestamp { chosen = state.lastTimestamp &+ 1 }
            frame.timestamp_ns = chosen
            state.lastTimestamp = chosen
            if let problem {
                notes.append((.timestamps, "\(problem); the host uses its own receive times for such frames"))
            }
        }
        for (kind, detail) in notes { note(kind, detail) }
        return .admitted(frame)
    }

    private static func describe(_ shape: (format: UInt32, width: UInt32, height: UInt32)) -> String {
        "\(FrameCheck.formatName(shape.format)) \(shape.width)x\(shape.height)"
    }

    private static func placeName(_ phase: Phase) -> String {
        switch phase {
        case .creating: return "inside create()"
        case .created: return "before start()"
        case .delivering: return "while delivering"
        case .stopped: return "after stop() returned"
        }
    }
}
