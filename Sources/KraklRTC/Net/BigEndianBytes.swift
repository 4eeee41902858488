// Network byte order reads and writes on plain byte arrays. Readers do not
// check bounds: every parser checks the length it needs before it reads, so
// a short datagram becomes a typed error at the place that knows the field.

extension Array where Element == UInt8 {
    mutating func appendBE16(_ value: UInt16) {
        append(UInt8(truncatingIfNeeded: value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }

    mutating func appendBE24(_ value: UInt32) {
        append(UInt8(truncatingIfNeeded: value >> 16))
        append(UInt8(truncatingIfNeeded: value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }

    mutating func appendBE32(_ value: UInt32) {
        appendBE16(UInt16(truncatingIfNeeded: value >> 16))
        appendBE16(UInt16(truncatingIfNeeded: value))
    }

    mutating func appendBE64(_ value: UInt64) {
        appendBE32(UInt32(truncatingIfNeeded: value >> 32))
        appendBE32(UInt32(truncatingIfNeeded: value))
    }

    mutating func putBE16(_ value: UInt16, at index: Int) {
        self[index] = UInt8(truncatingIfNeeded: value >> 8)
        self[index + 1] = UInt8(truncatingIfNeeded: value)
    }

    mutating func putBE32(_ value: UInt32, at index: Int) {
        putBE16(UInt16(truncatingIfNeeded: value >> 16), at: index)
        putBE16(UInt16(truncatingIfNeeded: value), at: index + 2)
    }

    func be16(at index: Int) -> UInt16 {
        UInt16(self[index]) << 8 | UInt16(self[index + 1])
    }

    func be24(at index: Int) -> UInt32 {
        UInt32(self[index]) << 16 | UInt32(self[index + 1]) << 8 | UInt32(self[index + 2])
    }

    func be32(at index: Int) -> UInt32 {
        UInt32(be16(at: index)) << 16 | UInt32(be16(at: index + 2))
    }

    func be64(at index: Int) -> UInt64 {
        UInt64(be32(at: index)) << 32 | UInt64(be32(at: index + 4))
    }

    /// Bytes `start..<start+count` as a new array (callers checked the bounds).
    func bytes(_ start: Int, _ count: Int) -> [UInt8] {
        Array(self[start..<(start + count)])
    }
}

/// Rounds up to the next multiple of four (STUN attributes, RTCP, RTP extensions are 32-bit aligned).
@inline(__always) func paddedTo4(_ n: Int) -> Int { (n + 3) & ~3 }

/// "0x0020": how attribute and packet types appear in error messages.
func hex16(_ value: UInt16) -> String {
    let digits = String(value, radix: 16)
    return "0x" + String(repeating: "0", count: 4 - digits.count) + digits
}
