import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklEncoder
import KraklRTC
import KraklRoom
import KraklSession
import KraklViewer

/// The command line, parsed. Parsing never exits: errors are HostError
/// .usage / .invalidOption so main() can print them and pick the status.
struct Arguments {
    enum Command: Equatable {
        case run, join(JoinCodeSource), code(JoinCodeSource), qr(String), scan, backends, sources, conformance(String), help, version
        /// `krakl-agent daemon`, and the commands that talk to it (docs/daemon.md).
        case daemon, control(ControlCommand)
        /// `krakl-agent home`: the interactive home screen (docs/home-screen.md).
        case home
    }

    /// How the non-interactive lifecycle is logged: a line of words, or a JSON object, per event.
    enum LogFormat: String { case text, json }

    var command: Command = .run
    var backend: String?
    var plugins: String?
    var options: [(key: String, value: JSON)] = []
    /// --isolate / --no-isolate: run the backend in a child process or in the agent (nil: plugins.json decides).
    var isolate: Bool?
    var frames: Int?
    var seconds: Double?
    var expectEnd = false
    var timeout = 10.0
    /// (conformance, internal) Run one group of checks in this process: the
    /// child processes `krakl-agent conformance` starts (ConformanceChild).
    var conformanceGroup: String?
    var verbose = false
    var quiet = false
    /// --record FILE: record the encoded screen to FILE instead of sharing it to the viewer.
    var record: String?
    /// --no-record: capture only (no encoder, no viewer).
    var captureOnly = false
    /// The built-in viewer (the default without a join code): where it listens, how many may watch,
    /// and whether a token is required on loopback too.
    var listen = ListenAddress(host: "127.0.0.1")
    var maximumViewers = 4
    var viewerToken = false
    var encoder = EncoderSettings()
    var dumpInput: String?
    var statsJSON: String?
    var frameLog: String?
    /// --join: share into the room of this join code.
    var join: JoinCodeSource?
    /// End the process when the session ends, with its end reason's exit status.
    var once = false
    var connectTimeout = 15.0
    /// `--twilio-url`: the signaling URL for Twilio codes that name none (a bare access token).
    var twilioURL: URL?
    /// Host candidates only from these addresses (default: every interface that is up, no loopback).
    var addresses: [IPAddress] = []
    /// `--ice-server`: STUN/TURN servers besides those of the join code and the room server.
    var iceServers: [IceServer] = []
    /// `--ice-transport relay`: only relay candidates (as iceTransportPolicy "relay").
    var relayOnly = false
    /// `--ice-ca FILE`: trust only these CA certificates (PEM) for turns: servers.
    var iceCAFile: String?
    /// --refresh was given (a room session otherwise turns the idle refresh off).
    var refreshGiven = false
    /// --qr FILE: the join code from a picture; --scan-only: print its summary instead of joining.
    var qr: String?
    var scanOnly = false
    /// --scan: the join code from a QR code on the screen (any backend's frames).
    var scan = false
    var scanTimeout = 120.0
    /// --camera [NAME]: scan a camera's view instead of the screen ("": the first camera).
    var camera: String?
    /// `sources --cameras`: list the cameras a scan can read.
    var cameras = false
    /// --preview: with --camera, the camera's picture on the built-in viewer's page while scanning.
    var preview = false
    /// --json: `status` and `watch` print the daemon's JSON lines.
    var json = false
    /// --headless: never the home screen, even on a terminal.
    var headless = false
    /// --log-format: the non-interactive lifecycle's lines.
    var logFormat = LogFormat.text

    /// A signaling URL's problem in words for an option (not "not a valid join code: u= …").
    static func urlProblem(_ error: JoinCodeError) -> String {
        if case .malformedCode(.badURL(let reason)) = error { return "it " + reason }
        return error.description
    }

    init(_ words: [String], environment: [String: String] = ProcessInfo.processInfo.environment) throws(HostError) {
        var positional: [String] = []
        var given = Given()
        // A flag that ends the reading (--help, --version) leaves the rest unread.
        guard try readFlags(words, positional: &positional, given: &given) else { return }
        // A malformed $KRAKL_TWILIO_URL is a usage error now, not a silent fall-back to Twilio's endpoint.
        if twilioURL == nil, let text = environment["KRAKL_TWILIO_URL"], !text.isEmpty {
            do throws(JoinCodeError) { twilioURL = try JoinCode.signalingURL(text) } catch {
                throw .usage("KRAKL_TWILIO_URL=\(text.prefix(200)): \(Self.urlProblem(error))")
            }
        }
        try readCommand(positional, environment: environment)
        if command == .help { return }
        try checkAcrossFlags(given, positional: positional)
    }

    /// The flags, each through its entry in the flag table, and the other words in order; false
    /// when a flag ended the reading.
    private mutating func readFlags(_ words: [String], positional: inout [String], given: inout Given) throws(HostError) -> Bool {
        var rest = words[...]
        func value(for flag: String) throws(HostError) -> String {
            guard let next = rest.popFirst() else { throw .usage("\(flag) needs a value") }
            return next
        }
        while let word = rest.popFirst() {
            // --flag=value is the same as --flag value.
            var name = word
            if word.hasPrefix("--"), let equals = word.firstIndex(of: "=") {
                name = String(word[..<equals])
                rest.insert(String(word[word.index(after: equals)...]), at: rest.startIndex)
            }
            guard let flag = Self.flagsByName[name] else {
                if name.hasPrefix("-") && name != "-" { throw .usage("unknown flag \(name)") }
                positional.append(word)
                continue
            }
            let text: String
            if flag.value == nil {
                text = ""
            } else if flag.optionalValue {
                // The next word is the value unless it is a flag or a command (`--camera home`).
                let takes = word.contains("=") || (rest.first.map { !$0.hasPrefix("-") && !Self.commands.contains($0) } ?? false)
                text = takes ? try value(for: name) : ""
            } else {
                text = try value(for: name)
            }
            do {
                try flag.apply(&self, &given, text)
            } catch let error as HostError {
                throw error
            } catch {
                throw .usage("\(name) \(text): \(error)")
            }
            if flag.ends { return false }
        }
        return true
    }

    /// The command the first positional word names (none: run, or join with a code from the flags or $KRAKL_JOIN).
    private mutating func readCommand(_ positional: [String], environment: [String: String]) throws(HostError) {
        switch positional.first {
        case nil, "run":
            command = .run
            if qr != nil || scan {
                // A picture or the screen, asked for on purpose, wins over $KRAKL_JOIN; with --join
                // (or each other) it is a contradiction.
                guard join == nil, qr == nil || !scan else { throw .usage("--qr, --scan and --join each give a join code: use one") }
                command = qr.map { .qr($0) } ?? .scan
            } else {
                if join == nil, let code = environment["KRAKL_JOIN"], !code.isEmpty { join = .environment(code) }
                if let join { command = .join(join) }
            }
        case "code":
            guard positional.count >= 2 else { throw .usage("code needs a join code: krakl-agent code CODE|@FILE|-") }
            command = .code(JoinCodeSource(positional[1]))
        case "backends": command = .backends
        case "sources": command = .sources
        case "conformance":
            guard positional.count >= 2 else { throw .usage("conformance needs the path of a backend library (.so)") }
            command = .conformance(positional[1])
        case "help": command = .help
        case "daemon": command = .daemon
        case "home": command = .home
        case "status": command = .control(.status)
        case "stop": command = .control(.stop)
        case "watch": command = .control(.watch)
        case "connect": command = .control(.connect(try ControlCommand.connectTarget(positional.dropFirst().first, qr: qr, scan: scan, camera: camera)))
        case "open":
            // A join link (the desktop entry's handler of krakl: links): connect with the code it carries.
            guard positional.count >= 2 else { throw .usage("open needs a join link: krakl-agent open 'krakl:v=1;…' (what xdg-open hands over)") }
            command = .control(.connect(.code(.link(positional[1]))))
        default: throw .usage("unknown command \(positional[0]) (commands: \(Self.commands.joined(separator: ", ")))")
        }
    }

    /// What no single flag can judge: flags that contradict each other or the command, the viewer's
    /// address, and words left over.
    private mutating func checkAcrossFlags(_ given: Given, positional: [String]) throws(HostError) {
        if preview && camera == nil { throw .usage("--preview shows a camera's picture while it is scanned: give it with --camera") }
        if preview && command != .scan && command != .home {
            throw .usage("--preview is for a scan this process runs (--scan --camera, home), not one through the daemon")
        }
        if let port = given.listen?.port, let other = given.viewerPort, port != other {
            throw .usage("--listen names port \(port) and --viewer-port \(other): give one")
        }
        listen = ListenAddress(host: given.listen?.host ?? "127.0.0.1", port: given.listen?.port ?? given.viewerPort ?? ListenAddress.defaultPort)
        if (given.listen != nil || given.viewerPort != nil || viewerToken) && !sharesToViewer && !mayShowHomeScreen {
            throw .usage("--listen, --viewer-port and --viewer-token are for the viewer: a run without --join, --record or --no-record, "
                         + "or the home screen's (home, or --join/--qr/--scan on a terminal)")
        }
        let expected: Int
        switch command {
        case .conformance, .code, .control(.connect(.code)): expected = 2
        default: expected = 1
        }
        if positional.count > expected { throw .usage("unexpected argument \(positional[expected])") }
    }

    static let commands = ["run", "home", "code", "backends", "sources", "conformance", "daemon", "status", "connect", "open", "stop", "watch"]

    /// The home screen instead of lines: `home`, or a join code (--join, --qr, --scan) given on a
    /// terminal (stdin and stdout), unless --headless, --once, --scan-only, -q or --log-format json
    /// asks for the line-per-event lifecycle (docs/home-screen.md).
    func wantsHomeScreen(terminal: Bool) -> Bool {
        guard terminal, !headless, logFormat == .text else { return false }
        switch command {
        case .home: return true
        case .join, .qr, .scan: return !once && !scanOnly && !quiet
        default: return false
        }
    }

    /// A command that shows the home screen on a terminal (whose `v` starts the viewer); in lines
    /// mode the viewer options are accepted and unused.
    var mayShowHomeScreen: Bool {
        switch command {
        case .home, .join, .qr, .scan: return true
        default: return false
        }
    }

    /// A run that shares to the built-in viewer: no join code, no recording, not capture only.
    var sharesToViewer: Bool { command == .run && record == nil && !captureOnly }
}

let helpText = """
krakl-agent: share this machine's screen into a video room. Given a join code
(from the conference page's QR code) it joins the room as the code's identity
and publishes the screen only, until you stop it or the room ends. Without a
join code it shares the screen to its own viewer: a page at
http://127.0.0.1:8990/ (and a WHEP endpoint for any WHEP player); with
--record FILE it records the encoded screen to a file instead.

USAGE
  krakl-agent --join CODE|@FILE|- [--once] [--backend NAME] [--option KEY=VALUE]...
                    [--address IP]... [--connect-timeout S] [ENCODER OPTIONS]
  krakl-agent --qr IMAGE [--scan-only] [--once] [SHARING OPTIONS]
  krakl-agent --scan [--backend NAME] [--scan-timeout S] [--scan-only] [--once] [SHARING OPTIONS]
  krakl-agent --scan --camera [NAME] [--scan-timeout S] [--scan-only] [--once] [SHARING OPTIONS]
  krakl-agent home [--join CODE|--qr IMAGE|--scan [--camera [NAME]]] [SHARING OPTIONS]
  krakl-agent code CODE|@FILE|-
  krakl-agent daemon [SHARING OPTIONS]
  krakl-agent connect CODE|@FILE|-|--qr FILE|--scan   krakl-agent stop
  krakl-agent open 'krakl:v=1;…'                   (a join link, as xdg-open hands it over)
  krakl-agent status [--json]                      krakl-agent watch [--json]
  krakl-agent [run] [--backend NAME] [--option KEY=VALUE]... [--frames N] [--seconds S]
                    [--listen ADDR[:PORT]] [--viewer-port N] [--max-viewers N] [--viewer-token]
                    [ENCODER OPTIONS]
  krakl-agent [run] [--backend NAME] [--option KEY=VALUE]... [--frames N] [--seconds S]
                    --record FILE.webm|FILE.ivf | --no-record [ENCODER OPTIONS]
  krakl-agent backends
  krakl-agent sources [--backend NAME] [--option KEY=VALUE]...
  krakl-agent conformance LIBRARY.so [--option KEY=VALUE]... [--expect-end] [--timeout S]

COMMANDS
  home            The interactive home screen (docs/home-screen.md): keys to connect
                  (c: a join code, q: a QR picture, s: scan the screen, w: the webcam), stop and quit,
                  and the live numbers while sharing; v starts a local preview viewer
                  (on --listen, default 127.0.0.1:8990) showing what is shared and
                  opens it with $BROWSER or xdg-open. --join, --qr and --scan show it
                  too when stdin and stdout are a terminal (not with --headless,
                  --once, --scan-only, -q or --log-format json).
  --join CODE     Share the screen into the room of a join code (docs/join-codes.md):
                  prepare the source (the sharing dialog, if any, comes first), join
                  (Twilio Video, WHIP or Janus VideoRoom), publish, and show live
                  status until Ctrl-C, SIGTERM or the room ends; then leave and say
                  why. Without --once the agent then waits for the next code on
                  stdin. CODE may be @FILE (read the file), - (read one line from
                  stdin) or come from $KRAKL_JOIN. A bare Twilio access token (the
                  JWT a Twilio page shows) is a Twilio code for Twilio's global
                  signaling endpoint (--twilio-url names another).
                  A code given as a plain argument is visible to every local user in
                  ps: prefer @FILE, - or KRAKL_JOIN (a warning says so).
                  Signalling honours HTTPS_PROXY, HTTP_PROXY and NO_PROXY (an http://
                  proxy, CONNECT for https; no SOCKS; media never goes through it:
                  docs/rooms.md, "Through an HTTP proxy").
  --qr IMAGE      Read the join code from a QR code in a picture (PNG, JPEG, binary
                  PPM/PGM) and share as with --join; with --scan-only print the code's
                  summary instead. Only QR codes are read, as bytes (no charset guessing);
                  a payload that is not a join code is reported, never opened.
  --scan          Look for a join code's QR code on the screen (the backend's frames:
                  --backend x11, pipewire, file, …), where it changed first, at most
                  every 200 ms, with a live progress line; the first valid code starts
                  sharing (or, with --scan-only, its summary is printed). A QR that is
                  not a join code, or an expired one, is reported once and scanning goes
                  on; two different codes at once are refused and listed. Gives up
                  after --scan-timeout S (default 120). Ctrl-C stops.
  --camera [NAME] With --scan (or alone): read the code off another device's screen
                  with a camera instead of this screen: a PipeWire camera node (what
                  WirePlumber makes of a webcam; the pipewire backend's camera mode),
                  the first one, or NAME: its number or node name (sources --cameras)
                  or a part of its name ("--camera webcam"). Mirrored and light-on-dark
                  codes are read too; after 10 s without a code a hint says how to hold
                  it. The screen is then shared with the usual backend. 56: no camera.
  --preview       With --camera: show the camera's picture on the built-in viewer's page
                  (--listen, default 127.0.0.1:8990) while scanning, opened in the
                  browser where there is a screen ($BROWSER or xdg-open), to aim by.
  code CODE       Check a join code and print what it would do: service, URL, room,
                  identity, expiry (the token is shown as its first 8 characters only).
  daemon          Keep an idle agent in the background, without a terminal, driven
                  through a control socket ($XDG_RUNTIME_DIR/krakl/control.sock: owner
                  only; docs/daemon.md). One session at a time; SIGTERM leaves the room,
                  then exits 0. The user unit scripts/install and the Debian package put
                  in place runs it at login: systemctl --user enable --now krakl-agent.
  connect CODE    Ask the daemon to share into a join code's room (CODE, @FILE, - for
                  stdin, --qr FILE: the daemon reads the picture, or --scan: the daemon
                  scans its screen, --scan --camera [NAME]: a camera's view). Returns
                  once the screen is shared (0) or with the status of why it could not be.
  open LINK       What the desktop entry runs for a krakl: link (xdg-open, a browser):
                  hands the join code it carries to the running daemon, as connect does
                  (a link percent-encoded by a browser is decoded first). A link that is
                  no join code is refused with the join code's status (40-43, 39); with
                  no daemon it says how to start one (61) and starts no session itself.
  stop            Ask the daemon to stop sharing; returns once the room was left.
  status          The daemon's state: idle (and how the last session ended) or the
                  room, identity and live numbers; --json prints its JSON line.
  watch           Follow the daemon: a line per event and every second while sharing.
  run (default)   Capture from a backend, encode, share to the built-in viewer and print
                  its URL (docs/viewer.md), with live status (capture fps, damage share,
                  latency; encoded kbit/s, encode time, active blocks; viewers) until
                  Ctrl-C, --frames, --seconds or the source's end, then a summary. With
                  --record FILE the encoded screen goes to FILE instead; --no-record
                  captures only. Without --backend the viewer shows the real screen, as
                  rooms and scans do (see --backend); a recording records the default.
  backends        List the backends in plugins.json and whether each one loads.
  sources         List what a backend can capture (X11: the screen and each XRandR
                  monitor), with the option value that selects it; --cameras: the
                  cameras --camera can read (56 when there is none).
  conformance     Run the backend conformance checks on a backend library; one line
                  per check (PASS/FAIL/SKIP), then a summary line; exit status 1 if
                  any check fails. The checks run in child processes, so a backend
                  that crashes or hangs fails a check instead of ending the run;
                  the first line says the run's time bound.

OPTIONS
\(Arguments.helpText(.options))

ENCODER OPTIONS
\(Arguments.helpText(.encoder))

FILE BACKEND OPTIONS (--backend file)
  scene=static|typing|scrolling|video   width=320..7680   height=240..4320
  fps=1..240   frames=N (end after N frame intervals)   speed=1..256 (scrolling px/frame)
  seed=N   path=FILE.y4m (play a 4:2:0 Y4M file instead)   loop=true|false

X11 BACKEND OPTIONS (--backend x11)
  display=:N (default $DISPLAY)   monitor=NAME|INDEX (XRandR)   region=WxH+X+Y
  cursor=true|false   fps=1..240   shm=true|false   damage=true|false (force fallbacks)

SIGNALS (recording run)
  SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed), SIGQUIT (Ctrl-\\) and
  SIGPIPE end the run cleanly: the recording and every output are completed and
  the summary printed, exit status 0. A closed stdout (krakl-agent | head) ends it
  the same way. SIGUSR1 asks for a keyframe. (--join: SIGINT stops the session,
  SIGTERM, SIGHUP and SIGQUIT quit.)

EXIT STATUS
   0 done (stopped, frame/time limit reached, or the source ended)
   1 conformance: a check failed
   2 usage error                      3 invalid --option
   4 plugins.json unreadable          5 plugins.json malformed (file:line:column)
   6 unknown backend name             7 backend library file missing
   8 backend library does not load    9 library lacks the krakl_backend_v1 symbol
  10 backend ABI version mismatch or malformed table
  11 backend create() failed (other)  12 backend start() failed
  13 the source reported an error while capturing
  14 encoding failed (libvpx)
  15 the backend could not list its sources
  backend create() failed because (from its errno):
  16 an option or input was rejected (EINVAL)
  17 what to capture is not there: display, monitor, node, file (ENODEV, ENOENT)
  18 the system lacks what the backend needs: no portal, unsupported format
     (EOPNOTSUPP, ENOSYS)
  19 a service it needs is not running: PipeWire, D-Bus (ECONNREFUSED, ENXIO)
  20 capture was not allowed: the sharing (or camera) dialog was denied (EACCES, EPERM)
  21 nobody answered in time: the sharing dialog (ETIMEDOUT)
  22 the backend hung: a call into it overran its budget (watchdog)
  23 an output (recording, --stats-json, --frame-log, --dump-input) could not be
     opened, written, flushed or closed (checked before capture; capture stops at once)
  24 the isolated backend's process crashed or exited
  25 the backend delivered no usable frame
  sharing into a room (--join … --once; docs/exit-codes.md):
   0 you stopped sharing              30 the room ended (host ended it, removed)
  31 the screen source was closed     32 connection lost
  33 the token was not accepted (401/403)   34 no such room (404)
  35 refused otherwise (4xx)          36 the room server failed (5xx, busy)
  37 the room server cannot be reached    38 the room server's reply is unusable
  39 the token expired or is not valid yet  40 not a join code
  41 join code version too new        42 the token is malformed
  43 room mismatch or no room         44 sharing failed on our side
  53 the HTTP proxy (HTTPS_PROXY, HTTP_PROXY) refused, did not answer or is
     malformed (docs/rooms.md: "Through an HTTP proxy")
  54 the room is full (Twilio 53105)  55 the same identity joined elsewhere (Twilio 53205)
  57 no path, and the TURN relay refused our credentials (wrong, expired)
  58 no path, and the TURN relay's certificate is not trusted (turns:, --ice-ca)
  reading a join code from a picture (--qr):
  45 no QR code found                 46 the image is unreadable (missing, empty, damaged)
  47 the image is too large (refused before decoding)
  48 a QR code that is not a join code (or too long, non-ASCII, control characters)
  49 two or more different join codes: give a picture with one
  scanning the screen or a camera (--scan, --camera):
  50 no join code found within --scan-timeout   51 the screen source ended first
  56 --camera: no camera (or none of that name; sources --cameras lists them)
   0 stopped with Ctrl-C (nothing found)
  the built-in viewer:
  52 the viewer cannot listen: the port is in use, or the address is not this machine's
  the daemon and its clients (daemon, status, connect, open, stop, watch):
  60 another daemon already runs for this user   61 no daemon is running
  62 the control socket cannot be made or used (no XDG_RUNTIME_DIR, not yours)
  63 the daemon refused the request (already sharing: stop first; malformed)
  64 the daemon's reply is unusable     connect, open: 30-58 as for --join and --qr
"""

extension Arguments {
    /// `URL[,USER,CREDENTIAL]` as the agent can use it: STUN, or TURN over UDP, TCP or TLS, by address or name.
    static func iceServer(_ text: String) throws(HostError) -> IceServer {
        let fields = text.split(separator: ",", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
        let server = IceServer(url: fields[0], username: fields.count > 1 ? fields[1] : nil, credential: fields.count > 2 ? fields[2] : nil)
        guard server.parts != nil else {
            throw .usage("--ice-server \(fields[0]): not a stun:/turn:/turns: URL (RFC 7064/7065)")
        }
        if let reason = server.unusableReason {
            throw .usage("--ice-server \(fields[0]): " + (server.parts?.scheme != "stun" && (server.username == nil || server.credential == nil)
                ? "a TURN server needs its user and credential: --ice-server URL,USER,CREDENTIAL" : reason))
        }
        return server
    }
}
