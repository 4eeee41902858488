/// One STUN attribute (RFC 8489 §14, RFC 8445 §16.1 for the ICE ones).
/// Attributes this stack does not interpret keep their raw value in `.other`.
public enum StunAttribute: Equatable, Sendable {
    case mappedAddress(TransportAddress)
    case xorMappedAddress(TransportAddress)
    case username(String)
    /// The 20-byte HMAC-SHA1. When building, pass the key to `StunMessage.encoded` instead.
    case messageIntegrity([UInt8])
    case fingerprint(UInt32)
    case errorCode(code: Int, reason: String)
    case unknownAttributes([UInt16])
    case software(String)
    case priority(UInt32)
    case useCandidate
    case iceControlled(tieBreaker: UInt64)
    case iceControlling(tieBreaker: UInt64)
    /// TURN (RFC 8656 §18): the peer a Send/Data indication or permission is about.
    case xorPeerAddress(TransportAddress)
    /// TURN: the allocation's address on the server (Allocate success).
    case xorRelayedAddress(TransportAddress)
    /// TURN: seconds an allocation (or, in a request, the asked-for one) lives; 0 deallocates.
    case lifetime(UInt32)
    /// TURN: the application datagram of a Send or Data indication.
    case data([UInt8])
    /// TURN: a ChannelBind's channel, 0x4000-0x4FFF.
    case channelNumber(UInt16)
    /// TURN: the relayed transport's IP protocol number (17 = UDP).
    case requestedTransport(UInt8)
    case other(type: UInt16, value: [UInt8])

    /// Attribute type codes (IANA STUN Attributes registry).
    public enum Code {
        public static let mappedAddress: UInt16 = 0x0001
        public static let username: UInt16 = 0x0006
        public static let messageIntegrity: UInt16 = 0x0008
        public static let errorCode: UInt16 = 0x0009
        public static let unknownAttributes: UInt16 = 0x000A
        public static let realm: UInt16 = 0x0014
        public static let nonce: UInt16 = 0x0015
        public static let xorMappedAddress: UInt16 = 0x0020
        public static let priority: UInt16 = 0x0024
        public static let useCandidate: UInt16 = 0x0025
        public static let channelNumber: UInt16 = 0x000C
        public static let lifetime: UInt16 = 0x000D
        public static let xorPeerAddress: UInt16 = 0x0012
        public static let data: UInt16 = 0x0013
        public static let xorRelayedAddress: UInt16 = 0x0016
        public static let requestedTransport: UInt16 = 0x0019
        public static let software: UInt16 = 0x8022
        public static let fingerprint: UInt16 = 0x8028
        public static let iceControlled: UInt16 = 0x8029
        public static let iceControlling: UInt16 = 0x802A
    }

    public var type: UInt16 {
        switch self {
        case .mappedAddress: return Code.mappedAddress
        case .xorMappedAddress: return Code.xorMappedAddress
        case .username: return Code.username
        case .messageIntegrity: return Code.messageIntegrity
        case .fingerprint: return Code.fingerprint
        case .errorCode: return Code.errorCode
        case .unknownAttributes: return Code.unknownAttributes
        case .software: return Code.software
        case .priority: return Code.priority
        case .useCandidate: return Code.useCandidate
        case .iceControlled: return Code.iceControlled
        case .iceControlling: return Code.iceControlling
        case .xorPeerAddress: return Code.xorPeerAddress
        case .xorRelayedAddress: return Code.xorRelayedAddress
        case .lifetime: return Code.lifetime
        case .data: return Code.data
        case .channelNumber: return Code.channelNumber
        case .requestedTransport: return Code.requestedTransport
        case .other(let type, _): return type
        }
    }

    /// The value bytes (without header or padding). XOR-MAPPED-ADDRESS needs the transaction ID.
    func value(transactionID: [UInt8]) -> [UInt8] {
        var v: [UInt8] = []
        switch self {
        case .mappedAddress(let address):
            Self.appendAddress(address, to: &v, xorWith: nil)
        case .xorMappedAddress(let address), .xorPeerAddress(let address), .xorRelayedAddress(let address):
            Self.appendAddress(address, to: &v, xorWith: StunMessage.cookieBytes + transactionID)
        case .username(let s), .software(let s):
            v = Array(s.utf8)
        case .messageIntegrity(let mac):
            v = mac
        case .fingerprint(let crc):
            v.appendBE32(crc)
        case .errorCode(let code, let reason):
            // Class is the hundreds digit, number the remainder (RFC 8489 §14.8).
            v = [0, 0, UInt8(clamping: (code / 100) & 0x7), UInt8(clamping: code % 100)] + Array(reason.utf8)
        case .unknownAttributes(let types):
            for t in types { v.appendBE16(t) }
        case .priority(let p):
            v.appendBE32(p)
        case .useCandidate:
            break
        case .iceControlled(let t), .iceControlling(let t):
            v.appendBE64(t)
        case .lifetime(let seconds):
            v.appendBE32(seconds)
        case .data(let bytes):
            v = bytes
        case .channelNumber(let channel):
            // RFFU half must be zero (RFC 8656 §18.1).
            v.appendBE16(channel)
            v.appendBE16(0)
        case .requestedTransport(let proto):
            v = [proto, 0, 0, 0]
        case .other(_, let value):
            v = value
        }
        return v
    }

    /// Reads one attribute's value; `type` and `value` come from the attribute header.
    static func decode(type: UInt16, value: [UInt8], transactionID: [UInt8]) throws(StunError) -> StunAttribute {
        func need(_ n: Int, exact: Bool = true) throws(StunError) {
            if exact ? value.count != n : value.count < n {
                throw StunError.badAttribute(type: type, "\(value.count) bytes where \(exact ? "" : "at least ")\(n) are required")
            }
        }
        switch type {
        case Code.mappedAddress:
            return .mappedAddress(try readAddress(value, type: type, xorWith: nil))
        case Code.xorMappedAddress:
            return .xorMappedAddress(try readAddress(value, type: type, xorWith: cookieAndID(transactionID)))
        case Code.xorPeerAddress:
            return .xorPeerAddress(try readAddress(value, type: type, xorWith: cookieAndID(transactionID)))
        case Code.xorRelayedAddress:
            return .xorRelayedAddress(try readAddress(value, type: type, xorWith: cookieAndID(transactionID)))
        case Code.lifetime:
            try need(4)
            return .lifetime(value.be32(at: 0))
        case Code.data:
            return .data(value)
        case Code.channelNumber:
            try need(4)
            let channel = value.be16(at: 0)
            guard ChannelData.channelRange.contains(channel) else {
                throw StunError.badAttribute(type: type, "channel 0x\(String(channel, radix: 16)) outside 0x4000-0x4FFF")
            }
            return .channelNumber(channel)
        case Code.requestedTransport:
            try need(4)
            return .requestedTransport(value[0])
        case Code.username:
            return .username(try utf8(value, type: type))
        case Code.software:
            return .software(try utf8(value, type: type))
        case Code.messageIntegrity:
            try need(20)
            return .messageIntegrity(value)
        case Code.fingerprint:
            try need(4)
            return .fingerprint(value.be32(at: 0))
        case Code.errorCode:
            try need(4, exact: false)
            let code = Int(value[2] & 0x7) * 100 + Int(value[3])
            guard (300...699).contains(code) else {
                throw StunError.badAttribute(type: type, "error code \(code) outside 300-699")
            }
            return .errorCode(code: code, reason: try utf8(Array(value[4...]), type: type))
        case Code.unknownAttributes:
            guard value.count % 2 == 0 else { throw StunError.badAttribute(type: type, "odd length \(value.count)") }
            return .unknownAttributes(stride(from: 0, to: value.count, by: 2).map { value.be16(at: $0) })
        case Code.priority:
            try need(4)
            return .priority(value.be32(at: 0))
        case Code.useCandidate:
            try need(0)
            return .useCandidate
        case Code.iceControlled:
            try need(8)
            return .iceControlled(tieBreaker: value.be64(at: 0))
        case Code.iceControlling:
            try need(8)
            return .iceControlling(tieBreaker: value.be64(at: 0))
        default:
            return .other(type: type, value: value)
        }
    }

    private static func cookieAndID(_ transactionID: [UInt8]) -> [UInt8] { StunMessage.cookieBytes + transactionID }

    private static func utf8(_ value: [UInt8], type: UInt16) throws(StunError) -> String {
        guard let s = String(validating: value, as: UTF8.self) else {
            throw StunError.badAttribute(type: type, "value is not UTF-8")
        }
        return s
    }

    // Family 0x01 = IPv4, 0x02 = IPv6; the XOR variant masks the port with the
    // cookie's top half and the address with cookie + transaction ID (RFC 8489 §14.2).
    private static func appendAddress(_ a: TransportAddress, to v: inout [UInt8], xorWith mask: [UInt8]?) {
        let ip = a.ip.bytes
        v += [0, a.ip.isIPv6 ? 2 : 1]
        let port = mask.map { a.port ^ $0.be16(at: 0) } ?? a.port
        v.appendBE16(port)
        for (i, b) in ip.enumerated() { v.append(mask.map { b ^ $0[i] } ?? b) }
    }

    private static func readAddress(_ v: [UInt8], type: UInt16, xorWith mask: [UInt8]?) throws(StunError) -> TransportAddress {
        guard v.count >= 4 else { throw StunError.badAttribute(type: type, "address shorter than 4 bytes") }
        let length: Int
        switch v[1] {
        case 1: length = 4
        case 2: length = 16
        default: throw StunError.badAttribute(type: type, "unknown address family \(v[1])")
        }
        guard v.count == 4 + length else {
            throw StunError.badAttribute(type: type, "\(v.count - 4) address bytes for a \(length)-byte family")
        }
        let port = mask.map { v.be16(at: 2) ^ $0.be16(at: 0) } ?? v.be16(at: 2)
        let raw = (0..<length).map { i in mask.map { v[4 + i] ^ $0[i] } ?? v[4 + i] }
        return TransportAddress(ip: length == 4 ? .v4(raw) : .v6(raw), port: port)
    }
}
