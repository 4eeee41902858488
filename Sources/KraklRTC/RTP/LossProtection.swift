import KraklBase
/// Which media packets to send again unasked, and when: the publisher's loss protection for small
/// frames (the rules and why are at `VideoSendConfiguration.protectedFramePackets`).
///
/// Pure state (no clock, no socket), driven by the publisher's network thread: it reports frames as
/// they are queued, packets as they leave, and the receiver's loss reports; it asks `takeDue(now:)`
/// which sequence numbers to copy now and `nextDue` when to ask again.
struct LossProtection: Sendable {
    let framePackets: Int
    let delay: UInt64
    let hold: UInt64
    let secondCopyLoss: Double

    /// Protection is on until this time; `.max` until the first receiver report (loss unknown).
    private(set) var activeUntil = UInt64.max
    /// The loss fraction of the last receiver report.
    private(set) var reportedLoss = 0.0
    /// Packets of protected frames not sent yet.
    private var marked = Set<UInt16>()
    /// First and second copies, each queue in due order (a queue per copy keeps both sorted).
    private var due = [RingQueue<(dueNs: UInt64, sequence: UInt16)>](repeating: RingQueue(), count: 2)

    init(configuration: VideoSendConfiguration) {
        framePackets = configuration.protectedFramePackets
        delay = configuration.protectionDelay.inNanoseconds
        hold = configuration.protectionHold.inNanoseconds
        secondCopyLoss = configuration.secondCopyLoss
    }

    func isActive(now: UInt64) -> Bool { framePackets > 0 && now < activeUntil }

    /// A frame's packets went into the pacer.
    mutating func frameQueued<Sequences: Collection<UInt16>>(_ sequences: Sequences, now: UInt64) {
        guard isActive(now: now), sequences.count <= framePackets else { return }
        // Bounded: packets the pacer dropped never leave and would stay marked.
        if marked.count > 256 { marked.removeAll(keepingCapacity: true) }
        marked.formUnion(sequences)
    }

    /// A media packet left: a protected one is copied `delay` later, and again at twice that while the
    /// receiver reports `secondCopyLoss` or more.
    mutating func packetSent(_ sequence: UInt16, at sentNs: UInt64) {
        guard marked.remove(sequence) != nil else { return }
        due[0].append((sentNs + delay, sequence))
        if reportedLoss >= secondCopyLoss { due[1].append((sentNs + 2 * delay, sequence)) }
    }

    /// A receiver report about our stream: loss keeps protection on for `hold`; the first report
    /// without loss turns the start-up protection off.
    mutating func receiverReport(lossFraction: Double, now: UInt64) {
        reportedLoss = lossFraction
        if lossFraction > 0 {
            lossSeen(now: now)
        } else if activeUntil == .max {
            activeUntil = 0
        }
    }

    /// A NACK: loss, whatever the reports say.
    mutating func lossSeen(now: UInt64) { activeUntil = now + hold }

    /// The sequence numbers whose copies are due, oldest first in each round of copies.
    mutating func takeDue(now: UInt64) -> [UInt16] {
        var sequences: [UInt16] = []
        for k in due.indices {
            while let first = due[k].first, first.dueNs <= now {
                _ = due[k].popFirst()
                sequences.append(first.sequence)
            }
        }
        return sequences
    }

    /// When the next copy is due, if any is waiting.
    var nextDue: UInt64? { due.compactMap { $0.first?.dueNs }.min() }
}
