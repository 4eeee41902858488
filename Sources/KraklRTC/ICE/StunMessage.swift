/// What went wrong reading or checking a STUN message. A datagram that fails
/// here is dropped by ICE (RFC 8489 §6.3: silently discard malformed messages).
public enum StunError: Error, Equatable, CustomStringConvertible {
    case truncated(needed: Int, got: Int)
    case notStun(String)
    case badLength(declared: Int, actual: Int)
    case badAttribute(type: UInt16, String)
    case attributeAfterFingerprint(type: UInt16)
    case missingMessageIntegrity
    case integrityMismatch
    case missingFingerprint
    case fingerprintMismatch(expected: UInt32, found: UInt32)

    public var description: String {
        switch self {
        case .truncated(let needed, let got): return "STUN message truncated: \(got) bytes, at least \(needed) needed"
        case .notStun(let why): return "not a STUN message: \(why)"
        case .badLength(let declared, let actual): return "STUN length field says \(declared) bytes of attributes but \(actual) follow the header"
        case .badAttribute(let type, let why): return "STUN attribute \(hex16(type)) malformed: " + why
        case .attributeAfterFingerprint(let type): return "STUN attribute \(hex16(type)) follows FINGERPRINT, which must be last"
        case .missingMessageIntegrity: return "STUN message has no MESSAGE-INTEGRITY; it cannot be authenticated"
        case .integrityMismatch: return "STUN MESSAGE-INTEGRITY does not match: wrong ICE password or a tampered message"
        case .missingFingerprint: return "STUN message has no FINGERPRINT (ICE requires it, RFC 8445 §7.1)"
        case .fingerprintMismatch(let e, let f): return "STUN FINGERPRINT is 0x\(String(f, radix: 16)), the message's CRC gives 0x\(String(e, radix: 16))"
        }
    }
}

/// The STUN class bits of the message type (RFC 8489 §5).
public enum StunClass: UInt8, Sendable {
    case request = 0, indication = 1, successResponse = 2, errorResponse = 3
}

/// A STUN message: header fields plus attributes in wire order.
/// Build one and call `encoded(integrityKey:)`, or parse with `init(parsing:)`
/// and then `validateIntegrity(key:)` / `validateFingerprint()`.
public struct StunMessage: Equatable, Sendable {
    public static let magicCookie: UInt32 = 0x2112_A442
    public static let bindingMethod: UInt16 = 0x001
    static let cookieBytes: [UInt8] = [0x21, 0x12, 0xA4, 0x42]
    static let headerSize = 20

    /// The 12-bit method (0x001 = Binding).
    public var method: UInt16
    public var messageClass: StunClass
    /// 96 random bits that match a response to its request.
    public var transactionID: [UInt8]
    public var attributes: [StunAttribute]

    /// The datagram this message was parsed from and where its integrity and fingerprint
    /// attributes started: the checks hash exactly the received bytes.
    private var received: [UInt8]?
    private var integrityOffset: Int?
    private var fingerprintOffset: Int?

    public init(method: UInt16 = StunMessage.bindingMethod, class messageClass: StunClass,
                transactionID: [UInt8], attributes: [StunAttribute] = []) {
        precondition(transactionID.count == 12, "a STUN transaction ID is 12 bytes")
        self.method = method
        self.messageClass = messageClass
        self.transactionID = transactionID
        self.attributes = attributes
    }

    public static func == (a: StunMessage, b: StunMessage) -> Bool {
        a.method == b.method && a.messageClass == b.messageClass && a.transactionID == b.transactionID && a.attributes == b.attributes
    }

    /// 12 random bytes for a new transaction.
    public static func randomTransactionID() -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<12).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    /// The short-term credential key is the password's bytes (RFC 8489 §9.1.1; ICE passwords need no OpaqueString changes).
    public static func shortTermKey(password: String) -> [UInt8] { Array(password.utf8) }

    /// The long-term key: MD5(username ":" realm ":" password) (RFC 8489 §9.2.2, MD5 algorithm); for TURN later.
    public static func longTermKey(username: String, realm: String, password: String) -> [UInt8] {
        OpenSSLDigest.digest(Array("\(username):\(realm):\(password)".utf8), algorithm: "md5")!
    }

    /// The message-type field: method bits M0-M11 interleaved with class bits C0, C1 (RFC 8489 §5).
    var messageType: UInt16 {
        let m = method & 0xFFF, c = UInt16(messageClass.rawValue)
        return (m & 0x000F) | ((c & 1) << 4) | ((m & 0x0070) << 1) | ((c & 2) << 7) | ((m & 0x0F80) << 2)
    }

    /// True when the datagram can only be STUN: first two bits zero and the magic cookie in place
    /// (how ICE tells STUN from DTLS and RTP on one socket, RFC 7983 §7).
    public static func looksLikeStun(_ datagram: [UInt8]) -> Bool {
        datagram.count >= headerSize && datagram[0] & 0xC0 == 0 && datagram.be32(at: 4) == magicCookie
    }

    // MARK: encoding

    /// The wire form. With `integrityKey`, a MESSAGE-INTEGRITY is computed and appended; with
    /// `fingerprint`, a FINGERPRINT follows it. Any such attributes already in `attributes` are
    /// written as given. `paddingByte` fills attribute padding (receivers ignore it; RFC 5769's
    /// vectors use spaces).
    public func encoded(integrityKey: [UInt8]? = nil, fingerprint: Bool = false, paddingByte: UInt8 = 0) -> [UInt8] {
        var out: [UInt8] = []
        out.appendBE16(messageType)
        out.appendBE16(0)
        out += Self.cookieBytes
        out += transactionID
        for attribute in attributes {
            Self.append(type: attribute.type, value: attribute.value(transactionID: transactionID), to: &out, padding: paddingByte)
        }
        if let key = integrityKey {
            // The length field covers the MESSAGE-INTEGRITY attribute while the HMAC is computed (§14.5).
            out.putBE16(UInt16(out.count - Self.headerSize + 24), at: 2)
            let mac = OpenSSLDigest.hmacSHA1(key: key, data: out)
            Self.append(type: StunAttribute.Code.messageIntegrity, value: mac, to: &out, padding: paddingByte)
        }
        if fingerprint {
            out.putBE16(UInt16(out.count - Self.headerSize + 8), at: 2)
            var crc: [UInt8] = []
            crc.appendBE32(Crc32.checksum(out) ^ 0x5354_554E)
            Self.append(type: StunAttribute.Code.fingerprint, value: crc, to: &out, padding: paddingByte)
        }
        out.putBE16(UInt16(out.count - Self.headerSize), at: 2)
        return out
    }

    private static func append(type: UInt16, value: [UInt8], to out: inout [UInt8], padding: UInt8) {
        out.appendBE16(type)
        out.appendBE16(UInt16(value.count))
        out += value
        out += [UInt8](repeating: padding, count: paddedTo4(value.count) - value.count)
    }

    // MARK: decoding

    /// Parses a datagram. Checks the header, the length, every attribute's bounds and that
    /// FINGERPRINT comes last; it does not check integrity or fingerprint values (call the
    /// `validate…` functions, which need the key).
    public init(parsing datagram: [UInt8]) throws(StunError) {
        let h = Self.headerSize
        guard datagram.count >= h else { throw StunError.truncated(needed: h, got: datagram.count) }
        guard datagram[0] & 0xC0 == 0 else { throw StunError.notStun("first two bits are not zero") }
        guard datagram.be32(at: 4) == Self.magicCookie else { throw StunError.notStun("no magic cookie (RFC 3489 messages are not supported)") }
        let length = Int(datagram.be16(at: 2))
        guard length % 4 == 0 else { throw StunError.notStun("length \(length) is not a multiple of 4") }
        guard length == datagram.count - h else { throw StunError.badLength(declared: length, actual: datagram.count - h) }

        let type = datagram.be16(at: 0)
        method = (type & 0x000F) | ((type & 0x00E0) >> 1) | ((type & 0x3E00) >> 2)
        messageClass = StunClass(rawValue: UInt8(((type >> 4) & 1) | ((type >> 7) & 2)))!
        transactionID = datagram.bytes(8, 12)
        attributes = []
        received = datagram

        var offset = h
        while offset < datagram.count {
            guard datagram.count - offset >= 4 else { throw StunError.truncated(needed: offset + 4, got: datagram.count) }
            let attributeType = datagram.be16(at: offset)
            let valueLength = Int(datagram.be16(at: offset + 2))
            let end = offset + 4 + paddedTo4(valueLength)
            guard end <= datagram.count else {
                throw StunError.badAttribute(type: attributeType, "length \(valueLength) runs past the end of the message")
            }
            if fingerprintOffset != nil { throw StunError.attributeAfterFingerprint(type: attributeType) }
            let attribute = try StunAttribute.decode(type: attributeType, value: datagram.bytes(offset + 4, valueLength),
                                                     transactionID: transactionID)
            switch attributeType {
            case StunAttribute.Code.messageIntegrity where integrityOffset == nil:
                integrityOffset = offset
                attributes.append(attribute)
            case StunAttribute.Code.fingerprint:
                fingerprintOffset = offset
                attributes.append(attribute)
            default:
                // Attributes after MESSAGE-INTEGRITY other than FINGERPRINT are not covered by it: ignore them (§14.5).
                if integrityOffset == nil { attributes.append(attribute) }
            }
            offset = end
        }
    }

    /// Checks MESSAGE-INTEGRITY against `key` (see `shortTermKey`). Throws when it is missing or wrong.
    public func validateIntegrity(key: [UInt8]) throws(StunError) {
        guard let bytes = received, let at = integrityOffset else { throw StunError.missingMessageIntegrity }
        var covered = Array(bytes[0..<at])
        covered.putBE16(UInt16(at - Self.headerSize + 24), at: 2)
        let expected = OpenSSLDigest.hmacSHA1(key: key, data: covered)
        // Constant-time comparison: the MAC guards a password.
        var diff: UInt8 = 0
        for i in 0..<20 { diff |= expected[i] ^ bytes[at + 4 + i] }
        guard diff == 0 else { throw StunError.integrityMismatch }
    }

    /// Checks FINGERPRINT (CRC-32 of everything before it, xor 0x5354554E). Throws when missing or wrong.
    public func validateFingerprint() throws(StunError) {
        guard let bytes = received, let at = fingerprintOffset else { throw StunError.missingFingerprint }
        let expected = Crc32.checksum(bytes[0..<at]) ^ 0x5354_554E
        let found = bytes.be32(at: at + 4)
        guard expected == found else { throw StunError.fingerprintMismatch(expected: expected, found: found) }
    }

    // MARK: convenience

    /// The first attribute of this type, for reading.
    public func attribute(_ type: UInt16) -> StunAttribute? { attributes.first { $0.type == type } }

    public var username: String? {
        if case .username(let u)? = attribute(StunAttribute.Code.username) { return u } else { return nil }
    }

    public var xorMappedAddress: TransportAddress? {
        if case .xorMappedAddress(let a)? = attribute(StunAttribute.Code.xorMappedAddress) { return a } else { return nil }
    }

    public var priority: UInt32? {
        if case .priority(let p)? = attribute(StunAttribute.Code.priority) { return p } else { return nil }
    }

    public var useCandidate: Bool { attribute(StunAttribute.Code.useCandidate) != nil }

    public var errorCode: (code: Int, reason: String)? {
        if case .errorCode(let c, let r)? = attribute(StunAttribute.Code.errorCode) { return (c, r) } else { return nil }
    }

    /// Comprehension-required types (0x0000-0x7FFF) this stack does not know; a request carrying
    /// any must get a 420 response listing them (RFC 8489 §7.3.1).
    public var unknownComprehensionRequired: [UInt16] {
        attributes.compactMap { if case .other(let t, _) = $0, t < 0x8000 { return t } else { return nil } }
    }

    // MARK: ICE messages (RFC 8445 §7.1.1, §7.3.1.4)

    /// A connectivity check: USERNAME "remote:local", PRIORITY, ICE-CONTROLLING or -CONTROLLED,
    /// USE-CANDIDATE when nominating. Encode with the remote password's key and a fingerprint.
    public static func bindingRequest(transactionID: [UInt8] = randomTransactionID(), username: String, priority: UInt32,
                                      controlling: Bool, tieBreaker: UInt64, useCandidate: Bool = false) -> StunMessage {
        var attributes: [StunAttribute] = [.username(username), .priority(priority),
                                           controlling ? .iceControlling(tieBreaker: tieBreaker) : .iceControlled(tieBreaker: tieBreaker)]
        if useCandidate { attributes.append(.useCandidate) }
        return StunMessage(class: .request, transactionID: transactionID, attributes: attributes)
    }

    /// The success answer to `request`, telling the peer the address its request came from.
    public static func bindingSuccess(to request: StunMessage, mappedAddress: TransportAddress) -> StunMessage {
        StunMessage(method: request.method, class: .successResponse, transactionID: request.transactionID,
                    attributes: [.xorMappedAddress(mappedAddress)])
    }

    /// An error answer (400 Bad Request, 401 Unauthorized, 420 Unknown Attribute, 487 Role Conflict).
    public static func bindingError(to request: StunMessage, code: Int, reason: String, unknown: [UInt16] = []) -> StunMessage {
        var attributes: [StunAttribute] = [.errorCode(code: code, reason: reason)]
        if !unknown.isEmpty { attributes.append(.unknownAttributes(unknown)) }
        return StunMessage(method: request.method, class: .errorResponse, transactionID: request.transactionID, attributes: attributes)
    }
}
