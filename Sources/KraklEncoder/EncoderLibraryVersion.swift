import CVpx

/// The libvpx the agent runs with, for `krakl-agent --version` (wraps `vpx_codec_version_str`).
public enum EncoderLibraryVersion {
    public static var libvpx: String { String(cString: vpx_codec_version_str()) }
}
