import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// Which backend shows "the screen" when the person named none: one choice for every entry point
/// (`--join`, `home`, the daemon's `connect`, `--scan`, the viewer), so a room never gets a test
/// pattern by surprise. `--backend` wins, then a `default` that plugins.json names; otherwise the
/// PipeWire portal on a Wayland session, X11 when there is an X display, else the file backend's
/// test pattern, said in so many words.
struct BackendChoice: Equatable {
    /// nil: leave it to the registry (its `default`, or it is unreadable and says so itself).
    var name: String?
    /// Why, for the line printed when a session or run starts; empty when there is nothing to say.
    var why: String
    /// The backend as status lines and the home screen show it: "x11 (display :0)", "file (test pattern)".
    var label: String?
}

/// `scanning`: the choice is for reading a join code, not for sharing: the words for the test
/// pattern say so.
func chooseScreenBackend(registryPath: String?, given: String?, scanning: Bool = false,
                         environment: [String: String] = ProcessInfo.processInfo.environment) -> BackendChoice {
    func label(_ name: String) -> String {
        switch name {
        case "x11": return "x11 (display \(environment["DISPLAY"].flatMap { $0.isEmpty ? nil : $0 } ?? "?"))"
        case "pipewire": return "pipewire (the ScreenCast portal)"
        case "file": return "file (test pattern)"
        default: return name
        }
    }
    // Named on the command line: its options (display=, node=) may say more than the environment.
    if let given { return BackendChoice(name: given, why: "as asked (--backend)", label: given == "file" ? label(given) : given) }
    // An unreadable registry is reported by the selection that follows, with its own status.
    guard let registry = try? PluginRegistry.load(path: registryPath ?? PluginRegistry.defaultPath()) else { return BackendChoice(name: nil, why: "") }
    if registry.defaultIsExplicit {
        return BackendChoice(name: registry.defaultBackend, why: "the default of \(registry.path)", label: label(registry.defaultBackend))
    }
    func usable(_ name: String) -> Bool {
        guard let entry = try? registry.entry(named: name) else { return false }
        return FileManager.default.fileExists(atPath: entry.library)
    }
    if let wayland = environment["WAYLAND_DISPLAY"], !wayland.isEmpty, usable("pipewire") {
        return BackendChoice(name: "pipewire", why: "a Wayland session (WAYLAND_DISPLAY=\(wayland)): the screen through the ScreenCast portal",
                             label: label("pipewire"))
    }
    if let display = environment["DISPLAY"], !display.isEmpty, usable("x11") {
        return BackendChoice(name: "x11", why: "an X display (DISPLAY=\(display)): the X11 screen", label: label("x11"))
    }
    let fallback = registry.defaultBackend
    let words = fallback == "file" ? "no screen found (no Wayland session or X display with its backend): \(scanning ? "" : "sharing ")a test pattern (file backend)"
        : "no screen found (no Wayland session or X display with its backend): backend \(fallback)"
    return BackendChoice(name: fallback, why: words, label: label(fallback))
}
