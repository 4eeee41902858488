import BackendKit
import Glibc

/// A node PipeWire's registry shows: what option `node` and option `camera`
/// choose among, and what list_sources reports.
struct PipeWireNode: Equatable {
    let id: UInt32
    /// node.name: stable across restarts, what a person can put in plugins.json.
    let name: String
    let mediaClass: String
    /// media.role ("Camera" for WirePlumber's V4L2 and libcamera nodes).
    let role: String
    /// node.description (WirePlumber copies the device's product name there), else node.nick, else node.name.
    let description: String
    /// device.api: v4l2, libcamera, … (empty for nodes a program made).
    let api: String

    var isVideo: Bool { mediaClass.hasPrefix("Video/") }

    /// A camera: a video source whose role says Camera (what libwebrtc's and the portal's camera
    /// filters go by), or one a camera API made (a session manager that leaves the role out).
    var isCamera: Bool { mediaClass == "Video/Source" && (role == "Camera" || api == "v4l2" || api == "libcamera") }

    /// How messages and `sources --cameras` name it.
    var label: String { "\"\(description)\" (node \(id), \(name))" }

    /// There is no camera at all (create() and list_sources() alike).
    static let noCamera = BackendError(-ENODEV, "no camera found: PipeWire shows no camera node (a Video/Source with media.role Camera); "
        + "is the camera plugged in, and is WirePlumber running for this user?")

    /// The camera option `camera` names: empty picks the first camera (the lowest id: the one
    /// plugged in first), else a node id, a node.name, or the description (case does not matter;
    /// a part of it is enough when only one camera has it).
    static func camera(_ wanted: String, among nodes: [PipeWireNode]) throws(BackendError) -> PipeWireNode {
        let cameras = nodes.filter(\.isCamera).sorted { $0.id < $1.id }
        guard !cameras.isEmpty else { throw noCamera }
        if wanted.isEmpty { return cameras[0] }
        if let id = UInt32(wanted), let byID = cameras.first(where: { $0.id == id }) { return byID }
        if let byName = cameras.first(where: { $0.name == wanted || $0.description.lowercased() == wanted.lowercased() }) { return byName }
        let partial = cameras.filter { $0.description.lowercased().contains(wanted.lowercased()) }
        if partial.count == 1 { return partial[0] }
        let list = cameras.map(\.label).joined(separator: ", ")
        throw BackendError(-ENODEV, partial.isEmpty ? "no camera \"\(wanted)\"; cameras: \(list)"
            : "\"\(wanted)\" names more than one camera (\(partial.map(\.label).joined(separator: ", "))): give its node id or node.name")
    }
}
