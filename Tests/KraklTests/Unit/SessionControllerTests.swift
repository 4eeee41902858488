import Foundation
import Glibc
import KraklBase
import KraklHost
import KraklRoom
import KraklRTC
import KraklSession
import Testing

/// SessionController in this process (the session logic the daemon, the home screen and `--join`
/// lines share; DaemonTests and HomeScreenTests drive it through the agent): refused connects leave
/// it idle with nothing started, one session at a time, stop when idle does nothing, and a
/// session's end comes back as an event and as the status's last end, with the status the owner
/// numbered it. Every call is made on the controller's loop, as its owners do (`LoopBound` traps
/// otherwise); sessions use a room driver of this file (no server) and the file backend in process.
@Suite(.tags(.unit)) struct SessionControllerTests {
    /// A join code's text for a WHIP room, its token valid from `nbf` to `exp` (seconds since 1970).
    static func code(exp: Int, nbf: Int) -> String {
        let token = JoinCodeTests.token(claims: JoinCodeTests.claims(exp: exp, nbf: nbf))
        return JoinCode(service: .whip, url: URL(string: "http://127.0.0.1:9/whip")!, token: token).text
    }

    static var validCode: String {
        let now = Int(Date().timeIntervalSince1970)
        return code(exp: now + 3600, nbf: now - 60)
    }

    /// A room driver whose publish waits (at most 20 s) until the test lets it fail.
    final class HeldDriver: RoomDriver, Sendable {
        let service = "held room"
        private let state = Guarded<(published: Int, left: Int, release: RoomError?)>((0, 0, nil))
        private let handler = Locked<(@Sendable (RoomEvent) -> Void)?>(wrappedValue: nil)

        var onEvent: (@Sendable (RoomEvent) -> Void)? {
            get { handler.wrappedValue }
            set { handler.wrappedValue = newValue }
        }
        var left: Int { state.withLock { $0.left } }

        /// How many publishes began, once there is one (or `timeout` s passed: 0).
        func waitForPublish(timeout: Double) -> Int {
            state.wait(until: Date().addingTimeInterval(timeout), for: { $0.published > 0 }, then: { value, _ in value.published })
        }

        func release(_ error: RoomError) { state.change { $0.release = error } }

        func publish(offer: String, identity: String) throws(RoomError) -> RoomAnswer {
            state.change { $0.published += 1 }
            let released = state.wait(until: Date().addingTimeInterval(20), for: { $0.release != nil }, then: { value, _ in value.release })
            throw released ?? .unreachable("the test never released the held publish")
        }
        func restart(offer: String) throws(RoomError) -> String { throw .restartUnsupported("held room") }
        func trickle(candidate: String, mid: String) {}
        func leave() { state.change { $0.left += 1 } }
        func endOfCandidates() {}
        var roomDetails: String? { nil }
    }

    /// A controller on a loop of its own, its events collected, its sessions made by `prepare`.
    final class Rig: Sendable {
        let loop: EventLoop
        let controller: SessionController
        let events = Guarded<[SessionController.Event]>([])
        let prepared = Guarded(0)
        /// What the owner numbers ends with here (the agent: ExitStatus.swift).
        static let exitStatusOfStops: Int32 = 70
        static let exitStatusOfEnds: Int32 = 77

        init(registry: String = "/nonexistent/plugins.json", driver: HeldDriver = HeldDriver()) throws {
            loop = try EventLoop(name: "test-controller")
            let prepared = prepared
            let setup = SessionController.Setup(prepare: { _ in
                prepared.change { $0 += 1 }
                var configuration = SharingConfiguration()
                configuration.registryPath = registry
                configuration.backendName = "file"
                configuration.backendIsolation = false
                configuration.backendOptions = [("scene", .string("static")), ("width", .number("320")), ("height", .number("240"))]
                configuration.publisher.addresses = IceAddressPolicy(allowed: [IPAddress("127.0.0.1")!])
                return (driver, configuration)
            }, exitStatus: { $0 == .userStopped ? Rig.exitStatusOfStops : Rig.exitStatusOfEnds }, source: "scene static")
            controller = SessionController(setup: setup, loop: loop, logger: stderrLogger(maximum: .error), notifier: nil)
            let events = events
            controller.onEvent { event in events.change { $0.append(event) } }
            loop.start()
        }

        deinit { _ = loop.stop(timeout: .seconds(5)) }

        /// Runs `body` on the controller's loop and returns what it returned (bounded: 10 s).
        func onLoop<T: Sendable>(_ body: @escaping @Sendable (SessionController) -> T) throws -> T {
            let result = Guarded<T?>(nil)
            loop.post { [controller] in
                let value = body(controller)
                result.change { $0 = value }
            }
            let value = result.wait(until: Date().addingTimeInterval(10), for: { $0 != nil }, then: { value, _ in value })
            return try #require(value, "the controller's loop did not run the work within 10 s")
        }

        /// The first event `match` takes, waiting up to `timeout` seconds for it.
        func waitFor<T>(_ what: String, timeout: Double = 15, _ match: (SessionController.Event) -> T?) throws -> T {
            let found = events.wait(until: Date().addingTimeInterval(timeout), for: { $0.contains { match($0) != nil } },
                                    then: { events, _ in events.lazy.compactMap(match).first })
            return try #require(found, "no \(what) within \(timeout) s; events: \(events.withLock { $0 })")
        }

        var eventsSoFar: [SessionController.Event] { events.withLock { $0 } }
        var preparedSoFar: Int { prepared.withLock { $0 } }
    }

    @Test func aMalformedJoinCodeIsRefusedAndNothingStarts() throws {
        let rig = try Rig()
        let refusal = try rig.onLoop { $0.connect(code: "krakl:not-a-join-code") }
        let reason = try #require(refusal?.reason)
        guard case .joinCode(.malformedCode) = reason else {
            Issue.record("refused as \(reason), not as a malformed code: \(refusal?.message ?? "")")
            return
        }
        #expect(try rig.onLoop { $0.isActive } == false)
        #expect(try rig.onLoop { $0.status().state } == "idle")
        #expect(try rig.onLoop { $0.status().lastEnd } == nil)
        #expect(rig.preparedSoFar == 0, "a refused code must not make a driver or a configuration")
        #expect(rig.eventsSoFar.isEmpty, "events after a refused connect: \(rig.eventsSoFar)")
    }

    @Test func anExpiredJoinCodeIsRefusedWithItsReasonAndNothingStarts() throws {
        let rig = try Rig()
        let now = Int(Date().timeIntervalSince1970)
        let expired = Self.code(exp: now - 3600, nbf: now - 7200)
        let refusal = try rig.onLoop { $0.connect(code: expired) }
        let reason = try #require(refusal?.reason)
        guard case .joinCode(.tokenExpired) = reason else {
            Issue.record("refused as \(reason), not as an expired token: \(refusal?.message ?? "")")
            return
        }
        #expect(refusal?.message.contains("expired") == true, "the words: \(refusal?.message ?? "")")
        #expect(try rig.onLoop { $0.isActive } == false)
        #expect(try rig.onLoop { $0.status().state } == "idle")
        #expect(rig.preparedSoFar == 0)
        #expect(rig.eventsSoFar.isEmpty)
        // Still usable: a valid code is accepted afterwards (its session ends on the missing backend).
        #expect(try rig.onLoop { $0.connect(code: Self.validCode)?.message } == nil)
        _ = try rig.waitFor("end") { if case .ended(let reason, _) = $0 { reason } else { nil } }
    }

    @Test func stopWhenIdleDoesNothing() throws {
        let rig = try Rig()
        #expect(try rig.onLoop { $0.stop() } == false)
        #expect(try rig.onLoop { $0.stop() } == false)
        let status = try rig.onLoop { $0.status() }
        #expect(status.state == "idle")
        #expect(status.lastEnd == nil)
        #expect(status.pid == getpid())
        #expect(status.room == nil && status.source == nil)
        #expect(try rig.onLoop { $0.sessionStatus() == nil })
        #expect(rig.eventsSoFar.isEmpty)
    }

    /// Both connects in one turn of the loop: the first session's end (posted to the loop) cannot
    /// come between them, so the second always finds it running.
    @Test func aSecondConnectWhileOneRunsIsRefusedAndTheFirstEndsAsItWould() throws {
        let rig = try Rig()
        let code = Self.validCode
        let (first, second, activeBetween) = try rig.onLoop { controller -> (String?, SessionController.Refusal.Reason?, Bool) in
            let first = controller.connect(code: code)
            let active = controller.isActive
            let second = controller.connect(code: code)
            return (first?.message, second?.reason, active)
        }
        #expect(first == nil, "the first connect was refused: \(first ?? "")")
        #expect(activeBetween)
        #expect(second == .alreadySharing)
        #expect(rig.preparedSoFar == 1, "the refused connect made a session too")
        let start = try rig.waitFor("connecting") { if case .connecting(let start) = $0 { start } else { nil } }
        #expect(start.service == "held room")
        #expect(start.words.hasPrefix("connecting to http://127.0.0.1:9/whip on held room as "), "\(start.words)")
        // The backend's registry does not exist: the session ends on its own, as sourceUnavailable.
        let (reason, idle) = try rig.waitFor("end") { if case .ended(let reason, let status) = $0 { (reason, status) } else { nil } }
        guard case .sourceUnavailable = reason else {
            Issue.record("ended as \(reason), not sourceUnavailable")
            return
        }
        #expect(idle.state == "idle")
        #expect(idle.lastEnd == ControlEnd(reason: "source-unavailable", message: reason.description, exitStatus: Rig.exitStatusOfEnds))
        #expect(try rig.onLoop { $0.isActive } == false)
        #expect(try rig.onLoop { $0.status().lastEnd?.reason } == "source-unavailable")
        #expect(try rig.onLoop { $0.stop() } == false)
    }

    /// The person stops while the room has not answered: the session leaves (the controller tells
    /// the move), the held publish fails, the end is the person's and the controller is idle again.
    @Test func stopWhileJoiningEndsTheSessionAsUserStopped() throws {
        try KraklRTC.prepare()
        let folder = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: folder)
        let driver = HeldDriver()
        let rig = try Rig(registry: registry, driver: driver)
        #expect(try rig.onLoop { $0.connect(code: Self.validCode)?.message } == nil)
        // Joining: the source is open and the publish waits on the room.
        _ = try rig.waitFor("joining", timeout: 20) { if case .moved(.joining, let status) = $0 { status } else { nil } }
        #expect(driver.waitForPublish(timeout: 10) == 1, "the session never called publish (or twice)")
        let running = try rig.onLoop { $0.status() }
        #expect(running.state == "joining")
        #expect(running.service == "held room")
        #expect(running.source == "scene static")
        #expect(running.lastEnd == nil)
        #expect(try rig.onLoop { $0.stop() } == true)
        _ = try rig.waitFor("leaving") { if case .moved(.leaving(.userStopped), _) = $0 { true } else { nil } }
        driver.release(.unreachable("released by the test"))
        let (reason, idle) = try rig.waitFor("end") { if case .ended(let reason, let status) = $0 { (reason, status) } else { nil } }
        #expect(reason == .userStopped)
        #expect(idle.state == "idle")
        #expect(idle.lastEnd?.reason == "user-stopped")
        #expect(idle.lastEnd?.exitStatus == Rig.exitStatusOfStops)
        #expect(driver.left >= 1, "the session ended without leaving the room")
        #expect(try rig.onLoop { $0.isActive } == false)
    }
}
