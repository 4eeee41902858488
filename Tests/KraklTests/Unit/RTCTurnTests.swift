import Foundation
import Testing
@testable import KraklRTC

/// Canned TURN server answers (RFC 8656) for the client's state machine: it reads what the client
/// sent and builds responses the way coturn does (401 with REALM and NONCE, MESSAGE-INTEGRITY on
/// answers to authenticated requests).
struct CannedTurnServer {
    let address = TransportAddress(ip: IPAddress("198.51.100.1")!, port: 3478)
    let relayed = TransportAddress(ip: IPAddress("198.51.100.1")!, port: 50_000)
    let mapped = TransportAddress(ip: IPAddress("203.0.113.9")!, port: 40_000)
    var user = "u", password = "p", realm = "krakl", nonce = "nonce-1"
    var key: [UInt8] { StunMessage.longTermKey(username: user, realm: realm, password: password) }
    var transport = TurnTransport.udp
    var server: TurnServer { TurnServer(address: address, username: user, password: password, transport: transport) }

    func parse(_ bytes: [UInt8]) throws -> StunMessage { try StunMessage(parsing: bytes) }

    func challenge(_ request: StunMessage, code: Int = 401, reason: String = "Unauthorized", nonce: String? = nil) -> [UInt8] {
        StunMessage(method: request.method, class: .errorResponse, transactionID: request.transactionID,
                    attributes: [.errorCode(code: code, reason: reason),
                                 .other(type: StunAttribute.Code.realm, value: Array(realm.utf8)),
                                 .other(type: StunAttribute.Code.nonce, value: Array((nonce ?? self.nonce).utf8))]).encoded()
    }

    func error(_ request: StunMessage, code: Int, reason: String) -> [UInt8] {
        StunMessage(method: request.method, class: .errorResponse, transactionID: request.transactionID,
                    attributes: [.errorCode(code: code, reason: reason)]).encoded(integrityKey: key)
    }

    func success(_ request: StunMessage, _ attributes: [StunAttribute] = [], integrity: Bool = true) -> [UInt8] {
        StunMessage(method: request.method, class: .successResponse, transactionID: request.transactionID, attributes: attributes)
            .encoded(integrityKey: integrity ? key : nil, fingerprint: true)
    }

    func allocated(_ request: StunMessage, lifetime: UInt32 = 600) -> [UInt8] {
        success(request, [.xorRelayedAddress(relayed), .xorMappedAddress(mapped), .lifetime(lifetime)])
    }

    /// Runs the 401 exchange and the allocation; returns the client, allocated, at time `now`.
    func allocatedClient(now: UInt64 = 1_000, lifetime: UInt32 = 600, configuration: TurnConfiguration = TurnConfiguration()) throws -> TurnClient {
        let client = TurnClient(server: server, configuration: configuration)
        client.start(now: now)
        let first = try parse(try #require(client.drain().datagrams.first))
        _ = client.receive(challenge(first), now: now)
        let second = try parse(try #require(client.drain().datagrams.first))
        _ = client.receive(allocated(second, lifetime: lifetime), now: now)
        try #require(client.state == .allocated)
        _ = client.drain()
        return client
    }
}

@Suite(.tags(.unit)) struct RTCTurnTests {
    let turn = CannedTurnServer()
    let peer = TransportAddress(ip: IPAddress("192.0.2.7")!, port: 5000)

    @Test func allocateAnswersTheChallengeWithLongTermCredentials() throws {
        let client = TurnClient(server: turn.server)
        client.start(now: 0)
        let first = try turn.parse(try #require(client.drain().datagrams.first))
        #expect(first.method == TurnMethod.allocate && first.messageClass == .request)
        #expect(first.attribute(StunAttribute.Code.requestedTransport) == .requestedTransport(17))
        #expect(first.attribute(StunAttribute.Code.messageIntegrity) == nil, "the first Allocate has no credentials yet")

        _ = client.receive(turn.challenge(first), now: 10)
        let second = try turn.parse(try #require(client.drain().datagrams.first))
        #expect(second.transactionID != first.transactionID)
        #expect(second.username == "u")
        #expect(second.attribute(StunAttribute.Code.realm) == .other(type: StunAttribute.Code.realm, value: Array("krakl".utf8)))
        #expect(second.attribute(StunAttribute.Code.nonce) == .other(type: StunAttribute.Code.nonce, value: Array("nonce-1".utf8)))
        try second.validateIntegrity(key: turn.key)

        _ = client.receive(turn.allocated(second), now: 20)
        let (_, events) = client.drain()
        #expect(events == [.allocated(relayed: turn.relayed, mapped: turn.mapped)])
        #expect(client.relayedAddress == turn.relayed && client.lifetime == 600)
        // Refreshed a minute before the 600 s lifetime ends.
        #expect(client.nextDeadline == 20 + 540_000_000_000)
    }

    @Test func secondUnauthorizedIsWrongCredentials() throws {
        let client = TurnClient(server: turn.server)
        client.start(now: 0)
        let first = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.challenge(first), now: 0)
        let second = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.challenge(second), now: 0)
        let (datagrams, events) = client.drain()
        #expect(datagrams.isEmpty, "no third attempt")
        #expect(events == [.failed(.unauthorized(server: "\(turn.address)"))])
        #expect("\(TurnError.unauthorized(server: "x"))".contains("credentials"))
    }

    @Test func unauthorizedWithoutRealmFails() throws {
        let client = TurnClient(server: turn.server)
        client.start(now: 0)
        let first = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.error(first, code: 401, reason: "Unauthorized"), now: 0)
        #expect(client.drain().events == [.failed(.noChallenge(server: "\(turn.address)"))])
    }

    @Test func staleNonceRetriesWithTheNewNonceAndIsBounded() throws {
        var configuration = TurnConfiguration()
        configuration.maximumStaleNonceRetries = 2
        let client = TurnClient(server: turn.server, configuration: configuration)
        client.start(now: 0)
        var request = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.challenge(request), now: 0)
        request = try turn.parse(try #require(client.drain().datagrams.first))
        // Two 438s are retried, each with the nonce it brought; the third gives up.
        for attempt in 2...3 {
            _ = client.receive(turn.challenge(request, code: 438, reason: "Stale Nonce", nonce: "nonce-\(attempt)"), now: 0)
            request = try turn.parse(try #require(client.drain().datagrams.first, "no retry after 438 #\(attempt)"))
            #expect(request.attribute(StunAttribute.Code.nonce) == .other(type: StunAttribute.Code.nonce, value: Array("nonce-\(attempt)".utf8)))
            try request.validateIntegrity(key: turn.key)
        }
        _ = client.receive(turn.challenge(request, code: 438, reason: "Stale Nonce", nonce: "nonce-4"), now: 0)
        let (datagrams, events) = client.drain()
        #expect(datagrams.isEmpty)
        #expect(events == [.failed(.staleNonceLoop(server: "\(turn.address)"))])
        // A 438 then success allocates.
        let fresh = TurnClient(server: turn.server)
        fresh.start(now: 0)
        var r = try turn.parse(fresh.drain().datagrams[0])
        _ = fresh.receive(turn.challenge(r), now: 0)
        r = try turn.parse(fresh.drain().datagrams[0])
        _ = fresh.receive(turn.challenge(r, code: 438, reason: "Stale Nonce", nonce: "nonce-9"), now: 0)
        r = try turn.parse(fresh.drain().datagrams[0])
        _ = fresh.receive(turn.allocated(r), now: 0)
        #expect(fresh.state == .allocated)
    }

    @Test func quotaAndMismatchAreTypedErrors() throws {
        for (code, expected) in [(486, TurnError.quotaReached(server: "\(turn.address)")), (437, .allocationMismatch(server: "\(turn.address)")),
                                 (508, .rejected(server: "\(turn.address)", code: 508, reason: "Insufficient Capacity"))] {
            let client = TurnClient(server: turn.server)
            client.start(now: 0)
            let first = try turn.parse(client.drain().datagrams[0])
            _ = client.receive(turn.challenge(first), now: 0)
            let second = try turn.parse(client.drain().datagrams[0])
            _ = client.receive(turn.error(second, code: code, reason: code == 508 ? "Insufficient Capacity" : "x"), now: 0)
            #expect(client.drain().events == [.failed(expected)], "code \(code)")
            #expect(client.state == .failed(expected))
        }
    }

    @Test func silentServerTimesOutAfterBoundedRetransmissions() throws {
        let client = TurnClient(server: turn.server)
        client.start(now: 0)
        var sent = client.drain().datagrams.count
        var events: [TurnEvent] = []
        for _ in 0..<20 {
            guard let due = client.nextDeadline else { break }
            client.tick(now: due)
            let out = client.drain()
            sent += out.datagrams.count
            events += out.events
        }
        #expect(sent == TurnConfiguration().maximumTransmissions)
        guard case .failed(.timeout(_, let request, let seconds, _))? = events.first else {
            Issue.record("no timeout: \(events)")
            return
        }
        #expect(request == "Allocate" && seconds > 5 && seconds < 10)
        #expect(client.nextDeadline == nil)
    }

    @Test func lifetimeRefreshHappensBeforeExpiryAndMismatchEndsTheAllocation() throws {
        let client = try turn.allocatedClient(now: 0, lifetime: 60)
        // A short lifetime is refreshed halfway.
        let due = try #require(client.nextDeadline)
        #expect(due == 30_000_000_000)
        client.tick(now: due - 1)
        #expect(client.drain().datagrams.isEmpty)
        client.tick(now: due)
        let refresh = try turn.parse(try #require(client.drain().datagrams.first))
        #expect(refresh.method == TurnMethod.refresh)
        #expect(refresh.attribute(StunAttribute.Code.lifetime) == .lifetime(600))
        try refresh.validateIntegrity(key: turn.key)
        _ = client.receive(turn.success(refresh, [.lifetime(300)]), now: due)
        #expect(client.lifetime == 300)
        #expect(client.nextDeadline == due + 240_000_000_000)

        client.tick(now: due + 240_000_000_000)
        let second = try turn.parse(try #require(client.drain().datagrams.first))
        _ = client.receive(turn.error(second, code: 437, reason: "Allocation Mismatch"), now: due + 240_000_000_000)
        #expect(client.drain().events == [.failed(.allocationMismatch(server: "\(turn.address)"))])
        #expect(client.wrap([1, 2, 3], to: peer, now: 0) == nil, "nothing is relayed on a lost allocation")
    }

    /// A permission or channel refresh that the server never answers means the server is gone:
    /// the allocation fails then (not when consent expires), with the request that went unanswered.
    @Test func anUnansweredPermissionRefreshFailsTheAllocation() throws {
        let client = try turn.allocatedClient(now: 0)
        _ = client.wrap([1], to: peer, now: 0)
        let permission = try turn.parse(try #require(client.drain().datagrams.first))
        _ = client.receive(turn.success(permission), now: 0)
        let bind = try #require(try client.drain().datagrams.map { try turn.parse($0) }.first { $0.method == TurnMethod.channelBind })
        _ = client.receive(turn.success(bind), now: 0)
        _ = client.drain()
        var events: [TurnEvent] = []
        var refreshes = 0
        for _ in 0..<40 {
            guard let due = client.nextDeadline else { break }
            client.tick(now: due)
            let out = client.drain()
            refreshes += try out.datagrams.map { try turn.parse($0) }.filter { $0.method == TurnMethod.createPermission }.count
            events += out.events
            if !events.isEmpty { break }
        }
        #expect(refreshes == TurnConfiguration().maximumTransmissions, "\(refreshes) CreatePermission transmissions")
        guard case .failed(.timeout(_, let request, _, .udp))? = events.first else {
            Issue.record("the allocation did not fail: \(events), \(client.state)")
            return
        }
        #expect(request == "CreatePermission")
        #expect(client.wrap([1], to: peer, now: 0) == nil, "nothing is relayed on a lost allocation")
    }

    /// Over UDP the server's death shows as an ICMP port unreachable; the owner reports it and the
    /// allocation fails with a reason that names the server and UDP.
    @Test func anUnreachableUdpServerFailsTheAllocation() throws {
        let client = try turn.allocatedClient()
        client.connectionFailed("port unreachable (ICMP)")
        let events = client.drain().events
        #expect(events == [.failed(.connectionFailed(server: "\(turn.address)", over: "UDP", reason: "port unreachable (ICMP)"))])
        guard case .failed(let error) = client.state else {
            Issue.record("not failed: \(client.state)")
            return
        }
        #expect(error.description == "TURN server \(turn.address) over UDP: port unreachable (ICMP)")
    }

    /// The kernel's ICMP port unreachable reaches an unconnected socket only with IP_RECVERR: the
    /// socket reports where the refused datagram went, and reading on is not blocked by it.
    @Test func aUdpSocketReportsAnUnreachablePort() throws {
        let loopback = try #require(IPAddress("127.0.0.1"))
        let socket = try UdpSocket(bindTo: loopback, reportsErrors: true)
        let peer = try UdpSocket(bindTo: loopback)
        let closed = peer.localAddress
        peer.close()  // nothing listens there now
        let echo = try UdpSocket(bindTo: loopback)
        #expect(socket.send([1, 2, 3], to: closed))
        var report: (destination: TransportAddress, code: Int32)?
        for _ in 0..<200 where report == nil {
            report = socket.receiveError()
            if report == nil { usleep(5_000) }
        }
        let got = try #require(report, "no error report for a datagram to a closed port")
        #expect(got.destination == closed && got.code == ECONNREFUSED, "report: \(got)")
        #expect(socket.receiveError() == nil, "one datagram, one report")
        // The error pending after it costs no later datagram: this one is sent, and arrives.
        #expect(socket.send([1, 2, 3], to: closed))
        // Until the ICMP is in (the socket polls in error), bounded.
        var waiting = pollfd(fd: socket.fd, events: 0, revents: 0)
        for _ in 0..<100 where waiting.revents & Int16(POLLERR) == 0 { _ = poll(&waiting, 1, 10) }
        #expect(waiting.revents & Int16(POLLERR) != 0, "no ICMP error for the second datagram")
        #expect(socket.send([7], to: echo.localAddress), "a send failed on the earlier datagram's ICMP error")
        #expect(socket.sendFailures == 0)
        var echoed: [UInt8]?
        var echoBuffer = [UInt8](repeating: 0, count: 64)
        for _ in 0..<200 where echoed == nil {
            echoed = echo.receive(&echoBuffer)?.bytes
            if echoed == nil { usleep(5_000) }
        }
        #expect(echoed == [7])
        _ = socket.receiveError()
        // Datagrams still arrive after the error.
        #expect(echo.send([9], to: socket.localAddress))
        var buffer = [UInt8](repeating: 0, count: 64)
        var received: [UInt8]?
        for _ in 0..<200 where received == nil {
            received = socket.receive(&buffer)?.bytes
            if received == nil { usleep(5_000) }
        }
        #expect(received == [9])
    }

    @Test func permissionThenChannelCarryData() throws {
        let client = try turn.allocatedClient()
        // Before the permission: queued, CreatePermission asked.
        #expect(client.wrap([0xAA, 0xBB], to: peer, now: 2_000) == nil)
        let permission = try turn.parse(try #require(client.drain().datagrams.first))
        #expect(permission.method == TurnMethod.createPermission)
        #expect(permission.attribute(StunAttribute.Code.xorPeerAddress) == .xorPeerAddress(TransportAddress(ip: peer.ip, port: 0)))
        try permission.validateIntegrity(key: turn.key)
        _ = client.receive(turn.success(permission), now: 3_000)
        let (afterPermission, _) = client.drain()
        let messages = try afterPermission.map { try turn.parse($0) }
        // The queued datagram leaves as a Send indication, and the channel is asked for.
        let send = try #require(messages.first { $0.method == TurnMethod.send })
        #expect(send.messageClass == .indication)
        #expect(send.attribute(StunAttribute.Code.data) == .data([0xAA, 0xBB]))
        #expect(send.attribute(StunAttribute.Code.xorPeerAddress) == .xorPeerAddress(peer))
        let bind = try #require(messages.first { $0.method == TurnMethod.channelBind })
        #expect(bind.attribute(StunAttribute.Code.channelNumber) == .channelNumber(0x4000))
        // Until the channel is bound: Send indications.
        let beforeBind = try turn.parse(try #require(client.wrap([1], to: peer, now: 3_000)))
        #expect(beforeBind.method == TurnMethod.send)
        _ = client.receive(turn.success(bind), now: 4_000)
        #expect(client.drain().events == [.channelBound(peer: peer, channel: 0x4000)])
        #expect(client.wrap([1, 2, 3], to: peer, now: 4_000) == [0x40, 0x00, 0x00, 0x03, 1, 2, 3])

        // Incoming: ChannelData on the bound channel and Data indications; unknown channels dropped.
        #expect(client.receive([0x40, 0x00, 0x00, 0x02, 9, 8, 0, 0], now: 5_000).map { [$0.peer == peer ? 1 : 0] + $0.data } == [1, 9, 8])
        #expect(client.receive([0x40, 0x01, 0x00, 0x01, 7], now: 5_000) == nil)
        let indication = StunMessage(method: TurnMethod.data, class: .indication, transactionID: StunMessage.randomTransactionID(),
                                     attributes: [.xorPeerAddress(peer), .data([5, 6])]).encoded()
        let received = try #require(client.receive(indication, now: 5_000))
        #expect(received.peer == peer && received.data == [5, 6])

        // Permissions are renewed before their 300 s, channels before their 600 s.
        client.tick(now: 3_000 + 240_000_000_000)
        let renewals = try client.drain().datagrams.map { try turn.parse($0) }
        #expect(renewals.contains { $0.method == TurnMethod.createPermission })
    }

    @Test func forgedSuccessWithoutIntegrityIsIgnored() throws {
        let client = TurnClient(server: turn.server)
        client.start(now: 0)
        let first = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.challenge(first), now: 0)
        let second = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.success(second, [.xorRelayedAddress(turn.relayed)], integrity: false), now: 0)
        #expect(client.state == .allocating)
        var wrong = turn
        wrong.password = "not-p"
        _ = client.receive(wrong.allocated(second), now: 0)
        #expect(client.state == .allocating)
        _ = client.receive(turn.allocated(second), now: 0)
        #expect(client.state == .allocated)
    }

    @Test func closeDeallocatesWithLifetimeZero() throws {
        let client = try turn.allocatedClient()
        client.close(now: 5_000)
        let refresh = try turn.parse(try #require(client.drain().datagrams.first))
        #expect(refresh.method == TurnMethod.refresh && refresh.attribute(StunAttribute.Code.lifetime) == .lifetime(0))
        try refresh.validateIntegrity(key: turn.key)
        _ = client.receive(turn.success(refresh, [.lifetime(0)]), now: 6_000)
        #expect(client.drain().events == [.closed])
        #expect(client.state == .closed)
    }

    @Test func channelDataFramingAndPadding() {
        let message = ChannelData(channel: 0x4001, data: [1, 2, 3, 4, 5])
        #expect(message.encoded() == [0x40, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        #expect(message.encoded(padded: true) == [0x40, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0, 0, 0])
        #expect(ChannelData(parsing: message.encoded(padded: true)) == message, "padding after the data is ignored")
        #expect(ChannelData(parsing: [0x40, 0x01, 0x00, 0x06, 1, 2, 3, 4, 5]) == nil, "length past the end")
        #expect(ChannelData(parsing: [0x50, 0x00, 0x00, 0x00]) == nil, "reserved channel 0x5000")
        #expect(ChannelData(parsing: [0x40, 0x00, 0x00]) == nil)
        #expect(ChannelData(parsing: [0x4F, 0xFF, 0x00, 0x00]) == ChannelData(channel: 0x4FFF, data: []))
        #expect(ChannelData.looksLikeChannelData([0x40, 0, 0, 0]) && !ChannelData.looksLikeChannelData([0x00, 0x01, 0, 0]))
    }

    @Test func turnAttributesRoundTripAndRejectBadValues() throws {
        let id = StunMessage.randomTransactionID()
        let message = StunMessage(method: TurnMethod.channelBind, class: .request, transactionID: id,
                                  attributes: [.channelNumber(0x4ABC), .xorPeerAddress(peer), .lifetime(77), .data([1, 2, 3]),
                                               .requestedTransport(17), .xorRelayedAddress(turn.relayed)])
        let back = try StunMessage(parsing: message.encoded())
        #expect(back.attributes == message.attributes)
        // CHANNEL-NUMBER outside 0x4000-0x4FFF, LIFETIME of 3 bytes, an address of a bad family: rejected.
        for (type, value) in [(StunAttribute.Code.channelNumber, [0x30, 0x00, 0, 0] as [UInt8]), (StunAttribute.Code.lifetime, [0, 0, 1]),
                              (StunAttribute.Code.xorRelayedAddress, [0, 3, 0, 0, 1, 2, 3, 4]), (StunAttribute.Code.xorPeerAddress, [0, 1, 0])] {
            #expect(throws: StunError.self) { try StunAttribute.decode(type: type, value: value, transactionID: id) }
        }
    }

    /// Mutated TURN answers, Data indications and ChannelData never crash the client, and whatever
    /// it accepts is well formed.
    @Test func fuzzedServerDatagramsNeverCrashTheClient() throws {
        let client = try turn.allocatedClient()
        _ = client.wrap([1], to: peer, now: 0)
        let permission = try turn.parse(client.drain().datagrams[0])
        _ = client.receive(turn.success(permission), now: 0)
        let bind = try client.drain().datagrams.map { try turn.parse($0) }.first { $0.method == TurnMethod.channelBind }!
        _ = client.receive(turn.success(bind), now: 0)
        #expect(client.wrap([1], to: peer, now: 0)?.first == 0x40)

        let samples: [[UInt8]] = [
            [0x40, 0x00, 0x00, 0x04, 1, 2, 3, 4],
            StunMessage(method: TurnMethod.data, class: .indication, transactionID: StunMessage.randomTransactionID(),
                        attributes: [.xorPeerAddress(peer), .data([5, 6, 7])]).encoded(),
            turn.allocated(StunMessage(method: TurnMethod.allocate, class: .request, transactionID: StunMessage.randomTransactionID())),
            turn.challenge(StunMessage(method: TurnMethod.refresh, class: .request, transactionID: StunMessage.randomTransactionID()), code: 438),
            turn.success(StunMessage(method: TurnMethod.channelBind, class: .request, transactionID: StunMessage.randomTransactionID()),
                         [.channelNumber(0x4000), .lifetime(600)]),
        ]
        var delivered = 0
        let outcome = Fuzz.run(seed: 0x7E57_7A2B, samples: samples) { input in
            if let (_, data) = client.receive(input, now: 1) {
                delivered += 1
                #expect(data.count <= input.count)
            } else {
                throw StunError.truncated(needed: 0, got: input.count)
            }
        }
        print("TURN client fuzz: \(outcome.inputs) inputs, \(outcome.accepted) delivered a peer datagram, \(outcome.rejected) dropped")
        #expect(outcome.inputs >= 1000 && outcome.accepted > 0 && outcome.rejected > 0)
        #expect(delivered == outcome.accepted)

        let stun = Fuzz.run(seed: 0xC0FF_EE42, samples: samples) { _ = try StunMessage(parsing: $0) }
        #expect(stun.inputs >= 1000 && stun.accepted > 0 && stun.rejected > 0)
        let framing = Fuzz.run(seed: 0x4000_4FFF, samples: [samples[0], ChannelData(channel: 0x4FFF, data: [1, 2, 3]).encoded(padded: true)]) { input in
            guard let message = ChannelData(parsing: input) else { throw StunError.truncated(needed: 4, got: input.count) }
            #expect(ChannelData.channelRange.contains(message.channel) && message.data.count <= input.count - 4)
        }
        #expect(framing.inputs >= 1000 && framing.accepted > 0 && framing.rejected > 0)
    }

    /// Over TCP (RFC 8656 §3.1): a request is sent once and times out as over UDP; ChannelData is
    /// padded to 4 bytes so the next message on the stream starts aligned.
    @Test func overTcpRequestsAreNotRetransmittedAndChannelDataIsPadded() throws {
        var tcp = turn
        tcp.transport = .tcp
        let client = TurnClient(server: tcp.server)
        client.start(now: 0)
        #expect(client.drain().datagrams.count == 1)
        var later = 0
        for step in 1...40 {
            client.tick(now: UInt64(step) * 250_000_000)
            later += client.drain().datagrams.count
        }
        #expect(later == 0, "\(later) retransmissions over TCP")
        guard case .failed(.timeout) = client.state else {
            Issue.record("no time-out after 10 s: \(client.state)")
            return
        }

        let allocated = try tcp.allocatedClient()
        let peer = TransportAddress(ip: IPAddress("192.0.2.7")!, port: 9)
        _ = allocated.wrap([1], to: peer, now: 1_000)
        let permission = try tcp.parse(allocated.drain().datagrams[0])
        _ = allocated.receive(tcp.success(permission), now: 1_000)
        let bind = try allocated.drain().datagrams.map { try tcp.parse($0) }.first { $0.method == TurnMethod.channelBind }!
        _ = allocated.receive(tcp.success(bind), now: 1_000)
        let wire = try #require(allocated.wrap([1, 2, 3, 4, 5], to: peer, now: 1_000))
        #expect(wire.count == 12 && wire[0] == 0x40 && wire[3] == 5, "ChannelData over TCP: \(wire)")
    }
}
