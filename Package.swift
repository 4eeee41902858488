// swift-tools-version:6.0
// krakl-agent: a Linux screen-sharing agent. See README.md for the layout.
import PackageDescription

/// Swift 6 language mode (complete concurrency checking) for every module. What the compiler
/// cannot see, the code says where it is: each `@unchecked Sendable` carries its reason (a lock,
/// a loop it belongs to, a C callback thread), and state that belongs to one event loop is
/// `LoopBound` (it traps when touched from another thread).
let swift6: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "krakl-agent",
    products: [
        .executable(name: "krakl-agent", targets: ["Agent"]),
        .executable(name: "krakl-bench", targets: ["KraklBench"]),
        .executable(name: "krakl-rtc-probe", targets: ["RTCProbe"]),
        // Isolated mode: runs one backend in a child process of the agent (--isolate).
        .executable(name: "krakl-backend-host", targets: ["BackendHost"]),
        // Each backend is a shared library the agent dlopen()s at run time.
        .library(name: "BackendFile", type: .dynamic, targets: ["BackendFile"]),
        .library(name: "BackendX11", type: .dynamic, targets: ["BackendX11"]),
        .library(name: "BackendPipeWire", type: .dynamic, targets: ["BackendPipeWire"]),
    ],
    targets: [
        // The public backend contract: one C header (include/krakl_backend.h).
        .target(name: "KraklBackendABI"),
        // Frame number + capture time drawn into pixels, readable after lossy coding.
        .target(name: "FrameStamp", swiftSettings: swift6),
        // The token-bucket rate cap the encoder's --max-fps and a backend's capture cadence share.
        .target(name: "RateCap", swiftSettings: swift6),
        // What every in-tree Swift backend shares: the exported table, host calls, pacing thread.
        .target(name: "BackendKit", dependencies: ["KraklBackendABI", "RateCap"], swiftSettings: swift6),
        .target(name: "BackendFile", dependencies: ["BackendKit", "FrameStamp"], swiftSettings: swift6),
        // Xlib + MIT-SHM + XDamage + XFixes + XRandR (Debian libx11-dev and friends).
        .systemLibrary(name: "CX11", path: "Sources/System/CX11"),
        .target(name: "BackendX11", dependencies: ["BackendKit", "KraklBackendABI", "CX11", "CYuv"], swiftSettings: swift6),
        // libpipewire-0.3 (macro and SPA pod helpers) and sd-bus (the ScreenCast portal client), from Debian.
        .systemLibrary(name: "CPipeWire", path: "Sources/System/CPipeWire", pkgConfig: "libpipewire-0.3"),
        .systemLibrary(name: "CSdBus", path: "Sources/System/CSdBus", pkgConfig: "libsystemd"),
        .target(name: "BackendPipeWire", dependencies: ["BackendKit", "KraklBackendABI", "CPipeWire", "CSdBus", "CYuv"], swiftSettings: swift6),
        // What every layer uses and none owns: the monotonic clock, IP literals, codecs, the VideoFeed
        // protocol, JSON, histograms, child processes, log rate limits, the one TLS client context.
        .target(name: "KraklBase", dependencies: ["COpenSSL"], swiftSettings: swift6),
        // The host side: plugins.json, dlopen loader, source lifecycle, conformance suite.
        .target(name: "KraklHost", dependencies: ["KraklBase", "KraklBackendABI"], swiftSettings: swift6),
        // libvpx (Debian libvpx-dev) with shims for its macro-only calls.
        .target(name: "CVpx", path: "Sources/System/CVpx", linkerSettings: [.linkedLibrary("vpx")]),
        // libyuv (Debian libyuv-dev): colour conversion and scaling; no .pc file.
        .systemLibrary(name: "CYuv", path: "Sources/System/CYuv"),
        // Frames -> I420 -> VP8/VP9, damage-driven; WebM/IVF recording.
        .target(name: "KraklEncoder", dependencies: ["KraklBase", "KraklHost", "RateCap", "CVpx", "CYuv"], swiftSettings: swift6),
        // OpenSSL (DTLS 1.2, certificates, HMAC) and libsrtp2 (SRTP), both from Debian.
        .systemLibrary(name: "COpenSSL", path: "Sources/System/COpenSSL", pkgConfig: "openssl"),
        .systemLibrary(name: "CSrtp", path: "Sources/System/CSrtp", pkgConfig: "libsrtp2"),
        // The send-only WebRTC stack: SDP, ICE/STUN, DTLS-SRTP, RTP/RTCP, pacing, bandwidth estimate.
        .target(name: "KraklRTC", dependencies: ["KraklBase", "COpenSSL", "CSrtp"], swiftSettings: swift6),
        // Rooms: join codes and tokens, the WHIP and Janus VideoRoom drivers (HTTP on its own HTTPConnection).
        .target(name: "KraklRoom", dependencies: ["KraklBase", "COpenSSL"], swiftSettings: swift6),
        // QR scanning: libzbar (Debian libzbar-dev) and stb_image (Debian libstb-dev, header-only,
        // compiled here for PNG, JPEG and PNM only), under the join-code scanner.
        .systemLibrary(name: "CZbar", path: "Sources/System/CZbar", pkgConfig: "zbar"),
        .target(name: "CStbImage", path: "Sources/System/CStbImage"),
        .target(name: "KraklScan", dependencies: ["KraklBase", "KraklHost", "KraklBackendABI", "CYuv", "KraklRoom", "CZbar", "CStbImage"], swiftSettings: swift6),
        // The built-in viewer: a bounded HTTP/1.1 server, WHEP's rules and the viewer page, over a
        // ViewerPeerFactory protocol (the WebRTC answerer over it lives in KraklSession).
        .target(name: "KraklViewer", dependencies: ["KraklBase"], swiftSettings: swift6),
        // One sharing session: the lifecycle state machine, the one media path (source -> gate ->
        // encoder -> feeds, for rooms, the viewer and recordings) and the session over it, the
        // publisher and the room driver (krakl-agent and krakl-rtc-probe are command lines over it);
        // the viewer's WebRTC answerer (RtcViewerAnswerer, KraklViewer's ViewerPeerFactory); the
        // session controller the agent's front ends share (one session at a time on their loop).
        .target(name: "KraklSession", dependencies: ["KraklBase", "KraklHost", "KraklEncoder", "KraklRTC", "KraklRoom", "KraklViewer"], swiftSettings: swift6),
        // The agent's memset: large zero fills of private anonymous memory become
        // page releases (libvpx's 50 MB token-buffer clear at 1080p). Agent only.
        .target(name: "ZeroFill", path: "Sources/System/ZeroFill"),
        // krakl-backend-host: dlopens one backend in a child process and hands its frames to the
        // agent through a shared-memory ring (isolated mode); a C shim for memfd seals and close_range.
        .target(name: "CBackendHost", path: "Sources/System/CBackendHost"),
        .executableTarget(name: "BackendHost", dependencies: ["KraklBase", "KraklHost", "KraklBackendABI", "CBackendHost"], swiftSettings: swift6),
        .executableTarget(name: "Agent", dependencies: ["KraklBase", "KraklHost", "KraklEncoder", "KraklRTC", "KraklRoom", "KraklSession", "KraklScan", "KraklViewer", "ZeroFill", "CSdBus"], swiftSettings: swift6),
        // Test-only: runs the publisher against a given SDP answer (issue 6 item 8).
        .executableTarget(name: "RTCProbe", dependencies: ["KraklBackendABI", "KraklBase", "KraklHost", "KraklEncoder", "KraklRTC", "KraklRoom", "KraklSession"], swiftSettings: swift6),
        // bench/: krakl vs ffmpeg vs GStreamer on the same content (docs/PERFORMANCE.md).
        .executableTarget(name: "KraklBench", dependencies: ["KraklBase", "KraklHost"], path: "bench",
                          exclude: ["xactivity.c", "portal_gst.py", "xroom.c", "xaside.c", "gst_janus_publisher.py", "room_watch.py",
                                    "chromium_publisher.py", "chromium_share.html", "smaps_parts.py", "alloc_log.c"], swiftSettings: swift6),
        .testTarget(name: "KraklTests", dependencies: ["KraklBase", "KraklHost", "KraklEncoder", "FrameStamp", "KraklRTC", "ZeroFill", "BackendKit", "RateCap", "KraklRoom", "KraklSession", "KraklScan", "KraklViewer"], swiftSettings: swift6),
    ]
)
