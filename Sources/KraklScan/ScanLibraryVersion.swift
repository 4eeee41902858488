internal import CZbar

/// The zbar the agent reads QR codes with, for `krakl-agent --version` (wraps `zbar_version`).
public enum ScanLibraryVersion {
    public static var zbar: String {
        var major: UInt32 = 0, minor: UInt32 = 0, patch: UInt32 = 0
        _ = zbar_version(&major, &minor, &patch)
        return "\(major).\(minor).\(patch)"
    }
}
