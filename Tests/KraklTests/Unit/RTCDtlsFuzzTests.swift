import Foundation
import KraklRTC
import Testing

/// Garbage and mutated DTLS datagrams: dropped or an error, never a crash,
/// never a second "connected", never new keys.
@Suite(.tags(.unit))
struct RTCDtlsFuzzTests {
    typealias Random = Fuzz.Rng

    /// Random bytes, and real handshake datagrams with bits flipped, bytes
    /// cut, lengths bent and records spliced.
    static func mutations(of real: [[UInt8]], count: Int, random: inout Random) -> [[UInt8]] {
        (0..<count).map { index in
            switch index % 5 {
            case 0:
                var bytes = random.bytes(1 + random.below(1400))
                bytes[0] = UInt8(20 + random.below(44))  // looks like DTLS to the demultiplexer
                return bytes
            case 1:
                var bytes = real[random.below(real.count)]
                for _ in 0...random.below(4) { bytes[random.below(bytes.count)] ^= UInt8(1 << random.below(8)) }
                return bytes
            case 2:
                let bytes = real[random.below(real.count)]
                return Array(bytes.prefix(random.below(bytes.count + 1)))
            case 3:
                var bytes = real[random.below(real.count)]
                if bytes.count > 13 { bytes[11] = UInt8(random.below(256)); bytes[12] = UInt8(random.below(256)) }
                return bytes
            default:
                return Array(real[random.below(real.count)].prefix(40)) + random.bytes(random.below(200))
            }
        }
    }

    @Test func garbageNeverConnectsAFreshServer() throws {
        let seed = Self.seed(UInt64(Date().timeIntervalSince1970 * 1000))
        print("RTCDtlsFuzzTests seed \(seed) (KRAKL_FUZZ_SEED=\(seed) runs it again)")
        var random = Random(state: seed)
        let server = try DtlsTransport(role: .server, certificate: try Certificate(), expectedFingerprint: try Certificate().fingerprint)
        var events: [DtlsEvent] = []
        for _ in 0..<2_000 {
            var bytes = random.bytes(random.below(600))
            if !bytes.isEmpty { bytes[0] = UInt8(20 + random.below(44)) }
            events += server.receive(bytes).events
        }
        #expect(!events.contains(where: { $0.isConnected }))
        #expect(events.allSatisfy({ $0.isFailure }), "garbage produced something other than a failure")
        #expect(server.keys == nil)
    }

    /// A new seed from the clock, or the one `KRAKL_FUZZ_SEED` names: a failure is reproduced from the
    /// seed the failing run printed.
    static func seed(_ fresh: UInt64) -> UInt64 {
        ProcessInfo.processInfo.environment["KRAKL_FUZZ_SEED"].flatMap { UInt64($0) } ?? fresh
    }

    /// Seeds that ended the session before the record filter (OpenSSL 3.0's
    /// fatal alert on short epoch-1 records): 56% of seeds did.
    static let fixedSeeds: [UInt64] = [1, 4, 6, 7, 12, 13, 14, 15, 16, 17, 18, 21, 25, 26]

    @Test(arguments: fixedSeeds)
    func connectedPairSurvivesMutations(seed: UInt64) throws {
        try Self.survive(seed: seed)
    }

    @Test func connectedPairSurvivesMutationsOfANewSeed() throws {
        let seed = Self.seed(UInt64(Date().timeIntervalSince1970 * 1000) ^ 0x5eed)
        print("RTCDtlsFuzzTests seed \(seed) (KRAKL_FUZZ_SEED=\(seed) runs it again)")
        try Self.survive(seed: seed)
    }

    /// 5 000 mutated datagrams, alternately to each side of a connected pair:
    /// both must stay connected with the same keys, send nothing (no alert),
    /// report nothing but the one genuine first delivery of each data record,
    /// and still carry data both ways afterwards.
    static func survive(seed: UInt64) throws {
        var random = Random(state: seed)
        let pair = try RTCDtlsLoopbackTests.Pair()
        let wire = pair.handshake()
        let clientKeys = try #require(pair.client.keys), serverKeys = try #require(pair.server.keys)
        // Real records from this session, plus application data each way (never delivered).
        let fromClient = Array(repeating: UInt8(0x41), count: 100), fromServer = Array(repeating: UInt8(0x42), count: 30)
        var real = wire.datagrams
        real += pair.client.send(fromClient).datagrams
        real += pair.server.send(fromServer).datagrams
        var eventsClient: [DtlsEvent] = [], eventsServer: [DtlsEvent] = []
        var sent = 0
        let started = Date()
        for (index, datagram) in mutations(of: real, count: 5_000, random: &random).enumerated() {
            let output = index % 2 == 0 ? pair.client.receive(datagram) : pair.server.receive(datagram)
            if index % 2 == 0 { eventsClient += output.events } else { eventsServer += output.events }
            sent += output.datagrams.count
            if Date().timeIntervalSince(started) > 60 { break }  // bounded in time as well as count
        }
        let context = "seed \(seed): client \(pair.client.state) \(pair.client.counters), server \(pair.server.state) \(pair.server.counters)"
        #expect(pair.client.state == .connected && pair.server.state == .connected, "a mutated datagram ended the session (\(context))")
        #expect(pair.client.keys == clientKeys && pair.server.keys == serverKeys, "keys changed under fuzzing (\(context))")
        #expect(sent == 0, "a mutated datagram made a side send something (an alert?) (\(context))")
        // The only acceptable events: an unmutated copy of the peer's data record, accepted once (replays are discarded).
        #expect(eventsClient.allSatisfy { $0 == .applicationData(fromServer) } && eventsClient.count <= 1, "client events \(eventsClient) (\(context))")
        #expect(eventsServer.allSatisfy { $0 == .applicationData(fromClient) } && eventsServer.count <= 1, "server events \(eventsServer) (\(context))")
        // The filter's drops and OpenSSL's own (failed authentication, replays) were both met.
        // (Short epoch-1 records, the class that used to end the session, are
        // rarer here; RTCDtlsRecordTests covers each class on its own.)
        for counters in [pair.client.counters, pair.server.counters] {
            #expect(counters.malformedDatagrams > 0 && counters.wrongEpochRecords > 0, "\(context)")
            #expect(counters.discardedRecords > 0, "no mutated epoch-1 record reached OpenSSL (\(context))")
        }
        // Data still flows both ways.
        let up = pair.client.send([1, 2, 3]).datagrams.flatMap { pair.server.receive($0).events }
        let down = pair.server.send([4, 5]).datagrams.flatMap { pair.client.receive($0).events }
        #expect(up == [.applicationData([1, 2, 3])] && down == [.applicationData([4, 5])], "data no longer flows after fuzzing (\(context))")
    }
}
