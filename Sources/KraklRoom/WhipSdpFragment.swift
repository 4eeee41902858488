/// The `application/trickle-ice-sdpfrag` bodies (RFC 8840 §9) a WHIP client
/// sends and receives in PATCH requests (RFC 9725 §4.3), made from and
/// merged into whole SDPs. Only the ICE lines are touched: everything else
/// of an answer (fingerprint, codecs, setup) stays as the first answer gave it.
public struct WhipSdpFragment: Equatable, Sendable {
    public var iceUfrag: String?
    public var icePwd: String?
    /// The first m-section's `m=` line and `a=mid` value.
    public var mediaLine: String?
    public var mid: String?
    /// `a=candidate` values (without `a=`).
    public var candidates: [String]
    public var endOfCandidates: Bool

    public init(iceUfrag: String? = nil, icePwd: String? = nil, mediaLine: String? = nil, mid: String? = nil,
                candidates: [String] = [], endOfCandidates: Bool = false) {
        self.iceUfrag = iceUfrag
        self.icePwd = icePwd
        self.mediaLine = mediaLine
        self.mid = mid
        self.candidates = candidates
        self.endOfCandidates = endOfCandidates
    }

    /// The ICE lines of an SDP or an sdpfrag (session or first m-section level; later m-sections are
    /// ignored: WHIP bundles everything on the first).
    public init(parsing text: String) {
        self.init()
        var sections = 0
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmedOfSpaces
            if line.hasPrefix("m=") {
                sections += 1
                if sections == 1 { mediaLine = line }
                continue
            }
            guard sections <= 1 else { continue }
            if let value = line.value(of: "a=ice-ufrag:") { iceUfrag = iceUfrag ?? value }
            else if let value = line.value(of: "a=ice-pwd:") { icePwd = icePwd ?? value }
            else if let value = line.value(of: "a=mid:") { mid = mid ?? value }
            else if let value = line.value(of: "a=candidate:") { candidates.append("candidate:" + value) }
            else if line == "a=end-of-candidates" { endOfCandidates = true }
        }
    }

    /// The sdpfrag body: credentials at session level, then the m-line with its mid and candidates
    /// (RFC 8840 §9's grammar; the shape of RFC 9725 §4.3's examples).
    public var body: String {
        var lines: [String] = []
        if let iceUfrag { lines.append("a=ice-ufrag:" + iceUfrag) }
        if let icePwd { lines.append("a=ice-pwd:" + icePwd) }
        if let mediaLine { lines.append(mediaLine) }
        if let mid { lines.append("a=mid:" + mid) }
        lines += candidates.map { "a=" + $0 }
        if endOfCandidates { lines.append("a=end-of-candidates") }
        return lines.map { $0 + "\r\n" }.joined()
    }

    /// `answer` with this fragment's credentials and candidates in place of its own: what an ICE
    /// restart's sdpfrag answer means for a publisher that wants a whole SDP. Nil when this fragment
    /// lacks the credentials.
    public func replacingIce(in answer: String) -> String? {
        guard let iceUfrag, let icePwd else { return nil }
        var output: [String] = []
        var sections = 0
        var inserted = false
        func insertCandidates() {
            guard !inserted else { return }
            inserted = true
            output += candidates.map { "a=" + $0 }
            if endOfCandidates { output.append("a=end-of-candidates") }
        }
        for raw in answer.split(whereSeparator: \.isNewline) {
            let line = raw.trimmedOfSpaces
            if line.isEmpty { continue }
            if line.hasPrefix("m=") {
                if sections == 1 { insertCandidates() }
                sections += 1
            }
            if line.hasPrefix("a=ice-ufrag:") { output.append("a=ice-ufrag:" + iceUfrag); continue }
            if line.hasPrefix("a=ice-pwd:") { output.append("a=ice-pwd:" + icePwd); continue }
            if line.hasPrefix("a=candidate:") || line == "a=end-of-candidates" { continue }
            output.append(line)
        }
        if sections >= 1 { insertCandidates() }
        return output.map { $0 + "\r\n" }.joined()
    }
}

extension Substring {
    fileprivate var trimmedOfSpaces: String {
        var scalars = unicodeScalars
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }
}

extension String {
    fileprivate func value(of prefix: String) -> String? {
        hasPrefix(prefix) ? String(dropFirst(prefix.count)) : nil
    }


}
