import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import KraklRTC

/// A screen scan (`scanScreen`) on a thread of its own, since it waits for frames, for an owner
/// that lives on an EventLoop: the lines mode, the home screen and the daemon. What it says and
/// how it ends arrive through the closures (on the scan's thread: the owner posts them to its
/// loop); `stop` ends it within one wait.
final class ScreenScanJob: ScanHost, Sendable {
    /// How a scan ended: the join code found, or none and the exit status (50 nothing within
    /// --scan-timeout, 51 the source ended first, 0 stopped), with the last line it said.
    enum Outcome {
        case found(Invitation)
        case notFound(status: Int32, lastSaid: String)
        case failed(HostError)
    }

    private struct Shared {
        var stopped = false
        var changed = false
        /// The last line `scanScreen` said (why it ended).
        var lastSaid = "scanning stopped"
    }
    private let shared = Guarded(Shared())
    private let sayLine: @Sendable (String) -> Void
    private let progressLine: @Sendable (String) -> Void

    /// Starts scanning at once; `say` gets the lines worth a line of their own, `progress` the
    /// once-a-second ones, `done` the outcome.
    init(arguments: Arguments, logger: @escaping BackendLogger, say: @escaping @Sendable (String) -> Void,
         progress: @escaping @Sendable (String) -> Void, done: @escaping @Sendable (Outcome) -> Void) throws(HostError) {
        sayLine = say
        progressLine = progress
        // Fails here, not on the thread, when the backend cannot be chosen.
        _ = try selectedBackend(arguments)
        startThread(name: "krakl-scan") { [self] in
            do throws(HostError) {
                let (invitation, status) = try scanScreen(arguments, logger: logger, host: self)
                done(invitation.map { .found($0) } ?? .notFound(status: status, lastSaid: shared.withLock { $0.lastSaid }))
            } catch {
                done(.failed(error))
            }
        }
    }

    /// The same for an owner on `loop`: each report is posted to it.
    convenience init(arguments: Arguments, logger: @escaping BackendLogger, postingTo loop: EventLoop, say: @escaping (String) -> Void,
                     progress: @escaping (String) -> Void, done: @escaping (Outcome) -> Void) throws(HostError) {
        let (say, progress, done) = (OnLoop(loop, say), OnLoop(loop, progress), OnLoop(loop, done))
        try self.init(arguments: arguments, logger: logger) { say($0) } progress: { progress($0) } done: { done($0) }
    }

    func stop() { shared.change { $0.stopped = true } }

    func wait(_ seconds: Double) -> Bool {
        shared.wait(until: Date().addingTimeInterval(seconds), for: { $0.stopped || $0.changed }) { state, _ in
            state.changed = false
            return state.stopped
        }
    }

    func wake() { shared.change { $0.changed = true } }

    func say(_ line: String) {
        shared.withLock { $0.lastSaid = line }
        sayLine(line)
    }

    func progress(_ line: String) { progressLine(line) }
}

/// A handler of an owner that lives on `loop`: each call is posted there, so the handler only ever
/// runs on the owner's thread, whatever it captures, and may be handed to another thread (it is
/// `LoopBound`: reached on the loop's thread only, checked).
struct OnLoop<Argument: Sendable>: Sendable {
    let handler: LoopBound<(Argument) -> Void>

    init(_ loop: EventLoop, _ handler: @escaping (Argument) -> Void) {
        self.handler = LoopBound(handler, loop: loop)
    }

    func callAsFunction(_ argument: Argument) { handler.loop.post { [handler] in handler.value(argument) } }
}
