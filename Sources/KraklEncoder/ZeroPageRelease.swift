import Glibc

/// Gives back to the kernel the pages of large new anonymous mappings that
/// are still all zero.
///
/// Why: libvpx sizes its token buffer for the worst case of every
/// macroblock of a frame (VP8 at 1080p: 8160 blocks × 384 tokens × 16 bytes,
/// about 50 MB) and allocates it with vpx_calloc, which is malloc + memset:
/// every page becomes resident at once though a screen frame fills a small
/// part of it. A private anonymous page that is all zero reads back as zero
/// after MADV_DONTNEED, so dropping such pages changes no value the program
/// can see; the kernel hands a fresh zero page back on the next touch.
///
/// Only mappings that did not exist in `before` (created while the encoder
/// was set up on this thread) and are at least 16 MB are considered, and
/// their first page (where malloc keeps its chunk header) is left alone.
enum ZeroPageRelease {
    struct Region: Equatable { let start: UInt; let end: UInt }

    /// Private, writable, anonymous mappings of this process.
    static func anonymousRegions() -> [Region] {
        guard let file = fopen("/proc/self/maps", "r") else { return [] }
        defer { fclose(file) }
        var regions: [Region] = []
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, Int32(line.count), file) != nil {
            let text = String(cString: line)
            let fields = text.split(separator: " ", omittingEmptySubsequences: true)
            // start-end perms offset dev inode [path]
            guard fields.count == 5 || (fields.count == 6 && fields[5] == "\n"), fields[1] == "rw-p", fields[4].hasPrefix("0") else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1].trimmingCharacters(in: .whitespacesAndNewlines), radix: 16) else { continue }
            regions.append(Region(start: start, end: end))
        }
        return regions
    }

    /// Releases all-zero pages of regions that are new since `before`.
    /// Returns the bytes released.
    @discardableResult
    static func releaseNewZeroPages(since before: [Region]) -> Int {
        let page = UInt(sysconf(Int32(_SC_PAGESIZE)))
        var released = 0
        for region in anonymousRegions() where region.end - region.start >= 16 << 20 {
            guard !before.contains(where: { $0.start < region.end && region.start < $0.end }) else { continue }
            var runStart: UInt?
            var address = region.start + page
            func flush(_ end: UInt) {
                if let start = runStart, end > start {
                    if madvise(UnsafeMutableRawPointer(bitPattern: start), Int(end - start), MADV_DONTNEED) == 0 { released += Int(end - start) }
                }
                runStart = nil
            }
            while address < region.end {
                let words = UnsafePointer<UInt64>(bitPattern: address)!
                var zero = true
                for i in 0..<Int(page / 8) where words[i] != 0 {
                    zero = false
                    break
                }
                if zero { if runStart == nil { runStart = address } } else { flush(address) }
                address += page
            }
            flush(region.end)
        }
        return released
    }
}
