import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklRoom
import KraklViewer

/// One command-line flag: its names, the name of its value in `--help` (nil: a switch), where
/// `--help` lists it and its lines there, and what it sets. The table below is the one place a
/// flag is declared: `Arguments.init` parses with it, `--help`'s OPTIONS and ENCODER OPTIONS are
/// printed from it (the man page is made from `--help`), and BadInputTests checks that every flag
/// `--help` names is in it and every flag in it is told there.
struct Flag: Sendable {
    enum Section: Sendable {
        /// Printed under OPTIONS, or ENCODER OPTIONS.
        case options, encoder
        /// Told in USAGE or COMMANDS (`--join`, `--scan`, …): its lines are there.
        case commands
        /// Not for people (`--run-group`: conformance's child processes).
        case hidden
    }

    /// As `--help` shows them: the short name first (`-b`, `--backend`).
    let names: [String]
    let value: String?
    let section: Section
    /// Its description in `--help`, pre-wrapped: printed from column 27 (after the names and value).
    let help: [String]
    /// The value may be left out (`--camera [NAME]`): the next word is taken only when it is not a flag or a command.
    var optionalValue = false
    /// `--help` and `--version`: nothing after them is read.
    var ends = false
    /// Throws HostError (`.usage`, `.invalidOption`): closures cannot yet say so in their type.
    let apply: @Sendable (inout Arguments, inout Arguments.Given, String) throws -> Void

    init(_ names: [String], _ value: String? = nil, _ section: Section, _ help: [String] = [], optionalValue: Bool = false, ends: Bool = false,
         _ apply: @escaping @Sendable (inout Arguments, inout Arguments.Given, String) throws -> Void) {
        self.names = names
        self.value = value
        self.section = section
        self.help = help
        self.optionalValue = optionalValue
        self.ends = ends
        self.apply = apply
    }

    /// The flag's lines in `--help`: names and value, padded to column 27, then the description;
    /// names too long for that column have the description on the lines below.
    var helpText: String {
        let short = names.first { !$0.hasPrefix("--") }
        let long = names.first { $0.hasPrefix("--") } ?? names[0]
        let head = "  " + (short.map { "\($0), " } ?? "    ") + long + (value.map { " " + $0 } ?? "")
        let indent = String(repeating: " ", count: 26)
        var lines: [String]
        if head.count <= 24, let first = help.first {
            lines = [head.padded(to: 26) + first] + help.dropFirst().map { indent + $0 }
        } else {
            lines = [head] + help.map { indent + $0 }
        }
        return lines.joined(separator: "\n")
    }
}

extension Arguments {
    /// What two flags decide together, known only once all are read (`--listen` and `--viewer-port`).
    struct Given {
        var listen: (host: String, port: UInt16?)?
        var viewerPort: UInt16?
    }

    /// A number in a range, or a usage error that says what to give (a bounded range also refuses
    /// "inf" and "nan", which Double reads).
    private static func number<T: LosslessStringConvertible & Comparable>(_ text: String, _ flag: String, in range: ClosedRange<T>,
                                                                          _ give: String) throws(HostError) -> T {
        guard let n = T(text), range.contains(n) else { throw HostError.usage("\(flag) \(text): \(give)") }
        return n
    }

    /// Every flag, in `--help`'s order.
    static let flags: [Flag] = [
        // Told in USAGE and COMMANDS.
        Flag(["-j", "--join"], "CODE", .commands) { a, _, v in a.join = JoinCodeSource(v) },
        Flag(["--qr"], "IMAGE", .commands) { a, _, v in a.qr = v },
        Flag(["--scan"], nil, .commands) { a, _, _ in a.scan = true },
        Flag(["--camera"], "[NAME]", .commands, optionalValue: true) { a, _, v in
            a.scan = true
            a.camera = v
        },
        Flag(["--preview"], nil, .commands) { a, _, _ in a.preview = true },
        Flag(["--scan-only"], nil, .commands) { a, _, _ in a.scanOnly = true },
        Flag(["--scan-timeout"], "S", .commands) { a, _, v in
            a.scanTimeout = try number(v, "--scan-timeout", in: 1.0...3600.0, "give seconds from 1 to 3600")
        },
        Flag(["--cameras"], nil, .commands) { a, _, _ in a.cameras = true },
        Flag(["--run-group"], "GROUP", .hidden) { a, _, v in a.conformanceGroup = v },

        Flag(["-b", "--backend"], "NAME", .options, [
            "Backend to use. Default: plugins.json's \"default\" if it names one,",
            "else the screen's: pipewire on a Wayland session ($WAYLAND_DISPLAY),",
            "x11 when $DISPLAY is set, else file (a test pattern, said so);",
            "the same for --join, home, connect, --scan and the viewer.",
        ]) { a, _, v in a.backend = v },
        Flag(["--plugins"], "FILE", .options, [
            "Backend registry (default: $KRAKL_PLUGINS, ./plugins.json,",
            "or plugins.json next to the executable or up to 4 folders above).",
        ]) { a, _, v in a.plugins = v },
        Flag(["-o", "--option"], "KEY=VALUE", .options, [
            "Override a backend option; VALUE is read as JSON when it is",
            "a number, true/false or null, else as a string. Repeatable.",
        ]) { a, _, v in a.options.append(try parseOptionAssignment(v)) },
        Flag(["--isolate"], nil, .options, [
            "Run the backend in a child process (krakl-backend-host): a crash,",
            "exit or hang of the backend ends the source (exit 24 or 22 for a",
            "run), never the agent. --no-isolate loads it into the agent. Default:",
            "the backend's \"isolate\" in plugins.json, else isolated for a library",
            "from elsewhere, in the agent for those next to krakl-agent.",
        ]) { a, _, _ in a.isolate = true },
        // Told in --isolate's lines.
        Flag(["--no-isolate"], nil, .commands) { a, _, _ in a.isolate = false },
        Flag(["--frames"], "N", .options, ["Stop after N frames."]) { a, _, v in
            a.frames = try number(v, "--frames", in: 1...Int.max, "give a positive whole number")
        },
        Flag(["--seconds"], "S", .options, ["Stop after S seconds."]) { a, _, v in
            guard let s = Double(v), s > 0, s.isFinite else { throw HostError.usage("--seconds \(v): give a positive number") }
            a.seconds = s
        },
        Flag(["--once"], nil, .options, ["(--join) Exit when the session ends, with its end reason's status."]) { a, _, _ in a.once = true },
        Flag(["--headless"], nil, .options, ["(--join, --qr, --scan) Lines, never the home screen, even on a terminal."]) { a, _, _ in
            a.headless = true
        },
        Flag(["--log-format"], "F", .options, [
            "(--join, --qr, --scan without the home screen) text (default) or",
            "json: one JSON object a line (time, event, state, reason, numbers).",
        ]) { a, _, v in
            guard let format = LogFormat(rawValue: v) else { throw HostError.usage("--log-format \(v): use text or json") }
            a.logFormat = format
        },
        Flag(["--address"], "IP", .options, [
            "(--join) Offer host candidates from this address only (repeatable;",
            "default: every interface that is up, loopback excluded).",
        ]) { a, _, v in
            guard let ip = IPAddress(v) else { throw HostError.usage("--address \(v): give an IP address of this machine") }
            a.addresses.append(ip)
        },
        Flag(["--ice-server"], "URL[,USER,CREDENTIAL]", .options, [
            "(--join) A STUN or TURN server besides the join code's and the room",
            "server's (repeatable): stun:HOST[:PORT], turn:HOST[:PORT][?transport=udp|tcp]",
            "or turns:HOST[:PORT] (TLS, port 5349 unless given) with its long-term",
            "credentials; HOST is an address or a name (every address it resolves",
            "to within 2 s is used; a turns: certificate must be for HOST).",
        ]) { a, _, v in a.iceServers.append(try iceServer(v)) },
        Flag(["--ice-ca"], "FILE", .options, [
            "(--join) Check turns: servers' certificates against the CA certificates",
            "in this PEM file only (default: the system store, /etc/ssl/certs).",
        ]) { a, _, v in
            guard access(v, R_OK) == 0 else {
                throw HostError.usage("--ice-ca \(v): cannot read it (\(String(cString: strerror(errno)))); give a PEM file of CA certificates")
            }
            a.iceCAFile = v
        },
        Flag(["--ice-transport"], "P", .options, ["(--join) all (default) or relay: only relay candidates (TURN)."]) { a, _, v in
            guard v == "all" || v == "relay" else { throw HostError.usage("--ice-transport \(v): use all or relay") }
            a.relayOnly = v == "relay"
        },
        Flag(["--twilio-url"], "URL", .options, [
            "(Twilio codes without u=, and bare Twilio access tokens) The signaling",
            "WebSocket to use instead of wss://global.vss.twilio.com/signaling: a",
            "region's (wss://au1.vss.twilio.com/signaling) or a test server's",
            "(ws:// only to a loopback address). Also $KRAKL_TWILIO_URL.",
        ]) { a, _, v in
            do throws(JoinCodeError) { a.twilioURL = try JoinCode.signalingURL(v) } catch {
                throw HostError.usage("--twilio-url \(v.prefix(200)): \(urlProblem(error))")
            }
        },
        Flag(["--connect-timeout"], "S", .options, [
            "(--join) ICE and DTLS must be up S seconds after the room's",
            "answer (default 15), else the session ends as connection lost.",
        ]) { a, _, v in
            a.connectTimeout = try number(v, "--connect-timeout", in: 1.0...300.0, "give seconds from 1 to 300")
        },
        Flag(["--listen"], "ADDR[:PORT]", .options, [
            "(viewer) Listen on this IP address (default 127.0.0.1:8990).",
            "Any address that is not loopback requires an access token: a",
            "random one is made and shown once, in the printed URL (#token=…).",
        ]) { _, given, v in
            // Port 0 (an explicit ":0") is any free port; the printed URL shows the one chosen.
            let explicitPort = v.hasPrefix("[") ? v.contains("]:") : v.filter({ $0 == ":" }).count == 1
            guard let address = ListenAddress(v) else {
                throw HostError.usage("--listen \(v): give an IP address of this machine, optionally with :PORT (e.g. 127.0.0.1:8990, 192.168.1.5, [::1]:9000)")
            }
            given.listen = (address.host, explicitPort ? address.port : nil)
        },
        Flag(["--viewer-port"], "N", .options, ["(viewer) The port (default 8990; 0: any free port)."]) { _, given, v in
            guard let port = UInt16(v) else { throw HostError.usage("--viewer-port \(v): give a port from 1 to 65535 (0: any free port)") }
            given.viewerPort = port
        },
        Flag(["--max-viewers"], "N", .options, ["(viewer) Viewers at once (default 4; more get 503 Retry-After)."]) { a, _, v in
            a.maximumViewers = try number(v, "--max-viewers", in: 1...64, "give 1 to 64")
        },
        Flag(["--viewer-token"], nil, .options, ["(viewer) Require the token on loopback too."]) { a, _, _ in a.viewerToken = true },
        Flag(["--expect-end"], nil, .options, ["(conformance) The options make the source end; check that."]) { a, _, _ in a.expectEnd = true },
        Flag(["--timeout"], "S", .options, [
            "(conformance) Wait at most S seconds for frames, create() or",
            "start() (default 10); the run's bound grows with it.",
        ]) { a, _, v in
            guard let s = Double(v), s > 0, s <= 600 else { throw HostError.usage("--timeout \(v): give seconds from 0 to 600") }
            a.timeout = s
        },

        Flag(["--json"], nil, .options, ["(status, watch) Print the daemon's JSON lines (docs/daemon.md)."]) { a, _, _ in a.json = true },
        Flag(["-v", "--verbose"], nil, .options, ["Show backends' info and debug log lines."]) { a, _, _ in a.verbose = true },
        Flag(["-q", "--quiet"], nil, .options, ["No live status line; summary only."]) { a, _, _ in a.quiet = true },
        Flag(["-h", "--help"], nil, .options, ["This text."], ends: true) { a, _, _ in a.command = .help },
        Flag(["--version"], nil, .options, [
            "The version, the git commit it was installed from (scripts/install",
            "and the Debian package record it), and libvpx, OpenSSL and zbar as loaded.",
        ], ends: true) { a, _, _ in a.command = .version },

        Flag(["--record"], "FILE", .encoder, [
            "Write the encoded screen to FILE (.webm or .ivf) instead of",
            "sharing it to the viewer.",
        ]) { a, _, v in
            // The suffix picks the container, in any case (x.WEBM is a WebM file too).
            let suffix = v.lowercased()
            guard suffix.hasSuffix(".webm") || suffix.hasSuffix(".ivf") else { throw HostError.usage("--record \(v): the file must end in .webm or .ivf") }
            a.record = v
            a.captureOnly = false
        },
        Flag(["--no-record"], nil, .encoder, ["Capture only: no encoding, no file, no viewer."]) { a, _, _ in
            a.record = nil
            a.captureOnly = true
        },
        Flag(["--codec"], "vp8|vp9", .encoder, ["Codec (default vp8)."]) { a, _, v in
            guard let codec = VideoCodec(rawValue: v) else { throw HostError.usage("--codec \(v): use vp8 or vp9") }
            a.encoder.codec = codec
        },
        Flag(["--bitrate"], "KBPS", .encoder, ["Target bitrate, CBR (default 2500)."]) { a, _, v in
            a.encoder.bitrateKbps = try number(v, "--bitrate", in: 50...50_000, "give kbit/s from 50 to 50000")
        },
        Flag(["--max-size"], "WxH", .encoder, ["Scale down to fit within this (default 1920x1080)."]) { a, _, v in
            let parts = v.split(separator: "x").compactMap { Int($0) }
            guard parts.count == 2, parts.allSatisfy({ (16...16384).contains($0) }) else { throw HostError.usage("--max-size \(v): give WIDTHxHEIGHT, e.g. 1920x1080") }
            a.encoder.maximumSize = (parts[0], parts[1])
        },
        Flag(["--max-fps"], "N", .encoder, [
            "At most N encoded frames a second (default 30), held over",
            "time; a frame that comes a little early is not delayed.",
        ]) { a, _, v in
            a.encoder.maximumFps = try number(v, "--max-fps", in: 1.0...120.0, "give 1 to 120")
        },
        Flag(["--refresh"], "S", .encoder, [
            "Re-encode an unchanged screen every S seconds so late or",
            "lossy receivers recover (default 1 when recording). 0: no",
            "periodic refresh; after 1 s without change the picture is",
            "re-encoded at the frame rate until its quality converges,",
            "then nothing (the default in a room and for the viewer,",
            "whose receivers ask for what they miss with PLI/NACK).",
        ]) { a, _, v in
            let seconds = try number(v, "--refresh", in: 0.0...3600.0, "give seconds from 0 (refine once after each change) to 3600")
            if seconds == 0 {
                a.encoder.refreshForReceiversThatAsk()
            } else {
                a.encoder.refreshInterval = .seconds(seconds)
                a.encoder.refineAfterSettling = false
            }
            a.refreshGiven = true
        },
        Flag(["--keyframe-interval"], "S", .encoder, [
            "A keyframe at least every S seconds (default 0: on",
            "request only; SIGUSR1 requests one, at most one per 0.3 s).",
        ]) { a, _, v in
            a.encoder.keyframeInterval = .seconds(try number(v, "--keyframe-interval", in: 0.0...3600.0, "give seconds from 0 (on request only) to 3600"))
        },
        Flag(["--encoder-threads"], "N", .encoder, ["libvpx threads (default 0: 2 at 720p and up on 4+ cores, else 1)."]) { a, _, v in
            a.encoder.threads = try number(v, "--encoder-threads", in: 0...16, "give 0 (automatic) to 16")
        },
        Flag(["--vp8-profile"], "N", .encoder, [
            "VP8 bitstream version 0-3 (default 2: no loop filter, ~20 %",
            "less encoder CPU on a screen; 0 for a receiver whose hardware",
            "decoder knows only version 0).",
        ]) { a, _, v in
            a.encoder.vp8Profile = try number(v, "--vp8-profile", in: 0...3,
                                              "give 0 to 3 (2, the default, has no loop filter; 0 is the one every hardware decoder knows)")
        },
        Flag(["--dump-input"], "FILE", .encoder, ["Also write every encoded picture as raw I420 (for PSNR)."]) { a, _, v in a.dumpInput = v },
        Flag(["--stats-json"], "FILE", .encoder, ["Write the run's numbers as JSON at the end."]) { a, _, v in a.statsJSON = v },
        Flag(["--frame-log"], "FILE", .encoder, [
            "Write one CSV line per encoded frame (time, bytes, keyframe,",
            "refresh, active-block share, encode ms, quantizer 0-63) as it",
            "is encoded.",
            "Every output is opened (or its folder checked) before",
            "capture starts; one that cannot be written ends the run",
            "with status 23. --record may name a FIFO (mkfifo live.webm):",
            "WebM is then written as a live stream (no seeking needed).",
        ]) { a, _, v in a.frameLog = v },
    ]

    /// The table by every name a flag has.
    static let flagsByName: [String: Flag] = {
        var byName: [String: Flag] = [:]
        for flag in flags {
            for name in flag.names {
                precondition(byName[name] == nil, "the flag \(name) is declared twice")
                byName[name] = flag
            }
        }
        return byName
    }()

    /// `--help`'s lines for the flags of one section, in the table's order.
    static func helpText(_ section: Flag.Section) -> String {
        flags.filter { $0.section == section }.map(\.helpText).joined(separator: "\n")
    }
}
