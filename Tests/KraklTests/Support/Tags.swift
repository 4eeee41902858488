import Testing

/// What a suite needs, for `swift test --filter tag:NAME` / `--skip tag:NAME` (docs/testing.md).
extension Tag {
    /// In the test process only: no child process, no fixture, no namespace; seconds for all of them.
    @Tag static var unit: Self
    /// Starts other programs: the agent, Python fixtures, Janus, aiortc, coturn, Xvfb, PipeWire, ffmpeg.
    @Tag static var integration: Self
    /// Drives Chromium (the viewer's page, the conference page).
    @Tag static var browser: Self
    /// Makes network namespaces (needs root): rooms, relays and peers on addresses of their own.
    @Tag static var netns: Self
}
