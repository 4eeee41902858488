import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklRoom
import KraklScan
import KraklSession

// Line-buffered stdout even into a pipe, so status and check lines appear
// as they happen.
StandardStream.lineBufferOutput()

// Big buffers mmap'ed at a fixed threshold, so that a finished session's memory goes back to the
// system (HeapRelease.swift says why): before any other thread exists.
HeapRelease.configure()

func fail(_ error: HostError) -> Never {
    StandardStream.error("krakl-agent: \(error.description)\n")
    exit(error.exitStatus)
}

// The child `krakl-agent backends` loads each library in (BackendProbe); not a user command.
if CommandLine.arguments.count == 3 && CommandLine.arguments[1] == BackendProbe.subcommand {
    exit(BackendProbe.runChild(path: CommandLine.arguments[2]))
}

let arguments: Arguments
do throws(HostError) {
    arguments = try Arguments(Array(CommandLine.arguments.dropFirst()))
} catch {
    fail(error)
}

let logger = stderrLogger(maximum: arguments.verbose ? .debug : .warning)
let homeScreen = arguments.wantsHomeScreen(terminal: TerminalScreen.available())

do throws(HostError) {
    // A room session's --frame-log and --dump-input are made at each answer; an unwritable path is
    // refused here, before anything is joined, as a recording's is (status 23).
    if arguments.mayShowHomeScreen {
        for path in [arguments.frameLog, arguments.dumpInput].compactMap({ $0 }) { try checkRecordingPath(path) }
    }
    switch arguments.command {
    case .help:
        print(helpText)
    case .version:
        print("krakl-agent \(BuildInfo.version) (backend ABI \(BackendLibrary.hostVersion.major).\(BackendLibrary.hostVersion.minor))")
        print(BuildInfo.commitLine())
        // The libraries it runs with (the loaded ones, not the headers it was built against): what a bug report needs.
        print("libvpx \(EncoderLibraryVersion.libvpx), \(TLSLibraryVersion.openSSL), zbar \(ScanLibraryVersion.zbar)")
    case .sources where arguments.cameras:
        let cameras: [(name: String, description: String)]
        do throws(HostError) {
            cameras = try CameraScan.selection(arguments, camera: "").listSources(logger: logger) ?? []
        } catch {
            guard let words = CameraScan.noCamera(error) else { throw error }
            StandardStream.error("krakl-agent: \(words)\n")
            exit(CameraScan.noCameraStatus)
        }
        printSources(cameras, heading: "Cameras (krakl-agent --scan --camera NAME takes the number, the node name or the name):")
    case .sources:
        let selection = try selectedBackend(arguments).selection
        guard let sources = try selection.listSources(logger: logger) else {
            print("backend \(selection.entry.name) does not list sources (it has no list_sources)")
            break
        }
        printSources(sources, heading: "Sources of backend \(selection.entry.name):")
    case .backends:
        listBackends(try PluginRegistry.load(path: arguments.plugins ?? PluginRegistry.defaultPath()))
    case .conformance(let path):
        var options = JSONObject()
        for (key, value) in arguments.options { options[key] = value }
        if let group = arguments.conformanceGroup {
            ConformanceChild.run(group: group, path: path, options: options, expectEnd: arguments.expectEnd,
                                 timeout: .seconds(arguments.timeout), logger: logger)
        }
        // Each group of checks runs in a child: this program again, given the same library and options.
        let executable = InstalledLayout.executable
        let childCommand = { (group: ConformanceGroup) -> [String] in
            [executable, "conformance", "--run-group", group.rawValue, path, "--timeout", "\(arguments.timeout)"]
                + options.members.flatMap { ["--option", "\($0.key)=\($0.value.serialized)"] }
                + (arguments.expectEnd ? ["--expect-end"] : []) + (arguments.verbose ? ["--verbose"] : [])
        }
        let suite = ConformanceSuite(path: path, options: options, expectEnd: arguments.expectEnd,
                                     timeout: .seconds(arguments.timeout), childCommand: childCommand) { print($0) }
        exit(suite.run() ? 0 : 1)
    case .run:
        exit(try runCapture(arguments, logger: logger))
    case .join(let source) where homeScreen:
        let text = try source.read()
        exit(runHome(arguments, first: .code(text), logger: logger))
    case .join(let source):
        exit(runLines(arguments, first: .code(source), logger: logger))
    case .scan where homeScreen:
        exit(runHome(arguments, first: .scan, logger: logger))
    case .qr(let path) where homeScreen:
        exit(runHome(arguments, first: .picture(URL(fileURLWithPath: path).path), logger: logger))
    case .home:
        guard homeScreen else {
            StandardStream.error("krakl-agent: home is the interactive screen and needs a terminal (stdin and stdout)\(arguments.headless ? ", not --headless" : ""); "
                  + "without one use `krakl-agent --join @FILE` (a line per event) or the daemon (docs/daemon.md)\n")
            exit(ExitCode.usage)
        }
        let first: HomeStart? = arguments.join.map { _ in .code("") } ?? arguments.qr.map { .picture(URL(fileURLWithPath: $0).path) }
            ?? (arguments.scan ? .scan : nil)
        if case .code? = first, let source = arguments.join {
            exit(runHome(arguments, first: .code(try source.read()), logger: logger))
        }
        exit(runHome(arguments, first: first, logger: logger))
    case .scan:
        exit(runLines(arguments, first: .scan, logger: logger))
    case .qr(let path):
        let (code, status) = runQRFile(path: path, scanOnly: arguments.scanOnly)
        guard let code else { exit(status) }
        exit(runLines(arguments, first: .code(.scanned(code)), logger: logger))
    case .daemon:
        exit(runDaemon(arguments, logger: logger))
    case .control(let command):
        exit(runControlClient(command, json: arguments.json))
    case .code(let source):
        let text = try source.read()
        do throws(JoinCodeError) {
            print(try Invitation.read(text, now: Date()).summary)
        } catch {
            StandardStream.error("krakl-agent: \(error.description)\n")
            exit(error.exitStatus)
        }
    }
} catch {
    fail(error)
}
