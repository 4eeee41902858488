// krakl-rtc-probe: a test-only way to run a sharing session against a given
// SDP answer instead of a room server (tests and krakl-bench rtc). It is a
// command line over SharingSession with a "room driver" that is this
// process's stdin and stdout.
//
// Prints the offer SDP on stdout followed by an empty line, reads the answer
// (stdin up to an empty line or its end, or --answer FILE), connects,
// captures a backend (the file backend's pattern scenes by default) through
// the encoder into the publisher for --seconds after connecting, then
// prints one line of JSON: {"result": ..., "stats": {...}, "encoder": {...}}.
// Events go to stderr as JSON lines as they happen.
//
// Exit status: 0 ran to the end (or the peer closed), 2 bad usage or
// answer, 3 failed to connect (ICE, DTLS: e.g. a wrong fingerprint),
// 4 connection lost (consent expired), 5 capture or encoder failure.
import Dispatch
import FoundationEssentials
import Glibc
import KraklBackendABI
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklRoom
import KraklSession
import Synchronization

let usage = """
usage: krakl-rtc-probe [--address IP]... [--allow-loopback] [--no-ipv6] [--stun HOST:PORT]
                       [--turn IP:PORT,USER,PASSWORD]... [--ice-server URL[,USER,PASSWORD]]... [--relay-only] [--ice-ca FILE]
                       [--answer FILE] [--seconds N] [--connect-timeout S]
                       [--backend NAME] [--plugins FILE] [--option key=value]...
                       [--bitrate KBPS] [--min-bitrate KBPS] [--max-bitrate KBPS]
                       [--fps N] [--max-size WxH] [--dump-input FILE] [--vp9-first]
                       [--startup-probe-ceiling BITS_PER_SECOND (0: off)] [--refresh S (0: off, the default)]
                       [--retransmission-copies N (copies of each NACKed packet; 2 by default)]
                       [--media-at-connect (capture and encoding start when ICE+DTLS are up, not at the answer)]
"""

/// The probe's exit statuses (the comment at the top says when each comes).
enum ProbeExit {
    static let ranToTheEnd: Int32 = 0
    static let badUsageOrAnswer: Int32 = 2
    static let connectFailed: Int32 = 3
    static let connectionLost: Int32 = 4
    static let captureOrEncoderFailed: Int32 = 5
}

func fail(_ message: String, status: Int32) -> Never {
    StandardStream.error("krakl-rtc-probe: \(message)\n")
    exit(status)
}

/// One JSON line to stdout (the report) or stderr (events), flushed at once for the reader.
func emit(_ object: [String: Any], toError: Bool = false) {
    guard let text = try? JSONText.serialize(object, options: [.sortedKeys]) else { return }
    let line = text + "\n"
    if toError {
        StandardStream.error(line)
    } else {
        print(line, terminator: "")
        StandardStream.flushOutput()
    }
}

// MARK: arguments

var configuration = PublisherConfiguration()
var allowed: [IPAddress] = []
var answerPath: String?
var seconds = 5.0
var connectTimeout = 10.0
var backendName: String?
var pluginsPath: String?
var options: [(String, JSON)] = []
var encoderSettings = SharingConfiguration().encoder
var dumpInput: String?
var mediaAtConnect = false
var iceServers: [IceServer] = []
do {
    var arguments = Array(CommandLine.arguments.dropFirst())
    func value(_ flag: String) -> String {
        guard !arguments.isEmpty else { fail("\(flag) needs a value\n\(usage)", status: ProbeExit.badUsageOrAnswer) }
        return arguments.removeFirst()
    }
    func number(_ flag: String) -> Double {
        let text = value(flag)
        guard let n = Double(text), n >= 0 else { fail("\(flag) \(text) is not a non-negative number", status: ProbeExit.badUsageOrAnswer) }
        return n
    }
    while !arguments.isEmpty {
        let flag = arguments.removeFirst()
        switch flag {
        case "--address":
            let text = value(flag)
            guard let ip = IPAddress(text) else { fail("--address \(text) is not an IP address", status: ProbeExit.badUsageOrAnswer) }
            allowed.append(ip)
        case "--allow-loopback": configuration.addresses.includeLoopback = true
        case "--no-ipv6": configuration.addresses.includeIPv6 = false
        case "--stun":
            let text = value(flag)
            guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]),
                  let ip = IPAddress(String(text[..<colon]).trimming(where: { $0 == "[" || $0 == "]" })) else {
                fail("--stun \(text) is not IP:PORT", status: ProbeExit.badUsageOrAnswer)
            }
            configuration.stunServers.append(TransportAddress(ip: ip, port: port))
        case "--turn":
            // IP:PORT,USER,PASSWORD (a test tool: the password is on the command line).
            let text = value(flag)
            let parts = text.split(separator: ",", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
            guard parts.count == 3, let colon = parts[0].lastIndex(of: ":"), let port = UInt16(parts[0][parts[0].index(after: colon)...]),
                  let ip = IPAddress(String(parts[0][..<colon]).trimming(where: { $0 == "[" || $0 == "]" })) else {
                fail("--turn wants IP:PORT,USER,PASSWORD", status: ProbeExit.badUsageOrAnswer)
            }
            configuration.turnServers.append(TurnServer(address: TransportAddress(ip: ip, port: port), username: parts[1], password: parts[2]))
        case "--ice-server":
            // stun:/turn: URL by address or name: the session resolves it when joining.
            let parts = value(flag).split(separator: ",", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
            iceServers.append(IceServer(url: parts[0], username: parts.count > 1 ? parts[1] : nil, credential: parts.count > 2 ? parts[2] : nil))
        case "--relay-only": configuration.relayOnly = true
        case "--ice-ca": configuration.turnCAFile = value(flag)
        case "--answer": answerPath = value(flag)
        case "--seconds": seconds = number(flag)
        case "--connect-timeout": connectTimeout = number(flag)
        case "--backend": backendName = value(flag)
        case "--plugins": pluginsPath = value(flag)
        case "--option":
            do throws(HostError) { options.append(try parseOptionAssignment(value(flag))) } catch { fail("\(error)", status: ProbeExit.badUsageOrAnswer) }
        case "--bitrate":
            encoderSettings.bitrateKbps = Int(number(flag))
            configuration.startBitrate = Double(encoderSettings.bitrateKbps) * 1000
        case "--min-bitrate": configuration.minimumBitrate = number(flag) * 1000
        case "--max-bitrate": configuration.maximumBitrate = number(flag) * 1000
        case "--fps": encoderSettings.maximumFps = number(flag)
        case "--max-size":
            let parts = value(flag).split(separator: "x").compactMap { Int($0) }
            guard parts.count == 2 else { fail("--max-size needs WxH", status: ProbeExit.badUsageOrAnswer) }
            encoderSettings.maximumSize = (parts[0], parts[1])
        case "--dump-input": dumpInput = value(flag)
        case "--vp9-first": configuration.codecs = [.vp9, .vp8]
        case "--startup-probe-ceiling": configuration.startupProbeCeiling = number(flag)
        case "--retransmission-copies": configuration.retransmissionCopies = Int(number(flag))
        case "--refresh": encoderSettings.refreshInterval = .seconds(number(flag))
        case "--media-at-connect": mediaAtConnect = true
        case "--help", "-h":
            print(usage)
            exit(0)
        default:
            fail("unknown argument \(flag)\n\(usage)", status: ProbeExit.badUsageOrAnswer)
        }
    }
}
if !allowed.isEmpty { configuration.addresses.allowed = allowed }
configuration.maximumBitrate = max(configuration.maximumBitrate, configuration.minimumBitrate)
configuration.startBitrate = min(max(configuration.startBitrate, configuration.minimumBitrate), configuration.maximumBitrate)

// MARK: the answer comes from stdin (or --answer FILE)

/// The room driver of the probe: prints the offer and an empty line on stdout and reads the answer.
final class StdioSignalling: RoomDriver, Sendable {
    let service = "stdio"
    /// The session sets it before it starts; the probe itself never calls it.
    var onEvent: (@Sendable (RoomEvent) -> Void)? {
        get { eventHandler.wrappedValue }
        set { eventHandler.wrappedValue = newValue }
    }
    private let eventHandler = Locked<(@Sendable (RoomEvent) -> Void)?>(wrappedValue: nil)
    let answerPath: String?
    init(answerPath: String?) { self.answerPath = answerPath }

    func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
        print(offer)
        StandardStream.flushOutput()
        if let answerPath {
            guard let text = try? String(contentsOfFile: answerPath, encoding: .utf8) else { throw .badReply("cannot read \(answerPath)") }
            return RoomAnswer(sdp: text)
        }
        var text = ""
        while let line = readLine(strippingNewline: true) {
            if line.trimmingSpaces().isEmpty { if text.isEmpty { continue } else { break } }
            text += line + "\r\n"
        }
        return RoomAnswer(sdp: text)
    }
    func restart(offer: String) throws(RoomError) -> String { throw .restartUnsupported("the probe has no signalling for a restart") }
    func trickle(candidate: String, mid: String) {}
    func leave() {}
}

/// What the publisher reported, as JSON lines on stderr and for the final report (the publisher's
/// events come on its network thread).
final class EventLog: Sendable {
    struct Record {
        var connected = false
        /// The end the publisher itself reported (status, words), if it did.
        var ended: (status: Int32, reason: String)?
        var events: [[String: any Sendable]] = []
    }
    let state = Guarded(Record())

    func record(_ event: PublisherEvent) {
        var object: [String: any Sendable] = ["t_ms": MonotonicClock.milliseconds()]
        state.withLock { log in
            switch event {
            case .connected(let ms):
                object["event"] = "connected"
                object["connect_ms"] = ms
                log.connected = true
            case .connectionLost(let reason):
                object["event"] = "connection_lost"
                object["reason"] = reason
                if log.ended == nil { log.ended = (ProbeExit.connectionLost, "connection lost: \(reason)") }
            case .remoteClosed:
                object["event"] = "remote_closed"
                if log.ended == nil { log.ended = (ProbeExit.ranToTheEnd, "the peer closed the connection (DTLS close_notify)") }
            case .remoteBye(let reason):
                object["event"] = "remote_bye"
                object["reason"] = reason
                if log.ended == nil { log.ended = (ProbeExit.ranToTheEnd, "the peer ended the session (RTCP BYE\(reason.map { ": \($0)" } ?? ""))") }
            case .failed(let reason), .relayRefused(_, let reason):
                // A relay's refusal is a failure to connect for the probe (3); its kind is in the event.
                object["event"] = "failed"
                object["reason"] = reason
                if case .relayRefused(let refusal, _) = event { object["relay_refused"] = refusal.rawValue }
                if log.ended == nil { log.ended = (log.connected ? ProbeExit.connectionLost : ProbeExit.connectFailed, "failed: \(reason)") }
            case .localCandidate(let candidate):
                object["event"] = "local_candidate"
                object["candidate"] = candidate.sdpValue
            }
            log.events.append(object)
        }
        emit(object, toError: true)
    }
}

var sessionConfiguration = SharingConfiguration()
sessionConfiguration.registryPath = pluginsPath
sessionConfiguration.backendName = backendName
sessionConfiguration.backendOptions = options.map { (key: $0.0, value: $0.1) }
sessionConfiguration.encoder = encoderSettings
sessionConfiguration.publisher = configuration
sessionConfiguration.connectTimeout = .seconds(connectTimeout)
sessionConfiguration.dumpInput = dumpInput
sessionConfiguration.mediaStartsAtAnswer = !mediaAtConnect
sessionConfiguration.iceServers = iceServers

let log = EventLog()
let session = SharingSession(configuration: sessionConfiguration, driver: StdioSignalling(answerPath: answerPath),
                             identity: "krakl-rtc-probe", room: nil, logger: stderrLogger(maximum: .warning))
session.onPublisherEvent = { log.record($0) }
let sharing = DispatchSemaphore(value: 0)
session.onStateChange = { state in if state == .sharing { sharing.signal() } }
do { try KraklRTC.prepare() } catch { fail("the WebRTC stack cannot start: \(error)", status: ProbeExit.connectFailed) }
do { try session.start() } catch { fail("cannot start the session: \(error)", status: ProbeExit.captureOrEncoderFailed) }

// MARK: run --seconds after connecting, with a status line a second

/// Set when --seconds ran out (the session was stopped for that reason).
let timeUp = Atomic<Bool>(false)
while sharing.wait(timeout: .now() + 0.2) == .timedOut {
    if session.waitUntilFinished(timeout: .zero) != nil { break }
}
if session.state == .sharing {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end, session.waitUntilFinished(timeout: .seconds(min(1, end.timeIntervalSinceNow))) == nil {
        guard let s = session.status(window: false).rtc else { continue }
        emit(["t_ms": MonotonicClock.milliseconds(), "frames_sent": s.framesSent, "packets_sent": s.packetsSent,
              "bytes_sent": s.bytesSent, "retransmitted_bytes": s.retransmittedBytes, "redundant_bytes": s.redundantBytes,
              "target_bitrate": s.targetBitrate,
              "rtt_ms": s.roundTripMilliseconds ?? -1, "fraction_lost": s.fractionLost ?? -1,
              "nacks": s.nacksReceived, "plis": s.plisReceived, "keyframes": s.keyframesSent], toError: true)
    }
    if session.waitUntilFinished(timeout: .zero) == nil {
        timeUp.store(true, ordering: .relaxed)
        session.stop()
    }
}
let reason = session.waitUntilFinished(timeout: .seconds(30)) ?? .failure("the session did not end within 30 s of being stopped")

// MARK: the final report

/// The exit status (`ProbeExit`) and the result in words.
@MainActor func outcome(_ reason: EndReason) -> (status: Int32, result: String) {
    let (ended, connected) = log.state.withLock { ($0.ended, $0.connected) }
    if let ended, !timeUp.load(ordering: .relaxed) { return (ended.status, ended.reason) }
    switch reason {
    case .userStopped: return (ProbeExit.ranToTheEnd, "ran \(seconds) s")
    case .joinRefused(let error): return (ProbeExit.badUsageOrAnswer, "the answer is not usable: \(error)")
    case .connectionLost(let words), .relayRefused(_, let words): return (connected ? ProbeExit.connectionLost : ProbeExit.connectFailed, words)
    case .roomEnded(let words), .replaced(let words): return (ProbeExit.ranToTheEnd, words)
    case .sourceUnavailable(let error): return (ProbeExit.captureOrEncoderFailed, "capture set-up failed: \(error)")
    case .sourceEnded(let words): return (ProbeExit.captureOrEncoderFailed, "the source ended: \(words)")
    case .tokenExpired(let words), .failure(let words): return (ProbeExit.captureOrEncoderFailed, words)
    }
}

let (status, result) = outcome(reason)
if status == ProbeExit.badUsageOrAnswer || status == ProbeExit.connectFailed { StandardStream.error("krakl-rtc-probe: \(result)\n") }
let totals = session.totals
var report: [String: Any] = ["result": result, "status": Int(status), "stats": totals.rtc?.dictionary ?? [:]]
report["events"] = log.state.withLock { $0.events }
if let e = totals.encoder {
    let waits = totals.captureToEncodedMs.sorted()
    func percentile(_ p: Double) -> Double { waits.nearestRank(p) ?? 0 }
    report["encoder"] = ["frames": e.frames, "keyframes": e.keyframes, "bytes": e.bytes, "bitrate_kbps": e.bitrateKbps,
                         "dropped_frames": e.droppedFrames, "encode_ms_p50": e.encodeMs.p50, "encode_ms_p99": e.encodeMs.p99,
                         "capture_to_encoded_ms_p50": percentile(0.5), "capture_to_encoded_ms_p99": percentile(0.99)]
}
emit(report)
exit(status)
