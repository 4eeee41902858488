import Foundation
import Testing
import ZeroFill

/// The test binary links ZeroFill like the agent does, so `memset` here is
/// the agent's. These check that it still means "these bytes are now zero"
/// on every kind of memory, and that it only takes the page-release path
/// where that is exact.
@Suite(.tags(.integration)) struct ZeroFillTests {
    let size = 24 << 20

    /// Resident pages of the whole pages inside [pointer, pointer + count).
    /// Released pages are not resident until touched again; memset's are.
    private func residentPages(_ pointer: UnsafeMutableRawPointer, _ count: Int) -> Int {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = (Int(bitPattern: pointer) + page - 1) / page * page
        let end = (Int(bitPattern: pointer) + count) / page * page
        guard end > start else { return 0 }
        var vector = [UInt8](repeating: 0, count: (end - start) / page)
        guard mincore(UnsafeMutableRawPointer(bitPattern: start), end - start, &vector) == 0 else { return -1 }
        return vector.reduce(0) { $0 + Int($1 & 1) }
    }

    private func allZero(_ pointer: UnsafeMutableRawPointer, _ count: Int) -> Bool {
        let bytes = pointer.assumingMemoryBound(to: UInt8.self)
        for i in 0..<count where bytes[i] != 0 { return false }
        return true
    }

    @Test func largeZeroFillOfHeapMemoryReleasesPagesAndReadsBackZero() throws {
        #expect(krakl_zero_fill_is_active() == 1)
        let buffer = try #require(malloc(size))
        defer { free(buffer) }
        // An odd offset and length, so the head and tail are partial pages.
        let start = buffer + 123, count = size - 5000
        for i in stride(from: 0, to: size, by: 997) { buffer.storeBytes(of: 0xAB, toByteOffset: i, as: UInt8.self) }
        buffer.storeBytes(of: 0xCD, toByteOffset: 122, as: UInt8.self)
        buffer.storeBytes(of: 0xEF, toByteOffset: 123 + count, as: UInt8.self)
        let before = krakl_zero_fill_read_stats()
        memset(start, 0, count)
        let after = krakl_zero_fill_read_stats()
        #expect(after.bytes - before.bytes >= UInt64(count), "the fill is counted (other tests may add theirs)")
        #expect(residentPages(start, count) == 0, "the fill released the pages instead of writing them")
        #expect(allZero(start, count), "every byte of the range reads back as zero")
        #expect(buffer.load(fromByteOffset: 122, as: UInt8.self) == 0xCD, "the byte before the range is untouched")
        #expect(buffer.load(fromByteOffset: 123 + count, as: UInt8.self) == 0xEF, "the byte after the range is untouched")
    }

    @Test func sharedAndFileMemoryAndNonZeroFillsUseThePlainMemset() throws {

        // Shared anonymous memory: MADV_DONTNEED would not zero it.
        let shared = try #require(mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))
        #expect(shared != MAP_FAILED)
        defer { munmap(shared, size) }
        memset(shared, 0x5A, size)
        memset(shared, 0, size)
        #expect(residentPages(shared, size) == size / Int(sysconf(Int32(_SC_PAGESIZE))), "written, not released")
        #expect(allZero(shared, size))

        // A private mapping of a file: after MADV_DONTNEED it would read the file again.
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("zero-fill-\(getpid())").path
        defer { unlink(path) }
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(ftruncate(fd, off_t(size)) == 0)
        let pattern = [UInt8](repeating: 0x77, count: 1 << 20)
        for _ in 0..<(size >> 20) { #expect(write(fd, pattern, pattern.count) == pattern.count) }
        let file = try #require(mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0))
        #expect(file != MAP_FAILED)
        defer { munmap(file, size) }
        memset(file, 0, size)
        #expect(residentPages(file, size) == size / Int(sysconf(Int32(_SC_PAGESIZE))), "written, not released")
        #expect(allZero(file, size), "a private file mapping reads back as zero, not as the file")

        // A large non-zero fill on heap memory.
        let heap = try #require(malloc(size))
        defer { free(heap) }
        memset(heap, 0x11, size)
        #expect(heap.load(fromByteOffset: size / 2, as: UInt8.self) == 0x11)
    }

    /// In the real agent at 1080p, libvpx's clear of its worst-case token
    /// buffer (≈ 50 MB) goes through the page release, and the recording still
    /// decodes to every frame (the encoder never saw anything but zeros there).
    @Test func theAgentsLibvpxSetUpFillIsReleasedNotWritten() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        let result = try Harness.agent(["--plugins", registry, "-q", "-o", "width=1920", "-o", "height=1080", "-o", "scene=typing",
                                        "--frames", "15", "--record", dir + "/out.webm", "--stats-json", dir + "/stats.json"])
        #expect(result.status == 0, "\(result.stderr)")
        let stats = (try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/stats.json")))) as? [String: Any] ?? [:]
        let released = stats["zero_fill_released_bytes"] as? Int ?? 0
        #expect(released >= 40 << 20, "released \(released) bytes")
        guard let ffprobe = Harness.which("ffprobe") else { return skipTest("ffprobe is not installed (scripts/setup installs ffmpeg)") }
        let probe = try Harness.run(ffprobe, ["-v", "error", "-count_frames", "-show_entries", "stream=width,nb_read_frames", "-of", "csv=p=0", dir + "/out.webm"])
        #expect(probe.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "1920,\(stats["encoded_frames"] as? Int ?? -1)", "\(probe.stdout)")
    }
}
