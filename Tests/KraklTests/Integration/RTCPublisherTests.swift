import KraklBase
import KraklHost
import Foundation
import Glibc
import KraklRTC
import Testing

/// A network namespace of the test's own (docs/testing.md, "Network namespaces"): lo up and a veth
/// pair carrying 127.0.0.2, because aiortc drops 127.0.0.1 from its host
/// candidates. Every packet of a session stays inside it. Deleted on deinit.
final class RtcTestNamespace {
    static let ip = "/usr/sbin/ip"
    /// The namespace recipe, shared with krakl-bench rtc.
    static var script: String { Harness.repoRoot + "/scripts/rtc-netns" }
    let name: String
    /// Only a namespace this object made is deleted: a failed init still
    /// runs deinit, and deleting by name would take a namespace of another
    /// test running in parallel.
    private var made = false

    /// nil (after printing SKIP and the reason) when namespaces cannot be made here.
    init?() throws {
        guard geteuid() == 0 else {
            skipTest("network namespaces need root (ip netns add)")
            return nil
        }
        guard FileManager.default.isExecutableFile(atPath: Self.ip) else {
            skipTest("\(Self.ip) missing (iproute2)")
            return nil
        }
        // Unique without shared state: tests make namespaces in parallel.
        name = "krakl-test-\(getpid())-" + UUID().uuidString.prefix(8).lowercased()
        let result = try Harness.run("/bin/bash", [Self.script, "add", name], timeout: 20)
        if result.status != 0 {
            skipTest("cannot make a network namespace: scripts/rtc-netns add \(name): \(result.stderr)")
            return nil
        }
        made = true
    }

    deinit {
        if made { _ = try? Harness.run("/bin/bash", [Self.script, "del", name], timeout: 20) }
    }

    /// argv for running `program` inside the namespace.
    func command(_ program: String, _ arguments: [String]) -> (String, [String]) {
        (Self.ip, ["netns", "exec", name, program] + arguments)
    }

    @discardableResult
    func run(_ program: String, _ arguments: [String]) throws -> Harness.Result {
        try Harness.run(Self.ip, ["netns", "exec", name, program] + arguments, timeout: 20)
    }

    static let nft = "/usr/sbin/nft"

    /// An nftables input chain in the namespace for loss and outages; false when nft is missing.
    func prepareFaults() throws -> Bool {
        guard FileManager.default.isExecutableFile(atPath: Self.nft) else { return false }
        try #require(try run(Self.nft, ["add", "table", "inet", "krakl"]).status == 0)
        try #require(try run(Self.nft, ["add", "chain", "inet", "krakl", "input", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"]).status == 0)
        return true
    }

    /// Drops `percent` % of UDP arriving in the namespace (100: an outage). Both directions pass input once.
    func dropUdp(percent: Int) throws {
        let rule = percent >= 100 ? ["meta", "l4proto", "udp", "drop"]
            : ["meta", "l4proto", "udp", "numgen", "random", "mod", "100", "<", "\(percent)", "drop"]
        let result = try run(Self.nft, ["add", "rule", "inet", "krakl", "input"] + rule)
        try #require(result.status == 0, "nft: \(result.stderr)")
    }

    func heal() throws {
        let result = try run(Self.nft, ["flush", "chain", "inet", "krakl", "input"])
        try #require(result.status == 0, "nft flush: \(result.stderr)")
    }
}

/// One publisher session: krakl-rtc-probe and the aiortc receiver in a
/// namespace, with the test passing the offer and answer between them.
final class RtcPublisherSession {
    static let python = "/opt/krakl-venv/bin/python"
    static var probePath: String { Harness.buildDir + "/krakl-rtc-probe" }
    static var receiverScript: String { Harness.repoRoot + "/Tests/Fixtures/aiortc_receiver.py" }

    let namespace: RtcTestNamespace
    let folder: String
    let probe: DtlsTestProcess
    let receiver: DtlsTestProcess
    private(set) var answer = ""

    /// nil (after SKIP) when the probe or the aiortc venv is missing.
    static func prerequisites() -> Bool {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            skipTest("\(python) missing (scripts/setup makes the venv with aiortc)")
            return false
        }
        guard FileManager.default.isExecutableFile(atPath: probePath) else {
            skipTest("\(probePath) missing (swift build builds krakl-rtc-probe)")
            return false
        }
        return true
    }

    init(namespace: RtcTestNamespace, seconds: Double, scene: String = "typing", extraProbeArguments: [String] = [], receiverSeconds: Double = 90) throws {
        self.namespace = namespace
        folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let dump = folder + "/source.i420"
        let (rp, ra) = namespace.command(Self.python, [Self.receiverScript, "--seconds", "\(receiverSeconds)", "--dump", dump])
        receiver = try DtlsTestProcess(rp, ra)
        let (pp, pa) = namespace.command(Self.probePath, ["--address", "127.0.0.2", "--seconds", "\(seconds)", "--plugins", registry,
                                                         "--option", "scene=\(scene)", "--option", "width=640", "--option", "height=360",
                                                         "--dump-input", dump] + extraProbeArguments)
        probe = try DtlsTestProcess(pp, pa)
    }

    deinit { stop() }

    func stop() {
        probe.stop()
        receiver.stop()
    }

    /// The SDP a process printed: from "v=0" to the first empty line; nil until complete.
    static func sdpBlock(_ text: String) -> String? {
        guard let start = text.range(of: "v=0") else { return nil }
        var lines: [String] = []
        // "\r\n" is one Character in Swift: split on every kind of line end.
        for line in text[start.lowerBound...].split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty { return lines.joined(separator: "\r\n") + "\r\n" }
            lines.append(trimmed)
        }
        return nil
    }

    static func waitForSdp(_ process: DtlsTestProcess, timeout: Double) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let sdp = sdpBlock(process.log) { return sdp }
            if !process.isRunning { return sdpBlock(process.log) }
            _ = process.waitFor("\u{1}never\u{1}", timeout: 0.05)  // returns on new output or after 50 ms
        }
        return nil
    }

    /// Offer → receiver, answer (optionally changed) → probe.
    func exchange(changeAnswer: (String) -> String = { $0 }) throws {
        let offer = try #require(Self.waitForSdp(probe, timeout: 30), "no offer from the probe: \(probe.log)")
        #expect(offer.contains("a=candidate:") && offer.contains("127.0.0.2"), "the offer has no 127.0.0.2 host candidate")
        receiver.type(offer + "\n")
        let original = try #require(Self.waitForSdp(receiver, timeout: 30), "no answer from aiortc: \(receiver.log)")
        answer = changeAnswer(original)
        probe.type(answer + "\n")
    }

    /// The JSON object on the first output line containing `marker`, once it is there.
    static func jsonLine(_ process: DtlsTestProcess, marker: String, timeout: Double) -> [String: Any]? {
        guard process.waitFor(marker, timeout: timeout) else { return nil }
        for line in process.log.split(whereSeparator: \.isNewline) where line.contains(marker) {
            if let data = String(line).data(using: .utf8), let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] {
                return object
            }
        }
        return nil
    }

    func probeResult(timeout: Double) -> [String: Any]? { Self.jsonLine(probe, marker: "\"result\"", timeout: timeout) }

    /// The receiver's report: it ends on its own when our close_notify ends the track; stdin's end stops it otherwise.
    func receiverReport(timeout: Double) -> [String: Any]? {
        if let report = Self.jsonLine(receiver, marker: "{\"report\"", timeout: timeout) { return report["report"] as? [String: Any] }
        receiver.stop()
        return (Self.jsonLine(receiver, marker: "{\"report\"", timeout: 5))?["report"] as? [String: Any]
    }

    /// Waits for the probe's "connected" event; returns the event's time (CLOCK_MONOTONIC ms).
    func waitConnected(timeout: Double) -> Double? {
        guard probe.waitFor("\"event\":\"connected\"", timeout: timeout) else { return nil }
        for line in probe.log.split(whereSeparator: \.isNewline) where line.contains("\"event\":\"connected\"") {
            if let data = String(line).data(using: .utf8), let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] {
                return object["t_ms"] as? Double
            }
        }
        return nil
    }
}

/// Waits until CLOCK_MONOTONIC reaches `ms`: the scenario's timeline (fault start/stop), not a readiness guess.
func rtcWait(untilMonotonicMs ms: Double) {
    for _ in 0..<100_000 where MonotonicClock.milliseconds() < ms { usleep(10_000) }
}

/// Decoded frames and gaps of a receiver report within a time window (CLOCK_MONOTONIC ms).
struct RtcArrivals {
    let times: [Double]
    let stamps: [Int?]
    /// Capture times read from the stamps: CLOCK_MONOTONIC ms, low 32 bits.
    let captures: [Int?]

    init(_ report: [String: Any]) {
        let rows = report["arrivals"] as? [[Any]] ?? []
        times = rows.compactMap { $0.first as? Double }
        stamps = rows.map { $0.count > 1 ? $0[1] as? Int : nil }
        captures = rows.map { $0.count > 2 ? $0[2] as? Int : nil }
    }

    /// Whether a stamp's 32-bit capture time lies after `ms` (CLOCK_MONOTONIC).
    static func captured(_ capture: Int, after ms: Double) -> Bool {
        Int32(truncatingIfNeeded: capture &- Int(UInt32(truncatingIfNeeded: Int(ms)))) > 0
    }

    /// Decode times of frames captured after `ms`: content that could not exist before it.
    func decodedCaptured(after ms: Double) -> [Double] {
        zip(times, captures).compactMap { time, capture in capture.map { Self.captured($0, after: ms) } == true ? time : nil }
    }

    func longestGap(from start: Double, to end: Double) -> Double {
        let span = longestGapSpan(from: start, to: end)
        return span.end - span.start
    }

    /// Where the longest gap lies: the decode times around it (or the window's ends).
    func longestGapSpan(from start: Double, to end: Double) -> (start: Double, end: Double) {
        let inside = [start] + times.filter { $0 > start && $0 < end } + [end]
        return zip(inside, inside.dropFirst()).max { $0.1 - $0.0 < $1.1 - $1.0 } ?? (start, end)
    }

    func firstAfter(_ t: Double) -> Double? { times.first { $0 > t } }
}

@Suite(.serialized, .tags(.integration, .netns)) struct RTCPublisherTests {
    @Test func publishesVp8ThatAiortcDecodesInOrder() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 5)
        defer { session.stop() }
        try session.exchange()
        let connected = try #require(session.waitConnected(timeout: 30), "never connected: \(session.probe.log)")
        let result = try #require(session.probeResult(timeout: 60), "the probe gave no result: \(session.probe.log)")
        let report = try #require(session.receiverReport(timeout: 30), "aiortc gave no report: \(session.receiver.log)")
        let stats = try #require(result["stats"] as? [String: Any])

        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")")
        // Capture and encoding start at the answer, not when ICE and DTLS are up: the first picture aiortc
        // decodes was captured before the connection (it was dropped, and a keyframe asked for, before).
        let firstCapture = try #require(RtcArrivals(report).captures.first ?? nil, "the first decoded frame has no readable stamp")
        #expect(!RtcArrivals.captured(firstCapture, after: connected),
                "the first decoded frame was captured after connecting (\(firstCapture) vs \(Int(connected)) ms): media started late")
        print("first decoded frame captured \(Int(connected) - firstCapture) ms before connecting; frames encoded while connecting and sent at once: \(stats["early_frames_sent"] ?? "-")")
        let connectMs = try #require(stats["connect_ms"] as? Double, "never connected: \(session.probe.log)")
        let sent = stats["frames_sent"] as? Int ?? 0
        let decoded = report["frames_decoded"] as? Int ?? 0
        let psnr = report["psnr_y_min"] as? Double
        print(String(format: "aiortc: connected %.1f ms after the answer (ICE + DTLS); %d of %d frames decoded; latency p50 %@ ms p99 %@ ms; luma PSNR min %@ dB over %@ samples; RTT %@ ms; SRTP %@; loss-protection copies %@ (until the first receiver report)",
                     connectMs, decoded, sent, "\(report["latency_ms_p50"] ?? "-")", "\(report["latency_ms_p99"] ?? "-")",
                     psnr.map { String(format: "%.1f", $0) } ?? "-", "\(report["psnr_samples"] ?? 0)", "\(stats["rtt_ms"] ?? "-")",
                     "\(stats["srtp_profile"] ?? "-")", "\(stats["redundant_packets"] ?? "-")"))
        #expect(connectMs < 10_000, "a hang guard (10x 1 s): connecting took \(connectMs) ms on loopback")
        // Frames flow (a small number, not a rate: krakl-bench rtc measures frames sent and decoded).
        #expect(sent >= 30, "only \(sent) frames sent in 5 s at 30 fps")
        #expect(Double(decoded) >= 0.9 * Double(sent), "aiortc decoded \(decoded) of \(sent) frames")
        #expect(report["decreasing"] as? Int == 0, "frame numbers went backwards \(report["decreasing"] ?? "?") times")
        #expect((report["stamps_read"] as? Int ?? 0) >= decoded * 9 / 10, "frame stamps unreadable in most frames")
        #expect(report["sizes"] as? [String] == ["640x360"], "decoded sizes \(report["sizes"] ?? "?")")
        if let psnr { #expect(psnr >= 30, "decoded pictures differ from the source: PSNR \(psnr) dB") }
        #expect((report["psnr_samples"] as? Int ?? 0) > 0, "no decoded frame could be matched to the source dump")
        #expect(stats["keyframes_sent"] as? Int ?? 0 >= 1)
        // One keyframe unless aiortc asked: the transport's start must not ask for a second one while the
        // first is being encoded (or already waits, encoded while connecting).
        let asked = (stats["plis_received"] as? Int ?? 0) + (stats["firs_received"] as? Int ?? 0)
        #expect(stats["keyframes_sent"] as? Int ?? 0 <= 1 + asked, "\(stats["keyframes_sent"] ?? 0) keyframes for \(asked) PLI/FIR")
        // Loss protection runs only until aiortc's first receiver report says the path is clean (aiortc reports
        // every 0.5–1.5 s: at most ~45 frames; 16–31 copies seen). Kept on, it would copy all ~150 typing frames.
        #expect(stats["redundant_packets"] as? Int ?? 0 < sent / 2, "loss protection copies went on over a clean link: \(stats["redundant_packets"] ?? 0) for \(sent) frames")
        #expect(stats["sender_reports_sent"] as? Int ?? 0 >= 3, "sender reports: \(stats["sender_reports_sent"] ?? 0)")
        #expect(stats["receiver_reports"] as? Int ?? 0 >= 1, "no receiver report parsed")
        #expect(stats["dtls_role"] as? String == "server", "aiortc answers setup:active, so we are the DTLS server")
        #expect(report["track_ended"] as? Bool == true, "our close_notify did not end aiortc's track")
    }

    @Test func aWrongFingerprintInTheAnswerFailsClosed() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let session = try RtcPublisherSession(namespace: namespace, seconds: 3, extraProbeArguments: ["--connect-timeout", "10"])
        defer { session.stop() }
        // Every fingerprint aiortc lists gets its first byte changed.
        try session.exchange { answer in
            answer.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).map { line -> String in
                guard line.hasPrefix("a=fingerprint:"), let space = line.firstIndex(of: " ") else { return String(line) }
                let hex = line[line.index(after: space)...]
                let flipped = hex.hasPrefix("00") ? "11" + hex.dropFirst(2) : "00" + hex.dropFirst(2)
                return String(line[...space]) + flipped
            }.joined(separator: "\r\n")
        }
        #expect(session.answer.contains("a=fingerprint:sha-256 "))
        let result = try #require(session.probeResult(timeout: 30), "the probe gave no result: \(session.probe.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let reason = result["result"] as? String ?? ""
        print("wrong fingerprint: \(reason)")
        #expect(result["status"] as? Int == 3, "the probe must fail to connect (status 3): \(reason)")
        #expect(reason.contains("fingerprint") && reason.contains("does not match"), "unclear error: \(reason)")
        #expect(stats["connect_ms"] == nil, "it reported a connection")
        #expect(stats["packets_sent"] as? Int == 0, "media left before the peer was verified")
        // aiortc's own count (its report comes when its stdin ends): nothing decoded.
        let report = try #require(session.receiverReport(timeout: 2), "aiortc gave no report: \(session.receiver.log.suffix(800))")
        #expect(report["frames_decoded"] as? Int == 0, "aiortc decoded frames from an unverified session")
    }

    @Test(arguments: [(5, "scrolling"), (5, "typing"), (20, "scrolling")])
    func randomLossKeepsTheReceiverDecoding(percent: Int, scene: String) throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        guard try namespace.prepareFaults() else {
            skipTest("nft missing (Debian package nftables): no loss test")
            return
        }
        let seconds = 10.0
        let session = try RtcPublisherSession(namespace: namespace, seconds: seconds, scene: scene)
        defer { session.stop() }
        try session.exchange()
        let connected = try #require(session.waitConnected(timeout: 20), "never connected: \(session.probe.log)")
        // The loss starts once aiortc shows a picture. A first keyframe whose opening packets are lost before
        // aiortc saw any packet cannot be repaired by NACK (aiortc asks only for packets after the first it
        // got): decode errors and PLIs until the next keyframe, in 2 of 80 sessions started at "connected"
        // (95.0 and 95.9 % decoded), none of 80 started at the first picture (issue 26).
        try #require(session.receiver.waitFor("\"first_frame\"", timeout: 20), "a hang guard: aiortc decoded nothing in 20 s: \(session.receiver.log)")
        try namespace.dropUdp(percent: percent)
        let result = try #require(session.probeResult(timeout: seconds + 30), "the probe gave no result: \(session.probe.log)")
        try namespace.heal()
        let report = try #require(session.receiverReport(timeout: 30), "aiortc gave no report: \(session.receiver.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let sent = stats["frames_sent"] as? Int ?? 0
        let decoded = report["frames_decoded"] as? Int ?? 0
        let arrivals = RtcArrivals(report)
        let freezeSpan = arrivals.longestGapSpan(from: connected + 500, to: connected + seconds * 1000 - 200)
        let freeze = freezeSpan.end - freezeSpan.start
        let ratio = sent > 0 ? Double(decoded) / Double(sent) : 0
        print(String(format: "%d %% loss, %@: %d of %d frames decoded (%.1f %%), longest freeze %.0f ms; NACKs %@ (%@ packets), retransmitted %@, PLIs %@ (%@ crossed a keyframe), keyframes %@, target %@ bit/s, loss seen %@, RTT %@ ms",
                     percent, scene, decoded, sent, ratio * 100, freeze, "\(stats["nacks_received"] ?? 0)", "\(stats["nacked_packets"] ?? 0)",
                     "\(stats["retransmitted_packets"] ?? 0) (+ \(stats["redundant_packets"] ?? 0) copies)", "\(stats["plis_received"] ?? 0)", "\(stats["keyframe_requests_suppressed"] ?? 0)",
                     "\(stats["keyframes_sent"] ?? 0)",
                     "\(stats["target_bitrate"] ?? 0)", "\(stats["fraction_lost"] ?? "-")", "\(stats["rtt_ms"] ?? "-")"))
        let repair = try #require(report["repair"] as? [String: Any], "aiortc's report has no repair log")
        let forgotten = repair["forgotten"] as? [Int] ?? []
        // The hole that ended the longest freeze, when aiortc had to ask for it again: its first NACK brought
        // nothing (lost on the way, or both resends were), and aiortc asks again only at a new gap.
        let holes = (repair["slow_repairs"] as? [[Any]] ?? []).map { $0.map { ($0 as? Double) ?? ($0 as? Int).map(Double.init) ?? -1 } }
        let reasked = holes.first { hole in hole.count == 4 && hole[3] >= 2 && hole[2] >= freezeSpan.start && hole[2] <= freezeSpan.end }
        let named = stats["nacked_packets"] as? Int ?? 0
        let (resentNamed, inFlight, refused) = (stats["nacked_packets_resent"] as? Int ?? 0, stats["nacked_packets_in_flight"] as? Int ?? 0,
                                                stats["nacked_packets_refused"] as? Int ?? 0)
        print(String(format: "  ours: %d packets named in NACKs: %d resent (+ %@ second copies), %d with a resend on its way, %d refused; longest pacer wait of a resend %.1f ms",
                     named, resentNamed, "\(stats["retransmissions_repeated"] ?? 0)", inFlight, refused, stats["retransmission_wait_max_ms"] as? Double ?? -1))
        print("  aiortc: \(repair["nacks_sent"] ?? 0) NACKs sent (\(stats["nacks_received"] ?? 0) reached us) naming \(repair["packets_nacked"] ?? 0) packets, \(repair["nacked_again"] ?? 0) named again; RTX received \(repair["rtx_received"] ?? 0) (\(repair["rtx_duplicates"] ?? 0) of packets it had); never arrived \(repair["nacked_never_arrived"] ?? []), of them forgotten (128 newer packets came) \(forgotten); holes that held frames over 200 ms [seq, first NACK, arrived, NACKs] \(repair["slow_repairs"] ?? []); PLIs \(repair["plis_sent"] ?? [:])")
        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")")
        #expect(report["decreasing"] as? Int == 0, "frame numbers went backwards")
        // Ours: every packet named in a NACK that reached us was resent at once (ahead of media: RTCPacerTests),
        // or a resend of it had left less than the resend window ago; none was refused (gone from the history,
        // resent 8 times, an outage-sized NACK), and each went out twice (retransmissionCopies).
        // aiortc's side of it, from its own log: every packet it asked for arrived, but for those it stopped
        // asking for (judged below) and those still asked for when the probe stopped.
        #expect(stats["retransmitted_packets"] as? Int ?? 0 > 0, "no retransmission under \(percent) % loss")
        #expect(refused == 0, "\(refused) of \(named) packets named in NACKs were not resent (gone from the history, resent 8 times, or an outage-sized NACK)")
        // aiortc re-asks for a lost packet only when it sees the next gap and hands its decoder at most one
        // frame per arriving packet. In the typing scene (one packet a frame) a lost NACK or retransmission
        // used to stall it until the next loss and leave a backlog that never drained (75–94 % decoded);
        // the publisher's loss protection (small frames sent twice once loss is reported) is what keeps it
        // decoding, so the typing case also checks that copies went out.
        // aiortc stalls up to ~3 s behind a packet it cannot get (its 512-packet buffer, then a PLI).
        #expect(arrivals.firstAfter(connected + seconds * 1000 - 4000) != nil, "decoding stopped under \(percent) % loss")
        switch (percent, scene) {
        case (5, "scrolling"):
            #expect(ratio >= 0.95, "only \(decoded) of \(sent) frames decoded under 5 % loss")
            // aiortc asks for a lost packet only when it sees a new gap and stops asking once 128 newer packets
            // came; its 512-packet jitter buffer then waits and asks for a keyframe: a 2.3-2.8 s freeze. With
            // resends sent twice a packet is forgotten when the NACKs naming it are lost on the way (5 % each)
            // and no other gap comes soon: 3 sessions in 200 (issue 26; 6 in 180 with one resend), each one
            // traced shown by aiortc's log and our RTX sequence numbers or NACK trace to be NACKs that never
            // reached the probe. That freeze is aiortc's; what is ours is judged above. Two such events in
            // one session (about 1 in 10 000 sessions by those numbers) would mean resends do not reach it;
            // packets first named by the same NACK are lost together and forgotten together: one event.
            let forgottenEvents = repair["forgotten_events"] as? Int ?? forgotten.count
            #expect(forgottenEvents <= 1, "aiortc stopped asking for \(forgotten) (first named by \(forgottenEvents) NACKs) without receiving them")
            if !forgotten.isEmpty {
                print("  aiortc forgot \(forgotten) (its NACKs never brought it): the \(Int(freeze)) ms freeze is its 512-packet wait")
            } else if let reasked, freeze > 1000 {
                print("  the \(Int(freeze)) ms freeze ended when \(Int(reasked[0])) came, which aiortc asked for again \(Int(reasked[2] - reasked[1])) ms after its first NACK")
            } else {
                // A hang guard, not a speed claim: 10x krakl-bench rtc's 500 ms freeze target (ours is judged above:
                // every NACKed packet resent, the decoded share).
                #expect(freeze <= 5000, "a freeze of \(freeze) ms under 5 % loss, with every packet aiortc asked for received at its first NACK")
            }
        case (5, _):
            #expect(stats["redundant_packets"] as? Int ?? 0 > 0, "no loss protection copies under 5 % loss")
            #expect(ratio >= 0.95, "only \(decoded) of \(sent) frames decoded under 5 % loss")
            // One packet a frame: a packet whose NACK is lost (5 %) before loss protection is on (it turns
            // off at the first clean receiver report and on at the first NACK or lossy report) waits for
            // aiortc's next gap, 0.7 s on average at 30 packets a second, over 1 s 1 time in 5: a freeze in
            // 1 of 20 test runs, before and after resends went out twice (issue 26). aiortc's log shows it.
            if let reasked, freeze > 1000 {
                print("  the \(Int(freeze)) ms freeze ended when \(Int(reasked[0])) came, which aiortc asked for again \(Int(reasked[2] - reasked[1])) ms after its first NACK")
            } else {
                // A hang guard, not a speed claim: 10x krakl-bench rtc's 500 ms freeze target (ours is judged above:
                // every NACKed packet resent, the decoded share).
                #expect(freeze <= 5000, "a freeze of \(freeze) ms under 5 % loss, with every packet aiortc asked for received at its first NACK")
            }
        default:
            #expect(ratio >= 0.85, "only \(decoded) of \(sent) frames decoded under \(percent) % loss")
            // A hang guard, not a speed claim: 10x krakl-bench rtc's 500 ms freeze target.
            #expect(freeze <= 5000, "a freeze of \(freeze) ms under \(percent) % loss")
        }
    }

    @Test func videoResumesAfterAFiveSecondOutage() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        guard try namespace.prepareFaults() else {
            skipTest("nft missing (Debian package nftables): no outage test")
            return
        }
        // Scrolling (several packets a frame): a 5 s gap then exceeds aiortc's 512-packet jitter buffer, which
        // makes it drop the gap and ask for a keyframe. With one packet a frame (typing) aiortc instead waits for
        // the packets its NACK list (capped at 128) never asks for, until 512 more arrive: ~17 s, whatever we do.
        // 20 s: 3 s before the outage, 5 s of it, and over 10 s after healing, so the 10 s hang guard below is real.
        let session = try RtcPublisherSession(namespace: namespace, seconds: 20, scene: "scrolling")
        defer { session.stop() }
        try session.exchange()
        let connected = try #require(session.waitConnected(timeout: 20), "never connected: \(session.probe.log)")
        rtcWait(untilMonotonicMs: connected + 3000)
        // The outage starts once the rule is in place: starting `nft` can take
        // hundreds of ms on a busy machine, and frames captured before then pass.
        let asked = MonotonicClock.milliseconds()
        try namespace.dropUdp(percent: 100)
        let outage = MonotonicClock.milliseconds()
        rtcWait(untilMonotonicMs: outage + 5000)
        // The rule goes away somewhere while `nft` runs: the outage surely lasts
        // until `healing`, and resumption is timed from there (the strict side).
        let healing = MonotonicClock.milliseconds()
        try namespace.heal()
        let healed = MonotonicClock.milliseconds()
        let result = try #require(session.probeResult(timeout: 40), "the probe gave no result: \(session.probe.log)")
        let report = try #require(session.receiverReport(timeout: 30), "aiortc gave no report: \(session.receiver.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let arrivals = RtcArrivals(report)
        // Judged by capture time: frames captured before the outage may still be
        // decoded during it (aiortc works through its backlog, slower on a busy machine).
        let resumed = try #require(arrivals.decodedCaptured(after: outage).first { $0 > healing }, "no frame captured after the outage began was decoded after healing")
        let resumedMs = resumed - healing
        let during = arrivals.decodedCaptured(after: outage + 300).filter { $0 < healing }.count
        print(String(format: "5 s outage (nft took %.0f ms to add the drop rule, %.0f ms to remove it): first intact frame %.0f ms after healing began; %d frames decoded during it; PLIs %@, keyframes %@, status %@",
                     outage - asked, healed - healing, resumedMs, during, "\(stats["plis_received"] ?? 0)", "\(stats["keyframes_sent"] ?? 0)", "\(result["result"] ?? "?")"))
        #expect(during == 0, "frames captured during a total outage were decoded before it ended: the fault did not apply")
        #expect(resumedMs <= 10_000, "a hang guard (10x the 1 s target): video resumed \(resumedMs) ms after the network healed")
        #expect(stats["keyframes_sent"] as? Int ?? 0 >= 2, "no keyframe repaired the picture after the outage")
        #expect(result["status"] as? Int == 0, "a 5 s outage must not end the session: \(result["result"] ?? "?")")
        #expect(report["decreasing"] as? Int == 0, "frame numbers went backwards")
    }

    @Test func aBandwidthLimitLowersTheTarget() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        let tc = "/usr/sbin/tc"
        guard FileManager.default.isExecutableFile(atPath: tc) else {
            skipTest("tc missing (iproute2): no bandwidth-limit test")
            return
        }
        let seconds = 15.0
        let session = try RtcPublisherSession(namespace: namespace, seconds: seconds, scene: "scrolling")
        defer { session.stop() }
        try session.exchange()
        let connected = try #require(session.waitConnected(timeout: 20), "never connected: \(session.probe.log)")
        rtcWait(untilMonotonicMs: connected + 3000)
        // Every packet in the namespace crosses lo: a token bucket there is the bottleneck link.
        let limit = try namespace.run(tc, ["qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit", "burst", "32kbit", "latency", "300ms"])
        guard limit.status == 0 else {
            skipTest("tc tbf unavailable here: \(limit.stderr)")
            return
        }
        let result = try #require(session.probeResult(timeout: seconds + 30), "the probe gave no result: \(session.probe.log)")
        let report = try #require(session.receiverReport(timeout: 30), "aiortc gave no report: \(session.receiver.log)")
        let stats = try #require(result["stats"] as? [String: Any])
        let target = stats["target_bitrate"] as? Double ?? .infinity
        let arrivals = RtcArrivals(report)
        let end = connected + seconds * 1000
        let lateFrames = arrivals.times.filter { $0 > end - 3000 && $0 < end }.count
        print(String(format: "1 Mbit/s bottleneck from 3 s: target %.0f kbit/s at the end (loss-based %.0f, REMB %@), RTT %@ ms, loss %@; %@ of %@ frames decoded, %d in the last 3 s, longest freeze after the limit %.0f ms; keyframes %@, PLIs %@",
                     target / 1000, (stats["loss_based_bitrate"] as? Double ?? 0) / 1000, "\(stats["remb_bitrate"] ?? "-")",
                     "\(stats["rtt_ms"] ?? "-")", "\(stats["fraction_lost"] ?? "-")", "\(report["frames_decoded"] ?? 0)",
                     "\(stats["frames_sent"] ?? 0)", lateFrames, arrivals.longestGap(from: connected + 3000, to: end - 200),
                     "\(stats["keyframes_sent"] ?? 0)", "\(stats["plis_received"] ?? 0)"))
        #expect(result["status"] as? Int == 0, "probe: \(result["result"] ?? "?")")
        #expect(target < 1_000_000, "the target stayed at \(target) bit/s over a 1 Mbit/s link")
        #expect(stats["bitrate_updates"] as? Int ?? 0 >= 2, "the encoder was never told a new bitrate")
        // Frames still flow behind the bottleneck (at least one in the last 3 s, not a rate).
        #expect(lateFrames > 0, "no frame decoded in the last 3 s behind the bottleneck")
    }

    @Test func consentExpiresAfterThirtySecondsOfSilence() throws {
        guard RtcPublisherSession.prerequisites(), let namespace = try RtcTestNamespace() else { return }
        guard try namespace.prepareFaults() else {
            skipTest("nft missing (Debian package nftables): no consent test")
            return
        }
        // Long enough for the hang guard below (10x the 30 s timer); the probe ends at connection lost.
        let session = try RtcPublisherSession(namespace: namespace, seconds: 330)
        defer { session.stop() }
        try session.exchange()
        let connected = try #require(session.waitConnected(timeout: 20), "never connected: \(session.probe.log)")
        rtcWait(untilMonotonicMs: connected + 2000)
        try namespace.dropUdp(percent: 100)
        let outage = MonotonicClock.milliseconds()  // once the rule is in place
        let result = try #require(session.probeResult(timeout: 320), "the probe gave no result: \(session.probe.log)")
        let events = result["events"] as? [[String: Any]] ?? []
        let lost = try #require(events.first { $0["event"] as? String == "connection_lost" }, "no connection_lost event: \(events)")
        let after = (lost["t_ms"] as? Double ?? 0) - outage
        print(String(format: "consent: connection lost %.1f s after the outage began (%@)", after / 1000, "\(lost["reason"] ?? "")"))
        #expect(result["status"] as? Int == 4, "the probe must end with connection lost (4)")
        // RFC 7675: consent expires 30 s after the last answer, which came 0-6 s before the outage (less
        // the time `nft` took): not before ~24 s, a protocol fact judged with 1 s of slack. The upper bound
        // is only a hang guard (10x the 30 s timer; a session that never expires ends with status 0).
        #expect(after >= 23_000, "connection lost \(after) ms after the outage began: consent expired early")
        #expect(after <= 300_000, "a hang guard (10x the 30 s timer): connection lost \(after) ms after the outage began")
    }
}
