/// After the screen settles, the unchanged picture is encoded again (every block active), pass
/// after pass at the frame rate, until libvpx says the picture has converged; then nothing until
/// the next change. This is what a room or the viewer gets instead of a periodic refresh
/// (`EncoderSettings.refineAfterSettling`). Sans I/O: the encoder thread tells it about changes
/// and passes, it answers when the next pass is due.
///
/// Why passes back to back and not a few seconds apart: libvpx's rate control moves the quantizer
/// a step per frame, whatever the time between frames (the pipeline feeds it a steady one-frame
/// clock). After a coarse 1080p keyframe (173 KB at 2.5 Mbit/s, 38.8 dB) the next frames come out
/// at the quantizer's ceiling, and only about ten frames later does it come down. The old schedule
/// of three passes at 1, 2 and 4 s all fell in that stretch: 840–960 bytes each, +0.04 dB, and a
/// room's viewers saw 27.7 dB of a static screen where Chromium's and GStreamer's reached 47
/// (docs/PERFORMANCE.md, issue 27). Passes at the frame rate took the same picture to 50.4 dB in
/// 55 passes (q 56 → 6), at the same CBR target, like libwebrtc's zero-hertz screenshare mode,
/// which repeats an unchanged frame until its quantizer converges.
struct SettleRefinement {
    /// No change for this long before the first pass: a short pause in typing is no reason to refine.
    static let settleDelayNs: UInt64 = 1_000_000_000
    /// A pass whose quantizer (0–63) is at most this has converged: libwebrtc's VP8 threshold
    /// (13 of 127). Measured at 1080p, 2.5 Mbit/s: 50.4 dB PSNR when it was reached.
    static let convergedQuantizer = 6
    /// At most this many passes after one change (3 s at 30 fps): a link too slow to converge
    /// still stops.
    static let passLimit = 90
    /// This many passes in a row that carried nothing but per-block skip flags, at a quantizer no
    /// lower than the pass before, end it too: at a low bitrate the quantizer stays at its
    /// ceiling and the picture stops improving (300 kbit/s, 1080p: 36.47 dB from pass 20 to pass
    /// 90, each pass ≈ 700 bytes at q 56). Right after a large keyframe there is a stretch of
    /// such passes too, before the quantizer starts to fall (9 at 2.5 Mbit/s, 1080p, then small
    /// passes with a falling quantizer, which reset the count); 15 rides it out.
    static let emptyRunLimit = 15

    let frameIntervalNs: UInt64
    /// Below this a pass changed (next to) nothing: about 0.1 byte a 16×16 block is the skip
    /// flags alone (≈ 700–960 bytes at 1080p), so one byte in eight blocks plus a frame header.
    let emptyPassBytes: Int

    private(set) var lastChangeNs: UInt64?
    private(set) var passes = 0
    private(set) var converged = false
    private var emptyRun = 0
    private var lastQuantizer: Int?
    private var lastPassNs: UInt64 = 0

    init(frameIntervalNs: UInt64, width: Int, height: Int) {
        self.frameIntervalNs = frameIntervalNs
        emptyPassBytes = BlockGrid(width: width, height: height).count / 8 + 64
    }

    /// A frame that carried a change (or a keyframe): refinement starts over after the next settle.
    mutating func changed(atNs now: UInt64) {
        lastChangeNs = now
        passes = 0
        emptyRun = 0
        lastQuantizer = nil
        converged = false
    }

    /// When the next pass is due; nil before the first picture and once converged.
    var nextPassNs: UInt64? {
        guard let changed = lastChangeNs, !converged else { return nil }
        return passes == 0 ? changed + Self.settleDelayNs : lastPassNs + frameIntervalNs
    }

    /// A pass went out. True when it ended the refinement (converged, no longer improving, or the
    /// limit), so the caller can send the frame that lets a receiver show it.
    mutating func passed(atNs now: UInt64, bytes: Int, quantizer: Int?) -> Bool {
        passes += 1
        lastPassNs = now
        let falling = quantizer.map { q in lastQuantizer.map { q < $0 } ?? false } ?? false
        emptyRun = bytes < emptyPassBytes && !falling ? emptyRun + 1 : 0
        lastQuantizer = quantizer
        if let quantizer, quantizer <= Self.convergedQuantizer { converged = true }
        if emptyRun >= Self.emptyRunLimit || passes >= Self.passLimit { converged = true }
        return converged
    }
}

/// The rolling band of 16×16 block rows that rides along with every frame's damage, so that areas
/// which stopped changing are still refined while the rest of the screen keeps changing (typing,
/// where the screen never settles): every row comes round every `sweep` frames. A block whose last
/// encoding was already at the converged quantizer is left out; the band then costs nothing once
/// the picture has converged, and a block that changed at a coarse quantizer comes back into it.
///
/// Why: with every block of the band encoded every frame, the band was most of the work while
/// typing: 600 of 8160 blocks at 1080p (7.4 % of the picture) against about 10 of damage, every
/// frame, at the quantizer's floor (q 2 for 176 of 236 frames of 1080p typing).
struct RefinementBand {
    /// Frames the band takes to sweep the picture (0.5 s at 30 fps).
    static let sweep = 15

    let grid: BlockGrid
    var columns: Int { grid.columns }
    var rows: Int { grid.rows }
    /// Per block: its last encoding was at a quantizer of at most `SettleRefinement.convergedQuantizer`.
    private(set) var converged: [Bool]
    private var nextRow = 0

    init(width: Int, height: Int) {
        grid = BlockGrid(width: width, height: height)
        converged = Array(repeating: false, count: grid.count)
    }

    /// Marks the band's blocks that have not converged in `map` (one byte a block, row by row) and
    /// moves the band on to the next rows.
    mutating func add(to map: inout [UInt8]) {
        precondition(map.count == grid.count)
        let height = max(1, (rows + Self.sweep - 1) / Self.sweep)
        if nextRow >= rows { nextRow = 0 }
        for row in nextRow..<min(rows, nextRow + height) {
            for column in 0..<columns where !converged[row * columns + column] { map[row * columns + column] = 1 }
        }
        nextRow = nextRow + height >= rows ? 0 : nextRow + height
    }

    /// A frame was encoded: its blocks (`map`'s, nil for all of them) are converged when its
    /// quantizer was at most the threshold, and not when it was coarser or unknown.
    mutating func encoded(map: [UInt8]?, quantizer: Int?) {
        let good = quantizer.map { $0 <= SettleRefinement.convergedQuantizer } ?? false
        guard let map else {
            for index in converged.indices { converged[index] = good }
            return
        }
        precondition(map.count == converged.count)
        for index in map.indices where map[index] != 0 { converged[index] = good }
    }
}
