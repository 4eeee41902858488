import Foundation
import Glibc

// krakl-bench turn: ICE + DTLS connect time (ms from the answer to SRTP keys) of krakl-rtc-probe →
// aiortc in a namespace each, directly and through coturn over UDP, TCP and TLS (issue 16's
// targets: UDP relay ≤ 400 ms, TLS relay ≤ 700 ms). The relayed paths drop the UDP that would let
// the peers meet directly (as the tests do), so the relay is what carries the session.

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

/// One session on `path`: connect ms, the selected pair's types, or why it failed.
func runTurnBenchSession(_ path: TurnBenchPath, index: Int, certificates: (ca: String, cert: String, key: String),
                         probe: String, receiver: String, python: String) -> (connectMs: Double, pair: String, failure: String?) {
    let namespace: BenchNamespace
    do { namespace = try BenchNamespace("krakl-bench-\(getpid())-t\(index)") } catch { return (.nan, "", "namespace: \(error)") }
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
        coturn = BenchChild(BenchNamespace.ip, namespace.command("/usr/bin/turnserver", [
            "-n", "--listening-ip=127.0.0.2", "--relay-ip=127.0.0.2", "--listening-port=3478", "--min-port=20000", "--max-port=20100",
            "--lt-cred-mech", "--user=u:p", "--realm=krakl", "--no-dtls", "--no-cli", "--allow-loopback-peers", "--simple-log",
            "--log-file=stdout", "--cert=\(certificates.cert)", "--pkey=\(certificates.key)", "--tls-listening-port=5349",
        ]), out: folder + "/coturn.out", err: folder + "/coturn.err")
        guard let coturn, coturn.poll(timeout: 15, { $0.contains("Total General servers") ? true : nil }) != nil else {
            return (.nan, "", "coturn did not start")
        }
        // Relay ports always pass; the TURN port over UDP only for the UDP relay; all other UDP is dropped.
        var rules = [["udp", "sport", "20000-20100", "accept"], ["udp", "dport", "20000-20100", "accept"]]
        if path == .udp { rules += [["udp", "sport", "3478", "accept"], ["udp", "dport", "3478", "accept"]] }
        rules.append(["meta", "l4proto", "udp", "drop"])
        let steps = [["add", "table", "inet", "krakl"],
                     ["add", "chain", "inet", "krakl", "input", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"]]
            + rules.map { ["add", "rule", "inet", "krakl", "input"] + $0 }
        for step in steps {
            let result = measure(BenchNamespace.ip, namespace.command(BenchNamespace.nft, step))
            guard result.status == 0 else { return (.nan, "", "nft: \(result.stderr)") }
        }
        switch path {
        case .udp: iceArguments = ["--ice-server", "turn:127.0.0.2,u,p"]
        case .tcp: iceArguments = ["--ice-server", "turn:127.0.0.2?transport=tcp,u,p"]
        case .tls: iceArguments = ["--ice-server", "turns:turn.krakl.test,u,p", "--ice-ca", certificates.ca]
        case .direct: break
        }
    }
    guard let aiortc = BenchChild(BenchNamespace.ip, namespace.command(python, [receiver, "--seconds", "60"]),
                                  out: folder + "/receiver.out", err: folder + "/receiver.err") else {
        return (.nan, "", "cannot start the aiortc receiver")
    }
    defer { aiortc.stop() }
    guard let publisher = BenchChild(BenchNamespace.ip, namespace.command(probe, [
        "--address", "127.0.0.2", "--seconds", "2", "--plugins", work + "/plugins.json", "--backend", "file",
        "--option", "scene=typing", "--option", "width=640", "--option", "height=360", "--connect-timeout", "15",
    ] + iceArguments), out: folder + "/probe.out", err: folder + "/probe.err") else {
        return (.nan, "", "cannot start krakl-rtc-probe")
    }
    defer { publisher.stop() }
    guard let offer = publisher.poll(timeout: 30, rtcSdpBlock) else { return (.nan, "", "no offer: \(publisher.stderr.suffix(300))") }
    aiortc.type(offer + "\n")
    guard let answer = aiortc.poll(timeout: 30, rtcSdpBlock) else { return (.nan, "", "no answer from aiortc: \(aiortc.stderr.suffix(300))") }
    publisher.type(answer + "\n")
    guard let result = publisher.poll(timeout: 60, { rtcJsonLine($0, marker: "\"result\"") }),
          let stats = result["stats"] as? [String: Any] else {
        return (.nan, "", "the probe gave no result: \(publisher.stderr.suffix(300))")
    }
    let pair = stats["selected_pair_types"] as? String ?? "-"
    guard result["status"] as? Int == 0 else { return (.nan, pair, "probe: \(result["result"] ?? "?")") }
    return (stats["connect_ms"] as? Double ?? .nan, pair, nil)
}

func runTurnBench(rounds: Int) throws {
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
}
