import Testing
@testable import KraklRTC

/// RFC 5769's published messages, byte for byte (sections 2.1-2.4).
enum Rfc5769 {
    static let password = "VOkJxbRl1RmTxUk/WvJxBt"
    static let transactionID: [UInt8] = [0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86, 0xfa, 0x87, 0xdf, 0xae]

    /// 2.1 Sample Request (SOFTWARE, PRIORITY, ICE-CONTROLLED, USERNAME, MESSAGE-INTEGRITY, FINGERPRINT).
    static let request: [UInt8] = [
        0x00, 0x01, 0x00, 0x58, 0x21, 0x12, 0xa4, 0x42, 0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86,
        0xfa, 0x87, 0xdf, 0xae, 0x80, 0x22, 0x00, 0x10, 0x53, 0x54, 0x55, 0x4e, 0x20, 0x74, 0x65, 0x73,
        0x74, 0x20, 0x63, 0x6c, 0x69, 0x65, 0x6e, 0x74, 0x00, 0x24, 0x00, 0x04, 0x6e, 0x00, 0x01, 0xff,
        0x80, 0x29, 0x00, 0x08, 0x93, 0x2f, 0xf9, 0xb1, 0x51, 0x26, 0x3b, 0x36, 0x00, 0x06, 0x00, 0x09,
        0x65, 0x76, 0x74, 0x6a, 0x3a, 0x68, 0x36, 0x76, 0x59, 0x20, 0x20, 0x20, 0x00, 0x08, 0x00, 0x14,
        0x9a, 0xea, 0xa7, 0x0c, 0xbf, 0xd8, 0xcb, 0x56, 0x78, 0x1e, 0xf2, 0xb5, 0xb2, 0xd3, 0xf2, 0x49,
        0xc1, 0xb5, 0x71, 0xa2, 0x80, 0x28, 0x00, 0x04, 0xe5, 0x7a, 0x3b, 0xcf,
    ]

    /// 2.2 Sample IPv4 Response: XOR-MAPPED-ADDRESS 192.0.2.1:32853.
    static let responseIPv4: [UInt8] = [
        0x01, 0x01, 0x00, 0x3c, 0x21, 0x12, 0xa4, 0x42, 0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86,
        0xfa, 0x87, 0xdf, 0xae, 0x80, 0x22, 0x00, 0x0b, 0x74, 0x65, 0x73, 0x74, 0x20, 0x76, 0x65, 0x63,
        0x74, 0x6f, 0x72, 0x20, 0x00, 0x20, 0x00, 0x08, 0x00, 0x01, 0xa1, 0x47, 0xe1, 0x12, 0xa6, 0x43,
        0x00, 0x08, 0x00, 0x14, 0x2b, 0x91, 0xf5, 0x99, 0xfd, 0x9e, 0x90, 0xc3, 0x8c, 0x74, 0x89, 0xf9,
        0x2a, 0xf9, 0xba, 0x53, 0xf0, 0x6b, 0xe7, 0xd7, 0x80, 0x28, 0x00, 0x04, 0xc0, 0x7d, 0x4c, 0x96,
    ]

    /// 2.3 Sample IPv6 Response: XOR-MAPPED-ADDRESS [2001:db8:1234:5678:11:2233:4455:6677]:32853.
    static let responseIPv6: [UInt8] = [
        0x01, 0x01, 0x00, 0x48, 0x21, 0x12, 0xa4, 0x42, 0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86,
        0xfa, 0x87, 0xdf, 0xae, 0x80, 0x22, 0x00, 0x0b, 0x74, 0x65, 0x73, 0x74, 0x20, 0x76, 0x65, 0x63,
        0x74, 0x6f, 0x72, 0x20, 0x00, 0x20, 0x00, 0x14, 0x00, 0x02, 0xa1, 0x47, 0x01, 0x13, 0xa9, 0xfa,
        0xa5, 0xd3, 0xf1, 0x79, 0xbc, 0x25, 0xf4, 0xb5, 0xbe, 0xd2, 0xb9, 0xd9, 0x00, 0x08, 0x00, 0x14,
        0xa3, 0x82, 0x95, 0x4e, 0x4b, 0xe6, 0x7b, 0xf1, 0x17, 0x84, 0xc9, 0x7c, 0x82, 0x92, 0xc2, 0x75,
        0xbf, 0xe3, 0xed, 0x41, 0x80, 0x28, 0x00, 0x04, 0xc8, 0xfb, 0x0b, 0x4c,
    ]

    /// 2.4 Sample Request with Long-Term Authentication (USERNAME, NONCE, REALM, MESSAGE-INTEGRITY).
    static let longTermRequest: [UInt8] = [
        0x00, 0x01, 0x00, 0x60, 0x21, 0x12, 0xa4, 0x42, 0x78, 0xad, 0x34, 0x33, 0xc6, 0xad, 0x72, 0xc0,
        0x29, 0xda, 0x41, 0x2e, 0x00, 0x06, 0x00, 0x12, 0xe3, 0x83, 0x9e, 0xe3, 0x83, 0x88, 0xe3, 0x83,
        0xaa, 0xe3, 0x83, 0x83, 0xe3, 0x82, 0xaf, 0xe3, 0x82, 0xb9, 0x00, 0x00, 0x00, 0x15, 0x00, 0x1c,
        0x66, 0x2f, 0x2f, 0x34, 0x39, 0x39, 0x6b, 0x39, 0x35, 0x34, 0x64, 0x36, 0x4f, 0x4c, 0x33, 0x34,
        0x6f, 0x4c, 0x39, 0x46, 0x53, 0x54, 0x76, 0x79, 0x36, 0x34, 0x73, 0x41, 0x00, 0x14, 0x00, 0x0b,
        0x65, 0x78, 0x61, 0x6d, 0x70, 0x6c, 0x65, 0x2e, 0x6f, 0x72, 0x67, 0x00, 0x00, 0x08, 0x00, 0x14,
        0xf6, 0x70, 0x24, 0x65, 0x6d, 0xd6, 0x4a, 0x3e, 0x02, 0xb8, 0xe0, 0x71, 0x2e, 0x85, 0xc9, 0xa2,
        0x8c, 0xa8, 0x96, 0x66,
    ]
}

@Suite(.tags(.unit)) struct RTCStunTests {
    let key = StunMessage.shortTermKey(password: Rfc5769.password)

    @Test func sampleRequestParsesAndValidates() throws {
        let message = try StunMessage(parsing: Rfc5769.request)
        #expect(message.messageClass == .request)
        #expect(message.method == StunMessage.bindingMethod)
        #expect(message.transactionID == Rfc5769.transactionID)
        #expect(message.username == "evtj:h6vY")
        #expect(message.priority == 0x6e0001ff)
        #expect(message.attribute(StunAttribute.Code.iceControlled) == .iceControlled(tieBreaker: 0x932ff9b151263b36))
        #expect(message.attribute(StunAttribute.Code.software) == .software("STUN test client"))
        try message.validateIntegrity(key: key)
        try message.validateFingerprint()
        #expect(throws: StunError.integrityMismatch) { try message.validateIntegrity(key: Array("wrong".utf8)) }
    }

    @Test func sampleRequestBuildsByteExact() {
        let message = StunMessage(class: .request, transactionID: Rfc5769.transactionID, attributes: [
            .software("STUN test client"), .priority(0x6e0001ff), .iceControlled(tieBreaker: 0x932ff9b151263b36),
            .username("evtj:h6vY"),
        ])
        let built = message.encoded(integrityKey: key, fingerprint: true, paddingByte: 0x20)
        #expect(built == Rfc5769.request)
    }

    @Test func ipv4ResponseBothDirections() throws {
        let parsed = try StunMessage(parsing: Rfc5769.responseIPv4)
        #expect(parsed.messageClass == .successResponse)
        #expect(parsed.xorMappedAddress == TransportAddress(ip: IPAddress("192.0.2.1")!, port: 32853))
        try parsed.validateIntegrity(key: key)
        try parsed.validateFingerprint()
        let built = StunMessage(class: .successResponse, transactionID: Rfc5769.transactionID, attributes: [
            .software("test vector"), .xorMappedAddress(TransportAddress(ip: IPAddress("192.0.2.1")!, port: 32853)),
        ]).encoded(integrityKey: key, fingerprint: true, paddingByte: 0x20)
        #expect(built == Rfc5769.responseIPv4)
    }

    @Test func ipv6ResponseBothDirections() throws {
        let address = TransportAddress(ip: IPAddress("2001:db8:1234:5678:11:2233:4455:6677")!, port: 32853)
        let parsed = try StunMessage(parsing: Rfc5769.responseIPv6)
        #expect(parsed.xorMappedAddress == address)
        #expect(parsed.xorMappedAddress?.description == "[2001:db8:1234:5678:11:2233:4455:6677]:32853")
        try parsed.validateIntegrity(key: key)
        try parsed.validateFingerprint()
        let built = StunMessage(class: .successResponse, transactionID: Rfc5769.transactionID, attributes: [
            .software("test vector"), .xorMappedAddress(address),
        ]).encoded(integrityKey: key, fingerprint: true, paddingByte: 0x20)
        #expect(built == Rfc5769.responseIPv6)
    }

    @Test func longTermRequestValidatesWithMD5Key() throws {
        let parsed = try StunMessage(parsing: Rfc5769.longTermRequest)
        #expect(parsed.username == "\u{30DE}\u{30C8}\u{30EA}\u{30C3}\u{30AF}\u{30B9}")
        #expect(parsed.attribute(StunAttribute.Code.realm) == .other(type: StunAttribute.Code.realm, value: Array("example.org".utf8)))
        // "TheMatrIX" is the password after SASLprep, as RFC 5769 §2.4 gives it.
        let longTerm = StunMessage.longTermKey(username: parsed.username!, realm: "example.org", password: "TheMatrIX")
        try parsed.validateIntegrity(key: longTerm)
        #expect(throws: StunError.missingFingerprint) { try parsed.validateFingerprint() }
    }

    @Test func flippedBitFailsFingerprintAndIntegrity() throws {
        var damaged = Rfc5769.request
        damaged[30] ^= 0x01 // inside SOFTWARE
        let message = try StunMessage(parsing: damaged)
        #expect(throws: StunError.self) { try message.validateFingerprint() }
        #expect(throws: StunError.integrityMismatch) { try message.validateIntegrity(key: key) }
    }

    @Test func iceCheckRoundTripsWithErrorsAndRoles() throws {
        let request = StunMessage.bindingRequest(username: "remote:local", priority: 1_853_824_767, controlling: true,
                                                 tieBreaker: 0x0102030405060708, useCandidate: true)
        let wire = request.encoded(integrityKey: StunMessage.shortTermKey(password: "remotepassword1234567890"), fingerprint: true)
        #expect(StunMessage.looksLikeStun(wire))
        let back = try StunMessage(parsing: wire)
        #expect(Array(back.attributes.prefix(4)) == request.attributes)
        #expect(back.attributes.count == 6, "MESSAGE-INTEGRITY and FINGERPRINT follow")
        #expect(back.useCandidate)
        #expect(back.attribute(StunAttribute.Code.iceControlling) == .iceControlling(tieBreaker: 0x0102030405060708))
        try back.validateIntegrity(key: StunMessage.shortTermKey(password: "remotepassword1234567890"))
        try back.validateFingerprint()

        let conflict = StunMessage.bindingError(to: back, code: 487, reason: "Role Conflict")
        let conflictBack = try StunMessage(parsing: conflict.encoded(fingerprint: true))
        #expect(conflictBack.messageClass == .errorResponse)
        #expect(conflictBack.errorCode?.code == 487)
        #expect(conflictBack.errorCode?.reason == "Role Conflict")
        #expect(conflictBack.transactionID == request.transactionID)

        let unknown = StunMessage.bindingError(to: back, code: 420, reason: "Unknown Attribute", unknown: [0x0003, 0x7777])
        let unknownBack = try StunMessage(parsing: unknown.encoded())
        #expect(unknownBack.attribute(StunAttribute.Code.unknownAttributes) == .unknownAttributes([0x0003, 0x7777]))

        let success = StunMessage.bindingSuccess(to: back, mappedAddress: TransportAddress(ip: IPAddress("127.0.0.2")!, port: 50000))
        let successBack = try StunMessage(parsing: success.encoded(integrityKey: key, fingerprint: true))
        #expect(successBack.xorMappedAddress?.description == "127.0.0.2:50000")
        #expect(successBack.messageClass == .successResponse)
    }

    @Test func unknownComprehensionRequiredAttributesAreListed() throws {
        let message = StunMessage(class: .request, transactionID: Rfc5769.transactionID,
                                  attributes: [.other(type: 0x0777, value: [1, 2, 3]), .other(type: 0xC001, value: [])])
        let back = try StunMessage(parsing: message.encoded())
        #expect(back.unknownComprehensionRequired == [0x0777])
    }

    @Test func attributesAfterIntegrityAreIgnoredExceptFingerprint() throws {
        // A SOFTWARE after MESSAGE-INTEGRITY is not covered by the MAC: RFC 8489 §14.5 says to ignore it.
        var wire = StunMessage(class: .request, transactionID: Rfc5769.transactionID, attributes: [.username("a:b")])
            .encoded(integrityKey: key)
        wire += [0x80, 0x22, 0x00, 0x04, 0x65, 0x76, 0x69, 0x6c]
        wire.putBE16(UInt16(wire.count - 20), at: 2)
        let message = try StunMessage(parsing: wire)
        #expect(message.attribute(StunAttribute.Code.software) == nil)
        try message.validateIntegrity(key: key)
    }

    static let malformed: [(bytes: [UInt8], why: String)] = {
        let request: [UInt8] = Rfc5769.request
        let header: [UInt8] = [0x21, 0x12, 0xa4, 0x42] + [UInt8](repeating: 0, count: 12)
        var cases: [(bytes: [UInt8], why: String)] = []
        cases.append(([], "empty"))
        cases.append((Array(request.prefix(19)), "shorter than a header"))
        cases.append((Array(request.prefix(60)), "length field larger than the datagram"))
        cases.append(([0x80] + Array(request.dropFirst()), "top bits set (RTP/DTLS)"))
        cases.append((Array(request.prefix(4)) + [0, 0, 0, 0] + Array(request.dropFirst(8)), "no magic cookie"))
        cases.append(([0x00, 0x01, 0x00, 0x04] + header + [0x00, 0x06, 0x00, 0x09], "attribute longer than the message"))
        cases.append(([0x00, 0x01, 0x00, 0x0c] + header + [0x00, 0x20, 0x00, 0x08, 0x00, 0x07, 0x00, 0x01, 1, 2, 3, 4], "unknown address family"))
        cases.append(([0x00, 0x01, 0x00, 0x08] + header + [0x00, 0x08, 0x00, 0x04, 1, 2, 3, 4], "short MESSAGE-INTEGRITY"))
        cases.append(([0x00, 0x01, 0x00, 0x03] + header + [0, 0, 0], "length not a multiple of 4"))
        return cases
    }()

    @Test(arguments: 0..<RTCStunTests.malformed.count)
    func malformedDatagramsThrow(index: Int) {
        let (bytes, why) = Self.malformed[index]
        #expect(throws: StunError.self, "\(why)") { try StunMessage(parsing: bytes) }
    }

    @Test func attributeAfterFingerprintIsRejected() {
        var wire = StunMessage(class: .request, transactionID: Rfc5769.transactionID).encoded(fingerprint: true)
        wire += [0x00, 0x25, 0x00, 0x00]
        wire.putBE16(UInt16(wire.count - 20), at: 2)
        #expect(throws: StunError.attributeAfterFingerprint(type: 0x0025)) { try StunMessage(parsing: wire) }
    }

    @Test func everyTruncationOfTheSampleThrowsInsteadOfCrashing() {
        for n in 0..<Rfc5769.request.count {
            #expect(throws: StunError.self, "prefix of \(n) bytes") { try StunMessage(parsing: Array(Rfc5769.request.prefix(n))) }
        }
    }
}
