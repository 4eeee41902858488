/// One candidate pair of the check list (RFC 8445 §6.1.2) and its check state.
public struct IceCandidatePair: Equatable, Sendable, CustomStringConvertible {
    /// RFC 8445 §6.1.2.6 pair states.
    public enum State: String, Sendable { case frozen, waiting, inProgress, succeeded, failed }

    public var local: IceCandidate
    /// The socket address checks and media leave from (a host candidate's own address).
    public var localBase: TransportAddress
    public var remote: IceCandidate
    public var remoteAddress: TransportAddress
    public var state: State = .frozen
    /// A check with USE-CANDIDATE succeeded on it (controlling), or the peer nominated it (controlled).
    public var nominated = false
    /// Controlled side: the peer sent USE-CANDIDATE before our own check succeeded.
    public var nominateOnSuccess = false

    public init(local: IceCandidate, localBase: TransportAddress, remote: IceCandidate, remoteAddress: TransportAddress) {
        self.local = local
        self.localBase = localBase
        self.remote = remote
        self.remoteAddress = remoteAddress
    }

    public var key: IcePairKey { IcePairKey(localBase: localBase, remote: remoteAddress) }
    /// Pairs with equal foundations are likely to succeed or fail together (§6.1.2.6).
    public var foundation: String { local.foundation + ":" + remote.foundation }

    /// §6.1.2.3: 2^32·MIN(G,D) + 2·MAX(G,D) + (G>D ? 1 : 0), G the controlling side's priority.
    public func priority(controlling: Bool) -> UInt64 {
        let g = UInt64(controlling ? local.priority : remote.priority)
        let d = UInt64(controlling ? remote.priority : local.priority)
        return (min(g, d) << 32) + 2 * max(g, d) + (g > d ? 1 : 0)
    }

    public var description: String { "\(localBase) -> \(remoteAddress) (\(remote.kind.rawValue), \(state.rawValue)\(nominated ? ", nominated" : ""))" }
}

/// A pair's identity: where checks leave from and where they go.
public struct IcePairKey: Hashable, Sendable {
    public var localBase: TransportAddress
    public var remote: TransportAddress
}

/// The check list of one component (RFC 8445 §6.1.2): pairs ordered by
/// priority, frozen by foundation, unfrozen as checks succeed. Pure state:
/// the agent decides when to check; this decides what.
public struct IceCheckList: Sendable {
    public private(set) var pairs: [IceCandidatePair] = []
    public var controlling: Bool
    /// RFC 8445 §6.1.2.5 suggests a limit; 100 is what libwebrtc and pion use.
    public let maximumPairs: Int

    public init(controlling: Bool, maximumPairs: Int = 100) {
        self.controlling = controlling
        self.maximumPairs = maximumPairs
    }

    public func index(of key: IcePairKey) -> Int? { pairs.firstIndex { $0.key == key } }
    public subscript(key: IcePairKey) -> IceCandidatePair? { index(of: key).map { pairs[$0] } }

    /// Adds a pair unless one with the same local base and remote address exists (§6.1.2.4
    /// pruning: the redundant one with the lower priority goes). New pairs start waiting when
    /// no other pair shares their foundation, else frozen. Returns the pair's key, or nil when
    /// the families differ, the remote port is 0, or the list is full.
    @discardableResult
    public mutating func add(local: IceCandidate, localBase: TransportAddress, remote: IceCandidate) -> IcePairKey? {
        guard let remoteAddress = remote.transportAddress, remoteAddress.port != 0,
              remoteAddress.ip.isIPv6 == localBase.ip.isIPv6, remote.component == local.component,
              remote.transport == "udp" else { return nil }
        var pair = IceCandidatePair(local: local, localBase: localBase, remote: remote, remoteAddress: remoteAddress)
        if let existing = index(of: pair.key) {
            // Keep the state; take the higher-priority remote description (a prflx later signalled as host).
            if pair.priority(controlling: controlling) > pairs[existing].priority(controlling: controlling) {
                pairs[existing].remote = remote
                sort()
            }
            return pair.key
        }
        guard pairs.count < maximumPairs else { return nil }
        pair.state = pairs.contains { $0.foundation == pair.foundation && $0.state != .failed } ? .frozen : .waiting
        pairs.append(pair)
        sort()
        return pair.key
    }

    private mutating func sort() {
        let controlling = self.controlling
        pairs.sort { $0.priority(controlling: controlling) > $1.priority(controlling: controlling) }
    }

    public mutating func setControlling(_ value: Bool) {
        controlling = value
        sort()
    }

    /// The pair an ordinary check should go to next (§6.1.4.2): the highest-priority waiting
    /// pair, else the highest-priority frozen one, which is unfrozen. nil when none is left.
    public mutating func nextOrdinaryCheck() -> IcePairKey? {
        if let i = pairs.firstIndex(where: { $0.state == .waiting }) { return pairs[i].key }
        if let i = pairs.firstIndex(where: { $0.state == .frozen }) {
            pairs[i].state = .waiting
            return pairs[i].key
        }
        return nil
    }

    public mutating func setState(_ key: IcePairKey, _ state: IceCandidatePair.State) {
        guard let i = index(of: key) else { return }
        pairs[i].state = state
        if state == .succeeded {
            // §7.2.5.3.3: a success unfreezes the pairs that share its foundation.
            let foundation = pairs[i].foundation
            for j in pairs.indices where pairs[j].state == .frozen && pairs[j].foundation == foundation { pairs[j].state = .waiting }
        }
    }

    public mutating func update(_ key: IcePairKey, _ change: (inout IceCandidatePair) -> Void) {
        guard let i = index(of: key) else { return }
        change(&pairs[i])
    }

    /// The best succeeded pair, the one the controlling side nominates.
    public var bestSucceeded: IceCandidatePair? { pairs.first { $0.state == .succeeded } }

    /// True while a pair ranked above `key` may still succeed (frozen, waiting or in progress).
    public func higherPriorityPending(than key: IcePairKey) -> Bool {
        guard let i = index(of: key) else { return false }
        return pairs[..<i].contains { $0.state == .frozen || $0.state == .waiting || $0.state == .inProgress }
    }

    public var allFailed: Bool { !pairs.isEmpty && pairs.allSatisfy { $0.state == .failed } }

    public mutating func removeAll() { pairs.removeAll() }
}
