import Foundation
import KraklBase
import KraklCore

/// What `krakl-agent --version` says of this build.
///
/// The git commit comes from PREFIX/lib/krakl-agent/build-info, a `commit=…` line that
/// scripts/install and scripts/package-deb write beside the installed binary. A file rather
/// than a value compiled in: SwiftPM caches the manifest, so Package.swift cannot read .git
/// reliably, and a `-Xcc -DKRAKL_GIT_COMMIT=…` define would change every C target's flags (a
/// rebuild of everything) and still be missing from products built without it, such as the
/// debug build `scripts/install --build-dir .build/debug` installs. A build that was not
/// installed has no such file and says so.
enum BuildInfo {
    static let version = "0.1.0"

    /// "commit: 0123abc…" or "commit: not recorded (development build)".
    static func commitLine(executable: String = InstalledLayout.executable) -> String {
        guard let path = InstalledLayout.installedFile("build-info", executable: executable),
              let handle = FileHandle(forReadingAtPath: path) else { return "commit: not recorded (development build)" }
        defer { try? handle.close() }
        // A few lines; bounded all the same.
        let text = String(decoding: (try? handle.read(upToCount: 4096)) ?? Data(), as: UTF8.self)
        let commit = text.split(separator: "\n").first { $0.hasPrefix("commit=") }.map { String($0.dropFirst("commit=".count)) }
        guard let commit, !commit.isEmpty else { return "commit: not recorded (\(path) names none)" }
        return "commit: " + BackendText.sanitized(commit)
    }
}
