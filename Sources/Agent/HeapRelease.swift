import Glibc

/// Hands the heap memory a finished session freed back to the system (glibc's malloc_trim).
///
/// Why: a session's threads (capture, encoder, network, the room driver's) each allocate from a
/// glibc arena of their own; when they end, what they freed stays in those arenas, so an idle
/// agent after many sessions looks as if it leaked. Measured with 100 connect/stop cycles through
/// the daemon (DaemonTests.connectStopCyclesKeepTheDaemonFlat; 640x360, VP8): without this, RSS
/// rose 49 → 56.4 MB over the first 20 cycles and a further 1.3 MB (16 KB a cycle) over the next
/// 80; with it, 51.8 MB after cycle 20 and 51.7 MB after cycle 100: what is left after a trim does not
/// grow, so no live object leaks per session (docs/daemon.md). It returns free pages only.
enum HeapRelease {
    /// malloc_trim(0) (not in Swift's Glibc module, hence dlsym); false where there is none (musl).
    @discardableResult
    static func trim() -> Bool {
        guard let symbol = dlsym(nil, "malloc_trim") else { return false }
        return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)(0) != 0
    }
}
