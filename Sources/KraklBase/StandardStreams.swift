@preconcurrency import Glibc  // first import: Foundation re-exports Glibc without it

/// The process's stdout and stderr. Glibc's `stdout` and `stderr` are global vars, which Swift 6
/// rejects as shared mutable state; stdio locks each call on a stream itself, so they are safe from
/// any thread, and this is the one place that says so (the rest of the agent calls these).
public enum StandardStream {
    /// `text` to stderr (unbuffered), as `fputs` writes it.
    public static func error(_ text: String) { fputs(text, stderr) }
    public static func flushOutput() { fflush(stdout) }
    public static func flushError() { fflush(stderr) }
    /// stdout's error flag: a reader closed the pipe (EPIPE) or the terminal went away (EIO).
    public static var outputFailed: Bool { ferror(stdout) != 0 }
    /// stdout line-buffered, so a reader of a pipe sees each line as it is printed.
    public static func lineBufferOutput() { setvbuf(stdout, nil, _IOLBF, 0) }
}
