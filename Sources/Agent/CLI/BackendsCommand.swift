import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// `krakl-agent backends`: every registry entry and whether it loads.
/// Loading runs only the entry symbol, never create(): a backend's create
/// may open a display or ask the person for permission. Each library is
/// loaded in a child process (BackendProbe), so one whose constructor
/// exits or crashes is reported and the list goes on.
func listBackends(_ registry: PluginRegistry) {
    let choice = registry.defaultIsExplicit ? nil : chooseScreenBackend(registryPath: registry.path, given: nil)
    print("Backends in \(registry.path) (default: " + (choice.map { "the screen's: \($0.name ?? registry.defaultBackend) here, \($0.why)" }
        ?? registry.defaultBackend) + ")")
    let width = registry.backends.map(\.name.count).max() ?? 4
    for entry in registry.backends {
        let name = entry.name.padded(to: width)
        let description = BackendText.sanitized(entry.description)
        let outcome = access(entry.library, F_OK) == 0
            ? BackendProbe.probe(path: entry.library)
            : .fails(HostError.libraryMissing(backend: entry.name, path: entry.library).description)
        switch outcome {
        case .loads(let abi, let libraryDescription):
            print("  \(name)  loads    ABI \(abi)  \(entry.library)")
            print("  \(String(repeating: " ", count: width))  \(libraryDescription.isEmpty ? description : libraryDescription)")
        case .fails(let reason):
            print("  \(name)  FAILS    \(reason)")
            if !description.isEmpty { print("  \(String(repeating: " ", count: width))  \(description)") }
        }
    }
}

/// `krakl-agent sources` (and `sources --cameras`): a heading, then each source's name (what the
/// backend's option takes) and its description, in columns.
func printSources(_ sources: [(name: String, description: String)], heading: String) {
    print(heading)
    let width = sources.map(\.name.count).max() ?? 0
    for source in sources { print("  \(source.name.padded(to: width))  \(source.description)") }
}
