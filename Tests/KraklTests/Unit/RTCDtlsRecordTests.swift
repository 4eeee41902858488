import Foundation
import KraklRTC
import Testing

/// One test per class of bad DTLS record that reaches a connected
/// transport: each is dropped and counted, nothing is sent back, the
/// session stays up and keeps carrying data. Found by the fuzz test; the
/// short epoch-1 record ended the session before (OpenSSL 3.0 answers it
/// with a fatal internal_error alert).
@Suite(.tags(.unit))
struct RTCDtlsRecordTests {
    typealias Pair = RTCDtlsLoopbackTests.Pair

    /// A connected pair and the datagrams of its handshake.
    static func connected() throws -> (Pair, DtlsTestWire) {
        let pair = try Pair()
        let wire = pair.handshake()
        try #require(pair.client.state == .connected && pair.server.state == .connected, "handshake did not finish")
        return (pair, wire)
    }

    /// Record headers of a datagram: (type, epoch, sequence, length, offset).
    static func records(_ datagram: [UInt8]) -> [(type: UInt8, epoch: Int, sequence: Int, length: Int, offset: Int)] {
        var result: [(UInt8, Int, Int, Int, Int)] = []
        var offset = 0
        while offset + 13 <= datagram.count {
            let length = Int(datagram[offset + 11]) << 8 | Int(datagram[offset + 12])
            let sequence = datagram[offset + 5..<offset + 11].reduce(0) { $0 << 8 | Int($1) }
            result.append((datagram[offset], Int(datagram[offset + 3]) << 8 | Int(datagram[offset + 4]), sequence, length, offset))
            offset += 13 + length
        }
        return result
    }

    /// One record: header fields as given, body as given.
    static func record(type: UInt8 = 23, version: UInt16 = 0xfefd, epoch: UInt16 = 1, sequence: UInt64, body: [UInt8]) -> [UInt8] {
        [type, UInt8(version >> 8), UInt8(version & 0xff), UInt8(epoch >> 8), UInt8(epoch & 0xff)]
            + (0..<6).map { UInt8(truncatingIfNeeded: sequence >> (8 * (5 - UInt64($0)))) }
            + [UInt8(body.count >> 8), UInt8(body.count & 0xff)] + body
    }

    /// Delivers `datagram` and requires that nothing happened: no event, nothing sent, still connected.
    static func expectDropped(_ transport: DtlsTransport, _ datagram: [UInt8], _ what: String,
                              sourceLocation: SourceLocation = #_sourceLocation) {
        let output = transport.receive(datagram)
        #expect(output.events.isEmpty, "\(what): events \(output.events)", sourceLocation: sourceLocation)
        #expect(output.datagrams.isEmpty, "\(what): sent \(output.datagrams.count) datagrams (an alert?)", sourceLocation: sourceLocation)
        #expect(transport.state == .connected, "\(what): \(transport.state)", sourceLocation: sourceLocation)
    }

    /// Data still flows both ways.
    static func expectDataFlows(_ pair: Pair, sourceLocation: SourceLocation = #_sourceLocation) {
        let up = pair.client.send([7, 7]).datagrams.flatMap { pair.server.receive($0).events }
        let down = pair.server.send([8]).datagrams.flatMap { pair.client.receive($0).events }
        #expect(up == [.applicationData([7, 7])] && down == [.applicationData([8])], "data no longer flows", sourceLocation: sourceLocation)
    }

    @Test func protectedRecordsShorterThanNonceAndTagAreDropped() throws {
        let (pair, _) = try Self.connected()
        // AES-GCM records carry an 8-byte explicit nonce and a 16-byte tag: 0...23 bytes cannot be genuine.
        for length in 0..<24 {
            for transport in [pair.client, pair.server] {
                Self.expectDropped(transport, Self.record(sequence: UInt64(100 + length), body: Array(repeating: 0x5a, count: length)), "\(length)-byte epoch-1 record")
            }
        }
        #expect(pair.client.counters.badLengthRecords == 24 && pair.server.counters.badLengthRecords == 24)
        // 24 bytes can be genuine: it reaches OpenSSL, fails authentication and is discarded.
        Self.expectDropped(pair.client, Self.record(sequence: 200, body: Array(repeating: 0x5a, count: 24)), "24-byte forged record")
        #expect(pair.client.counters.discardedRecords == 1)
        // Short records of the other types too (alert, handshake, change_cipher_spec).
        for type: UInt8 in [20, 21, 22] {
            Self.expectDropped(pair.server, Self.record(type: type, sequence: 300, body: [1, 0]), "short type-\(type) record")
        }
        #expect(pair.server.counters.badLengthRecords == 27)
        Self.expectDataFlows(pair)
    }

    @Test func epochFlippedToOneOnShortHandshakeRecordsIsDropped() throws {
        let (pair, wire) = try Self.connected()
        // The client's final flight (…, ChangeCipherSpec in epoch 0, Finished in epoch 1)
        // and the server's first (…, ServerHelloDone, 12 bytes): flip an epoch-0 record's epoch to 1.
        var flipped = 0
        for datagram in wire.datagrams {
            for record in Self.records(datagram) where record.epoch == 0 && record.length < 24 {
                var bent = datagram
                bent[record.offset + 4] ^= 1
                for transport in [pair.client, pair.server] { Self.expectDropped(transport, bent, "type-\(record.type) record of \(record.length) bytes in epoch 1") }
                flipped += 1
            }
        }
        #expect(flipped >= 2, "no short epoch-0 records in the handshake")
        #expect(pair.client.counters.badLengthRecords == flipped && pair.server.counters.badLengthRecords == flipped)
        Self.expectDataFlows(pair)
    }

    @Test func aLengthFieldThatDisagreesWithTheDatagramDropsItWhole() throws {
        let (pair, _) = try Self.connected()
        let genuine = try #require(pair.client.send(Array("payload".utf8)).datagrams.first)
        // Shorter (a 22-byte record followed by garbage), longer, and trailing bytes.
        var shorter = genuine; shorter[12] = 22
        var longer = genuine; longer[12] &+= 1
        Self.expectDropped(pair.server, shorter, "length field cut")
        Self.expectDropped(pair.server, longer, "length field past the end")
        Self.expectDropped(pair.server, genuine + [0, 0, 0], "trailing bytes")
        Self.expectDropped(pair.server, Array(genuine.prefix(12)), "a partial header")
        #expect(pair.server.counters.malformedDatagrams == 4)
        #expect(pair.server.counters.discardedRecords == 0, "a malformed datagram reached OpenSSL")
        // The forged copies burned nothing: the genuine record is still accepted, once.
        #expect(pair.server.receive(genuine).events == [.applicationData(Array("payload".utf8))])
    }

    @Test func aRecordThatFailsAuthenticationIsDiscardedAndCounted() throws {
        let (pair, _) = try Self.connected()
        let genuine = try #require(pair.client.send(Array(repeating: 0x33, count: 64)).datagrams.first)
        // Every byte after the header: nonce, ciphertext, tag.
        for index in 13..<genuine.count {
            var bent = genuine
            bent[index] ^= 0x10
            Self.expectDropped(pair.server, bent, "byte \(index) flipped")
        }
        // The header is authenticated too (additional data): type, version (major kept), sequence.
        for index in [0, 2, 10] {
            var bent = genuine
            bent[index] ^= index == 0 ? 0x03 : 0x01  // 23 -> 20 keeps the type valid
            Self.expectDropped(pair.server, bent, "header byte \(index) changed")
        }
        // Each flipped body byte and the two bent header fields that still pass the filter
        // (type, sequence) reached OpenSSL and were discarded there.
        let counters = pair.server.counters
        #expect(counters.discardedRecords == genuine.count - 13 + 2, "\(counters)")
        #expect(counters.unexpectedRecords == 1, "version 0xfefc is not DTLS 1.2: \(counters)")
        // None of them burned the sequence number: the genuine record arrives, once; its replay is discarded.
        #expect(pair.server.receive(genuine).events == [.applicationData(Array(repeating: 0x33, count: 64))])
        Self.expectDropped(pair.server, genuine, "replay")
        #expect(pair.server.counters.discardedRecords == counters.discardedRecords + 1)
        // Our own record sent back to us: the other direction's key, so it fails authentication.
        Self.expectDropped(pair.client, genuine, "reflected record")
        Self.expectDataFlows(pair)
    }

    @Test func staleHandshakeRecordsAfterConnectingAreDropped() throws {
        let (pair, wire) = try Self.connected()
        // Every handshake datagram, to both sides: epoch-0 records are dropped
        // by the filter; the epoch-1 Finished records are replays (discarded by OpenSSL).
        for datagram in wire.datagrams {
            for transport in [pair.client, pair.server] { Self.expectDropped(transport, datagram, "handshake datagram replayed") }
        }
        let epochZero = wire.datagrams.flatMap { Self.records($0) }.filter { $0.epoch == 0 }.count
        #expect(pair.client.counters.wrongEpochRecords == epochZero && pair.server.counters.wrongEpochRecords == epochZero,
                "\(epochZero) epoch-0 records; client \(pair.client.counters), server \(pair.server.counters)")
        // A fresh ClientHello-shaped record and an epoch-2 record.
        let hello = Self.record(type: 22, version: 0xfeff, epoch: 0, sequence: 9, body: [1] + Array(repeating: 0, count: 60))
        Self.expectDropped(pair.server, hello, "a new ClientHello")
        Self.expectDropped(pair.client, Self.record(type: 22, epoch: 2, sequence: 0, body: Array(repeating: 1, count: 40)), "epoch 2")
        #expect(pair.server.counters.wrongEpochRecords == epochZero + 1 && pair.client.counters.wrongEpochRecords == epochZero + 1)
        Self.expectDataFlows(pair)
    }

    @Test func wrongVersionsAndContentTypesAreDropped() throws {
        let (pair, _) = try Self.connected()
        let genuine = try #require(pair.server.send([9]).datagrams.first)
        var dtls10 = genuine; dtls10[2] = 0xff
        var tls12 = genuine; tls12[1] = 0x03; tls12[2] = 0x03
        Self.expectDropped(pair.client, dtls10, "DTLS 1.0 version after the handshake")
        Self.expectDropped(pair.client, tls12, "TLS 1.2 version")
        for type: UInt8 in [24, 25, 26, 63] {  // heartbeat, tls12_cid, unassigned, last DTLS first byte
            var bent = genuine; bent[0] = type
            Self.expectDropped(pair.client, bent, "content type \(type)")
        }
        #expect(pair.client.counters.unexpectedRecords == 6)
        #expect(pair.client.receive(genuine).events == [.applicationData([9])])
    }

    @Test func aConnectedServerStillAnswersARetransmittedFinished() throws {
        let pair = try Pair()
        // Lose the server's last flight (ChangeCipherSpec + Finished): the server is connected, the client is not.
        var wire = DtlsTestWire()
        wire.run(pair.client, pair.server, first: pair.client.start()) { fromClient, datagram in
            fromClient || pair.server.state != .connected ? datagram : nil
        }
        try #require(pair.server.state == .connected && pair.client.keys == nil, "server \(pair.server.state), client \(pair.client.state)")
        let due = try #require(pair.client.timeout, "no client retransmission timer")
        usleep(UInt32(min(due, 1) * 1_000_000) + 1_000)
        let retransmitted = pair.client.onTimer()
        try #require(!retransmitted.datagrams.isEmpty, "the client timer sent nothing")
        // Its flight: epoch-0 Certificate … ChangeCipherSpec (dropped: the server has them) and a
        // Finished in epoch 1 under a new sequence number, which OpenSSL answers.
        var answer: [[UInt8]] = []
        for datagram in retransmitted.datagrams {
            let output = pair.server.receive(datagram)
            #expect(output.events.isEmpty)
            answer += output.datagrams
        }
        #expect(!answer.isEmpty, "the connected server did not answer the retransmitted Finished")
        #expect(pair.server.counters.wrongEpochRecords > 0 && pair.server.counters.discardedRecords == 0, "\(pair.server.counters)")
        let events = answer.flatMap { pair.client.receive($0).events }
        #expect(events.filter(\.isConnected).count == 1, "the client did not connect: \(events)")
        #expect(pair.client.keys?.keyingMaterial == pair.server.keys?.keyingMaterial)
        Self.expectDataFlows(pair)
    }

    @Test func forgedProtectedRecordsDuringTheHandshakeDoNotBreakIt() throws {
        let pair = try Pair()
        // Before any cipher is chosen, no epoch-1 record can be genuine.
        let fresh = pair.server.receive(Self.record(sequence: 0, body: Array(repeating: 1, count: 40)))
        #expect(fresh.events.isEmpty && fresh.datagrams.isEmpty && pair.server.counters.wrongEpochRecords == 1)
        // Alongside every genuine handshake datagram, a short and a full-size forged epoch-1 record.
        var forgedSequence: UInt64 = 0
        var wire = DtlsTestWire()
        wire.run(pair.client, pair.server, first: pair.client.start()) { _, datagram in
            forgedSequence += 1
            return Self.record(sequence: forgedSequence, body: Array(repeating: 2, count: 12)) + datagram
                + Self.record(sequence: forgedSequence + 100, body: Array(repeating: 3, count: 48))
        }
        #expect(pair.client.state == .connected && pair.server.state == .connected, "client \(pair.client.state), server \(pair.server.state)")
        #expect(pair.client.keys?.keyingMaterial == pair.server.keys?.keyingMaterial)
        #expect(pair.client.counters.badLengthRecords + pair.client.counters.wrongEpochRecords > 0)
        Self.expectDataFlows(pair)
    }
}
