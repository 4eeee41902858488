/// TEMPORARY (isolate branch only): BackendSource as a CaptureSource until the branch that makes
/// its stop() and destroy() throwing merges; then BackendSource conforms itself and
/// `BackendSelection.makeSource` returns it directly (delete this file).
public final class InProcessCaptureSource: CaptureSource {
    public let source: BackendSource
    public var backendName: String { source.backendName }

    public init(_ source: BackendSource) { self.source = source }

    public func start() throws(HostError) { try source.start() }
    public func stop() throws(HostError) { source.stop() }
    public func destroy() throws(HostError) { source.destroy() }
}
