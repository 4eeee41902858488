import KraklBase

/// A leaky-bucket pacer (in the spirit of libwebrtc's): packets leave at
/// most at `rate` bits per second with a small burst allowance, so a
/// 100 kB keyframe spreads over ~100 ms at 2.5 Mbit/s × 2.5 instead of
/// leaving as one burst that overflows a router queue or a receiver's
/// socket buffer. Retransmissions go before new media. The queue is
/// bounded: when a frame does not fit, the oldest media packets are dropped
/// and the caller is told, so it can ask the encoder for a keyframe.
///
/// Pure state (no clock, no socket): the owner asks `pop(now:)` for the
/// next packet and `nextSendTime(now:)` for when to ask again.
public struct Pacer: Sendable {
    /// `redundant`: a copy sent unasked (see Publisher's loss protection); it waits and leaves
    /// with the retransmissions.
    public enum Kind: Sendable, Equatable { case media, retransmission, redundant }

    public struct Item: Sendable {
        public var packet: RtpPacket
        public var kind: Kind
        public var enqueuedNs: UInt64
        /// Bytes it will take on the wire before SRTP (header + payload).
        public var size: Int

        public init(packet: RtpPacket, kind: Kind, enqueuedNs: UInt64) {
            self.packet = packet
            self.kind = kind
            self.enqueuedNs = enqueuedNs
            size = packet.serializedSize
        }
    }

    /// Pacing rate in bits per second (the owner sets ~2.5 × the target bitrate).
    public private(set) var rate: Double
    /// How many packets may wait (media and retransmissions together).
    public let capacity: Int
    /// How long of a burst the bucket may save up while idle.
    public let burst: Duration

    private var media = RingQueue<Item>()
    private var retransmissions = RingQueue<Item>()
    /// Bytes that may leave now; negative while paying off the last packet.
    private var budget: Double = 0
    private var lastUpdate: UInt64?
    public private(set) var droppedPackets = 0

    public init(rate: Double, capacity: Int = 2048, burst: Duration = .milliseconds(5)) {
        precondition(rate > 0 && capacity > 0, "pacing needs a positive rate and capacity")
        self.rate = rate
        self.capacity = capacity
        self.burst = burst
    }

    public var count: Int { media.count + retransmissions.count }
    public var isEmpty: Bool { count == 0 }
    public var queuedBytes: Int { media.reduce(0) { $0 + $1.size } + retransmissions.reduce(0) { $0 + $1.size } }
    /// When the oldest waiting packet was queued.
    public var oldestEnqueuedNs: UInt64? {
        [media.first?.enqueuedNs, retransmissions.first?.enqueuedNs].compactMap { $0 }.min()
    }

    public mutating func setRate(_ bitsPerSecond: Double, now: UInt64) {
        refill(now)
        rate = max(bitsPerSecond, 8_000)
    }

    /// Queues one frame's packets (or retransmissions). Returns how many queued media
    /// packets had to be dropped to make room (0 normally); the frame itself always fits
    /// when it is no larger than the capacity.
    @discardableResult
    public mutating func enqueue(_ packets: [RtpPacket], kind: Kind, now: UInt64) -> Int {
        var dropped = 0
        if kind != .media {
            // Resends are worth less than fresh media when the queue is full: drop the excess.
            for packet in packets where count < capacity { retransmissions.append(Item(packet: packet, kind: kind, enqueuedNs: now)) }
            return 0
        }
        while count + packets.count > capacity, !media.isEmpty {
            _ = media.removeFirst()
            dropped += 1
        }
        while count + packets.count > capacity, !retransmissions.isEmpty { _ = retransmissions.removeFirst() }
        for packet in packets.prefix(capacity) { media.append(Item(packet: packet, kind: kind, enqueuedNs: now)) }
        droppedPackets += dropped
        return dropped
    }

    /// Drops every queued media packet (an outage: what waits is stale) and returns how many.
    public mutating func flushMedia() -> Int {
        let n = media.count
        media = RingQueue()
        droppedPackets += n
        return n
    }

    /// The next packet if the budget allows it now (retransmissions first), else nil.
    public mutating func pop(now: UInt64) -> Item? {
        refill(now)
        guard budget >= 0 else { return nil }
        let item = retransmissions.isEmpty ? media.popFirst() : retransmissions.popFirst()
        if let item { budget -= Double(item.size) }
        return item
    }

    /// When the next packet may leave: now when the budget allows, nil when nothing waits.
    public mutating func nextSendTime(now: UInt64) -> UInt64? {
        guard !isEmpty else { return nil }
        refill(now)
        if budget >= 0 { return now }
        return now + UInt64((-budget * 8 / rate) * 1e9) + 1
    }

    private mutating func refill(_ now: UInt64) {
        defer { lastUpdate = now }
        guard let last = lastUpdate, now > last else { return }
        let maximum = rate / 8 * Double(burst.inNanoseconds) / 1e9
        budget = min(maximum, budget + rate / 8 * Double(now - last) / 1e9)
    }
}

/// A FIFO over an array with a moving head: O(1) amortised append and removal at the front.
struct RingQueue<Element>: Sequence, Sendable where Element: Sendable {
    private var storage: [Element] = []
    private var head = 0

    var count: Int { storage.count - head }
    var isEmpty: Bool { count == 0 }
    var first: Element? { isEmpty ? nil : storage[head] }

    mutating func append(_ element: Element) { storage.append(element) }

    mutating func popFirst() -> Element? {
        guard !isEmpty else { return nil }
        let element = storage[head]
        head += 1
        if head >= 64 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
    }

    @discardableResult
    mutating func removeFirst() -> Element { popFirst()! }

    func makeIterator() -> ArraySlice<Element>.Iterator { storage[head...].makeIterator() }
}
