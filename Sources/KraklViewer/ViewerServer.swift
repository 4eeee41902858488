/// The built-in viewer as one object: the HTTP server bound to its address,
/// the WHEP endpoint behind it, and the access token when one is needed.
/// The agent makes one per sharing run and gives it the peer factory; that
/// is the only place the WebRTC side is plugged in.
public final class ViewerServer: Sendable {
    public let endpoint: WhepEndpoint
    public let http: HTTPServer
    /// nil: loopback without `--viewer-token`; no token is asked for.
    public let token: ViewerAccessToken?

    /// Binds now (a taken port throws here); serving starts with `start`.
    /// - Parameters:
    ///   - requireToken: true forces a token even on loopback; false is ignored on any other
    ///     address (a screen is private); nil: a token exactly when the address is not loopback.
    public init(listen: ListenAddress, factory: ViewerPeerFactory, maximumViewers: Int = 4, requireToken: Bool? = nil,
                token: ViewerAccessToken? = nil, limits: HTTPLimits = HTTPLimits()) throws(ViewerServerError) {
        let needsToken = !listen.isLoopback || requireToken == true
        self.token = needsToken ? (token ?? ViewerAccessToken()) : nil
        var policy = WhepEndpoint.Policy()
        policy.maximumViewers = maximumViewers
        policy.token = self.token
        let endpoint = WhepEndpoint(factory: factory, policy: policy)
        self.endpoint = endpoint
        http = try HTTPServer(address: listen, limits: limits) { endpoint.handle($0) }
    }

    public func start() { http.start() }

    /// Sharing ended: peers closed, then the server stops.
    public func stop(reason: String) {
        endpoint.end(reason: reason)
        http.stop()
    }

    /// The page's address with the token in its fragment: printed once, for the person to open.
    /// For 0.0.0.0 or :: the host is a placeholder for any of this machine's addresses.
    public var url: String { baseURL + (token.map { "#token=\($0.value)" } ?? "") }

    /// The same without the token's secret part, for logs.
    public var redactedURL: String { baseURL + (token.map { "#token=\($0.shortened)" } ?? "") }

    private var baseURL: String {
        let address = http.address
        let unspecified = address.host == "0.0.0.0" || address.host == "::"
        let host = unspecified ? "THIS-MACHINE" : (address.isIPv6 ? "[\(address.host)]" : address.host)
        return "http://\(host):\(address.port)/"
    }
}
