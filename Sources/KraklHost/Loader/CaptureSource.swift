import KraklBase
/// A created capture source the host drives: a backend loaded into this process
/// (`BackendSource`) or one running in a child process (`IsolatedBackendSource`).
/// The agent's commands, the sharing session and the scanner hold one of these and
/// never call a backend's table directly, so every call goes through the host's
/// watchdog and contract checks.
public protocol CaptureSource: AnyObject {
    /// The plugins.json name of the backend (for log lines and errors).
    var backendName: String { get }
    /// Begins delivery to the sink given at creation; returns without waiting for a frame.
    func start() throws(HostError)
    /// Ends delivery. When it returns, no frame or event for this source reaches the sink
    /// until the next start(). Throws `.backendHung` when the backend overran its budget;
    /// the source is unusable after that.
    func stop() throws(HostError)
    /// Stops (when started) and frees the source. Safe to call more than once.
    func destroy() throws(HostError)
}
