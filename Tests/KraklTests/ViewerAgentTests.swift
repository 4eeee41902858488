import Foundation
import Glibc
@testable import KraklViewer
import Testing

/// The built-in viewer as a person meets it: `krakl-agent` without a join code prints the
/// viewer's URL and serves it; the page itself in headless Chromium sends a recvonly offer.
@Suite struct ViewerAgentTests {
    /// The URL the agent printed ("open http://…").
    static func printedURL(_ output: String) -> String? {
        guard let range = output.range(of: "open http://") else { return nil }
        return String(output[output.index(range.lowerBound, offsetBy: 5)...].prefix { !$0.isWhitespace })
    }

    static func port(of url: String) -> UInt16? {
        URL(string: url)?.port.flatMap { UInt16(exactly: $0) }
    }

    @Test func theAgentSharesToItsViewerAndPrintsItsURL() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--backend", "file", "-o", "width=320", "-o", "height=240", "--listen", "127.0.0.1:0"])
        #expect(agent.read(until: "viewers 0/4"), "no URL or status: \(agent.output)")
        let url = try #require(Self.printedURL(agent.output), "\(agent.output)")
        #expect(url.hasPrefix("http://127.0.0.1:") && !url.contains("#token="), "loopback: no token")
        let port = try #require(Self.port(of: url))
        let page = try RawHTTP.request(port: port, "GET", "/")
        #expect(page.status == 200 && page.body.contains("<video"))
        let status = try RawHTTP.request(port: port, "GET", "/status")
        #expect(status.body.contains("\"sharing\":true"), "\(status.body)")
        #expect(agent.stop() == 0)
        #expect(agent.output.contains("summary:") && agent.output.contains("shared to the built-in viewer"), "\(agent.output)")
        // Gone with the agent.
        #expect(throws: (any Error).self) { _ = try RawHTTP.connect(port: port) }
    }

    @Test func aTokenGuardsTheViewerWhenAskedOrOffLoopback() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--backend", "file", "-o", "width=320", "-o", "height=240",
                                      "--listen", "127.0.0.1:0", "--viewer-token", "--max-viewers", "2"])
        #expect(agent.read(until: "viewers 0/2"), "\(agent.output)")
        let url = try #require(Self.printedURL(agent.output), "\(agent.output)")
        let token = try #require(url.components(separatedBy: "#token=").last)
        #expect(token.count >= 22 && url.contains("#token="))
        #expect(agent.output.components(separatedBy: token).count == 2, "the token is shown once")
        let port = try #require(Self.port(of: url))
        let refused = try RawHTTP.request(port: port, "POST", "/whep", headers: [("Content-Type", "application/sdp")], body: ViewerServerTests.offer)
        #expect(refused.status == 401 && refused.header("WWW-Authenticate")?.hasPrefix("Bearer") == true)
        #expect(try RawHTTP.request(port: port, "GET", "/status", headers: [("Authorization", "Bearer " + token)]).status == 200)
        #expect(agent.stop() == 0)
    }

    @Test func theBackendChoiceIsPrintedAndBindFailuresHaveTheirStatus() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let plain = try Harness.agent(["--plugins", registry, "-o", "width=320", "-o", "height=240", "--frames", "5", "-q", "--listen", "127.0.0.1:0"],
                                      environment: ["DISPLAY": "", "WAYLAND_DISPLAY": ""])
        #expect(plain.status == 0, "\(plain.stderr)")
        #expect(plain.stdout.contains("backend file: no Wayland session or X display"), "\(plain.stdout)")
        // An X display is taken to be the screen (this one does not exist: the X11 backend says so).
        let x = try Harness.agent(["--plugins", registry, "--frames", "5", "-q", "--listen", "127.0.0.1:0"],
                                  environment: ["DISPLAY": ":219", "WAYLAND_DISPLAY": ""])
        #expect(x.stdout.contains("backend x11: an X display (DISPLAY=:219)"), "\(x.stdout)")
        #expect(x.status == 17, "\(x.stderr)")
        // A port that is taken: its own status, said plainly, before any capture.
        let holder = try ViewerServer(listen: ListenAddress(host: "127.0.0.1", port: 0), factory: FakePeerFactory())
        let taken = try Harness.agent(["--plugins", registry, "--backend", "file", "--frames", "5", "--viewer-port", "\(holder.http.address.port)"])
        #expect(taken.status == 52, "\(taken.stderr)")
        #expect(taken.stderr.contains("cannot listen on 127.0.0.1:\(holder.http.address.port)") && taken.stderr.contains("in use"), "\(taken.stderr)")
        #expect(!taken.stdout.contains("capturing from"))
        // Usage errors.
        for flags in [["--listen", "example.com"], ["--listen", "127.0.0.1:80", "--viewer-port", "81"], ["--record", "x.webm", "--listen", "127.0.0.1"],
                      ["--max-viewers", "0"], ["--viewer-port", "http"]] {
            let result = try Harness.agent(["--plugins", registry, "--frames", "5"] + flags)
            #expect(result.status == 2, "\(flags): \(result.stderr)")
        }
    }

    /// The page's own script in headless Chromium: it reads the token from the fragment (and
    /// clears it from the address bar), POSTs a recvonly video offer at once
    /// with the Bearer token, and, given an answer it cannot use (the fake's), says so and
    /// DELETEs its session.
    @Test func thePageSendsARecvonlyOfferInChromium() throws {
        let python = "/opt/krakl-venv/bin/python"
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium"), FileManager.default.isExecutableFile(atPath: "/usr/bin/chromedriver"),
              (try? Harness.run(python, ["-c", "import selenium"]))?.status == 0 else {
            skipTest("chromium, chromium-driver or selenium in /opt/krakl-venv is missing (scripts/setup installs them)")
            return
        }
        let factory = FakePeerFactory()
        let server = try ViewerServer(listen: ListenAddress(host: "127.0.0.1", port: 0), factory: factory, requireToken: true)
        server.start()
        defer { server.stop(reason: "the test ended") }
        let result = try Harness.run(python, [Harness.repoRoot + "/Tests/Fixtures/viewer_page_smoke.py", server.url, "20"], timeout: 90)
        #expect(result.status == 0, "\(result.stderr)")
        let offer = try #require(factory.offers.first, "no offer reached the factory: \(result.stdout) \(result.stderr)")
        #expect(factory.offers.count == 1)
        #expect(offer.hasPrefix("v=0") && offer.contains("m=video ") && offer.contains("a=recvonly"), "\(offer)")
        #expect(offer.contains("a=fingerprint:sha-256") && offer.contains("a=ice-ufrag:"))
        #expect(offer.contains("VP8/90000"))
        #expect(!offer.contains("m=audio"))
        let report = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result.stdout)")
        let href = report["href"] as? String ?? ""
        #expect(!href.contains("token"), "the token was taken out of the address bar: \(href)")
        let state = report["state"] as? [String: Any] ?? [:]
        #expect(state["offerSent"] as? Bool == true && state["ended"] as? Bool == true, "\(state)")
        #expect((state["text"] as? String ?? "").contains("answer cannot be used"), "\(state)")
        // The page's DELETE (fetch keepalive, with the token) freed the session.
        let deadline = Date().addingTimeInterval(5)
        while server.endpoint.viewerCount > 0 && Date() < deadline { usleep(50_000) }
        #expect(server.endpoint.viewerCount == 0)
        #expect(factory.peers.first?.closed == true)
    }
}
