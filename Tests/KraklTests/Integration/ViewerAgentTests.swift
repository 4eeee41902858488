import Foundation
import Glibc
import KraklBase
import KraklHost
@testable import KraklViewer
import Testing

/// The built-in viewer as a person meets it: `krakl-agent` without a join code prints the
/// viewer's URL and serves it; the page itself in headless Chromium sends a recvonly offer.
@Suite(.tags(.integration, .browser)) struct ViewerAgentTests {
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

    /// A recvonly VP8 offer the real answerer accepts (its fingerprint is never checked: no DTLS here).
    static let realOffer = "v=0\r\no=- 42 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
        + "c=IN IP4 0.0.0.0\r\na=mid:0\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\n"
        + "a=fingerprint:sha-256 " + (0..<32).map { String(format: "%02X", $0 * 7 % 256) }.joined(separator: ":") + "\r\n"
        + "a=setup:actpass\r\na=rtcp-mux\r\na=recvonly\r\na=rtpmap:96 VP8/90000\r\n"

    /// The real agent's answerer restarts ICE over WHEP (RFC 9725 §4.3.2): 200 with its new ice-ufrag
    /// (not the answer's), its candidates and a new ETag; the old ETag is stale (412); trickle is 204;
    /// a session that is not there is 404. No browser: ICE never connects, only the exchange is checked.
    @Test func theAgentAnswersAnIceRestartPatchWithNewCredentials() throws {
        try Harness.requireBuild()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--backend", "file", "-o", "width=320", "-o", "height=240", "--listen", "127.0.0.1:0"])
        #expect(agent.read(until: "viewers 0/4"), "\(agent.output)")
        let url = try #require(Self.printedURL(agent.output), "\(agent.output)")
        let port = try #require(Self.port(of: url))
        let created = try RawHTTP.request(port: port, "POST", "/whep", headers: [("Content-Type", "application/sdp")], body: Self.realOffer)
        try #require(created.status == 201, "\(created.status) \(created.body)")
        let location = try #require(created.header("Location")), firstTag = try #require(created.header("ETag"))
        let answerUfrag = try #require(ViewerServerTests.ufrag(created.body))
        let fragment = [("Content-Type", "application/trickle-ice-sdpfrag")]
        let restartBody = "a=ice-ufrag:efgh\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:0\r\n"
            + "a=candidate:1 1 udp 2113937151 127.0.0.1 50002 typ host\r\n"
        let started = MonotonicClock.milliseconds()
        let restart = try RawHTTP.request(port: port, "PATCH", location, headers: fragment + [("If-Match", "*")], body: restartBody)
        let took = MonotonicClock.milliseconds() - started
        try #require(restart.status == 200, "\(restart.status) \(restart.body)")
        print(String(format: "ICE restart PATCH answered in %.1f ms: %@", took, restart.body.replacingOccurrences(of: "\r\n", with: " | ")))
        #expect(restart.header("Content-Type") == "application/trickle-ice-sdpfrag")
        let newUfrag = try #require(ViewerServerTests.ufrag(restart.body))
        #expect(newUfrag != answerUfrag && newUfrag != "efgh", "new credentials of our own: \(answerUfrag) → \(newUfrag)")
        #expect(restart.body.contains("a=ice-pwd:") && restart.body.contains("a=mid:0"))
        #expect(restart.body.contains("a=candidate:") && restart.body.contains(" 127.0.0.1 ") && restart.body.contains("a=end-of-candidates"))
        let secondTag = try #require(restart.header("ETag"))
        #expect(secondTag != firstTag)
        #expect(agent.read(until: "restarted ICE; 1 watching"), "\(agent.output.suffix(400))")
        let trickle = "a=ice-ufrag:efgh\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\na=candidate:2 1 udp 1 127.0.0.1 50003 typ host\r\n"
        #expect(try RawHTTP.request(port: port, "PATCH", location, headers: fragment + [("If-Match", firstTag)], body: trickle).status == 412)
        #expect(try RawHTTP.request(port: port, "PATCH", location, headers: fragment + [("If-Match", secondTag)], body: trickle).status == 204)
        #expect(try RawHTTP.request(port: port, "PATCH", "/whep/resource/00112233445566778899aabbccddeeff", headers: fragment + [("If-Match", "*")],
                                    body: restartBody).status == 404)
        #expect(try RawHTTP.request(port: port, "DELETE", location).status == 200)
        #expect(agent.read(until: "(1 ICE restart, 0 DTLS handshakes) left; 0 watching"), "\(agent.output.suffix(400))")
        #expect(agent.stop() == 0)
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
        #expect(plain.stdout.contains("backend file: no screen found") && plain.stdout.contains("sharing a test pattern (file backend)"), "\(plain.stdout)")
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
        // The page's DELETE (fetch keepalive, with the token) was answered before the browser went
        // (the script waits for it), and it freed the session.
        #expect(state["released"] is Int, "the page's DELETE was never answered: \(state)")
        let deadline = Date().addingTimeInterval(5)
        while server.endpoint.viewerCount > 0 && Date() < deadline { usleep(50_000) }
        #expect(server.endpoint.viewerCount == 0)
        #expect(factory.peers.first?.closed == true)
    }
}
