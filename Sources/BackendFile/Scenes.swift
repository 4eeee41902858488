import Glibc
import KraklBackendABI

/// One kind of synthetic screen activity. A scene owns the content area of
/// the canvas (everything below the frame stamp) and reports exactly the
/// rectangles it changed, so the damage it reports can be checked against
/// a pixel diff.
protocol Scene: AnyObject {
    /// Paints the whole content area (the first frame).
    func drawAll(_ canvas: Canvas)
    /// Advances one frame interval. Returns the rectangles it changed
    /// (empty: nothing changed), or nil when everything changed.
    func advance(_ canvas: Canvas) -> [krakl_rect]?
}

enum SceneName: String, CaseIterable {
    case `static`, typing, scrolling, video

    func make(area: krakl_rect, speed: Int, seed: UInt64) -> Scene {
        switch self {
        case .static: return StaticScene(area: area)
        case .typing: return TypingScene(area: area, seed: seed)
        case .scrolling: return ScrollingScene(area: area, speed: speed, seed: seed)
        case .video: return VideoScene(area: area)
        }
    }
}

/// A desktop with one window of text, painted once: one frame of change,
/// then nothing at all.
final class StaticScene: Scene {
    let area: krakl_rect
    init(area: krakl_rect) { self.area = area }

    func drawAll(_ canvas: Canvas) {
        canvas.fill(area, 0x3A6EA5)
        let x = Int(area.x) + Int(area.width) / 8, y = Int(area.y) + Int(area.height) / 8
        let w = Int(area.width) * 3 / 4, h = Int(area.height) * 3 / 4
        canvas.fill(rect(x, y, w, 24), 0x2D2D30)
        canvas.fill(rect(x, y + 24, w, h - 24), 0xFFFFFF)
        let cols = (w - 16) / Glyphs.cellWidth, rows = (h - 40) / Glyphs.cellHeight
        for row in 0..<rows {
            for col in 0..<(cols - (row * 7) % 13) {
                Glyphs.draw(UInt32(row * 131 + col * 7), on: canvas, x: x + 8 + col * Glyphs.cellWidth,
                            y: y + 32 + row * Glyphs.cellHeight, ink: 0x202020, paper: 0xFFFFFF)
            }
        }
    }

    func advance(_ canvas: Canvas) -> [krakl_rect]? { [] }
}

/// A terminal someone types into: one to three glyph cells a frame, the
/// cursor moving, now and then a new line; at the bottom it wraps to the
/// top and clears the line it lands on (like `clear`-less tmux panes).
final class TypingScene: Scene {
    let area: krakl_rect
    let cols: Int, rows: Int
    var col = 0, row = 0
    var rowHasText: [Bool]
    var random: SceneRandom
    static let paper: UInt32 = 0x1E1E1E, ink: UInt32 = 0xD0D0D0, cursor: UInt32 = 0x50C050

    init(area: krakl_rect, seed: UInt64) {
        self.area = area
        cols = Int(area.width) / Glyphs.cellWidth
        rows = Int(area.height) / Glyphs.cellHeight
        rowHasText = Array(repeating: false, count: rows)
        random = SceneRandom(seed: seed)
    }

    func cell(_ col: Int, _ row: Int) -> krakl_rect {
        rect(Int(area.x) + col * Glyphs.cellWidth, Int(area.y) + row * Glyphs.cellHeight, Glyphs.cellWidth, Glyphs.cellHeight)
    }

    func drawAll(_ canvas: Canvas) {
        canvas.fill(area, Self.paper)
        canvas.fill(cell(col, row), Self.cursor)
    }

    func advance(_ canvas: Canvas) -> [krakl_rect]? {
        var cells: [(col: Int, row: Int)] = []
        var clearedRows: Set<Int> = []
        for _ in 0..<(1 + random.below(3)) {
            if col >= cols || random.below(30) == 0 {
                if col < cols { // erase the cursor block left behind
                    canvas.fill(cell(col, row), Self.paper)
                    cells.append((col, row))
                }
                col = 0
                row = (row + 1) % rows
                if rowHasText[row] {
                    canvas.fill(rect(Int(area.x), Int(cell(0, row).y), cols * Glyphs.cellWidth, Glyphs.cellHeight), Self.paper)
                    rowHasText[row] = false
                    clearedRows.insert(row)
                }
                continue
            }
            let box = cell(col, row)
            Glyphs.draw(UInt32(33 + random.below(94)), on: canvas, x: Int(box.x), y: Int(box.y), ink: Self.ink, paper: Self.paper)
            rowHasText[row] = true
            cells.append((col, row))
            col += 1
        }
        if col < cols {
            canvas.fill(cell(col, row), Self.cursor)
            cells.append((col, row))
        }
        // One rectangle per run of neighbouring cells on a row; a cleared row is one rectangle.
        var damage = clearedRows.sorted().map { rect(Int(area.x), Int(cell(0, $0).y), cols * Glyphs.cellWidth, Glyphs.cellHeight) }
        let sorted = cells.filter { !clearedRows.contains($0.row) }.sorted { ($0.row, $0.col) < ($1.row, $1.col) }
        var index = 0
        while index < sorted.count {
            var end = index
            while end + 1 < sorted.count && sorted[end + 1].row == sorted[index].row && sorted[end + 1].col <= sorted[end].col + 1 { end += 1 }
            var run = cell(sorted[index].col, sorted[index].row)
            run.width = Int32((sorted[end].col - sorted[index].col + 1) * Glyphs.cellWidth)
            damage.append(run)
            index = end + 1
        }
        return damage
    }
}

/// A document in a window scrolling up at `speed` pixels a frame: the
/// viewport moves (large damage), the title bar stays, the scroll bar
/// changes when its thumb moves.
final class ScrollingScene: Scene {
    let area: krakl_rect
    let viewport: krakl_rect
    let scrollbar: krakl_rect
    let speed: Int
    let seed: UInt64
    var offset = 0
    var thumbY = -1
    static let titleHeight = 24, scrollbarWidth = 12, lines = 1000
    static let paper: UInt32 = 0xFFFF_FFFF, ink: UInt32 = 0xFF20_2020

    init(area: krakl_rect, speed: Int, seed: UInt64) {
        self.area = area
        self.speed = speed
        self.seed = seed
        let top = Int(area.y) + Self.titleHeight
        viewport = rect(Int(area.x), top, Int(area.width) - Self.scrollbarWidth, Int(area.y + area.height) - top)
        scrollbar = rect(Int(area.x + area.width) - Self.scrollbarWidth, top, Self.scrollbarWidth, Int(viewport.height))
    }

    func lineLength(_ line: Int) -> Int {
        var r = SceneRandom(seed: seed &+ UInt64(line) &* 0x9E37_79B9)
        let maxCols = (Int(viewport.width) - 8) / Glyphs.cellWidth
        if r.below(9) == 0 { return 0 } // paragraph break
        return min(maxCols, 10 + r.below(max(1, maxCols - 10)))
    }

    /// Paints document pixel row `docY` into canvas row `y`.
    func drawDocumentRow(_ docY: Int, at y: Int, on canvas: Canvas) {
        let line = (docY / Glyphs.cellHeight) % Self.lines
        let out = canvas.row(y) + Int(viewport.x)
        out.update(repeating: Self.paper, count: Int(viewport.width))
        for col in 0..<lineLength(line) {
            Glyphs.drawRow(UInt32(line &* 7919 &+ col &* 31), cellRow: docY % Glyphs.cellHeight,
                           into: out + 4 + col * Glyphs.cellWidth, ink: Self.ink, paper: Self.paper)
        }
    }

    /// Redraws the scroll bar; returns whether its pixels changed.
    func drawScrollbar(on canvas: Canvas) -> Bool {
        let documentHeight = Self.lines * Glyphs.cellHeight
        let thumbHeight = max(16, Int(scrollbar.height) * Int(viewport.height) / documentHeight)
        let y = (offset % documentHeight) * (Int(scrollbar.height) - thumbHeight) / documentHeight
        guard y != thumbY else { return false }
        thumbY = y
        canvas.fill(scrollbar, 0xE0E0E0)
        canvas.fill(rect(Int(scrollbar.x) + 2, Int(scrollbar.y) + y, Self.scrollbarWidth - 4, thumbHeight), 0x909090)
        return true
    }

    func drawAll(_ canvas: Canvas) {
        canvas.fill(rect(Int(area.x), Int(area.y), Int(area.width), Self.titleHeight), 0x2D2D30)
        for y in 0..<Int(viewport.height) { drawDocumentRow(offset + y, at: Int(viewport.y) + y, on: canvas) }
        thumbY = -1
        _ = drawScrollbar(on: canvas)
    }

    func advance(_ canvas: Canvas) -> [krakl_rect]? {
        let height = Int(viewport.height), step = min(speed, height)
        offset += step
        // Scroll like a compositor would: move what stays, paint what is new.
        canvas.moveRows(from: Int(viewport.y) + step, to: Int(viewport.y), count: height - step, x: Int(viewport.x), width: Int(viewport.width))
        for y in (height - step)..<height { drawDocumentRow(offset + y, at: Int(viewport.y) + y, on: canvas) }
        return drawScrollbar(on: canvas) ? [viewport, scrollbar] : [viewport]
    }
}

/// Full-frame motion: a moving texture and a moving block, every pixel
/// different each frame, as from a video player in full screen.
final class VideoScene: Scene {
    let area: krakl_rect
    var t = 0
    let palette: [UInt32]

    init(area: krakl_rect) {
        self.area = area
        palette = (0..<256).map { i in
            let r = UInt32(128 + 100 * sinTable(i)), g = UInt32(128 + 100 * sinTable(i + 85)), b = UInt32(128 + 100 * sinTable(i + 170))
            return 0xFF00_0000 | r << 16 | g << 8 | b
        }
    }

    func drawAll(_ canvas: Canvas) { draw(canvas) }

    func advance(_ canvas: Canvas) -> [krakl_rect]? {
        t += 1
        draw(canvas)
        return nil
    }

    func draw(_ canvas: Canvas) {
        palette.withUnsafeBufferPointer { palette in
            for y in 0..<Int(area.height) {
                let out = canvas.row(Int(area.y) + y) + Int(area.x)
                let ry = (y + t * 2) & 255
                for x in 0..<Int(area.width) { out[x] = palette[((x + t * 4) ^ ry) & 255] }
            }
        }
        let size = Int(min(area.width, area.height)) / 4
        let span = max(1, Int(area.width) - size)
        let phase = (t * 6) % (2 * span)
        let x = Int(area.x) + (phase < span ? phase : 2 * span - phase)
        canvas.fill(rect(x, Int(area.y) + (Int(area.height) - size) / 2, size, size), 0xF0F0F0)
    }
}

private func sinTable(_ i: Int) -> Double { sin(Double(i % 256) / 256 * 2 * Double.pi) }
