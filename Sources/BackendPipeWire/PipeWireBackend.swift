import BackendKit
import Glibc

/// PipeWire capture: the ScreenCast portal (persistent restore tokens,
/// damage and cursor metadata), or a PipeWire node directly (option node).
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "pipewire",
        description: "PipeWire screen capture through the ScreenCast portal (restore tokens, damage, cursor) or a node directly"
    ) { host throws(BackendError) in try PipeWireSource(host: host) })
}
