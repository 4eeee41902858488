import BackendKit
import Glibc

/// PipeWire capture: the ScreenCast portal (persistent restore tokens,
/// damage and cursor metadata), a PipeWire node directly (option node), or a
/// camera for reading join codes (option camera).
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "pipewire",
        description: "PipeWire screen capture through the ScreenCast portal (restore tokens, damage, cursor), a node directly, or a camera",
        lister: { host throws(BackendError) in try PipeWireSource.listSources(host: host) }
    ) { host throws(BackendError) in try PipeWireSource(host: host) })
}
