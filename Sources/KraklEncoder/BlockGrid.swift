/// The 16×16 blocks a VP8/VP9 encoder works in (macroblocks; VP9's active map is kept in the
/// same 16×16 units by libvpx): a picture's edge blocks are partial, so a 1920×1080 picture has
/// 120×68 = 8160 of them. Every per-block map here (libvpx's active map, the damage map, the
/// refinement band) is `count` bytes, row by row.
public struct BlockGrid: Equatable, Sendable {
    public static let blockSize = 16

    public let columns: Int
    public let rows: Int

    public init(width: Int, height: Int) {
        columns = (width + Self.blockSize - 1) / Self.blockSize
        rows = (height + Self.blockSize - 1) / Self.blockSize
    }

    public var count: Int { columns * rows }

    /// The block column holding pixel column `x` (clamped to the grid).
    func column(ofX x: Int) -> Int { min(columns - 1, max(0, x / Self.blockSize)) }

    /// The block row holding pixel row `y` (clamped to the grid).
    func row(ofY y: Int) -> Int { min(rows - 1, max(0, y / Self.blockSize)) }
}
