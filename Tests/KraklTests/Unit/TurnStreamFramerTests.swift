import Testing
import KraklRTC

/// TURN over TCP/TLS: STUN and padded ChannelData cut from a byte stream however it is split.
@Suite(.tags(.unit))
struct TurnStreamFramerTests {
    let stun = StunMessage(class: .request, transactionID: StunMessage.randomTransactionID()).encoded(fingerprint: true)
    let channel = ChannelData(channel: 0x4001, data: [1, 2, 3, 4, 5]).encoded(padded: true)

    @Test func messagesComeOutWholeWhateverTheReadSizes() throws {
        let stream = stun + channel + stun + ChannelData(channel: 0x4FFF, data: []).encoded(padded: true)
        #expect(channel.count == 12, "ChannelData over a stream is padded to 4 bytes")
        for chunk in [1, 3, 7, 20, stream.count] {
            var framer = TurnStreamFramer()
            var messages: [[UInt8]] = []
            var offset = 0
            while offset < stream.count {
                let end = min(offset + chunk, stream.count)
                messages += try framer.feed(stream[offset..<end])
                offset = end
            }
            #expect(messages == [stun, Array(channel.prefix(9)), stun, [0x4F, 0xFF, 0, 0]], "read in chunks of \(chunk)")
            #expect(framer.pendingCount == 0)
        }
    }

    @Test func aMessageOfNeitherKindEndsTheStream() throws {
        var framer = TurnStreamFramer()
        #expect(try framer.feed(stun).count == 1)
        #expect(throws: TurnStreamFramer.Failure.notTurn(firstByte: 0x80)) { try framer.feed([0x80, 0, 0, 4] + stun) }
        // It stays failed: the rest of the stream has no trustworthy boundaries.
        #expect(throws: TurnStreamFramer.Failure.self) { try framer.feed(stun) }
    }

    /// Mutated streams never crash the framer, and what it yields is within what it was fed.
    @Test func fuzzedStreamsNeverCrashTheFramer() {
        var fed = 0, yielded = 0
        let outcome = Fuzz.run(seed: 0x7C9_57AE, samples: [stun + channel, channel + channel + stun, stun]) { input in
            var framer = TurnStreamFramer()
            // Two reads, split in the middle, as a socket might return them.
            let half = input.count / 2
            let messages = try framer.feed(input[..<half]) + framer.feed(input[half...])
            fed += input.count
            yielded += messages.reduce(0) { $0 + $1.count }
            for message in messages {
                #expect(message.count >= 4 && message.count <= input.count)
                #expect(message[0] >> 6 <= 1)
            }
            if messages.isEmpty { throw StunError.truncated(needed: 4, got: input.count) }
        }
        print("TURN stream framer fuzz: \(outcome.inputs) inputs, \(outcome.accepted) gave messages, \(outcome.rejected) none or refused")
        #expect(outcome.inputs >= 1000 && outcome.accepted > 0 && outcome.rejected > 0)
        #expect(yielded <= fed)
    }
}
