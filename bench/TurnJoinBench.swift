import Foundation
import Glibc
import KraklBase
import KraklHost

// krakl-bench turn --joins N: the agent's join through a TURN relay, as a person runs it
// (`krakl-agent --join @code --once`), into a WHIP room on aiortc (Tests/Fixtures/whip_server.py)
// with coturn beside it, in a namespace of the bench's own. On the relayed variants nftables drops
// every UDP packet that is not to or from the TURN port or the relay ports, so the relay is the
// only path. Times are CLOCK_MONOTONIC (whip_server.py's `time.monotonic()` is the same clock):
// agent start → the relay candidate's PATCH at the server, → end-of-candidates, → "sharing the
// screen" (ICE + DTLS up). Issue 24: candidates gathered before the answer are held and trickled
// once the room has answered, instead of being lost.

enum TurnJoinVariant: String, CaseIterable {
    case direct = "direct (no TURN)"
    case flag = "TURN from --ice-server"
    case flagRelayOnly = "TURN from --ice-server, relay-only"
    case link = "TURN from the WHIP Link header"
    case linkRelayOnly = "TURN from the WHIP Link header, relay-only"

    var relayed: Bool { self != .direct }
    var fromLink: Bool { self == .link || self == .linkRelayOnly }
    var relayOnly: Bool { self == .flagRelayOnly || self == .linkRelayOnly }
}

struct TurnJoinRun {
    var sharingMs = Double.nan, relayPatchMs = Double.nan, endPatchMs = Double.nan
    var path = ""
    var failure: String?
}

func runTurnJoin(_ variant: TurnJoinVariant, index: Int, python: String, repoRoot: String) -> TurnJoinRun {
    var run = TurnJoinRun()
    let namespace: BenchNamespace
    do { namespace = try BenchNamespace("krakl-bench-\(getpid())-j\(index)") } catch { return TurnJoinRun(failure: "namespace: \(error)") }
    defer { namespace.delete() }
    let folder = work + "/join-\(index)"
    try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    var coturn: BenchChild?
    defer { coturn?.stop(grace: 1) }
    if variant.relayed {
        coturn = startBenchCoturn(in: namespace, folder: folder, tls: nil)
        guard coturn != nil else { return TurnJoinRun(failure: "coturn did not start") }
        if let failure = namespace.acceptOnlyUdp(ports: ["3478", "20000-20100"]) { return TurnJoinRun(failure: failure) }
    }
    let secret = "bench-secret", room = "bench-room"
    var serverArguments = [repoRoot + "/Tests/Fixtures/whip_server.py", "--secret", secret, "--room", room, "--seconds", "120"]
    if variant.fromLink { serverArguments += ["--link", #"<turn:127.0.0.2:3478?transport=udp>; rel="ice-server"; username="u"; credential="p""#] }
    guard let server = BenchChild(BenchNamespace.ip, namespace.command(python, serverArguments), out: folder + "/whip.out", err: folder + "/whip.err") else {
        return TurnJoinRun(failure: "cannot start whip_server.py")
    }
    defer { server.stop(grace: 2) }
    func events() -> [[String: Any]] {
        server.stdout.split(separator: "\n").compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
    }
    guard let port = server.poll(timeout: 30, { _ in events().first { $0["event"] as? String == "ready" }?["port"] as? Int }) else {
        return TurnJoinRun(failure: "whip_server.py did not start: \(server.stderr.suffix(500))")
    }
    let token = measure(python, ["-c", """
        import jwt, sys, time
        now = int(time.time())
        claims = {"jti": "SK-bench-%d" % now, "iss": "SK-bench", "sub": "AC-bench", "iat": now, "nbf": now - 5, "exp": now + 600,
                  "grants": {"identity": "Bench", "video": {"room": sys.argv[2]}}}
        print(jwt.encode(claims, sys.argv[1], algorithm="HS256", headers={"cty": "twilio-fpa;v=1"}))
        """, secret, room])
    guard token.status == 0 else { return TurnJoinRun(failure: "pyjwt: \(token.stderr)") }
    let code = folder + "/code"
    do {
        try "krakl:v=1;k=whip;u=http://127.0.0.1:\(port)/whip/endpoint/\(room);t=\(token.stdout.trimmingCharacters(in: .whitespacesAndNewlines))"
            .write(toFile: code, atomically: true, encoding: .utf8)
    } catch { return TurnJoinRun(failure: "\(error)") }
    var arguments = ["--join", "@" + code, "--once", "--address", "127.0.0.2", "--plugins", work + "/plugins.json", "--backend", "file",
                     "--option", "scene=typing", "--option", "width=1280", "--option", "height=720"]
    if variant == .flag || variant == .flagRelayOnly { arguments += ["--ice-server", "turn:127.0.0.2:3478?transport=udp,u,p"] }
    if variant.relayOnly { arguments += ["--ice-transport", "relay"] }
    let started = MonotonicClock.milliseconds()
    guard let sharer = BenchChild(BenchNamespace.ip, namespace.command(agent, arguments), out: folder + "/agent.out", err: folder + "/agent.err") else {
        return TurnJoinRun(failure: "cannot start krakl-agent")
    }
    defer { sharer.stop(grace: 5) }
    // The lines mode writes to stdout or stderr: look at both.
    guard sharer.poll(timeout: 30, { _ in (sharer.stdout + sharer.stderr).contains("sharing the screen") ? true : nil }) != nil else {
        return TurnJoinRun(failure: "no share: \((sharer.stdout + sharer.stderr).suffix(600).trimmingCharacters(in: .whitespacesAndNewlines))")
    }
    run.sharingMs = MonotonicClock.milliseconds() - started
    // The PATCHes, by the server's clock (time.monotonic(): CLOCK_MONOTONIC, as ours).
    _ = server.poll(timeout: 10) { _ in events().contains { $0["end_of_candidates"] as? Bool == true } ? true : nil }
    let patches = events().filter { $0["event"] as? String == "request" && $0["method"] as? String == "PATCH" }
    if let relay = patches.first(where: { ($0["candidates"] as? [String] ?? []).contains { $0.contains(" typ relay") } }), let at = relay["at"] as? Double {
        run.relayPatchMs = at * 1000 - started
    }
    if let end = patches.first(where: { $0["end_of_candidates"] as? Bool == true }), let at = end["at"] as? Double {
        run.endPatchMs = at * 1000 - started
    }
    _ = sharer.poll(timeout: 5) { _ in (sharer.stdout + sharer.stderr).contains("connected ") ? true : nil }
    let text = sharer.stdout + sharer.stderr
    if let range = text.range(of: #"connected [a-z]+/[a-z]+ -> [a-z]+"#, options: .regularExpression) {
        run.path = String(text[range].dropFirst("connected ".count))
    }
    if variant.relayed, !run.path.hasPrefix("relay/") { run.failure = "not relayed: \(run.path)" }
    return run
}

func runTurnJoinBench(joins: Int) throws {
    guard geteuid() == 0 else { throw BenchError("krakl-bench turn needs root (ip netns add, nft)") }
    let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let python = "/opt/krakl-venv/bin/python"
    for (path, why) in [(python, "scripts/setup makes the venv with aiortc and pyjwt"), ("/usr/bin/turnserver", "Debian package coturn"),
                        (BenchNamespace.nft, "Debian package nftables"), (agent, "swift build builds it")]
    where !FileManager.default.isExecutableFile(atPath: path) {
        throw BenchError("\(path) missing (\(why))")
    }
    installRtcSignalCleanup()
    defer { RtcLive.shared.tearDown() }
    print("krakl-bench turn --joins \(joins): krakl-agent --join into a WHIP room on aiortc, coturn beside it, direct UDP dropped on the relayed variants (1280x720 typing); interleaved")
    var runs: [TurnJoinVariant: [TurnJoinRun]] = [:]
    var failures: [TurnJoinVariant: Int] = [:]
    var index = 0
    for round in 0..<joins {
        for variant in TurnJoinVariant.allCases {
            index += 1
            let run = runTurnJoin(variant, index: index, python: python, repoRoot: repoRoot)
            print(String(format: "  join %d/%d: %@: sharing %.0f ms, relay candidate PATCH %.0f ms, end-of-candidates %.0f ms, %@%@", round + 1, joins,
                         variant.rawValue, run.sharingMs, run.relayPatchMs, run.endPatchMs, run.path, run.failure.map { "; FAILED: \($0)" } ?? ""))
            if run.failure == nil { runs[variant, default: []].append(run) } else { failures[variant, default: 0] += 1 }
        }
    }
    func median(_ values: [Double]) -> Double {
        let sorted = values.filter { !$0.isNaN }.sorted()
        return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
    }
    print("")
    print("| variant | agent start → sharing, median (min–max) ms | → relay candidate PATCHed, median ms | → end-of-candidates PATCHed, median ms | path | failed |")
    print("|---|---:|---:|---:|---|---:|")
    for variant in TurnJoinVariant.allCases {
        let done = runs[variant] ?? []
        let sharing = done.map(\.sharingMs).sorted()
        print(String(format: "| %@ | %.0f (%.0f–%.0f) | %.0f | %.0f | %@ | %d |", variant.rawValue, median(sharing), sharing.first ?? .nan, sharing.last ?? .nan,
                     median(done.map(\.relayPatchMs)), median(done.map(\.endPatchMs)), Set(done.map(\.path)).sorted().joined(separator: ", "),
                     failures[variant] ?? 0))
    }
}
