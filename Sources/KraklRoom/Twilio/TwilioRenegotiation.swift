import FoundationEssentials
import KraklBase
import Glibc

/// Answers a Twilio server's re-offer (an `update` whose peer connection carries `type:"offer"`,
/// sent when the room wants to renegotiate: subscriptions, a media server move) without touching
/// the running transport: our one sendonly video m-section is answered as already negotiated (same
/// ICE credentials, fingerprint, DTLS role, payload types and SSRCs), and every other m-section the
/// server offers is rejected (port 0, `a=inactive`), since the agent publishes the screen only and
/// subscribes to nothing. Sans-I/O: SDP text in, SDP text out.
enum TwilioRenegotiation {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// - Parameters:
    ///   - offer: the server's new offer.
    ///   - ourOffer: the offer we joined with (our media section as we described it).
    ///   - firstAnswer: the server's answer to it (the payload types and DTLS role in use).
    ///   - version: the `o=` session version for this answer (greater than any we sent).
    static func answer(toServerOffer offer: String, ourOffer: String, firstAnswer: String, version: Int) throws(Failure) -> String {
        let (_, offered) = sections(offer)
        let (ourSession, ourSections) = sections(ourOffer)
        let (_, answeredSections) = sections(firstAnswer)
        guard let ours = ourSections.first(where: { $0.kind == "video" }), let ourMid = ours.mid else {
            throw Failure(description: "our own offer has no video m-section")
        }
        guard offered.contains(where: { $0.mid == ourMid }) else {
            throw Failure(description: "the server's offer leaves out our video m-section (mid \(ourMid))")
        }
        // The DTLS role stays as the first answer set it: it chose active (we are the server) or passive.
        let answeredSetup = answeredSections.first { $0.mid == ourMid }?.attribute("setup") ?? "active"
        let setup = answeredSetup == "passive" ? "active" : "passive"
        // The payload types in use: those of the first answer that our offer had.
        let usedTypes = answeredSections.first { $0.mid == ourMid }?.payloadTypes ?? ours.payloadTypes
        let keptTypes = ours.payloadTypes.filter { usedTypes.contains($0) || ours.isRtx(of: $0, among: usedTypes) }

        var lines: [String] = ["v=0"]
        lines.append(ourSession.first { $0.hasPrefix("o=") }.map { origin($0, version: version) } ?? "o=- 0 \(version) IN IP4 127.0.0.1")
        lines += ourSession.filter { $0.hasPrefix("s=") || $0.hasPrefix("t=") }
        lines.append("a=group:BUNDLE \(ourMid)")
        lines += ourSession.filter { $0.hasPrefix("a=msid-semantic") }
        for section in offered {
            if section.mid == ourMid {
                lines.append("m=video 9 \(ours.proto) " + keptTypes.joined(separator: " "))
                for line in ours.lines.dropFirst() {
                    if let type = payloadTypeOf(line), !keptTypes.contains(type) { continue }
                    if line.hasPrefix("a=setup:") { lines.append("a=setup:\(setup)"); continue }
                    if line.hasPrefix("a=candidate:") || line == "a=end-of-candidates" || line == "a=ice-options:trickle" { continue }
                    if line.hasPrefix("a=sendrecv") || line.hasPrefix("a=recvonly") || line.hasPrefix("a=inactive") { lines.append("a=sendonly"); continue }
                    lines.append(line)
                }
            } else {
                // Not ours: rejected. Its first format is echoed (an m-line needs one).
                let format = section.payloadTypes.first ?? "0"
                lines.append("m=\(section.kind) 0 \(section.proto) \(format)")
                lines.append("c=IN IP4 0.0.0.0")
                // Our transport's credentials, as browsers write them in rejected sections too: some
                // peers (aiortc) refuse an answer section without them, rejected or not.
                lines += ours.lines.filter { $0.hasPrefix("a=ice-ufrag:") || $0.hasPrefix("a=ice-pwd:") || $0.hasPrefix("a=fingerprint:") }
                lines.append("a=setup:\(setup)")
                if let mid = section.mid { lines.append("a=mid:\(mid)") }
                lines += ["a=inactive", "a=rtcp-mux"]
                // The echoed format's own description (aiortc sets up even a rejected section's codecs).
                lines += section.lines.filter { $0.hasPrefix("a=rtpmap:\(format) ") }
            }
        }
        return lines.joined(separator: "\r\n") + "\r\n"
    }

    struct Section {
        var lines: [String]
        var kind: String { String(lines[0].dropFirst(2).split(separator: " ").first ?? "") }
        var proto: String { String(lines[0].split(separator: " ").dropFirst(2).first ?? "UDP/TLS/RTP/SAVPF") }
        var payloadTypes: [String] { lines[0].split(separator: " ").dropFirst(3).map(String.init) }
        var mid: String? { attribute("mid") }

        func attribute(_ name: String) -> String? { TwilioRenegotiation.attribute(name, inLines: lines) }

        /// Whether `type` is an RTX payload type (`a=fmtp:T apt=P`) for one of `used`.
        func isRtx(of type: String, among used: [String]) -> Bool {
            lines.contains { line in
                guard line.hasPrefix("a=fmtp:\(type) ") else { return false }
                return used.contains { line.contains("apt=\($0)") }
            }
        }
    }

    /// The value of the first `a=NAME:` line.
    static func attribute(_ name: String, in sdp: String) -> String? {
        attribute(name, inLines: sdp.split(whereSeparator: \.isNewline))
    }

    static func attribute<Line: StringProtocol>(_ name: String, inLines lines: [Line]) -> String? {
        lines.first { $0.hasPrefix("a=\(name):") }.map { String($0.dropFirst(name.count + 3)).trimmingSpaces() }
    }

    /// The track id of the first `a=msid:<stream> <track>` line.
    static func msidTrackID(_ sdp: String) -> String? {
        guard let value = attribute("msid", in: sdp) else { return nil }
        let parts = value.split(separator: " ")
        return parts.count == 2 ? String(parts[1]) : nil
    }

    /// An `o=` line with its session version set to `version` (the line as it is when it is not one).
    static func origin(_ line: String, version: Int) -> String {
        let parts = line.split(separator: " ")
        guard line.hasPrefix("o="), parts.count >= 6 else { return line }
        return ([String(parts[0]), String(parts[1]), "\(version)"] + parts.dropFirst(3).map(String.init)).joined(separator: " ")
    }

    /// `sdp` with its `o=` session version set to `version` (our offer again, for `create-offer`).
    static func reversioned(_ sdp: String, version: Int) -> String {
        sdp.split(separator: "\r\n", omittingEmptySubsequences: false).map { origin(String($0), version: version) }.joined(separator: "\r\n")
    }

    /// The session lines and the m-sections of an SDP.
    static func sections(_ sdp: String) -> (session: [String], media: [Section]) {
        var session: [String] = []
        var media: [Section] = []
        for raw in sdp.split(whereSeparator: \.isNewline) {
            let line = String(raw).trimmingSpaces()
            guard !line.isEmpty else { continue }
            if line.hasPrefix("m=") { media.append(Section(lines: [line])) } else if media.isEmpty { session.append(line) } else { media[media.count - 1].lines.append(line) }
        }
        return (session, media)
    }

    /// The payload type an `a=rtpmap:`, `a=fmtp:` or `a=rtcp-fb:` line is about.
    static func payloadTypeOf(_ line: String) -> String? {
        for prefix in ["a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"] where line.hasPrefix(prefix) {
            return String(line.dropFirst(prefix.count).prefix { $0 != " " })
        }
        return nil
    }
}
