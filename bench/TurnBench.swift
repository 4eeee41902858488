import KraklBase
import KraklHost
import Foundation
import Glibc

// krakl-bench turn: ICE + DTLS connect time (ms from the answer to SRTP keys) of krakl-rtc-probe →
// aiortc in a namespace each, directly and through coturn over UDP, TCP and TLS (issue 16's
// targets: UDP relay ≤ 400 ms, TLS relay ≤ 700 ms). The relayed paths drop the UDP that would let
// the peers meet directly (as the tests do), so the relay is what carries the session.
//
// Then the media targets: 1080p typing (the file backend's scene, its frame stamps read at aiortc)
// on each path, interleaved rounds: capture-to-decoded latency p50/p99 within 10 ms of the direct
// path, and the publisher's CPU (all its threads, per second of media) within 10 % of it; coturn's
// CPU on its own.

/// How the probe reaches aiortc.
enum TurnBenchPath: String, CaseIterable {
    case direct = "direct (host)"
    case udp = "TURN over UDP"
    case tcp = "TURN over TCP"
    case tls = "TURN over TLS (turns:)"
}

/// A test CA and a certificate for turn.krakl.test signed by it (openssl CLI), once per bench run.
func makeTurnBenchCertificates(in folder: String) throws -> (ca: String, cert: String, key: String) {
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    try "subjectAltName=DNS:turn.krakl.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        .write(toFile: folder + "/server.ext", atomically: true, encoding: .utf8)
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for arguments in [["req", "-x509"] + key + ["-keyout", folder + "/ca.key", "-out", folder + "/ca.pem", "-days", "1", "-subj", "/CN=krakl bench CA"],
                      ["req"] + key + ["-keyout", folder + "/server.key", "-out", folder + "/server.csr", "-subj", "/CN=turn.krakl.test"],
                      ["x509", "-req", "-in", folder + "/server.csr", "-CA", folder + "/ca.pem", "-CAkey", folder + "/ca.key", "-CAcreateserial",
                       "-out", folder + "/server.pem", "-days", "1", "-extfile", folder + "/server.ext"]] {
        let result = measure("/usr/bin/openssl", arguments)
        guard result.status == 0 else { throw BenchError("openssl \(arguments.prefix(2).joined(separator: " ")): \(result.stderr)") }
    }
    return (folder + "/ca.pem", folder + "/server.pem", folder + "/server.key")
}

/// coturn in `namespace` on 127.0.0.2:3478 (user u:p, relay ports 20000-20100), with TLS on 5349
/// when given a certificate and key; nil when it did not start within 15 s.
func startBenchCoturn(in namespace: BenchNamespace, folder: String, tls: (cert: String, key: String)?) -> BenchChild? {
    guard let coturn = BenchChild(BenchNamespace.ip, namespace.command("/usr/bin/turnserver", [
        "-n", "--listening-ip=127.0.0.2", "--relay-ip=127.0.0.2", "--listening-port=3478", "--min-port=20000", "--max-port=20100",
        "--lt-cred-mech", "--user=u:p", "--realm=krakl", "--no-dtls", "--no-cli", "--allow-loopback-peers", "--simple-log",
        "--log-file=stdout",
    ] + (tls.map { ["--cert=\($0.cert)", "--pkey=\($0.key)", "--tls-listening-port=5349"] } ?? ["--no-tls"])),
                                  out: folder + "/coturn.out", err: folder + "/coturn.err") else { return nil }
    guard coturn.poll(timeout: 15, { $0.contains("Total General servers") ? true : nil }) != nil else {
        coturn.stop(grace: 1)
        return nil
    }
    return coturn
}

extension BenchNamespace {
    /// Drops every UDP packet arriving in the namespace but those to or from `ports` (numbers or
    /// ranges): the relay becomes the only path. Nil when done, else nft's complaint.
    func acceptOnlyUdp(ports: [String]) -> String? {
        let rules = ports.flatMap { [["udp", "sport", $0, "accept"], ["udp", "dport", $0, "accept"]] } + [["meta", "l4proto", "udp", "drop"]]
        let steps = [["add", "table", "inet", "krakl"],
                     ["add", "chain", "inet", "krakl", "input", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"]]
            + rules.map { ["add", "rule", "inet", "krakl", "input"] + $0 }
        for step in steps {
            let result = measure(Self.ip, command(Self.nft, step))
            guard result.status == 0 else { return "nft: \(result.stderr)" }
        }
        return nil
    }
}

/// One session's numbers: connect, and for a media session latency and CPU.
struct TurnBenchRun {
    var connectMs = Double.nan
    var pair = ""
    var failure: String?
    var sent = 0, decoded = 0
    /// Capture → decoded at aiortc over every stamped frame, and over those captured ≥ 2 s after connecting.
    var p50 = Double.nan, p99 = Double.nan, steadyP50 = Double.nan, steadyP99 = Double.nan
    /// CPU % (100 = one core) over the media window: the publisher's process, coturn's.
    var publisherCpu = Double.nan, coturnCpu = Double.nan
    var kbps = Double.nan

    init(failure: String? = nil) { self.failure = failure }
}

/// One session on `path`: connect ms and the selected pair's types; with `media` (seconds) a
/// 1080p typing session whose latency and CPU are measured too.
func runTurnBenchSession(_ path: TurnBenchPath, index: Int, certificates: (ca: String, cert: String, key: String),
                         probe: String, receiver: String, python: String, media: Double? = nil) -> TurnBenchRun {
    let namespace: BenchNamespace
    do { namespace = try BenchNamespace("krakl-bench-\(getpid())-t\(index)") } catch { return TurnBenchRun(failure: "namespace: \(error)") }
    defer { namespace.delete() }
    let folder = work + "/turn-\(index)"
    try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    // ip netns exec bind-mounts /etc/netns/NAME/hosts over /etc/hosts: the TLS name resolves there.
    let hostsFolder = "/etc/netns/\(namespace.name)"
    try? FileManager.default.createDirectory(atPath: hostsFolder, withIntermediateDirectories: true)
    try? "127.0.0.2 turn.krakl.test\n".write(toFile: hostsFolder + "/hosts", atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(atPath: hostsFolder) }

    var coturn: BenchChild?
    defer { coturn?.stop(grace: 1) }
    var iceArguments: [String] = []
    if path != .direct {
        coturn = startBenchCoturn(in: namespace, folder: folder, tls: (certificates.cert, certificates.key))
        guard coturn != nil else { return TurnBenchRun(failure: "coturn did not start") }
        // Relay ports always pass; the TURN port over UDP only for the UDP relay; all other UDP is dropped.
        if let failure = namespace.acceptOnlyUdp(ports: ["20000-20100"] + (path == .udp ? ["3478"] : [])) {
            return TurnBenchRun(failure: failure)
        }
        switch path {
        case .udp: iceArguments = ["--ice-server", "turn:127.0.0.2,u,p"]
        case .tcp: iceArguments = ["--ice-server", "turn:127.0.0.2?transport=tcp,u,p"]
        case .tls: iceArguments = ["--ice-server", "turns:turn.krakl.test,u,p", "--ice-ca", certificates.ca]
        case .direct: break
        }
    }
    let seconds = media ?? 2
    guard let aiortc = BenchChild(BenchNamespace.ip, namespace.command(python, [receiver, "--seconds", "\(seconds + 60)"]),
                                  out: folder + "/receiver.out", err: folder + "/receiver.err") else {
        return TurnBenchRun(failure: "cannot start the aiortc receiver")
    }
    defer { aiortc.stop() }
    let size = media == nil ? (640, 360) : (1920, 1080)
    guard let publisher = BenchChild(BenchNamespace.ip, namespace.command(probe, [
        "--address", "127.0.0.2", "--seconds", "\(seconds)", "--plugins", work + "/plugins.json", "--backend", "file",
        "--option", "scene=typing", "--option", "width=\(size.0)", "--option", "height=\(size.1)", "--connect-timeout", "15",
    ] + iceArguments), out: folder + "/probe.out", err: folder + "/probe.err") else {
        return TurnBenchRun(failure: "cannot start krakl-rtc-probe")
    }
    defer { publisher.stop() }
    guard let offer = publisher.poll(timeout: 30, rtcSdpBlock) else { return TurnBenchRun(failure: "no offer: \(publisher.stderr.suffix(300))") }
    aiortc.type(offer + "\n")
    guard let answer = aiortc.poll(timeout: 30, rtcSdpBlock) else { return TurnBenchRun(failure: "no answer from aiortc: \(aiortc.stderr.suffix(300))") }
    publisher.type(answer + "\n")
    var run = TurnBenchRun()
    var connected = Double.nan
    if media != nil {
        // CPU over the media window (connected → connected + seconds), sampled while waiting for the result.
        guard let at = publisher.poll(timeout: 20, in: \.stderr, { text -> Double? in
            rtcJsonLine(text, marker: "\"event\":\"connected\"")?["t_ms"] as? Double
        }) else { return TurnBenchRun(failure: "never connected: \(publisher.stderr.suffix(300))") }
        connected = at
    }
    let windowEnd = connected + seconds * 1000
    let publisherStart = media == nil ? 0 : processCpuSeconds(publisher.pid)
    let coturnStart = coturn.map { processCpuSeconds($0.pid) } ?? 0
    var publisherEnd = publisherStart, coturnEnd = coturnStart
    var sampledUntil = MonotonicClock.milliseconds()
    let result = publisher.poll(timeout: seconds + 60) { text -> [String: Any]? in
        let now = MonotonicClock.milliseconds()
        if media != nil, now <= windowEnd {
            let p = processCpuSeconds(publisher.pid), c = coturn.map { processCpuSeconds($0.pid) } ?? 0
            if p > 0 { publisherEnd = p }
            if c > 0 { coturnEnd = c }
            sampledUntil = now
        }
        return rtcJsonLine(text, marker: "\"result\"")
    }
    guard let result, let stats = result["stats"] as? [String: Any] else {
        return TurnBenchRun(failure: "the probe gave no result: \(publisher.stderr.suffix(300))")
    }
    run.pair = stats["selected_pair_types"] as? String ?? "-"
    run.connectMs = stats["connect_ms"] as? Double ?? .nan
    guard result["status"] as? Int == 0 else {
        run.failure = "probe: \(result["result"] ?? "?")"
        return run
    }
    guard media != nil else { return run }
    let window = (sampledUntil - connected) / 1000
    if window > 1 {
        run.publisherCpu = (publisherEnd - publisherStart) / window * 100
        if coturn != nil { run.coturnCpu = (coturnEnd - coturnStart) / window * 100 }
    }
    run.sent = stats["frames_sent"] as? Int ?? 0
    run.kbps = Double(stats["bytes_sent"] as? Int ?? 0) * 8 / seconds / 1000
    guard let report = aiortcReport(aiortc) else {
        run.failure = "aiortc gave no report: \(aiortc.stderr.suffix(300))"
        return run
    }
    run.decoded = report["frames_decoded"] as? Int ?? 0
    let latency = rtcLatencies(report, connected: connected)
    (run.p50, run.p99, run.steadyP50, run.steadyP99) = (latency.p50, latency.p99, latency.steadyP50, latency.steadyP99)
    return run
}

/// `mediaSeconds`: the length of each 1080p media session (0: connect table only).
func runTurnBench(rounds: Int, mediaSeconds: Double) throws {
    guard geteuid() == 0 else { throw BenchError("krakl-bench turn needs root (ip netns add, nft)") }
    let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
    let receiver = repoRoot + "/Tests/Fixtures/aiortc_receiver.py"
    let python = "/opt/krakl-venv/bin/python"
    let probe = buildDir + "/krakl-rtc-probe"
    for (path, why) in [(probe, "swift build builds it"), (python, "scripts/setup makes the venv with aiortc"),
                        ("/usr/bin/turnserver", "Debian package coturn"), ("/usr/bin/openssl", "Debian package openssl"),
                        (BenchNamespace.nft, "Debian package nftables")]
    where !FileManager.default.isExecutableFile(atPath: path) {
        throw BenchError("\(path) missing (\(why))")
    }
    installRtcSignalCleanup()
    defer {
        RtcLive.shared.tearDown()
        try? FileManager.default.removeItem(atPath: work)
    }
    let certificates = try makeTurnBenchCertificates(in: work + "/certificates")
    print("krakl-bench turn: krakl-rtc-probe → aiortc (640x360 typing, 2 s) in a namespace each, directly and through coturn; \(rounds) rounds")
    var runs: [TurnBenchPath: [Double]] = [:]
    var failures: [TurnBenchPath: Int] = [:]
    var index = 0
    for round in 0..<rounds {
        for path in TurnBenchPath.allCases {
            index += 1
            let run = runTurnBenchSession(path, index: index, certificates: certificates, probe: probe, receiver: receiver, python: python)
            print(String(format: "  round %d/%d: %@: connect %.0f ms over %@%@", round + 1, rounds, path.rawValue, run.connectMs, run.pair,
                         run.failure.map { "; FAILED: \($0)" } ?? ""))
            if run.failure == nil { runs[path, default: []].append(run.connectMs) } else { failures[path, default: 0] += 1 }
        }
    }
    print("")
    print("| path | connect after the answer, median (ms) | min–max (ms) | target | failed rounds |")
    print("|---|---:|---:|---|---:|")
    for path in TurnBenchPath.allCases {
        let values = (runs[path] ?? []).sorted()
        let median = values.isEmpty ? Double.nan : (values.count % 2 == 1 ? values[values.count / 2] : (values[values.count / 2 - 1] + values[values.count / 2]) / 2)
        let target: String
        switch path {
        case .udp: target = (values.max() ?? .infinity) <= 400 ? "≤ 400 ms: met" : "≤ 400 ms: NOT met"
        case .tls: target = (values.max() ?? .infinity) <= 700 ? "≤ 700 ms: met" : "≤ 700 ms: NOT met"
        default: target = "-"
        }
        print(String(format: "| %@ | %.0f | %.0f–%.0f | %@ | %d |", path.rawValue, median, values.first ?? .nan, values.last ?? .nan, target,
                     failures[path] ?? 0))
    }

    guard mediaSeconds > 0 else { return }
    print("")
    print("Media: 1920x1080 typing, \(Int(mediaSeconds)) s a session, \(rounds) interleaved rounds (the order of the paths rotates)")
    var media: [TurnBenchPath: [TurnBenchRun]] = [:]
    var mediaFailures: [TurnBenchPath: Int] = [:]
    let paths = TurnBenchPath.allCases
    for round in 0..<rounds {
        for k in 0..<paths.count {
            let path = paths[(k + round) % paths.count]
            index += 1
            let run = runTurnBenchSession(path, index: index, certificates: certificates, probe: probe, receiver: receiver, python: python,
                                          media: mediaSeconds)
            print(String(format: "  round %d/%d: %@ over %@: %d/%d decoded, latency p50 %.0f p99 %.0f ms (from 2 s: %.0f/%.0f), publisher CPU %.1f %%, coturn CPU %.1f %%, %.0f kbit/s%@",
                         round + 1, rounds, path.rawValue, run.pair as NSString, run.decoded, run.sent, run.p50, run.p99, run.steadyP50, run.steadyP99,
                         run.publisherCpu, run.coturnCpu, run.kbps, run.failure.map { "; FAILED: \($0)" } ?? ""))
            if run.failure == nil { media[path, default: []].append(run) } else { mediaFailures[path, default: 0] += 1 }
        }
    }
    func median(_ values: [Double]) -> Double {
        let v = values.filter { !$0.isNaN }.sorted()
        return v.isEmpty ? .nan : (v.count % 2 == 1 ? v[v.count / 2] : (v[v.count / 2 - 1] + v[v.count / 2]) / 2)
    }
    func m(_ path: TurnBenchPath, _ key: KeyPath<TurnBenchRun, Double>) -> Double { median((media[path] ?? []).map { $0[keyPath: key] }) }
    print("")
    print("Medians over rounds:")
    print("")
    print("| path | latency p50 (ms) | latency p99 (ms) | p50 / p99 captured ≥ 2 s after connect (ms) | publisher CPU % | coturn CPU % | decoded / sent | bitrate (kbit/s) | failed rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in paths {
        let decoded = median((media[path] ?? []).map { Double($0.decoded) }), sent = median((media[path] ?? []).map { Double($0.sent) })
        print(String(format: "| %@ | %.0f | %.0f | %.0f / %.0f | %.1f | %@ | %.0f / %.0f | %.0f | %d |", path.rawValue, m(path, \.p50), m(path, \.p99),
                     m(path, \.steadyP50), m(path, \.steadyP99), m(path, \.publisherCpu),
                     path == .direct ? "-" : String(format: "%.1f", m(path, \.coturnCpu)), decoded, sent, m(path, \.kbps), mediaFailures[path] ?? 0))
    }
    print("")
    print("| relay path | latency p50 − direct (ms) | latency p99 − direct (ms) | within 10 ms | publisher CPU vs direct | within 10 % |")
    print("|---|---:|---:|---|---:|---|")
    for path in paths where path != .direct {
        let d50 = m(path, \.p50) - m(.direct, \.p50), d99 = m(path, \.p99) - m(.direct, \.p99)
        let cpu = m(path, \.publisherCpu) / m(.direct, \.publisherCpu) * 100 - 100
        print(String(format: "| %@ | %+.0f | %+.0f | %@ | %+.1f %% | %@ |", path.rawValue, d50, d99, d50 <= 10 && d99 <= 10 ? "met" : "NOT met",
                     cpu, cpu <= 10 ? "met" : "NOT met"))
    }
}

/// Capture → decoded latencies from an aiortc receiver's report (its "arrivals" rows: decoded ms,
/// frame number, the stamp's capture ms), over all stamped frames and over those captured ≥ 2 s
/// after `connected` (CLOCK_MONOTONIC ms), as krakl-bench rtc computes them.
func rtcLatencies(_ report: [String: Any], connected: Double) -> (p50: Double, p99: Double, steadyP50: Double, steadyP99: Double) {
    let rows = report["arrivals"] as? [[Any]] ?? []
    var latencies: [Double] = [], steady: [Double] = []
    for row in rows where row.count > 2 {
        // Decoded ms (truncated) minus the stamp's capture ms, mod 2^32, as the receiver computes it.
        guard let decodedAt = row[0] as? Double, let capture = row[2] as? Int else { continue }
        let latency = (Int64(decodedAt) - Int64(capture)) & 0xFFFF_FFFF
        guard latency < 10_000 else { continue }
        latencies.append(Double(latency))
        if decodedAt - Double(latency) >= connected + 2000 { steady.append(Double(latency)) }
    }
    return (percentile(latencies, 0.5), percentile(latencies, 0.99), percentile(steady, 0.5), percentile(steady, 0.99))
}
