import BackendKit
import Glibc

/// X11 damage-tracked capture arrives with issue #4. Until then this
/// library loads and says so through the ABI's error path.
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "x11",
        description: "X11 screen capture (not implemented yet: issue #4; create() fails with ENOSYS)"
    ) { _ throws(BackendError) in
        throw BackendError(-ENOSYS, "the x11 backend is not implemented yet (issue #4); use --backend file for now")
    })
}
