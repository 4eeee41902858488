import Glibc

/// What the agent does so that memory a finished session freed goes back to the system.
///
/// The cause (issue 23, 4.2): glibc's mmap threshold is dynamic. It starts at 128 KB, and each time a
/// chunk that was mmap'ed is freed it rises to that chunk's size (up to 32 MB), with the trim
/// threshold at twice it. The first session's libvpx encoder buffers (42 MB at 1280x720, of which a
/// 22 MB token buffer, all allocated once on the encoder thread; heaptrack) are mmap'ed and go back
/// at once; freeing them raises the threshold to 22 MB and the trim threshold to 44 MB. From the
/// second session on, the same buffers come from the encoder thread's glibc arena instead (a 64 MB
/// heap of its own, not the main heap) and, freed, lie in that heap's top chunk, which neither free
/// (the top is below 44 MB) nor malloc_trim (it trims only the main heap's top) hands back. What the
/// encoder had touched stayed resident, 13 MB an arena at 1280x720 (/proc/PID/smaps: 42 MB heaps
/// at 64 MB-aligned addresses, 13–14 MB resident each), and each session's encoder thread lands on
/// some arena of up to 8 per core: an idle daemon's RSS was 39.2 MB after one cycle, 80.6 after 10,
/// 119.8 after 50 and 124.1 after 100; with this 39.2, 39.7, 39.9 and 39.8 (docs/daemon.md).
public enum HeapRelease {
    /// mmap threshold (bytes): allocations this big or bigger get a mapping of their own and are
    /// unmapped when freed.
    public static let mmapThreshold: Int32 = 128 * 1024

    /// Fixes the thresholds at glibc's own starting values (M_MMAP_THRESHOLD 128 KB, which also stops
    /// M_TRIM_THRESHOLD moving from its 128 KB): the encoder's and the frame buffers are mmap'ed
    /// whatever came before, and a thread heap's free top over 128 KB is released on free. Called
    /// first thing in main, before any thread exists.
    ///
    /// What it costs: the dynamic threshold saves a program that allocates and frees big blocks all
    /// the time their mapping and page faults; the agent does not. Every allocation of 128 KB or more
    /// in a session is made once at its start (libvpx's buffers, the I420 pictures, the test pattern's
    /// canvas: 24 at 1280x720, none per frame; heaptrack's size histogram), so a session's start
    /// maps and faults in its buffers anew (~4,500 page faults, ~9 ms of CPU) instead of reusing
    /// what the last session left, and sharing makes the same calls as before: 30 s at 1920x1080,
    /// 0–19 mmap and 1–2 madvise calls, 30 fps, CPU per frame the same within the machine's noise
    /// (docs/daemon.md, "Memory between sessions").
    @discardableResult
    public static func configure() -> Bool {
        guard let symbol = dlsym(nil, "mallopt") else { return false }
        let mallopt = unsafeBitCast(symbol, to: (@convention(c) (Int32, Int32) -> Int32).self)
        return mallopt(-3 /* M_MMAP_THRESHOLD */, mmapThreshold) == 1
    }

    /// Hands the heap memory a finished session freed back to the system (glibc's malloc_trim(0)):
    /// the free pages inside every arena's heap and the main heap's free top. It returns free pages
    /// only; with `configure` there is little left for it (the thread heaps' tops were released on free).
    /// malloc_trim is not in Swift's Glibc module, hence dlsym; false where there is none (musl).
    @discardableResult
    public static func trim() -> Bool {
        guard let symbol = dlsym(nil, "malloc_trim") else { return false }
        return unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)(0) != 0
    }
}
