import BackendKit
import Glibc

/// PipeWire ScreenCast portal capture arrives with issue #5. Until then
/// this library loads and says so through the ABI's error path.
@_cdecl("krakl_backend_v1")
public func kraklBackendV1() -> UnsafeRawPointer {
    UnsafeRawPointer(exportBackend(
        name: "pipewire",
        description: "PipeWire ScreenCast portal capture (not implemented yet: issue #5; create() fails with ENOSYS)"
    ) { _ throws(BackendError) in
        throw BackendError(-ENOSYS, "the pipewire backend is not implemented yet (issue #5); use --backend file for now")
    })
}
