import Foundation

/// A property read and written under a lock of its own: the handlers that one thread sets and
/// another calls (`Publisher.onKeyframeRequest`, `VideoFanout.onBitrate`, a feed plugged in later),
/// written as `@Locked public var onBitrate: ((Int) -> Void)? = nil` instead of a get/set pair
/// around the owner's state lock each. The lock is held only to copy the value, never while a
/// handler runs. @unchecked Sendable: every access goes through the lock.
@propertyWrapper
public final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    public init(wrappedValue: Value) { value = wrappedValue }

    public var wrappedValue: Value {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}
