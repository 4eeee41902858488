import KraklBase
import FoundationEssentials
import Glibc

/// How long the host waits for each call into a backend before it gives up on the backend
/// (krakl_backend.h, "Watchdog"). A call that overruns is left running on its own thread, the
/// source is marked dead, and the caller gets `HostError.backendHung`.
public struct CallBudgets: Sendable, Equatable {
    /// create() may wait for a person at a sharing dialog (the PipeWire backend's own `timeout`
    /// option allows up to 600 s for it), so its budget is long.
    public var create: Duration = .seconds(900)
    /// start() must return without waiting for a frame.
    public var start: Duration = .seconds(5)
    /// The header promises 1 s; the host gives up after 2 s (1 s of grace for a loaded machine).
    public var stop: Duration = .seconds(2)
    /// Short enough that SIGTERM during a hung destroy() still ends a run within systemd-like grace (stop 2 s + destroy 3 s).
    public var destroy: Duration = .seconds(3)
    public var listSources: Duration = .seconds(30)

    public init() {}
    public static let standard = CallBudgets()
}

/// One thread that makes a source's calls into its backend, one at a time, while the caller waits
/// with a deadline. The backend then always sees the same control thread, and a call that never
/// returns keeps only this thread, never the caller (the agent's main thread, a session's work
/// queue), so signals, the session's leave and the outputs' finalization still happen.
/// @unchecked Sendable: a thread primitive: its job queue and flags are under `condition`, and the
/// jobs (with the CallResult each captures) are closures the compiler cannot see cross to its thread.
final class BackendCallThread: @unchecked Sendable {
    private let condition = Condition()
    private var jobs: [() -> Void] = []
    private var ending = false
    /// True while a job that overran its budget is still inside the backend: nothing more may run.
    private var wedged = false
    private var thread = pthread_t()
    private var started = false
    private let name: String
    /// The kernel's id of the thread once it runs (0 before): what /proc/self/task lists, for the
    /// tests that check it ends with its source.
    var kernelThreadID: pid_t { condition.lock(); defer { condition.unlock() }; return _kernelThreadID }
    private var _kernelThreadID: pid_t = 0

    init(name: String) {
        self.name = name
        let box = Unmanaged.passRetained(self)
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        let status = pthread_create(&thread, &attributes, { raw in
            let me = Unmanaged<BackendCallThread>.fromOpaque(raw!).takeRetainedValue()
            me.loop()
            return nil
        }, box.toOpaque())
        started = status == 0
        if !started { box.release() }
    }

    private func loop() {
        // For people reading `top -H` or a backtrace: which thread is inside a backend.
        nameCurrentThread(name)
        let id = currentKernelThreadID()
        condition.lock()
        _kernelThreadID = id
        condition.unlock()
        while true {
            condition.lock()
            while jobs.isEmpty && !ending { condition.wait() }
            if jobs.isEmpty {
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job()
        }
    }

    /// Runs `body` on the thread and waits up to `budget` for it. Returns its value, or nil
    /// when it overran (it goes on running; the thread takes no more work) or the thread is wedged.
    func call<T>(budget: Duration, _ body: @escaping () -> T) -> T? {
        // No thread (out of threads): run here, without a watchdog, rather than not at all.
        guard started else { return body() }
        let result = CallResult<T>()
        condition.lock()
        guard !wedged, !ending else {
            condition.unlock()
            return nil
        }
        jobs.append { [condition] in
            let value = body()
            condition.lock()
            result.value = value
            result.done = true
            condition.broadcast()
            condition.unlock()
        }
        condition.broadcast()
        let deadline = Date().addingTimeInterval(budget.inSeconds)
        let finished = condition.wait(while: { !result.done }, until: deadline)
        if !finished { wedged = true }
        condition.unlock()
        return finished ? result.value : nil
    }

    /// Whether a call overran and is still inside the backend.
    var isWedged: Bool { condition.withLock { wedged } }

    /// Ends the thread once its queue is empty. A thread stuck in a backend call is detached and
    /// left to the backend (a bounded leak: one thread per hung source); an idle one is joined,
    /// so a source that came and went leaves no thread behind.
    func end() {
        guard started else { return }
        condition.lock()
        guard !ending else {
            condition.unlock()
            return
        }
        ending = true
        let stuck = wedged
        condition.broadcast()
        condition.unlock()
        // A source released by its own call (never by design, but cheap to rule out) cannot join itself.
        if stuck || pthread_equal(pthread_self(), thread) != 0 {
            pthread_detach(thread)
        } else {
            pthread_join(thread, nil)
        }
    }
}

/// What one call returned, filled on the call thread and read by the waiter, both under the call
/// thread's `condition`. Not Sendable: it reaches the call thread only inside its job, a closure
/// in BackendCallThread's queue (whose conformance says why that is safe), never on its own.
private final class CallResult<T> {
    var value: T?
    var done = false
}
