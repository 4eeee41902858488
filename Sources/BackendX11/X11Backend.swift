import BackendKit
import Glibc

/// X11 capture: XDamage says what changed, MIT-SHM reads only that.
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "x11",
        description: "X11 screen capture: XDamage-tracked, MIT-SHM reads of changed areas only, cursor, monitors",
        lister: { host throws(BackendError) in try X11Source.listSources(host: host) }
    ) { host throws(BackendError) in try X11Source(host: host) })
}
