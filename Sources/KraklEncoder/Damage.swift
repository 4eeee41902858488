/// Changed areas accumulated between two encodes, in output pixels. Many
/// small rectangles stay separate (typing); past a bound they collapse to
/// their bounding box so bookkeeping never grows with the damage.
public struct DamageAccumulator {
    public private(set) var rects: [PixelRect] = []
    public private(set) var whole = false
    static let maximumRects = 128

    public init() {}

    public var isEmpty: Bool { !whole && rects.isEmpty }

    public mutating func addWhole() {
        whole = true
        rects.removeAll()
    }

    public mutating func add(_ rect: PixelRect) {
        guard !whole, !rect.isEmpty else { return }
        if rects.count >= Self.maximumRects {
            rects = [rects.dropFirst().reduce(rects[0]) { $0.union($1) }.union(rect)]
        } else {
            rects.append(rect)
        }
    }

    public mutating func merge(_ other: DamageAccumulator) {
        if other.whole { addWhole() } else { other.rects.forEach { add($0) } }
    }

    public mutating func clear() {
        whole = false
        rects.removeAll()
    }

    /// The libvpx active map: one byte per 16×16 macroblock, 1 where a
    /// rectangle touches it. Returns the map and the share of active blocks.
    public func macroblockMap(width: Int, height: Int) -> (map: [UInt8], activeShare: Double) {
        let grid = BlockGrid(width: width, height: height)
        if whole { return ([UInt8](repeating: 1, count: grid.count), 1) }
        var map = [UInt8](repeating: 0, count: grid.count)
        for r in rects where r.width > 0 && r.height > 0 && r.maxX > 0 && r.maxY > 0 && r.x < width && r.y < height {
            let c0 = grid.column(ofX: r.x), c1 = grid.column(ofX: r.maxX - 1)
            let r0 = grid.row(ofY: r.y), r1 = grid.row(ofY: r.maxY - 1)
            for row in r0...r1 { for col in c0...c1 { map[row * grid.columns + col] = 1 } }
        }
        let active = map.reduce(0) { $0 + Int($1) }
        return (map, Double(active) / Double(grid.count))
    }
}
