import Dispatch
import KraklRoom
import Synchronization

/// Our ICE candidates on their way to the room, each exactly once and in order, then "no more".
///
/// Server-reflexive and relay candidates are gathered while the offer is on its way: a TURN
/// allocation on loopback takes ~2 ms, the WHIP POST or Twilio `connect` longer. Before the room has
/// answered, a driver cannot send them (a WHIP server has no resource to PATCH yet), so they are
/// held and go in one batch as soon as `publish` returns; after that each goes as it comes. Once
/// gathering has ended, end-of-candidates follows everything sent before it. Without the holding,
/// every relay candidate found before the answer was lost, and relayed sessions connected only
/// because the receiver learned the relay address as peer-reflexive from our checks (issue 24).
///
/// The driver's calls block (an HTTP PATCH, up to its trickle time-out), so they run on a queue of
/// their own, never on the publisher's network thread; the order is the order of the calls here,
/// fixed under the lock.
final class CandidateForwarder: Sendable {
    private enum Phase {
        /// The room has not answered yet: what was gathered so far.
        case holding([String])
        case forwarding
    }

    private let phase = Mutex(Phase.holding([]))
    private let driver: any RoomDriver
    private let mid: String
    private let queue = DispatchQueue(label: "krakl-candidates")

    init(driver: any RoomDriver, mid: String) {
        self.driver = driver
        self.mid = mid
    }

    /// A candidate ICE gathered (an `a=candidate` value without `a=`); any thread.
    func add(_ candidate: String) {
        phase.withLock { phase in
            switch phase {
            case .holding(let held): phase = .holding(held + [candidate])
            case .forwarding: queue.async { [driver, mid] in driver.trickle(candidate: candidate, mid: mid) }
            }
        }
    }

    /// The room answered the offer: what was held goes now, in one message where the driver can.
    func roomAnswered() {
        phase.withLock { phase in
            guard case .holding(let held) = phase else { return }
            phase = .forwarding
            if !held.isEmpty { queue.async { [driver, mid] in driver.trickle(candidates: held, mid: mid) } }
        }
    }

    /// Gathering ended (every STUN and TURN server answered or gave up): end-of-candidates, after
    /// everything before it. Only once the room has answered (the session asks after the answer).
    func gatheringEnded() {
        phase.withLock { phase in
            guard case .forwarding = phase else { return }
            queue.async { [driver] in driver.endOfCandidates() }
        }
    }

}
