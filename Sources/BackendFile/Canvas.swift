import KraklBackendABI

/// A BGRx picture the pattern scenes draw into; it persists between frames
/// so that a scene only redraws what changes, like a real screen.
final class Canvas {
    let width: Int
    let height: Int
    let stride: Int
    let pixels: UnsafeMutablePointer<UInt8>

    init(width: Int, height: Int) {
        self.width = width
        self.height = height
        stride = width * 4
        pixels = .allocate(capacity: stride * height)
        pixels.initialize(repeating: 0, count: stride * height)
    }

    deinit { pixels.deallocate() }

    /// `color` is 0xRRGGBB; stored as B, G, R, x bytes.
    func fill(_ rect: krakl_rect, _ color: UInt32) {
        let value = color | 0xFF00_0000
        for y in Int(rect.y)..<Int(rect.y + rect.height) {
            let row = UnsafeMutableRawPointer(pixels + y * stride + Int(rect.x) * 4).assumingMemoryBound(to: UInt32.self)
            row.update(repeating: value.littleEndian, count: Int(rect.width))
        }
    }

    func row(_ y: Int) -> UnsafeMutablePointer<UInt32> {
        UnsafeMutableRawPointer(pixels + y * stride).assumingMemoryBound(to: UInt32.self)
    }

    /// Moves rows [from, from+count) to start at `to` (memmove semantics),
    /// limited to columns [x, x+width).
    func moveRows(from: Int, to: Int, count: Int, x: Int, width: Int) {
        guard count > 0 else { return }
        if to < from {
            for i in 0..<count { (row(to + i) + x).update(from: row(from + i) + x, count: width) }
        } else {
            for i in (0..<count).reversed() { (row(to + i) + x).update(from: row(from + i) + x, count: width) }
        }
    }
}

func rect(_ x: Int, _ y: Int, _ width: Int, _ height: Int) -> krakl_rect {
    krakl_rect(x: Int32(x), y: Int32(y), width: Int32(width), height: Int32(height))
}

/// Text-like glyphs without a font: each character code maps to a fixed
/// 5×7 bit pattern (drawn 1×2 into an 8×16 cell), always with some ink and
/// never a full cell, so drawing one always changes pixels.
enum Glyphs {
    static let cellWidth = 8
    static let cellHeight = 16

    /// Bits 0-4 of glyph row `row` (0-6) of character `code`.
    static func rowBits(_ code: UInt32, _ row: Int) -> UInt32 {
        var h = (code &+ 1) &* 2_654_435_761 &+ UInt32(row) &* 40_503
        h ^= h >> 13
        h = h &* 0x5bd1_e995
        h ^= h >> 15
        var bits = h & 0x1F
        if row == 3 { bits |= 0b00100 } // every glyph has ink on its middle row
        if row == 0 && code % 3 != 0 { bits = 0 } // most glyphs have no ascender
        return bits
    }

    /// Draws pixel row `y` (0-15) of a glyph cell whose left edge is `out`.
    static func drawRow(_ code: UInt32, cellRow y: Int, into out: UnsafeMutablePointer<UInt32>, ink: UInt32, paper: UInt32) {
        let glyphRow = (y - 1) / 2
        let bits: UInt32 = (y >= 1 && glyphRow < 7) ? rowBits(code, glyphRow) : 0
        out[0] = paper
        for i in 0..<5 { out[1 + i] = (bits >> UInt32(4 - i)) & 1 == 1 ? ink : paper }
        out[6] = paper
        out[7] = paper
    }

    static func draw(_ code: UInt32, on canvas: Canvas, x: Int, y: Int, ink: UInt32, paper: UInt32) {
        for dy in 0..<cellHeight { drawRow(code, cellRow: dy, into: canvas.row(y + dy) + x, ink: ink | 0xFF00_0000, paper: paper | 0xFF00_0000) }
    }
}

/// A small, fast, reproducible random source (xorshift64*), so a scene
/// plays the same way every run.
struct SceneRandom {
    private var state: UInt64
    init(seed: UInt64) { state = seed == 0 ? 0x9E37_79B9_7F4A_7C15 : seed }
    mutating func next() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 2_685_821_657_736_338_717
    }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
