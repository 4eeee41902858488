import Glibc

/// A file the agent writes (a recording, the frame log, the input dump, the statistics), with
/// every failure reported: at open, at each write, at flush and at close. Errors that stdio
/// holds back until a flush (a full disk, /dev/full, a FIFO whose reader left) are the ones a
/// run used to lose silently.
///
/// Only a regular file can be patched afterwards (`isSeekable`): a FIFO, a character device or
/// a terminal gets the bytes once, in order, and the containers write a live stream there.
/// Positions are counted here, not asked of ftell, which fails (-1) on a pipe and reads 0 on
/// /dev/null.
public final class OutputFile {
    public let path: String
    public let isSeekable: Bool
    /// Bytes written so far: the offset of the next byte.
    public private(set) var position = 0
    private var file: UnsafeMutablePointer<FILE>?

    /// How long opening a FIFO waits for its reader (a plain open would wait for ever, and the
    /// run could not end).
    public static let fifoReaderWait = 10.0

    /// Opens (creates or truncates) `path` for writing; a FIFO once a reader has it open.
    public init(path: String) throws(EncoderError) {
        var existing = stat()
        let opened: UnsafeMutablePointer<FILE>?
        if stat(path, &existing) == 0 && (existing.st_mode & S_IFMT) == S_IFIFO {
            opened = try Self.openFifo(path)
        } else {
            opened = fopen(path, "wbe")  // e: close-on-exec, so no child of a backend holds it open
        }
        guard let file = opened else { throw EncoderError(path: path, reason: Self.errnoText()) }
        var info = stat()
        isSeekable = fstat(fileno(file), &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG
        self.path = path
        self.file = file
    }

    deinit { if let file { fclose(file) } }

    public func write(_ bytes: [UInt8]) throws(EncoderError) {
        // withUnsafeBytes rethrows untyped errors: the failure is carried out by hand.
        var failure: EncoderError?
        bytes.withUnsafeBytes { buffer in
            do throws(EncoderError) { try write(buffer) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    public func write(_ text: String) throws(EncoderError) { try write(Array(text.utf8)) }

    public func write(_ buffer: UnsafeRawBufferPointer) throws(EncoderError) {
        guard let file else { throw EncoderError(path: path, reason: "written after it was closed") }
        guard buffer.count > 0, let base = buffer.baseAddress else { return }
        guard fwrite(base, 1, buffer.count, file) == buffer.count else { throw EncoderError(path: path, reason: Self.errnoText()) }
        position += buffer.count
    }

    /// Overwrites bytes at `offset` (written before); the next write still appends.
    /// Only for a seekable file.
    public func patch(_ bytes: [UInt8], at offset: Int) throws(EncoderError) {
        precondition(isSeekable && offset >= 0 && offset + bytes.count <= position, "patch outside what was written")
        try flush()
        guard let file else { return }
        let done = bytes.withUnsafeBytes { pwrite(fileno(file), $0.baseAddress, $0.count, off_t(offset)) }
        guard done == bytes.count else { throw EncoderError(path: path, reason: done < 0 ? Self.errnoText() : "short write") }
    }

    /// Hands what stdio holds to the kernel, so a write error shows now.
    public func flush() throws(EncoderError) {
        guard let file else { return }
        guard fflush(file) == 0 else { throw EncoderError(path: path, reason: Self.errnoText()) }
    }

    /// Flushes and closes; a failure of either is reported. Later calls do nothing.
    public func close() throws(EncoderError) {
        guard let file else { return }
        self.file = nil
        let flushed = fflush(file) == 0
        let flushError = errno
        let closed = fclose(file) == 0
        let closeError = errno
        guard flushed else { throw EncoderError(path: path, reason: String(cString: strerror(flushError))) }
        guard closed else { throw EncoderError(path: path, reason: String(cString: strerror(closeError))) }
    }

    private static func errnoText() -> String { String(cString: strerror(errno)) }

    /// A FIFO opened without blocking: ENXIO means no reader yet, so it is tried again every
    /// 50 ms for up to `fifoReaderWait` seconds.
    private static func openFifo(_ path: String) throws(EncoderError) -> UnsafeMutablePointer<FILE>? {
        let attempts = Int(fifoReaderWait / 0.05)
        for attempt in 0...attempts {
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            if fd >= 0 {
                // Writes block again once it is open: a slow reader slows the encoder, it does not fail it.
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
                guard let file = fdopen(fd, "wb") else {
                    let reason = errnoText()
                    Glibc.close(fd)
                    throw EncoderError(path: path, reason: reason)
                }
                return file
            }
            guard errno == ENXIO else { return nil }
            if attempt < attempts { usleep(50_000) }
        }
        throw EncoderError(path: path, reason: "no process opened the FIFO for reading within \(Int(fifoReaderWait)) s; start the reader first")
    }
}
