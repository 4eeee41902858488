import FoundationEssentials
import Glibc
import Synchronization

/// A property read and written under a lock of its own: the handlers that one thread sets and
/// another calls (`Publisher.onKeyframeRequest`, `VideoFanout.onBitrate`, a feed plugged in later),
/// written as `@Locked public var onBitrate: (@Sendable (Int) -> Void)? = nil` instead of a get/set
/// pair around the owner's state lock each. The lock is held only to copy the value, never while a
/// handler runs. Sendable, checked: a Mutex holds the value, which must itself be Sendable (a
/// handler called on another thread than the one that set it is a @Sendable closure).
@propertyWrapper
public final class Locked<Value: Sendable>: Sendable {
    private let value: Mutex<Value>

    public init(wrappedValue: Value) { value = Mutex(wrappedValue) }

    public var wrappedValue: Value {
        get { value.withLock { $0 } }
        set { value.withLock { $0 = newValue } }
    }
}

/// State several threads share, behind one lock with a condition to wait on: the value is reachable
/// only inside `withLock`, so an owner that keeps its mutable state in a `let Guarded` is Sendable
/// with the compiler checking it (no `@unchecked` on the owner). Sendable when the value is: what
/// leaves `withLock` must itself be safe to share.
public final class Guarded<Value> {
    private let condition = Condition()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    /// Runs `body` with the value, under the lock (never call back into this box from it).
    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        condition.lock()
        defer { condition.unlock() }
        return try body(&value)
    }

    /// `withLock`, then wakes every waiter: for changes someone may be waiting for.
    @inline(__always)
    public func change<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        condition.lock()
        defer {
            condition.broadcast()
            condition.unlock()
        }
        return try body(&value)
    }

    /// Waits until `done` holds for the value (checked under the lock, again after each `change`),
    /// or `deadline` passed; then runs `then` with the value, still under the lock, and returns its result.
    public func wait<Result>(until deadline: Date, for done: (Value) -> Bool, then: (inout Value, _ done: Bool) -> Result) -> Result {
        condition.lock()
        defer { condition.unlock() }
        let held = condition.wait(while: { !done(value) }, until: deadline)
        return then(&value, held)
    }
}

/// @unchecked Sendable: the value is reached only inside `withLock`, under the condition's lock.
extension Guarded: @unchecked Sendable where Value: Sendable {}

/// A value one thread owns from the moment it claims it (`claim()`, first thing on that thread):
/// every read and write then checks that it happens there and traps otherwise, so "that thread
/// only" is a check instead of a comment (`LoopBound` is the same for an EventLoop's thread).
/// Before the claim the creating thread may set it up. @unchecked Sendable (as `LoopBound`): once
/// claimed, only the owning thread can reach the value; the owner itself is an Atomic.
public final class ThreadConfined<Value>: @unchecked Sendable {
    /// The owning thread's pthread_t (glibc's is never 0); 0 until claimed.
    private let owner = Atomic<UInt>(0)
    private var _value: Value

    public init(_ value: Value) { _value = value }

    /// The calling thread owns the value from now on.
    public func claim() {
        let (claimed, _) = owner.compareExchange(expected: 0, desired: UInt(pthread_self()), ordering: .acquiringAndReleasing)
        precondition(claimed, "a thread-confined value was claimed twice")
    }

    public var value: Value {
        get {
            check()
            return _value
        }
        _modify {
            check()
            yield &_value
        }
    }

    @inline(__always)
    private func check() {
        let owner = owner.load(ordering: .relaxed)
        if owner != 0 { precondition(pthread_equal(pthread_t(owner), pthread_self()) != 0, "touched off the thread that owns it") }
    }
}
