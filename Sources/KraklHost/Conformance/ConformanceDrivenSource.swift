import KraklBase
import Glibc
import KraklBackendABI

/// One source driven straight through the backend's table, each call
/// announced to the parent (so a crash or hang in it can be named) and
/// timed, the recorder told where the source is in its life.
final class DrivenSource {
    let library: BackendLibrary
    let recorder: CallbackRecorder
    let channel: ConformanceChannel
    let budget: ConformanceBudget
    private(set) var source: OpaquePointer?
    private let optionsText: String

    init(library: BackendLibrary, optionsText: String, echo: BackendLogger?, channel: ConformanceChannel, budget: ConformanceBudget) {
        self.library = library
        self.optionsText = optionsText
        self.channel = channel
        self.budget = budget
        recorder = CallbackRecorder(backend: library.name.isEmpty ? "backend" : library.name, optionsText: optionsText, echo: echo)
    }

    /// create(); the status, and whether a source came back with it.
    func create() -> (status: Int32, created: Bool) {
        var created: OpaquePointer?
        let table = library.table
        let host = recorder.host
        let status = channel.call("create()", budget: budget.create) {
            optionsText.withCString { table.create!($0, host, &created) }
        }
        recorder.set(.created)
        if status == 0, let created { source = created }
        return (status, status == 0 && created != nil)
    }

    /// start(); the status and how long it took. A status ≥ 0 counts as started
    /// (a positive one is reported by return-values, delivery is still judged).
    func start() -> (status: Int32, seconds: Double) {
        guard let source else { return (-EINVAL, 0) }
        let table = library.table
        recorder.set(.started)
        let (status, seconds) = timed { channel.call("start()", budget: budget.start) { table.start!(source) } }
        if status < 0 { recorder.set(.stopped) }
        return (status, seconds)
    }

    func stop() -> (status: Int32, seconds: Double) {
        guard let source else { return (0, 0) }
        let table = library.table
        let (status, seconds) = timed { channel.call("stop()", budget: budget.stop) { table.stop!(source) } }
        recorder.set(.stopped)
        return (status, seconds)
    }

    func destroy() {
        guard let source else { return }
        let table = library.table
        recorder.set(.destroying)
        channel.call("destroy()", budget: budget.destroy) { table.destroy!(source) }
        recorder.set(.destroyed)
        self.source = nil
    }

    private func timed<T>(_ body: () -> T) -> (T, Double) {
        let start = MonotonicClock.nanoseconds()
        let value = body()
        return (value, Double(MonotonicClock.nanoseconds() - start) / 1e9)
    }
}

/// What a backend's status means under the ABI: 0, or a negative errno
/// (Linux's are 1...4095). Anything else is undefined and fails.
enum ReturnValue {
    static func problem(_ status: Int32, of call: String) -> String? {
        if status > 0 { return "\(call) returned \(status): the ABI defines only 0 (success) and a negative errno" }
        if status < -4095 { return "\(call) returned \(status), which is not a negative errno (-1...-4095)" }
        return nil
    }

    /// "EINVAL", or the number for codes without a name (and never a trap for INT32_MIN).
    static func name(_ status: Int32) -> String {
        status < 0 && status >= -4095 ? errnoName(status) : "\(status)"
    }
}
