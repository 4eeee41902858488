import KraklBase
import Glibc

/// What the transport tells the publisher, on the network thread: time to send, connected, RTCP,
/// the end, a candidate to trickle.
extension Publisher: PeerTransportDelegate {
    func transportService(now: UInt64) {
        if !net.gatheringWaiters.isEmpty, !transport.ice.isGathering {
            let waiters = net.gatheringWaiters
            net.gatheringWaiters.removeAll()
            for waiter in waiters { waiter() }
        }
        net.stream?.poll(now: now, pathReady: transport.pathReady, clock: MonotonicClock.nanoseconds, unixNanoseconds: Publisher.unixNanoseconds,
                     transmit: { [transport] plain, rtcp in transport.transmit(plain, rtcp: rtcp) })
    }

    func transportNextDeadline(now: UInt64) -> UInt64? { net.stream?.nextDeadline(now: now) }

    func transportConnected(milliseconds: Double) {
        net.media = true
        emit(.connected(milliseconds: milliseconds))
        // A chain encoded while connecting (from its keyframe on) goes first; without one, the
        // receiver needs a keyframe and the stream asks the encoder for it.
        keepEarly(takeQueuedFrames())
        let now = MonotonicClock.nanoseconds()
        let (chain, stale) = net.early.take(now: now)
        if stale > 0 { updateStats { $0.framesDropped += stale } }
        net.stream?.start(now: now, keyframeReady: !chain.isEmpty)
        if !chain.isEmpty {
            updateStats { $0.earlyFramesSent += chain.count }
            net.stream?.enqueue(chain, queueOverflowed: false, now: now)
        }
    }

    func transportReceivedRtcp(_ plain: [UInt8], now: UInt64) {
        guard let stream = net.stream else { return }
        if let bye = stream.handleRtcp(plain, now: now, unixNanoseconds: Publisher.unixNanoseconds) {
            transport.end(.remoteBye(reason: bye.reason), state: "closed")
            return
        }
        transport.service()
    }

    func transportEnded(_ event: PublisherEvent) {
        net.media = false
        net.mediaEnded = true
        net.early.clear()
        net.stream?.stop()
        emit(event)
        let reason: String
        switch event {
        case .remoteClosed: reason = "the peer closed the connection (DTLS close_notify)"
        case .remoteBye(let text): reason = "the peer said goodbye (RTCP BYE\(text.map { ": \($0)" } ?? ""))"
        case .connectionLost(let text), .failed(let text), .relayRefused(_, let text): reason = text
        case .connected, .localCandidate: return
        }
        onClosed?(reason)
    }

    func transportLocalCandidate(_ candidate: IceCandidate) { emit(.localCandidate(candidate)) }

    /// CLOCK_REALTIME, for RTCP's NTP timestamps.
    static func unixNanoseconds() -> UInt64 {
        var wall = timespec()
        clock_gettime(CLOCK_REALTIME, &wall)
        return UInt64(wall.tv_sec) * 1_000_000_000 + UInt64(wall.tv_nsec)
    }

    /// The peer's words without control characters (they end up in logs and terminals).
    static func printable(_ text: String) -> String { VideoSendStream.printable(text) }
}
