import Foundation
import KraklCore

/// `krakl-agent backends`: every registry entry and whether it loads.
/// Loading runs only the entry symbol, never create(): a backend's create
/// may open a display or ask the person for permission.
func listBackends(_ registry: PluginRegistry) {
    print("Backends in \(registry.path) (default: \(registry.defaultBackend))")
    let width = registry.backends.map(\.name.count).max() ?? 4
    for entry in registry.backends {
        let name = entry.name.padding(toLength: width, withPad: " ", startingAt: 0)
        do throws(HostError) {
            let library = try BackendLibrary.load(path: entry.library, backend: entry.name)
            print("  \(name)  loads    ABI \(library.abiMajor).\(library.abiMinor)  \(entry.library)")
            print("  \(String(repeating: " ", count: width))  \(library.description.isEmpty ? entry.description : library.description)")
        } catch {
            print("  \(name)  FAILS    \(error.description)")
            if !entry.description.isEmpty { print("  \(String(repeating: " ", count: width))  \(entry.description)") }
        }
    }
}
