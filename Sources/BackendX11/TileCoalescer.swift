import BackendKit
import KraklBackendABI

/// Merges many small damage rectangles onto a grid of tiles, so that a
/// burst of tiny changes (a terminal's glyphs) costs a few reads, not one
/// per glyph: each run of touched tiles along a tile row becomes one
/// rectangle, and identical runs on consecutive rows merge into one.
struct TileCoalescer {
    let width: Int
    let height: Int
    let tile: Int

    init(width: Int, height: Int, tile: Int = 32) {
        self.width = width
        self.height = height
        self.tile = tile
    }

    /// `rects` in capture-area pixels (clipped here); returns covering rectangles.
    /// Runs once a frame on the capture thread, so it walks only the tile
    /// rows the damage touched and keeps its work in two flat arrays.
    func coalesce(_ rects: [krakl_rect]) -> [krakl_rect] {
        let cols = (width + tile - 1) / tile, rows = (height + tile - 1) / tile
        var touched = [Bool](repeating: false, count: cols * rows)
        var firstRow = rows, lastRow = -1
        for rect in rects {
            guard let r = rect.clipped(width: width, height: height) else { continue }
            let x0 = Int(r.x), y0 = Int(r.y), x1 = Int(r.x + r.width), y1 = Int(r.y + r.height)
            firstRow = min(firstRow, y0 / tile)
            lastRow = max(lastRow, (y1 - 1) / tile)
            for ty in (y0 / tile)...((y1 - 1) / tile) {
                for tx in (x0 / tile)...((x1 - 1) / tile) { touched[ty * cols + tx] = true }
            }
        }
        guard firstRow <= lastRow else { return [] }
        // Rectangles still growing downwards, keyed by their first tile column.
        var open: [krakl_rect] = [], next: [krakl_rect] = []
        var out: [krakl_rect] = []
        for ty in firstRow...lastRow {
            next.removeAll(keepingCapacity: true)
            let y = ty * tile, h = min(height, y + tile) - y
            var tx = 0
            while tx < cols {
                guard touched[ty * cols + tx] else { tx += 1; continue }
                let start = tx
                while tx < cols && touched[ty * cols + tx] { tx += 1 }
                let x = start * tile, w = min(width, tx * tile) - x
                if let i = open.firstIndex(where: { Int($0.x) == x && Int($0.width) == w }) {
                    var grown = open.remove(at: i)
                    grown.height += Int32(h)
                    next.append(grown)
                } else {
                    next.append(krakl_rect(x: Int32(x), y: Int32(y), width: Int32(w), height: Int32(h)))
                }
            }
            out += open
            swap(&open, &next)
        }
        out += open
        return out.sorted { ($0.y, $0.x) < ($1.y, $1.x) }
    }
}
