import KraklBase
import FoundationEssentials

/// Where an installed agent keeps its own files (scripts/install, scripts/package-deb;
/// docs/install.md): the executable in PREFIX/bin, and beside it PREFIX/lib/krakl-agent with
/// plugins.json, krakl-backend-host, the backend libraries and build-info. A build folder
/// (.build/debug) keeps them all next to the executable instead; both are looked for.
public enum InstalledLayout {
    /// The running executable, symbolic links resolved (a link in ~/bin to an install still finds it).
    public static var executable: String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    /// PREFIX/lib/krakl-agent for an executable in PREFIX/bin.
    public static func libraryFolder(executable: String = executable) -> String {
        URL(fileURLWithPath: executable).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("lib/krakl-agent").standardized.path
    }

    /// `name` in the installed library folder, when it is there.
    public static func installedFile(_ name: String, executable: String = executable) -> String? {
        let path = libraryFolder(executable: executable) + "/" + name
        return FileManager.default.fileExists(atPath: path) ? path : nil
    }
}
