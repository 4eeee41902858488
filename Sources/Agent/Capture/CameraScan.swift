import Glibc
import KraklBase
import KraklHost

/// `--scan --camera [NAME]`: the join code read off another device's screen with a camera. The
/// camera is the PipeWire backend's camera mode (WirePlumber shows V4L2 and libcamera cameras as
/// PipeWire nodes with media.role Camera), whatever backend shares the screen afterwards; its
/// pictures go through the same LumaCapture and zbar as a screen scan's.
enum CameraScan {
    /// `--scan --camera` found no camera (or none of that name): its own status, since the fix
    /// (plug one in, start WirePlumber, name another) differs from a scan that saw no code (50).
    static let noCameraStatus = ExitCode.noCamera
    /// A scan looks at most 5 times a second (ScanCommand), so the camera hands over no more:
    /// converting the other 25 of a 30 fps camera's pictures would be the scan's largest cost.
    static let picturesPerSecond = 5
    static let hintAfter = 10.0
    static let hint = "no code seen yet: hold the code 20–40 cm from the camera, facing it, without glare on the screen"

    /// The PipeWire backend in camera mode (the screen options of --option are not the camera's;
    /// `--option via=…`, how the camera is reached, is).
    static func selection(_ arguments: Arguments, camera: String) throws(HostError) -> BackendSelection {
        let rate = arguments.preview ? CameraPreview.picturesPerSecond : picturesPerSecond
        return try BackendSelection(registryPath: arguments.plugins, name: "pipewire",
                                    overrides: [(key: "camera", value: .string(camera)), (key: "fps", value: .number("\(rate)"))]
                                        + arguments.options.filter { $0.key == "via" },
                                    isolate: arguments.isolate)
    }

    /// The words for a camera that is not there (the backend's ENODEV from create() or
    /// list_sources()), else nil.
    static func noCamera(_ error: HostError) -> String? {
        switch error {
        case .createFailed(_, let code, let message) where code == -ENODEV, .listFailed(_, let code, let message) where code == -ENODEV:
            return message
        default:
            return nil
        }
    }
}
