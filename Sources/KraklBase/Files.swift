@preconcurrency import Glibc

/// The first `limit` bytes of a file (fewer when it is shorter); nil when it cannot be opened.
/// What FileHandle(forReadingAtPath:) and read(upToCount:) gave: a file that opens but cannot be
/// read (a folder) reads as empty.
public func readFilePrefix(_ path: String, limit: Int) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes = [UInt8](repeating: 0, count: limit)
    var filled = 0
    while filled < limit {
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + filled, limit - filled) }
        if count < 0 && errno == EINTR { continue }
        if count <= 0 { break }
        filled += count
    }
    return Array(bytes.prefix(filled))
}

/// The folder part of a path as NSString's deletingLastPathComponent gave it: "dir/a.webm" ->
/// "dir", "a.webm" -> "", "/a.webm" -> "/", trailing and doubled slashes dropped.
public func folderPart(of path: String) -> String {
    var rest = Substring(path)
    while rest.count > 1, rest.hasSuffix("/") { rest.removeLast() }
    guard let slash = rest.lastIndex(of: "/") else { return "" }
    var folder = rest[..<slash]
    while folder.count > 1, folder.hasSuffix("/") { folder.removeLast() }
    return folder.isEmpty ? "/" : String(folder)
}
