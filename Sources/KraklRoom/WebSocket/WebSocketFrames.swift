/// The WebSocket framing of RFC 6455 §5, as a client speaks it: sans-I/O, so the parser can be fed
/// hostile bytes in tests and fuzzing without a socket.
///
/// `WebSocketFrameEncoder` makes the client's frames (always masked, §5.3); `WebSocketMessageParser`
/// takes the server's bytes in whatever pieces TCP delivers them and gives back whole messages and
/// control frames, enforcing what a server must not do: masked frames, reserved bits without an
/// extension, unknown opcodes, fragmented or oversized control frames, a continuation without a
/// start, text that is not UTF-8, a message over the cap.
public enum WebSocketOpcode: UInt8, Sendable {
    case continuation = 0x0, text = 0x1, binary = 0x2, close = 0x8, ping = 0x9, pong = 0xA

    var isControl: Bool { rawValue & 0x8 != 0 }
}

/// What the server sent, one whole message or control frame at a time.
public enum WebSocketInbound: Equatable, Sendable {
    case text(String)
    case binary([UInt8])
    case ping([UInt8])
    case pong([UInt8])
    /// The server's close frame: its code (nil: none given, 1005 on the wire means the same) and reason.
    case close(code: UInt16?, reason: String)
}

/// Why the server's bytes break the protocol; `closeCode` is what we then close with (§7.4.1).
public struct WebSocketProtocolError: Error, Equatable, Sendable, CustomStringConvertible {
    public let closeCode: UInt16
    public let description: String

    static func violation(_ words: String) -> Self { Self(closeCode: 1002, description: words) }
    static func tooBig(_ words: String) -> Self { Self(closeCode: 1009, description: words) }
    static func badText(_ words: String) -> Self { Self(closeCode: 1007, description: words) }
}

public enum WebSocketFrameEncoder {
    /// One frame, FIN set, masked with `mask` (4 random bytes per frame, §5.3: a proxy must not be
    /// able to predict the bytes on the wire).
    public static func frame(_ opcode: WebSocketOpcode, payload: [UInt8], mask: [UInt8], fin: Bool = true) -> [UInt8] {
        precondition(mask.count == 4, "a WebSocket mask is 4 bytes")
        var bytes: [UInt8] = [(fin ? 0x80 : 0) | opcode.rawValue]
        bytes.reserveCapacity(payload.count + 14)
        let count = payload.count
        if count < 126 {
            bytes.append(0x80 | UInt8(count))
        } else if count <= 0xFFFF {
            bytes += [0x80 | 126, UInt8(count >> 8), UInt8(count & 0xFF)]
        } else {
            bytes.append(0x80 | 127)
            for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((UInt64(count) >> UInt64(shift)) & 0xFF)) }
        }
        bytes += mask
        for (index, byte) in payload.enumerated() { bytes.append(byte ^ mask[index & 3]) }
        return bytes
    }

    /// A close frame's payload: the code, then the reason cut to fit a control frame (125 bytes) on
    /// a character boundary.
    public static func closePayload(code: UInt16, reason: String) -> [UInt8] {
        var reasonBytes = Array(reason.utf8.prefix(123))
        while String(validating: reasonBytes, as: UTF8.self) == nil { reasonBytes.removeLast() }
        return [UInt8(code >> 8), UInt8(code & 0xFF)] + reasonBytes
    }

    /// Close codes a peer may send (§7.4): 1000-1003, 1007-1011, 3000-4999. 1005, 1006 and 1015 are
    /// only ever reported, never sent.
    public static func isSendableCloseCode(_ code: UInt16) -> Bool {
        switch code {
        case 1000...1003, 1007...1011, 1012...1014, 3000...4999: return true
        default: return false
        }
    }
}

/// Server bytes in, messages out. Bounded: one message (all its fragments) at most
/// `maximumMessage` bytes, checked from the frame headers before any payload is buffered.
public struct WebSocketMessageParser: Sendable {
    public let maximumMessage: Int
    private var buffer: [UInt8] = []
    private var start = 0
    /// The message being reassembled from fragments: its opcode and the payload so far.
    private var fragments: (opcode: WebSocketOpcode, payload: [UInt8])?

    public init(maximumMessage: Int = 1 << 20) {
        self.maximumMessage = maximumMessage
    }

    /// Bytes waiting for the rest of their frame.
    public var pendingBytes: Int { buffer.count - start + (fragments?.payload.count ?? 0) }

    /// Adds bytes as they came from the socket.
    public mutating func feed(_ bytes: [UInt8]) {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 65_536 {
            buffer.removeFirst(start)
            start = 0
        }
        buffer += bytes
    }

    /// The next whole message or control frame, nil until one has arrived. Throws on a violation;
    /// after that the connection is to be closed, not read further.
    public mutating func next() throws(WebSocketProtocolError) -> WebSocketInbound? {
        while true {
            let available = buffer.count - start
            guard available >= 2 else { return nil }
            let first = buffer[start], second = buffer[start + 1]
            let fin = first & 0x80 != 0
            guard first & 0x70 == 0 else { throw .violation("the server set reserved bits (no extension was agreed)") }
            guard let opcode = WebSocketOpcode(rawValue: first & 0x0F) else {
                throw .violation("the server sent an unknown opcode \(first & 0x0F)")
            }
            guard second & 0x80 == 0 else { throw .violation("the server masked a frame (servers must not, RFC 6455 §5.1)") }
            var headerLength = 2
            var length = UInt64(second & 0x7F)
            if length == 126 {
                guard available >= 4 else { return nil }
                length = UInt64(buffer[start + 2]) << 8 | UInt64(buffer[start + 3])
                headerLength = 4
                guard length >= 126 else { throw .violation("a frame length in a longer form than needed") }
            } else if length == 127 {
                guard available >= 10 else { return nil }
                length = 0
                for index in 2..<10 { length = length << 8 | UInt64(buffer[start + index]) }
                headerLength = 10
                guard length >> 63 == 0 else { throw .violation("a frame length with the top bit set") }
                guard length > 0xFFFF else { throw .violation("a frame length in a longer form than needed") }
            }
            if opcode.isControl {
                guard fin else { throw .violation("a fragmented control frame") }
                guard length <= 125 else { throw .violation("a control frame of \(length) bytes (at most 125)") }
            } else {
                let sofar = opcode == .continuation ? (fragments?.payload.count ?? 0) : 0
                guard length <= UInt64(maximumMessage - sofar) else {
                    throw .tooBig("a message of more than \(maximumMessage) bytes")
                }
                if opcode == .continuation {
                    guard fragments != nil else { throw .violation("a continuation frame without a message to continue") }
                } else if fragments != nil {
                    throw .violation("a new message began inside a fragmented one")
                }
            }
            let total = headerLength + Int(length)
            guard available >= total else { return nil }
            let payload = Array(buffer[(start + headerLength)..<(start + total)])
            start += total

            switch opcode {
            case .ping: return .ping(payload)
            case .pong: return .pong(payload)
            case .close: return try Self.close(payload)
            case .text, .binary:
                if fin { return try Self.message(opcode, payload) }
                fragments = (opcode, payload)
            case .continuation:
                fragments!.payload += payload
                if fin {
                    let whole = fragments!
                    fragments = nil
                    return try Self.message(whole.opcode, whole.payload)
                }
            }
        }
    }

    private static func message(_ opcode: WebSocketOpcode, _ payload: [UInt8]) throws(WebSocketProtocolError) -> WebSocketInbound {
        guard opcode == .text else { return .binary(payload) }
        guard let text = String(validating: payload, as: UTF8.self) else { throw .badText("a text message that is not UTF-8") }
        return .text(text)
    }

    private static func close(_ payload: [UInt8]) throws(WebSocketProtocolError) -> WebSocketInbound {
        if payload.isEmpty { return .close(code: nil, reason: "") }
        guard payload.count >= 2 else { throw .violation("a close frame with a 1-byte payload") }
        let code = UInt16(payload[0]) << 8 | UInt16(payload[1])
        guard WebSocketFrameEncoder.isSendableCloseCode(code) else { throw .violation("a close frame with the code \(code), which a peer may not send") }
        guard let reason = String(validating: payload[2...], as: UTF8.self) else { throw .badText("a close reason that is not UTF-8") }
        return .close(code: code, reason: reason)
    }
}
