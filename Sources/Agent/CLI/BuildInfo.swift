import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// What `krakl-agent --version` says of this build.
///
/// The git commit comes from PREFIX/lib/krakl-agent/build-info, a `commit=…` line that
/// scripts/install and scripts/package-deb write beside the installed binary. A file rather
/// than a value compiled in: SwiftPM caches the manifest, so Package.swift cannot read .git
/// reliably, and a `-Xcc -DKRAKL_GIT_COMMIT=…` define would change every C target's flags (a
/// rebuild of everything) and still be missing from products built without it, such as the
/// debug build `scripts/install --build-dir .build/debug` installs. A build that was not
/// installed has no such file: it names the commit its git checkout is at (read from .git, no
/// git program needed), which is what it was built from unless files changed since.
enum BuildInfo {
    static let version = "0.1.0"

    /// "commit: 0123abc…", "commit: 0123abc… (development build in /src/krakl, checked out; files
    /// changed since are not told)" or "commit: not recorded (development build)".
    static func commitLine(executable: String = InstalledLayout.executable) -> String {
        // A few lines; bounded all the same.
        guard let path = InstalledLayout.installedFile("build-info", executable: executable),
              let text = GitCheckout.read(URL(fileURLWithPath: path), limit: 4096) else {
            guard let (checkout, commit) = GitCheckout.commit(above: executable) else { return "commit: not recorded (development build)" }
            return "commit: \(commit) (development build in \(checkout): the commit checked out; changes since are not told)"
        }
        let commit = text.split(separator: "\n").first { $0.hasPrefix("commit=") }.map { String($0.dropFirst("commit=".count)) }
        guard let commit, !commit.isEmpty else { return "commit: not recorded (\(path) names none)" }
        return "commit: " + BackendText.sanitized(commit)
    }
}

/// The commit a git checkout is at, read from its files: a build folder's agent lives in
/// CHECKOUT/.build/<triple>/<configuration>/, under a Package.swift and a .git.
enum GitCheckout {
    static func commit(above executable: String) -> (checkout: String, commit: String)? {
        var folder = URL(fileURLWithPath: executable).deletingLastPathComponent()
        for _ in 0..<6 {
            let manager = FileManager.default
            if manager.fileExists(atPath: folder.appendingPathComponent("Package.swift").path),
               let gitFolder = gitDirectory(folder), let commit = head(gitFolder) {
                return (folder.path, commit)
            }
            let parent = folder.deletingLastPathComponent()
            if parent.path == folder.path { break }
            folder = parent
        }
        return nil
    }

    /// .git is a folder, or (a worktree, a submodule) a file "gitdir: PATH".
    private static func gitDirectory(_ checkout: URL) -> URL? {
        let git = checkout.appendingPathComponent(".git")
        var isFolder = false
        guard FileManager.default.fileExists(atPath: git.path, isDirectory: &isFolder) else { return nil }
        if isFolder { return git }
        guard let line = read(git)?.split(separator: "\n").first, line.hasPrefix("gitdir: ") else { return nil }
        let path = String(line.dropFirst("gitdir: ".count))
        return path.hasPrefix("/") ? URL(fileURLWithPath: path) : checkout.appendingPathComponent(path).standardized
    }

    /// HEAD: a commit itself (detached), or "ref: refs/heads/NAME" resolved through the loose ref
    /// or packed-refs (in the common folder for a worktree).
    private static func head(_ gitFolder: URL) -> String? {
        guard let text = read(gitFolder.appendingPathComponent("HEAD"))?.trimmingWhitespace() else { return nil }
        guard text.hasPrefix("ref: ") else { return isCommit(text) ? text : nil }
        let ref = String(text.dropFirst("ref: ".count))
        guard !ref.contains(".."), ref.hasPrefix("refs/") else { return nil }
        let common = read(gitFolder.appendingPathComponent("commondir"))
            .map { $0.trimmingWhitespace() }
            .map { $0.hasPrefix("/") ? URL(fileURLWithPath: $0) : gitFolder.appendingPathComponent($0).standardized } ?? gitFolder
        for folder in [gitFolder, common] {
            if let loose = read(folder.appendingPathComponent(ref))?.trimmingWhitespace(), isCommit(loose) { return loose }
            for line in (read(folder.appendingPathComponent("packed-refs")) ?? "").split(separator: "\n") {
                let parts = line.split(separator: " ")
                if parts.count == 2, parts[1] == ref, isCommit(String(parts[0])) { return String(parts[0]) }
            }
        }
        return nil
    }

    private static func isCommit(_ text: String) -> Bool {
        (text.count == 40 || text.count == 64) && text.allSatisfy { $0.isHexDigit && !$0.isUppercase }
    }

    /// A small file's text, at most `limit` bytes of it (packed-refs of a big repository is the
    /// largest read here: 4 MB at most); nil when it cannot be opened.
    static func read(_ url: URL, limit: Int = 4 << 20) -> String? {
        readFilePrefix(url.path, limit: limit).map { String(decoding: $0, as: UTF8.self) }
    }
}
