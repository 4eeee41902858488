import Dispatch
import FoundationEssentials
import KraklBase
import Glibc

/// A single-threaded event loop on its own thread (not Swift concurrency):
/// file descriptors watched with poll(2), timers in a deadline heap, and an
/// self-pipe that wakes the loop when another thread posts work.
///
/// Thread rules: `post`, `stop` and `isRunning` may be called from any
/// thread; `watch`, `unwatch`, `schedule` and `cancel` only on the loop
/// thread (inside a posted closure, a timer or a readable handler), so the
/// loop's own state needs no lock; they check it (`preconditionInLoop`), as
/// `LoopBound` does for the state of the loop's owners.
/// @unchecked Sendable: its queue and timers are under `lock`; everything else is its own thread's (checked: preconditionInLoop).
public final class EventLoop: @unchecked Sendable {
    public typealias TimerID = UInt64

    private struct Timer {
        var deadline: UInt64
        var id: TimerID
        var handler: () -> Void
    }

    public let name: String
    /// The self-pipe: [read end, write end], both non-blocking.
    private let wakeFD: Int32
    private let wakeWriteFD: Int32
    private var watched: [(fd: Int32, handler: () -> Void)] = []
    /// One-shot: called once when the fd can be written (a TCP connect finished, a full send buffer drained).
    private var writable: [(fd: Int32, handler: () -> Void)] = []
    private var heap: [Timer] = []
    private var cancelled = Set<TimerID>()
    private var nextTimerID: TimerID = 1

    private let lock = Lock()
    private var posted: [() -> Void] = []
    private var stopping = false
    private var running = false
    /// The loop's thread exists (from its first instruction to the end of `run`): before and after
    /// that, the loop's state is its owner's, on whatever thread the owner is.
    private var threadAlive = false
    private let finished = DispatchSemaphore(value: 0)

    /// Creates the wake-up pipe; the thread starts with `start()`.
    public init(name: String = "krakl-net") throws(NetworkError) {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw NetworkError.socket("pipe: \(String(cString: strerror(errno)))") }
        for fd in ends {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        wakeFD = ends[0]
        wakeWriteFD = ends[1]
        self.name = name
    }

    deinit {
        close(wakeFD)
        close(wakeWriteFD)
    }

    /// Starts the loop thread.
    public func start() {
        lock.lock()
        guard !running else { lock.unlock(); return }
        running = true
        lock.unlock()
        startThread(name: name, stackSize: 1 << 20) { [self] in
            pthread_setspecific(Self.currentLoopKey, Unmanaged.passUnretained(self).toOpaque())
            self.lock.withLock { self.threadAlive = true }
            self.run()
            self.lock.withLock { self.threadAlive = false }
            self.finished.signal()
        }
    }

    public var isRunning: Bool { lock.lock(); defer { lock.unlock() }; return running && !stopping }

    /// True on the loop thread. A thread-specific value the loop's thread set for itself: no lock,
    /// a few nanoseconds, so checks can stay on hot paths.
    public var isLoopThread: Bool {
        pthread_getspecific(Self.currentLoopKey) == Unmanaged.passUnretained(self).toOpaque()
    }

    /// Traps unless called on the loop thread, or while no loop thread exists (before it started,
    /// after it ended: then the owner's thread is the only one): what "loop thread only" means, checked.
    @inline(__always)
    public func preconditionInLoop(file: StaticString = #fileID, line: UInt = #line) {
        if isLoopThread { return }
        precondition(!lock.withLock({ threadAlive }), "called off the \(name) loop's thread while it runs", file: file, line: line)
    }

    /// Which loop runs on this thread (set once by each loop's thread; never cleared: the thread ends with its loop).
    private static let currentLoopKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
        return key
    }()

    /// Any thread: runs `work` on the loop thread soon, in posting order. Never blocks
    /// beyond a short lock; work posted after `stop` is dropped.
    public func post(_ work: @escaping () -> Void) {
        lock.lock()
        if stopping { lock.unlock(); return }
        posted.append(work)
        lock.unlock()
        wake()
    }

    /// Any thread: makes the loop go round (run posted work, re-check timers).
    public func wake() {
        // A full pipe already means "wake up": EAGAIN is fine.
        var one: UInt8 = 1
        _ = Glibc.write(wakeWriteFD, &one, 1)
    }

    /// Any thread except the loop's: stops the loop after the work already posted and
    /// waits (at most `timeout`) for its thread to end. Returns whether it ended.
    @discardableResult
    public func stop(timeout: Duration = .seconds(5)) -> Bool {
        lock.lock()
        let wasRunning = running && !stopping
        stopping = true
        lock.unlock()
        guard wasRunning else { return true }
        wake()
        // On the loop thread itself (a handler dropped the last reference): it ends after this turn.
        if isLoopThread { return false }
        return finished.wait(timeout: .now() + timeout.inSeconds) == .success
    }

    // MARK: loop thread only (each checks it: preconditionInLoop)

    /// Calls `handler` on the loop thread whenever `fd` is readable.
    public func watch(fd: Int32, _ handler: @escaping () -> Void) {
        preconditionInLoop()
        unwatch(fd: fd)
        watched.append((fd, handler))
    }

    public func unwatch(fd: Int32) {
        preconditionInLoop()
        watched.removeAll { $0.fd == fd }
        writable.removeAll { $0.fd == fd }
    }

    /// Calls `handler` once on the loop thread when `fd` is writable (or in error).
    public func watchWritable(fd: Int32, _ handler: @escaping () -> Void) {
        preconditionInLoop()
        writable.removeAll { $0.fd == fd }
        writable.append((fd, handler))
    }

    /// Runs `handler` once at `deadline` (monotonic ns), or on the next turn if it has passed.
    @discardableResult
    public func schedule(at deadline: UInt64, _ handler: @escaping () -> Void) -> TimerID {
        preconditionInLoop()
        let id = nextTimerID
        nextTimerID += 1
        heap.append(Timer(deadline: deadline, id: id, handler: handler))
        siftUp(heap.count - 1)
        return id
    }

    /// Runs `handler` once, `delay` from now.
    @discardableResult
    public func schedule(after delay: Duration, _ handler: @escaping () -> Void) -> TimerID {
        schedule(at: MonotonicClock.nanoseconds() &+ delay.inNanoseconds, handler)
    }

    /// Cancels a timer that has not fired; harmless for one that has.
    public func cancel(_ id: TimerID) {
        preconditionInLoop()
        if heap.contains(where: { $0.id == id }) { cancelled.insert(id) }
    }

    private func run() {
        var descriptors: [pollfd] = []
        var buffer = [UInt8](repeating: 0, count: 64)
        while true {
            lock.lock()
            let work = posted
            posted.removeAll(keepingCapacity: true)
            let stop = stopping
            lock.unlock()
            for item in work { item() }
            if stop { break }
            fireDueTimers()

            descriptors.removeAll(keepingCapacity: true)
            descriptors.append(pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0))
            for entry in watched { descriptors.append(pollfd(fd: entry.fd, events: Int16(POLLIN), revents: 0)) }
            let readers = descriptors.count
            for entry in writable { descriptors.append(pollfd(fd: entry.fd, events: Int16(POLLOUT), revents: 0)) }
            // Sleep until the next timer (rounded up to whole ms: never early), at most 1 s.
            var wait = 1_000_000_000 as UInt64
            if let next = heap.first {
                let now = MonotonicClock.nanoseconds()
                wait = next.deadline > now ? min(wait, next.deadline - now) : 0
            }
            let ready = poll(&descriptors, nfds_t(descriptors.count), Int32((wait + 999_999) / 1_000_000))
            if ready < 0 {
                if errno == EINTR { continue }
                break
            }
            if ready == 0 { continue }
            if descriptors[0].revents != 0 {
                for _ in 0..<64 where Glibc.read(wakeFD, &buffer, 64) > 0 {}
            }
            let readable = descriptors[1..<readers].filter { $0.revents != 0 }.map(\.fd)
            let writeReady = descriptors[readers...].filter { $0.revents != 0 }.map(\.fd)
            for fd in readable {
                // A handler may unwatch another fd; look each up again.
                if let entry = watched.first(where: { $0.fd == fd }) { entry.handler() }
            }
            for fd in writeReady {
                guard let index = writable.firstIndex(where: { $0.fd == fd }) else { continue }
                let entry = writable.remove(at: index)
                entry.handler()
            }
        }
        lock.lock()
        running = false
        posted.removeAll()
        lock.unlock()
        heap.removeAll()
        watched.removeAll()
    }

    private func fireDueTimers() {
        // Bounded: timers scheduled by a handler for "now" wait for the next turn.
        var budget = heap.count
        let now = MonotonicClock.nanoseconds()
        while budget > 0, let first = heap.first, first.deadline <= now {
            budget -= 1
            let timer = popFirst()
            if cancelled.remove(timer.id) != nil { continue }
            timer.handler()
        }
    }

    private func popFirst() -> Timer {
        let first = heap[0]
        let last = heap.removeLast()
        if !heap.isEmpty {
            heap[0] = last
            siftDown(0)
        }
        return first
    }

    private func before(_ a: Int, _ b: Int) -> Bool {
        heap[a].deadline < heap[b].deadline || (heap[a].deadline == heap[b].deadline && heap[a].id < heap[b].id)
    }

    private func siftUp(_ index: Int) {
        var child = index
        while child > 0 {
            let parent = (child - 1) / 2
            guard before(child, parent) else { return }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func siftDown(_ index: Int) {
        var parent = index
        while true {
            let left = 2 * parent + 1, right = left + 1
            var best = parent
            if left < heap.count && before(left, best) { best = left }
            if right < heap.count && before(right, best) { best = right }
            if best == parent { return }
            heap.swapAt(parent, best)
            parent = best
        }
    }
}
