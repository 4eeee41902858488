// krakl-rtc-probe: a test-only way to run the WebRTC publisher against a
// given SDP answer, before the room drivers exist (issue 6 item 8).
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
import Foundation
import KraklBackendABI
import KraklCore
import KraklEncoder
import KraklRTC

let usage = """
usage: krakl-rtc-probe [--address IP]... [--allow-loopback] [--no-ipv6] [--stun HOST:PORT]
                       [--answer FILE] [--seconds N] [--connect-timeout S]
                       [--backend NAME] [--plugins FILE] [--option key=value]...
                       [--bitrate KBPS] [--min-bitrate KBPS] [--max-bitrate KBPS]
                       [--fps N] [--max-size WxH] [--dump-input FILE] [--vp9-first]
"""

func fail(_ message: String, status: Int32) -> Never {
    fputs("krakl-rtc-probe: \(message)\n", stderr)
    exit(status)
}

/// CLOCK_MONOTONIC in ms, the clock the frame stamp and the aiortc receiver's time.monotonic() use.
func monotonicMilliseconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1e6
}

func emit(_ object: [String: Any], to stream: UnsafeMutablePointer<FILE>) {
    guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return }
    fputs(String(decoding: data, as: UTF8.self) + "\n", stream)
    fflush(stream)
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
var encoderSettings = EncoderSettings()
var dumpInput: String?
do {
    var arguments = Array(CommandLine.arguments.dropFirst())
    func value(_ flag: String) -> String {
        guard !arguments.isEmpty else { fail("\(flag) needs a value\n\(usage)", status: 2) }
        return arguments.removeFirst()
    }
    func number(_ flag: String) -> Double {
        let text = value(flag)
        guard let n = Double(text), n >= 0 else { fail("\(flag) \(text) is not a non-negative number", status: 2) }
        return n
    }
    while !arguments.isEmpty {
        let flag = arguments.removeFirst()
        switch flag {
        case "--address":
            let text = value(flag)
            guard let ip = IPAddress(text) else { fail("--address \(text) is not an IP address", status: 2) }
            allowed.append(ip)
        case "--allow-loopback": configuration.addresses.includeLoopback = true
        case "--no-ipv6": configuration.addresses.includeIPv6 = false
        case "--stun":
            let text = value(flag)
            guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]),
                  let ip = IPAddress(String(text[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))) else {
                fail("--stun \(text) is not IP:PORT", status: 2)
            }
            configuration.stunServers.append(TransportAddress(ip: ip, port: port))
        case "--answer": answerPath = value(flag)
        case "--seconds": seconds = number(flag)
        case "--connect-timeout": connectTimeout = number(flag)
        case "--backend": backendName = value(flag)
        case "--plugins": pluginsPath = value(flag)
        case "--option":
            do throws(AgentError) { options.append(try parseOptionAssignment(value(flag))) } catch { fail("\(error)", status: 2) }
        case "--bitrate":
            encoderSettings.bitrateKbps = Int(number(flag))
            configuration.startBitrate = Double(encoderSettings.bitrateKbps) * 1000
        case "--min-bitrate": configuration.minimumBitrate = number(flag) * 1000
        case "--max-bitrate": configuration.maximumBitrate = number(flag) * 1000
        case "--fps": encoderSettings.maximumFps = number(flag)
        case "--max-size":
            let parts = value(flag).split(separator: "x").compactMap { Int($0) }
            guard parts.count == 2 else { fail("--max-size needs WxH", status: 2) }
            encoderSettings.maximumSize = (parts[0], parts[1])
        case "--dump-input": dumpInput = value(flag)
        case "--vp9-first": configuration.codecs = [.vp9, .vp8]
        case "--help", "-h":
            print(usage)
            exit(0)
        default:
            fail("unknown argument \(flag)\n\(usage)", status: 2)
        }
    }
}
if !allowed.isEmpty { configuration.addresses.allowed = allowed }
configuration.maximumBitrate = max(configuration.maximumBitrate, configuration.minimumBitrate)
configuration.startBitrate = min(max(configuration.startBitrate, configuration.minimumBitrate), configuration.maximumBitrate)

// MARK: offer and answer

/// What the network thread reported, for the main thread to wait on.
final class EventLog: @unchecked Sendable {
    let condition = NSCondition()
    var connected = false
    var ended: (status: Int32, reason: String)?
    var events: [[String: Any]] = []

    func record(_ event: PublisherEvent) {
        var object: [String: Any] = ["t_ms": monotonicMilliseconds()]
        condition.lock()
        switch event {
        case .connected(let ms):
            object["event"] = "connected"
            object["connect_ms"] = ms
            connected = true
        case .connectionLost(let reason):
            object["event"] = "connection_lost"
            object["reason"] = reason
            if ended == nil { ended = (4, "connection lost: \(reason)") }
        case .remoteClosed:
            object["event"] = "remote_closed"
            if ended == nil { ended = (0, "the peer closed the connection (DTLS close_notify)") }
        case .remoteBye(let reason):
            object["event"] = "remote_bye"
            object["reason"] = reason
            if ended == nil { ended = (0, "the peer ended the session (RTCP BYE\(reason.map { ": \($0)" } ?? ""))") }
        case .failed(let reason):
            object["event"] = "failed"
            object["reason"] = reason
            if ended == nil { ended = (connected ? 4 : 3, "failed: \(reason)") }
        case .localCandidate(let candidate):
            object["event"] = "local_candidate"
            object["candidate"] = candidate.sdpValue
        }
        events.append(object)
        condition.broadcast()
        condition.unlock()
        emit(object, to: stderr)
    }

    /// Waits until `done` holds or `deadline` passes.
    func wait(until deadline: Date, _ done: () -> Bool) {
        condition.lock()
        defer { condition.unlock() }
        _ = condition.wait(while: { !done() }, until: deadline)
    }
}

let log = EventLog()
let publisher: Publisher
do {
    publisher = try Publisher(configuration: configuration)
} catch {
    fail("cannot start the publisher: \(error)", status: 3)
}
publisher.onEvent = { log.record($0) }
print(publisher.offerSDP)
fflush(stdout)

var answerText = ""
if let answerPath {
    guard let text = try? String(contentsOfFile: answerPath, encoding: .utf8) else { fail("cannot read \(answerPath)", status: 2) }
    answerText = text
} else {
    while let line = readLine(strippingNewline: true) {
        if line.trimmingCharacters(in: .whitespaces).isEmpty { if answerText.isEmpty { continue } else { break } }
        answerText += line + "\r\n"
    }
}

/// Set once the encoder starts; read by finalReport.
nonisolated(unsafe) var publisherSink: PublisherSink?

func finalReport(result: String, status: Int32, encoder: EncoderStatistics.Summary?) -> Never {
    var object: [String: Any] = ["result": result, "status": Int(status), "stats": publisher.stats.dictionary]
    log.condition.lock()
    object["events"] = log.events
    log.condition.unlock()
    if let e = encoder {
        let waits = publisherSink?.captureToEncodedMs.sorted() ?? []
        func percentile(_ p: Double) -> Double { waits.nearestRank(p) ?? 0 }
        object["encoder"] = ["frames": e.frames, "keyframes": e.keyframes, "bytes": e.bytes, "bitrate_kbps": e.bitrateKbps,
                             "dropped_frames": e.droppedFrames, "encode_ms_p50": e.encodeMs.p50, "encode_ms_p99": e.encodeMs.p99,
                             "capture_to_encoded_ms_p50": percentile(0.5), "capture_to_encoded_ms_p99": percentile(0.99)]
    }
    emit(object, to: stdout)
    exit(status)
}

let answer: SdpAnswer
do {
    answer = try publisher.setAnswer(answerText)
} catch {
    publisher.close()
    fail("the answer is not usable: \(error)", status: 2)
}

// MARK: connect

log.wait(until: Date().addingTimeInterval(connectTimeout)) { log.connected || log.ended != nil }
log.condition.lock()
let connected = log.connected, early = log.ended
log.condition.unlock()
guard connected else {
    publisher.close()
    let reason = early?.reason ?? "not connected within \(connectTimeout) s"
    fputs("krakl-rtc-probe: \(reason)\n", stderr)
    finalReport(result: reason, status: 3, encoder: nil)
}

// MARK: capture → encoder → publisher

/// The encoder's output goes to the publisher instead of a file.
final class PublisherSink: EncodedFrameSink, @unchecked Sendable {
    let publisher: Publisher
    private let lock = NSLock()
    /// Capture → encoded, ms, a frame each: the part of the end-to-end latency spent before the publisher.
    private var encodedAfterMs: [Double] = []
    init(_ publisher: Publisher) { self.publisher = publisher }
    var captureToEncodedMs: [Double] { lock.withLock { encodedAfterMs } }
    func write(_ frame: EncodedFrame) throws(EncoderError) {
        let waited = monotonicMilliseconds() - Double(frame.timestampNs) / 1e6
        lock.withLock { encodedAfterMs.append(waited) }
        publisher.send(frame: frame.data, keyframe: frame.keyframe, captureNanoseconds: frame.timestampNs,
                       width: frame.width, height: frame.height)
    }
    func finish() throws(EncoderError) {}
}

/// Frames from the backend's thread into the encoder.
final class CaptureSink: FrameSink, @unchecked Sendable {
    var pipeline: EncoderPipeline?
    let condition = NSCondition()
    var problem: String?
    private var submitted = false
    /// True once a frame reached the encoder. EncoderPipeline traps (NSCondition.wait(until:) on an
    /// underflowed deadline in takeWork) when a keyframe is requested before its first frame, so
    /// requests wait for this; the first encoded frame is a keyframe anyway.
    var hasSubmitted: Bool { condition.lock(); defer { condition.unlock() }; return submitted }
    func frame(_ pointer: UnsafePointer<krakl_frame>) {
        let info = FrameInfo(pointer)
        guard FrameCheck.geometryProblem(pointer) == nil, FrameCheck.damageProblem(info) == nil else { return }
        pipeline?.submit(info)
        condition.lock()
        submitted = true
        condition.unlock()
    }
    func event(_ event: SourceEvent) {
        guard event.kind == .sourceEnded || event.kind == .error else { return }
        condition.lock()
        if problem == nil { problem = event.message ?? "the source ended" }
        condition.unlock()
    }
}

encoderSettings.codec = answer.codec == .vp9 ? .vp9 : .vp8
let capture = CaptureSink()
let pipeline: EncoderPipeline
let source: BackendSource
do {
    pipeline = try EncoderPipeline(settings: encoderSettings, dumpInput: dumpInput, output: { _, _, _ in
        let sink = PublisherSink(publisher)
        publisherSink = sink
        return sink
    },
                                   onFailure: { error in log.record(.failed("encoder: \(error.message)")) })
    capture.pipeline = pipeline
    let registry = try PluginRegistry.load(path: pluginsPath ?? PluginRegistry.defaultPath())
    let entry = try registry.entry(named: backendName ?? registry.defaultBackend)
    var backendOptions = entry.options
    for (key, value) in options { backendOptions[key] = value }
    let library = try BackendLibrary.load(path: entry.library, backend: entry.name)
    source = try BackendSource(library: library, backendName: entry.name, options: backendOptions, sink: capture,
                               logger: stderrLogger(maximum: .warning))
} catch {
    publisher.close()
    fputs("krakl-rtc-probe: capture set-up failed: \(error)\n", stderr)
    finalReport(result: "capture set-up failed: \(error)", status: 5, encoder: nil)
}
publisher.onKeyframeRequest = { if capture.hasSubmitted { pipeline.requestKeyframe() } }
publisher.onBitrate = { bps in pipeline.setBitrate(kbps: max(bps / 1000, 1)) }
pipeline.start()
do {
    try source.start()
} catch {
    pipeline.finish()
    publisher.close()
    finalReport(result: "capture did not start: \(error)", status: 5, encoder: nil)
}

// MARK: run

let end = Date().addingTimeInterval(seconds)
var result = "ran \(seconds) s"
var status: Int32 = 0
while Date() < end {
    log.wait(until: min(end, Date().addingTimeInterval(1))) { log.ended != nil }
    log.condition.lock()
    let ended = log.ended
    log.condition.unlock()
    if let ended {
        result = ended.reason
        status = ended.status
        break
    }
    let s = publisher.stats
    emit(["t_ms": monotonicMilliseconds(), "frames_sent": s.framesSent, "packets_sent": s.packetsSent,
          "bytes_sent": s.bytesSent, "retransmitted_bytes": s.retransmittedBytes, "redundant_bytes": s.redundantBytes,
          "target_bitrate": s.targetBitrate,
          "rtt_ms": s.roundTripMilliseconds ?? -1, "fraction_lost": s.fractionLost ?? -1,
          "nacks": s.nacksReceived, "plis": s.plisReceived, "keyframes": s.keyframesSent], to: stderr)
}
_ = source.stop()
source.destroy()
pipeline.finish()
publisher.close()
finalReport(result: result, status: status, encoder: pipeline.statistics.summary())
