// krakl-backend-host: runs one backend library in a process of its own for krakl-agent's
// isolated mode, so a backend that crashes, exits or hangs takes only this process down.
//
//   krakl-backend-host LIBRARY BACKEND-NAME SLOTS WAIT-MS CREATE,START,STOP,DESTROY,LIST-BUDGETS
//   (the agent's socket on fd 3)
//
// The agent spawns it (Sources/KraklHost/Isolation/IsolatedBackendSource.swift); it is not
// meant to be run by hand. The protocol is in Sources/KraklHost/Isolation/IsolationWire.swift.
import CBackendHost
import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// The child's one exit status of its own: what started it, or what it reads, is not the agent.
/// (A backend that crashes it ends it by its signal, which the agent reports.)
enum ChildExit {
    static let notTheAgent: Int32 = 2
}

let words = CommandLine.arguments
let budgetList = words.count == 6 ? words[5].split(separator: ",").compactMap { Double($0) } : []
guard words.count == 6, let slots = Int(words[3]), (2...Int(WireLimits.maximumSlots)).contains(slots),
      let waitMilliseconds = Int(words[4]), (0...60_000).contains(waitMilliseconds),
      budgetList.count == 5, budgetList.allSatisfy({ $0 > 0 && $0 <= 3600 }),
      fcntl(3, F_GETFD) >= 0 else {
    StandardStream.error("krakl-backend-host: started by krakl-agent in isolated mode only (see krakl-agent --help, --isolate)\n")
    exit(ChildExit.notTheAgent)
}
// The agent's descriptors other than stdio and the socket stay out of the backend's reach.
krakl_close_from(4)
_ = fcntl(3, F_SETFD, FD_CLOEXEC)
signal(SIGPIPE, SIG_IGN)

var budgets = CallBudgets()
(budgets.create, budgets.start, budgets.stop, budgets.destroy, budgets.listSources) =
    (.seconds(budgetList[0]), .seconds(budgetList[1]), .seconds(budgetList[2]), .seconds(budgetList[3]), .seconds(budgetList[4]))
let host = ChildHost(socket: WireSocket(fd: 3), backend: words[2], slots: slots, waitMilliseconds: waitMilliseconds, budgets: budgets)
// The control thread exists before the library loads: a constructor that hangs is then
// still ended by the agent closing the socket (the main thread reads it from the start).
startThread { host.load(path: words[1]); host.runCommands() }
host.readSocket()
