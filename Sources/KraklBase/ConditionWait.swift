import Foundation

extension NSCondition {
    /// Waits while `predicate` holds, but not past `deadline`. Call with the
    /// lock held; returns true when the predicate stopped holding. Waiting
    /// is on the condition, so a broadcast ends it at once, not a poll.
    public func wait(while predicate: () -> Bool, until deadline: Date) -> Bool {
        while predicate() {
            if !wait(until: deadline) { return !predicate() }
        }
        return true
    }
}
