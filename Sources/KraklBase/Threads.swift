@preconcurrency import Glibc
import FoundationEssentials

// Foundation's NSLock, NSCondition and Thread, on pthreads: importing Foundation for them maps
// libFoundation, lib_FoundationICU and libFoundationInternationalization (about 8 MB resident in a
// room session) into every process that links a module using them (issue 27).

/// A mutex for state that needs lock() and unlock() apart (a `Mutex` from Synchronization where
/// the state can live inside it). @unchecked Sendable: the pthread mutex is the synchronization.
public final class Lock: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    public init() { pthread_mutex_init(mutex, nil) }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    /// Takes the lock if it is free; false (and not held) when another thread holds it.
    public func tryLock() -> Bool { pthread_mutex_trylock(mutex) == 0 }

    /// Takes the lock, waiting at most until `deadline`; false (and not held) when it passed.
    public func lock(before deadline: Date) -> Bool {
        var until = timespec(deadline)
        return pthread_mutex_timedlock(mutex, &until) == 0
    }

    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }
}

extension timespec {
    /// A wall-clock deadline as pthread's timed waits take it; one past any real wait stays
    /// representable (`.distantFuture` is year 4001).
    init(_ deadline: Date) {
        let seconds = min(deadline.timeIntervalSince1970, 1e12)
        let whole = seconds.rounded(.down)
        self.init(tv_sec: Int(whole), tv_nsec: min(999_999_999, Int((seconds - whole) * 1e9)))
    }
}

/// A mutex with a condition variable, waited on with a wall-clock deadline as NSCondition was.
/// @unchecked Sendable: the pthread mutex and condition are the synchronization.
public final class Condition: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    public init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }
    public func signal() { pthread_cond_signal(condition) }
    public func broadcast() { pthread_cond_broadcast(condition) }

    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Waits for a signal or broadcast; call with the lock held (wakes may be spurious).
    public func wait() { pthread_cond_wait(condition, mutex) }

    /// `wait()`, but not past `deadline`; false when the deadline passed.
    public func wait(until deadline: Date) -> Bool {
        var until = timespec(deadline)
        return pthread_cond_timedwait(condition, mutex, &until) != ETIMEDOUT
    }

    /// Waits while `predicate` holds, but not past `deadline`. Call with the lock held; returns
    /// true when the predicate stopped holding. Waiting is on the condition, so a broadcast ends
    /// it at once, not a poll.
    public func wait(while predicate: () -> Bool, until deadline: Date) -> Bool {
        while predicate() {
            if !wait(until: deadline) { return !predicate() }
        }
        return true
    }
}

/// Starts a thread running `body`; nil when the system refuses one. `name` (at most 15 bytes
/// reach the kernel) is what top -H, gdb and /proc/PID/task/*/comm show. A joinable thread must
/// be joined (pthread_join) by its owner; otherwise the thread's resources go when it ends.
@discardableResult
public func startThread(name: String? = nil, stackSize: Int? = nil, joinable: Bool = false,
                        _ body: @escaping @Sendable () -> Void) -> pthread_t? {
    final class Start: Sendable {
        let name: String?
        let body: @Sendable () -> Void
        init(name: String?, body: @escaping @Sendable () -> Void) { (self.name, self.body) = (name, body) }
    }
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if let stackSize { pthread_attr_setstacksize(&attributes, stackSize) }
    if !joinable { pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED)) }
    let start = Unmanaged.passRetained(Start(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let status = pthread_create(&thread, &attributes, { raw in
        let start = Unmanaged<Start>.fromOpaque(raw!).takeRetainedValue()
        if let name = start.name { nameCurrentThread(name) }
        start.body()
        return nil
    }, start)
    guard status == 0 else {
        Unmanaged<Start>.fromOpaque(start).release()
        return nil
    }
    return thread
}

/// Gives the calling thread its kernel name (the first 15 bytes of `name`). Glibc's module hides
/// pthread_setname_np and prctl is variadic; /proc/thread-self/comm takes the name.
public func nameCurrentThread(_ name: String) {
    let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { return }
    let bytes = Array(name.utf8.prefix(15))
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
}
