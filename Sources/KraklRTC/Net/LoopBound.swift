/// A value that belongs to one `EventLoop`'s thread: every read and write checks that it happens on
/// that thread and traps otherwise (as swift-nio's `NIOLoopBound` does), so "loop thread only" is
/// a check instead of a comment. Sendable because only the loop's thread can reach the value; the
/// box is a class so that the owner may keep it in a `let`. Its fields read as the owner's own:
/// `state.quitting = true` (dynamic member lookup, each access checked).
@dynamicMemberLookup
public final class LoopBound<Value>: @unchecked Sendable {
    public let loop: EventLoop
    private var _value: Value

    /// Any thread: the value is only handed over here, before the loop touches it.
    public init(_ value: Value, loop: EventLoop) {
        self.loop = loop
        _value = value
    }

    /// On the loop's thread only.
    public var value: Value {
        get {
            loop.preconditionInLoop()
            return _value
        }
        _modify {
            loop.preconditionInLoop()
            yield &_value
        }
    }

    /// A field of the value, on the loop's thread only.
    public subscript<Field>(dynamicMember field: WritableKeyPath<Value, Field>) -> Field {
        get {
            loop.preconditionInLoop()
            return _value[keyPath: field]
        }
        _modify {
            loop.preconditionInLoop()
            yield &_value[keyPath: field]
        }
    }
}
