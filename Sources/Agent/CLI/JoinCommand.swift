import FoundationEssentials
import Glibc
import KraklBase
import KraklHost
import KraklRTC
import KraklRoom
import KraklSession

/// Where the join code comes from: `--join CODE`, `--join @FILE`, `--join -` (stdin) or `KRAKL_JOIN`.
enum JoinCodeSource: Equatable {
    case argument(String)
    case file(String)
    case standardInput
    case environment(String)
    /// Read from a QR code (`--qr`): not on the command line, so no `ps` warning.
    case scanned(String)
    /// A `krakl:` link as `xdg-open` hands it to `krakl-agent open` (percent-encoded by a browser or
    /// not). On the command line of that short-lived client only: no `ps` warning, nobody to read it.
    case link(String)

    init(_ value: String) {
        if value == "-" { self = .standardInput } else if value.hasPrefix("@") { self = .file(String(value.dropFirst())) } else { self = .argument(value) }
    }

    /// The code's text, read once.
    func read() throws(HostError) -> String {
        switch self {
        case .argument(let text), .environment(let text), .scanned(let text):
            return text
        case .link(let link):
            return JoinCode.text(ofLink: link)
        case .file(let path):
            // A join code is at most 4 KB; a bigger file is read up to 1 MiB, so the refusal names its
            // real size (a cut at 4 KB + 64 made every long file "4160 bytes").
            guard let bytes = readFilePrefix(path, limit: 1 << 20) else {
                throw .usage("--join @\(path): cannot read that file")
            }
            return String(decoding: bytes, as: UTF8.self)
        case .standardInput:
            return StandardInputLine.read(limit: JoinCode.maximumLength + 64)
        }
    }
}

/// The room driver a join code asks for.
func makeDriver(_ invitation: Invitation, arguments: Arguments) -> RoomDriver {
    switch invitation.code.service {
    case .twilio:
        return TwilioDriver(signalingURL: twilioSignalingURL(invitation, arguments: arguments), token: invitation.code.token,
                            room: invitation.room)
    case .whip:
        return WhipDriver(endpoint: invitation.code.url, token: invitation.code.token,
                          allowTokenAcrossOrigins: invitation.code.tokenAcrossOrigins)
    case .janus:
        return JanusDriver(baseURL: invitation.code.url, room: invitation.room ?? "")
    }
}

/// Where a Twilio code's signaling goes: its own `u=`, else `--twilio-url` or `$KRAKL_TWILIO_URL`
/// (read, and a malformed value refused, when the command line is parsed), else Twilio's global endpoint.
func twilioSignalingURL(_ invitation: Invitation, arguments: Arguments) -> URL {
    guard invitation.code.urlIsDefault else { return invitation.code.url }
    return arguments.twilioURL ?? invitation.code.url
}

/// The session's settings from the command line and the join code.
func sharingConfiguration(_ arguments: Arguments, invitation: Invitation, logger: BackendLogger) -> SharingConfiguration {
    var configuration = SharingConfiguration()
    configuration.registryPath = arguments.plugins
    // The screen's backend, as for every entry point: never a test pattern by surprise.
    let choice = chooseScreenBackend(registryPath: arguments.plugins, given: arguments.backend)
    configuration.backendName = choice.name ?? arguments.backend
    configuration.backendLabel = choice.label
    configuration.backendOptions = arguments.options
    configuration.backendIsolation = arguments.isolate
    configuration.encoder = arguments.encoder
    if !arguments.refreshGiven { configuration.encoder.refreshForReceiversThatAsk() }
    // Accepted with --join as everywhere, so they must do something here too (they were ignored).
    configuration.dumpInput = arguments.dumpInput
    configuration.frameLog = arguments.frameLog
    configuration.encoder.bitrateKbps = arguments.encoder.bitrateKbps
    configuration.publisher.startBitrate = Double(arguments.encoder.bitrateKbps) * 1000
    configuration.publisher.startBitrate = min(max(configuration.publisher.startBitrate, configuration.publisher.minimumBitrate),
                                               configuration.publisher.maximumBitrate)
    if !arguments.addresses.isEmpty { configuration.publisher.addresses.allowed = arguments.addresses }
    configuration.connectTimeout = .seconds(arguments.connectTimeout)
    configuration.publisher.label = invitation.identity
    // A WHIP server may name STUN servers in its answer (Link headers): candidates may trickle then.
    // Twilio's TURN servers (iced) reach ICE with the answer, and candidates trickle in updates.
    configuration.publisher.trickleLater = invitation.code.service == .whip || invitation.code.service == .twilio
    configuration.publisher.relayOnly = arguments.relayOnly
    configuration.publisher.turnCAFile = arguments.iceCAFile
    // Resolved by the session when it joins (names, bounded in time), never here.
    configuration.iceServers = invitation.code.iceServers + arguments.iceServers
    return configuration
}

/// One line from fd 0, read with read(2). Not the standard library's `readLine`: it retries
/// getline while errno is EINTR, and at end of input getline fails without touching errno, so a
/// stale EINTR from an earlier Ctrl-C made an idle agent spin at full CPU once stdin closed.
enum StandardInputLine {
    /// The line without its newline; "" at end of input or on a read error. A line longer than
    /// `limit` is cut there (the rest, up to 1 MiB, is read and dropped, so the next line starts clean).
    static func read(limit: Int) -> String {
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        var interruptions = 0
        var total = 0
        while total < 1 << 20 {
            total += 1
            let n = Glibc.read(STDIN_FILENO, &byte, 1)
            if n < 0 && errno == EINTR && interruptions < 100 { interruptions += 1; continue }
            guard n == 1, byte != UInt8(ascii: "\n") else { break }
            if bytes.count < limit { bytes.append(byte) }
        }
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        return String(decoding: bytes, as: UTF8.self)
    }
}
