import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// `krakl-agent open LINK` with no daemon running (the join link clicked before the person ever
/// started one, or with the user unit not enabled): the link's code must still reach a session.
/// The daemon is started as `krakl-agent daemon` in a session of its own (it outlives the
/// browser that ran xdg-open), with this command's other flags (`--plugins`, `--address`, …),
/// its output in `$XDG_STATE_HOME/krakl-agent/daemon.log`; then the code goes to it over the
/// control socket as always, never on its command line.
enum DaemonOnDemand {
    /// How long a starting daemon may take to listen (it reads plugins.json and binds the socket:
    /// about 30 ms here; 10 s is a hang guard).
    static let listenWithin: Duration = .seconds(10)

    static func start(arguments: [String] = CommandLine.arguments) throws(ControlError) -> ControlClientConnection {
        let log = logPath()
        let logFD = log.flatMap { path -> Int32? in
            let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            return fd >= 0 ? fd : nil
        }
        defer { if let logFD { close(logFD) } }
        var spawn = ChildSpawn(executable: InstalledLayout.executable, arguments: ["krakl-agent", "daemon"] + flags(arguments),
                               descriptors: [0: .devNull, 1: logFD.map { .copy($0) } ?? .devNull, 2: logFD.map { .copy($0) } ?? .devNull])
        spawn.newSession = true
        let pid: pid_t
        switch spawn.spawn() {
        case .success(let child): pid = child
        case .failure(let error): throw .noDaemon("no krakl-agent daemon was running, and starting one failed: \(error)")
        }
        StandardStream.error("krakl-agent: no daemon was running: started one (pid \(pid)\(log.map { ", log \($0)" } ?? ""))\n")
        let deadline = MonotonicClock.nanoseconds() + UInt64(listenWithin.inNanoseconds)
        var last = ControlError.noDaemon("the daemon started for the link did not listen")
        while MonotonicClock.nanoseconds() < deadline {
            do throws(ControlError) {
                return try ControlClientConnection(path: try ControlSocket.path())
            } catch {
                last = error
            }
            // It exited (a bad flag, another daemon won the race and this one refused): say so.
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                throw .noDaemon("the daemon started for the link exited at once (status \((status >> 8) & 0xff))\(log.map { "; its log: \($0)" } ?? "")")
            }
            usleep(20_000)
        }
        throw .noDaemon("the daemon started for the link did not listen within \(Int(listenWithin.inSeconds)) s (\(last.description))")
    }

    /// This command's flags for the daemon: everything but the command word and the link.
    static func flags(_ arguments: [String]) -> [String] {
        var rest = Array(arguments.dropFirst())
        if let command = rest.firstIndex(of: "open") {
            rest.remove(at: command)
            if command < rest.count { rest.remove(at: command) }   // the link, right after it
        }
        return rest
    }

    /// `$XDG_STATE_HOME/krakl-agent/daemon.log` (~/.local/state unless set), its folder made 0700;
    /// nil when there is no such place (the daemon's output is then dropped).
    static func logPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        let state = environment["XDG_STATE_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
            ?? environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 + "/.local/state" : nil }
        guard let state else { return nil }
        let folder = state + "/krakl-agent"
        guard (try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true,
                                                       attributes: [.posixPermissions: 0o700])) != nil else { return nil }
        return folder + "/daemon.log"
    }
}
