import Foundation
import KraklRTC
import Testing

/// Garbage and mutated DTLS datagrams: dropped or an error, never a crash,
/// never a second "connected", never new keys.
struct RTCDtlsFuzzTests {
    /// SplitMix64: reproducible randomness from a printed seed.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(bound)) }
        mutating func bytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8(truncatingIfNeeded: next()) } }
    }

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
        let seed = UInt64(Date().timeIntervalSince1970 * 1000)
        print("RTCDtlsFuzzTests seed \(seed)")
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

    @Test func mutatedDatagramsAgainstAConnectedPair() throws {
        let seed = UInt64(Date().timeIntervalSince1970 * 1000) ^ 0x5eed
        print("RTCDtlsFuzzTests seed \(seed)")
        var random = Random(state: seed)
        let pair = try RTCDtlsLoopbackTests.Pair()
        let wire = pair.handshake()
        let keys = try #require(pair.client.keys)
        // Real records from this session, plus application data and a close_notify-sized alert.
        var real = wire.datagrams
        real += pair.client.send(Array(repeating: 0x41, count: 100)).datagrams
        real += pair.server.send(Array(repeating: 0x42, count: 30)).datagrams
        let started = Date()
        var eventsClient: [DtlsEvent] = [], eventsServer: [DtlsEvent] = []
        for (index, datagram) in Self.mutations(of: real, count: 5_000, random: &random).enumerated() {
            if index % 2 == 0 { eventsClient += pair.client.receive(datagram).events } else { eventsServer += pair.server.receive(datagram).events }
            if Date().timeIntervalSince(started) > 60 { break }  // bounded in time as well as count
        }
        for events in [eventsClient, eventsServer] {
            #expect(!events.contains(where: { $0.isConnected }), "a mutated datagram re-ran the handshake")
            // Only drops (no event), the data records' own copies, a failure or a close are acceptable.
            #expect(events.allSatisfy { event in
                switch event {
                case .applicationData(let bytes): return bytes == Array(repeating: 0x41, count: 100) || bytes == Array(repeating: 0x42, count: 30)
                case .failed, .remoteClosed: return true
                case .connected: return false
                }
            })
        }
        #expect(pair.client.keys == keys, "keys changed under fuzzing")
        // Forged records cannot pass the record MAC, so the connection should survive; if it did, data still flows.
        if pair.client.state == .connected && pair.server.state == .connected {
            let output = pair.client.send([1, 2, 3])
            let received = output.datagrams.flatMap { pair.server.receive($0).events }
            #expect(received == [.applicationData([1, 2, 3])], "data no longer flows after fuzzing")
        } else {
            print("RTCDtlsFuzzTests: connection ended under fuzzing: client \(pair.client.state), server \(pair.server.state)")
        }
    }
}
