/// A frame's number and capture time drawn into its pixels as a row of big
/// black and white blocks, so a receiver far down the pipeline (after
/// conversion, VP8 at a low bitrate, RTP, a browser) can still read them and
/// check order, loss and latency.
///
/// Layout, from the top-left corner, 16×16-pixel blocks left to right,
/// wrapping to further block rows when the frame is narrow:
///
///     [1][0]  marker
///     32 bits frame number, most significant first
///     32 bits capture time in ms of CLOCK_MONOTONIC, modulo 2^32
///     8 bits  CRC-8 (polynomial 0x07) over the 8 bytes above
///
/// White (255) is 1, black (0) is 0. 16×16 blocks match VP8/VP9 macroblocks,
/// so each bit is one flat macroblock: the cheapest thing a codec can keep.
public struct FrameStamp: Equatable, Sendable {
    public var frameNumber: UInt32
    public var captureTimeMs: UInt32

    public init(frameNumber: UInt32, captureTimeMs: UInt32) {
        self.frameNumber = frameNumber
        self.captureTimeMs = captureTimeMs
    }

    public static let blockSize = 16
    static let bitCount = 2 + 32 + 32 + 8

    /// Where the stamp sits in a frame of this size, or nil when the frame is
    /// too small to hold it.
    public static func area(width: Int, height: Int) -> (x: Int, y: Int, width: Int, height: Int)? {
        let perRow = width / blockSize
        guard perRow > 0 else { return nil }
        let rows = (bitCount + perRow - 1) / perRow
        guard rows * blockSize <= height else { return nil }
        let blocksWide = rows == 1 ? bitCount : perRow
        return (0, 0, blocksWide * blockSize, rows * blockSize)
    }

    /// The 74 bits, marker first.
    var bits: [Bool] {
        var bytes: [UInt8] = []
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: frameNumber >> UInt32(shift))) }
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: captureTimeMs >> UInt32(shift))) }
        bytes.append(Self.crc8(bytes))
        var out: [Bool] = [true, false]
        for byte in bytes {
            for bit in stride(from: 7, through: 0, by: -1) { out.append((byte >> UInt8(bit)) & 1 == 1) }
        }
        return out
    }

    /// CRC-8/SMBUS: catches the odd block a decoder got wrong.
    static func crc8(_ bytes: [UInt8]) -> UInt8 {
        var crc: UInt8 = 0
        for byte in bytes {
            crc ^= byte
            for _ in 0..<8 { crc = (crc & 0x80) != 0 ? (crc << 1) ^ 0x07 : crc << 1 }
        }
        return crc
    }

    /// Draws the stamp into a 4-byte-per-pixel buffer (BGRx, RGBx, BGRA,
    /// RGBA: the blocks are grey, so the byte order does not matter).
    /// Returns false when the frame is too small.
    @discardableResult
    public func draw(into pixels: UnsafeMutablePointer<UInt8>, width: Int, height: Int, stride: Int) -> Bool {
        guard Self.area(width: width, height: height) != nil else { return false }
        let perRow = width / Self.blockSize
        for (index, bit) in bits.enumerated() {
            let bx = (index % perRow) * Self.blockSize
            let by = (index / perRow) * Self.blockSize
            let value: UInt8 = bit ? 255 : 0
            for y in by..<(by + Self.blockSize) {
                let row = pixels + y * stride + bx * 4
                for x in 0..<(Self.blockSize * 4) { row[x] = (x & 3) == 3 ? 255 : value }
            }
        }
        return true
    }

    /// Reads a stamp back. `luma(x, y)` returns the brightness (0-255) of a
    /// pixel; each block is judged by the mean of its centre 8×8 pixels so
    /// that ringing at block edges after lossy coding does not matter.
    /// Returns nil when the marker or the CRC does not match.
    public static func read(width: Int, height: Int, luma: (Int, Int) -> UInt8) -> FrameStamp? {
        guard area(width: width, height: height) != nil else { return nil }
        let perRow = width / blockSize
        var bits: [Bool] = []
        bits.reserveCapacity(bitCount)
        for index in 0..<bitCount {
            let bx = (index % perRow) * blockSize + blockSize / 4
            let by = (index / perRow) * blockSize + blockSize / 4
            var sum = 0
            for y in by..<(by + blockSize / 2) {
                for x in bx..<(bx + blockSize / 2) { sum += Int(luma(x, y)) }
            }
            bits.append(sum / (blockSize * blockSize / 4) >= 128)
        }
        guard bits[0], !bits[1] else { return nil }
        var bytes: [UInt8] = []
        for byteIndex in 0..<9 {
            var byte: UInt8 = 0
            for bit in 0..<8 where bits[2 + byteIndex * 8 + bit] { byte |= 0x80 >> UInt8(bit) }
            bytes.append(byte)
        }
        guard crc8(Array(bytes[0..<8])) == bytes[8] else { return nil }
        func word(_ at: Int) -> UInt32 {
            bytes[at..<(at + 4)].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        }
        return FrameStamp(frameNumber: word(0), captureTimeMs: word(4))
    }

    /// Reads a stamp from a packed 4-byte-per-pixel buffer whose first three
    /// bytes of each pixel are colour channels (any order).
    public static func read(packed pixels: UnsafePointer<UInt8>, width: Int, height: Int, stride: Int) -> FrameStamp? {
        read(width: width, height: height) { x, y in
            let p = pixels + y * stride + x * 4
            return UInt8((Int(p[0]) + Int(p[1]) + Int(p[2])) / 3)
        }
    }
}
