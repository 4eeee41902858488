import KraklBase
import KraklHost
import KraklRoom
import KraklSession
import Testing

/// The lifecycle state by state: every state × every event. The table below
/// lists each transition that does something; every other pair must leave
/// the state as it is and do nothing (a late answer after stop, a second
/// stop, news from a session that already ended).
@Suite(.tags(.unit)) struct SharingLifecycleTests {
    typealias S = SharingLifecycle.State
    typealias E = SharingLifecycle.Event
    typealias A = SharingLifecycle.Action

    static let refusal = RoomError.unauthorized(status: 401, message: "Unauthorized")
    static let hostError = HostError.createFailed(backend: "x11", code: -19, message: "no display")

    /// One of each event.
    static let events: [E] = [
        .connect, .sourceReady, .answered, .connected, .stop, .joinFailed(refusal), .tokenExpired("expired 5 min ago"),
        .roomEnded("destroyed"), .sourceUnavailable(hostError), .sourceEnded("portal closed"),
        .connectionInterrupted("no consent answer for 6 s"), .connectionLost("consent expired"), .failure("encoder"), .left,
    ]

    /// The end reason each ending event gives.
    static func reason(_ event: E, in state: S) -> EndReason? {
        switch event {
        case .stop: return .userStopped
        case .joinFailed(let e): return .joinRefused(e)
        case .tokenExpired(let w): return .tokenExpired(w)
        case .roomEnded(let w): return .roomEnded(w)
        case .replaced(let w): return .replaced(w)
        case .sourceUnavailable(let e): return .sourceUnavailable(e)
        case .sourceEnded(let w): return .sourceEnded(w)
        case .connectionLost(let w): return .connectionLost(w)
        case .connectionInterrupted(let w): return state == .joining ? .connectionLost(w) : nil
        case .failure(let w): return .failure(w)
        default: return nil
        }
    }

    /// How to reach each state from idle.
    static func machine(in state: S) -> SharingLifecycle {
        var m = SharingLifecycle()
        let path: [E]
        switch state {
        case .idle: path = []
        case .preparing: path = [.connect]
        case .joining: path = [.connect, .sourceReady]
        case .sharing: path = [.connect, .sourceReady, .connected]
        case .reconnecting: path = [.connect, .sourceReady, .connected, .connectionInterrupted("x")]
        case .leaving(let r):
            path = [.connect, .sourceReady, .connected, r == .userStopped ? .stop : .roomEnded("destroyed")]
        }
        for e in path { _ = m.handle(e) }
        #expect(m.state == state, "could not reach \(state)")
        return m
    }

    static let states: [S] = [.idle, .preparing, .joining, .sharing, .reconnecting, .leaving(.userStopped)]

    /// What should happen: nil = ignored.
    static func expected(_ state: S, _ event: E) -> (S, [A])? {
        switch (state, event) {
        case (.idle, .connect): return (.preparing, [.prepareSource])
        case (.idle, .tokenExpired(let w)): return (.idle, [.finished(.tokenExpired(w))])
        case (.idle, _): return nil
        case (.leaving(let r), .left): return (.idle, [.finished(r)])
        case (.leaving, _): return nil
        case (.preparing, .sourceReady): return (.joining, [.join])
        case (.joining, .answered): return (.joining, [.startMedia])
        case (.joining, .connected): return (.sharing, [])
        case (.reconnecting, .connected): return (.sharing, [])
        case (.sharing, .connectionInterrupted): return (.reconnecting, [.restartIce])
        default:
            guard let r = reason(event, in: state) else { return nil }
            return (.leaving(r), [.leave(r)])
        }
    }

    @Test(arguments: states)
    func everyEventInState(_ state: S) {
        for event in Self.events {
            var m = Self.machine(in: state)
            let actions = m.handle(event)
            if let (next, wanted) = Self.expected(state, event) {
                #expect(m.state == next, "\(state) + \(event): state \(m.state), wanted \(next)")
                #expect(actions == wanted, "\(state) + \(event): actions \(actions), wanted \(wanted)")
            } else {
                #expect(m.state == state, "\(state) + \(event) should be ignored, went to \(m.state)")
                #expect(actions.isEmpty, "\(state) + \(event) should do nothing, did \(actions)")
            }
        }
    }

    @Test func aWholeSessionFromConnectToIdle() {
        var m = SharingLifecycle()
        #expect(m.handle(.connect) == [.prepareSource])
        #expect(m.handle(.sourceReady) == [.join])
        #expect(m.handle(.answered) == [.startMedia], "capture and encoding start at the answer, before ICE/DTLS are up")
        #expect(m.state == .joining)
        #expect(m.handle(.connected).isEmpty)
        #expect(m.state == .sharing)
        #expect(m.handle(.roomEnded("the meeting was ended")) == [.leave(.roomEnded("the meeting was ended"))])
        #expect(m.handle(.left) == [.finished(.roomEnded("the meeting was ended"))])
        #expect(m.state == .idle && !m.isActive)
        // Ready again without a new machine.
        #expect(m.handle(.connect) == [.prepareSource])
    }

    @Test func stopWhileJoiningLeavesAndALateAnswerChangesNothing() {
        var m = Self.machine(in: .joining)
        #expect(m.handle(.stop) == [.leave(.userStopped)])
        #expect(m.handle(.answered).isEmpty, "an answer that arrives after stop must not start media")
        #expect(m.handle(.connected).isEmpty, "a connection that completes after stop must not start media")
        #expect(m.handle(.roomEnded("destroyed")).isEmpty, "the first reason is kept")
        #expect(m.handle(.left) == [.finished(.userStopped)])
    }

    @Test func stopWhilePreparingDoesNotJoin() {
        var m = Self.machine(in: .preparing)
        #expect(m.handle(.stop) == [.leave(.userStopped)])
        #expect(m.handle(.sourceReady).isEmpty, "the portal's late yes must not join the room")
        #expect(m.handle(.left) == [.finished(.userStopped)])
    }

    @Test func roomEndedWhileLeavingKeepsTheFirstReason() {
        var m = Self.machine(in: .leaving(.userStopped))
        #expect(m.handle(.roomEnded("destroyed")).isEmpty)
        #expect(m.handle(.left) == [.finished(.userStopped)])
    }

    @Test func aRestartThatFailsEndsAsConnectionLost() {
        var m = Self.machine(in: .sharing)
        #expect(m.handle(.connectionInterrupted("no consent answer")) == [.restartIce])
        #expect(m.handle(.connectionInterrupted("again")).isEmpty, "one restart at a time")
        #expect(m.handle(.connectionLost("restart refused")) == [.leave(.connectionLost("restart refused"))])
    }

    @Test func endReasonsHaveDistinctNamesAndPlainWords() {
        let reasons: [EndReason] = [.userStopped, .roomEnded("a"), .sourceEnded("b"), .connectionLost("c"),
                                    .joinRefused(Self.refusal), .tokenExpired("d"), .sourceUnavailable(Self.hostError), .failure("e")]
        #expect(Set(reasons.map(\.name)).count == reasons.count)
        #expect(EndReason.userStopped.description == "You stopped sharing.")
        #expect(EndReason.roomEnded("the meeting was ended").description == "Sharing was ended by the room: the meeting was ended.")
        #expect(EndReason.sourceEnded("x").description.hasPrefix("The screen source was closed"))
        #expect(EndReason.connectionLost("x").description.hasPrefix("Connection lost"))
    }
}
