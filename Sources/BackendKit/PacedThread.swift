import Glibc
import RateCap

/// A dedicated capture thread that calls `tick` at a fixed rate on
/// CLOCK_MONOTONIC deadlines, and that stop() wakes at once (a condition
/// variable on the monotonic clock, not a sleep), so stop returns in
/// microseconds rather than up to one frame interval.
///
/// With an `idleFD` (a damage-driven source) the rate is a cap, not a clock: after a tick that
/// had work the next may come as soon as `CaptureCadence` allows, and a tick that finds nothing
/// sleeps until the descriptor wakes it, so a change is captured when it arrives rather than at
/// the next tick of a clock whose phase has nothing to do with the screen's.
/// @unchecked Sendable: a thread primitive: its flags are under its own pthread mutex and condition.
public final class PacedThread: @unchecked Sendable {
    public enum Step {
        /// Tick again at the next interval.
        case next
        /// Nothing is happening: sleep until `idleFD` is readable (or stop),
        /// then tick at once. Only with an `idleFD`; otherwise like `.next`.
        case idle
        case end
    }

    private let periodNs: UInt64
    /// After an idle source is woken, how long its tick waits for the rest of the change: a program
    /// draws a frame in several requests (xroom: the page, then its stamp row), and a tick at the
    /// first damage event read the page alone, leaving the stamp to the next capture ¾ interval later.
    static let settleNs: UInt64 = 3_000_000
    private let tick: () -> Step
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var thread: pthread_t?
    private var stopRequested = false
    /// A descriptor that becomes readable when there may be work (the X
    /// connection, say), so an idle source sleeps instead of ticking.
    private let idleFD: Int32?
    /// A pipe stop() writes to, waking a thread sleeping in poll() on `idleFD`.
    private var stopPipe: [Int32] = [-1, -1]
    private var stopEvent: Int32 { stopPipe[0] }

    /// - Parameters:
    ///   - fps: ticks per second.
    ///   - tick: runs on the capture thread; return `.end` to finish.
    public init(fps: Double, idleFD: Int32? = nil, tick: @escaping () -> Step) {
        periodNs = UInt64(1_000_000_000 / fps)
        self.tick = tick
        self.idleFD = idleFD
        if idleFD != nil, pipe(&stopPipe) == 0 {
            for fd in stopPipe {
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            }
        }
        pthread_mutex_init(mutex, nil)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        stop()
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
        stopPipe.filter { $0 >= 0 }.forEach { close($0) }
    }

    public var isRunning: Bool { thread != nil }

    /// A thread already ticking: what a source's start() needs.
    public static func started(fps: Double, idleFD: Int32? = nil, tick: @escaping () -> Step) throws(BackendError) -> PacedThread {
        let thread = PacedThread(fps: fps, idleFD: idleFD, tick: tick)
        try thread.start()
        return thread
    }

    /// Control thread. Starts ticking; the first tick is immediate.
    public func start() throws(BackendError) {
        guard thread == nil else { throw BackendError(-EBUSY, "already started") }
        stopRequested = false
        var handle = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let status = pthread_create(&handle, nil, { context in
            let me = Unmanaged<PacedThread>.fromOpaque(context!).takeRetainedValue()
            me.run()
            return nil
        }, context)
        guard status == 0 else {
            Unmanaged<PacedThread>.fromOpaque(context).release()
            throw BackendError(-status, "could not start the capture thread (errno \(status))")
        }
        thread = handle
    }

    /// Control thread. Wakes the thread, waits for it to finish.
    public func stop() {
        guard let handle = thread else { return }
        pthread_mutex_lock(mutex)
        stopRequested = true
        pthread_cond_signal(cond)
        pthread_mutex_unlock(mutex)
        if stopPipe[1] >= 0 {
            var one: UInt8 = 1
            _ = write(stopPipe[1], &one, 1)
        }
        pthread_join(handle, nil)
        if stopEvent >= 0 { // drain it for a later start()
            var byte: UInt8 = 0
            while read(stopEvent, &byte, 1) > 0 {}
        }
        thread = nil
    }

    private func run() {
        var deadline = monotonicNanoseconds()
        var cadence = CaptureCadence(interval: periodNs)
        while true {
            pthread_mutex_lock(mutex)
            while !stopRequested && monotonicNanoseconds() < deadline {
                var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
                pthread_cond_timedwait(cond, mutex, &ts)
            }
            let stopping = stopRequested
            pthread_mutex_unlock(mutex)
            if stopping { return }
            let tickStart = monotonicNanoseconds()
            switch tick() {
            case .end:
                return
            case .idle where idleFD != nil:
                // Sleep until there may be work or stop() writes stopEvent, then tick as soon as the
                // cadence allows (at once, unless the last capture was less than ¾ interval ago).
                var fds = [pollfd(fd: idleFD!, events: Int16(POLLIN), revents: 0), pollfd(fd: stopEvent, events: Int16(POLLIN), revents: 0)]
                _ = poll(&fds, 2, -1)
                deadline = max(cadence.opensAt(), monotonicNanoseconds() + Self.settleNs)
                continue
            case .next where idleFD != nil:
                cadence.take(now: tickStart)
                deadline = cadence.opensAt()
                continue
            case .next, .idle:
                break
            }
            deadline += periodNs
            // Fell behind by more than a frame: skip ahead instead of bursting.
            let now = monotonicNanoseconds()
            if now > deadline + periodNs { deadline = now }
        }
    }
}

/// When a damage-driven capture thread may tick again after one that had work: the encoder's rule
/// (`TokenBucketCap`: credit up to two intervals, one spent per capture, never closer than ¾ of an
/// interval). A screen that changes faster than the rate is still held to it; one that changes at
/// the rate is captured as each change arrives.
///
/// Measured (issue 27, 1080p typing into a room, the screen drawn at 30 frames/s): on a fixed
/// 30 Hz clock the wait from a change to the next tick was whatever the two clocks' phases made it,
/// 0–33 ms for a whole session: draw → decoded p50 50, 67 and 77 ms in three sessions.
public typealias CaptureCadence = TokenBucketCap
