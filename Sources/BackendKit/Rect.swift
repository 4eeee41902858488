import KraklBackendABI

extension krakl_rect {
    /// The part of this rectangle inside a width × height picture; nil when
    /// none of it is. Backends clip what their sources report (damage, crop,
    /// a pointer near the edge) before it goes into a frame.
    public func clipped(width: Int, height: Int) -> krakl_rect? {
        let x0 = max(0, Int(x)), y0 = max(0, Int(y))
        let x1 = min(width, Int(x) + Int(self.width)), y1 = min(height, Int(y) + Int(self.height))
        guard x0 < x1, y0 < y1 else { return nil }
        return krakl_rect(x: Int32(x0), y: Int32(y0), width: Int32(x1 - x0), height: Int32(y1 - y0))
    }

    /// This rectangle grown to even x, y, width and height (2×2 chroma blocks), then clipped to a
    /// width × height picture; an odd picture size leaves the last column or row odd. A 4:2:0
    /// backend reads, converts and reports damage this way, so a chroma sample never mixes
    /// converted and unconverted pixels.
    public func evenAligned(width: Int, height: Int) -> krakl_rect? {
        let x0 = Int(x) & ~1, y0 = Int(y) & ~1
        let x1 = (Int(x) + Int(self.width) + 1) & ~1, y1 = (Int(y) + Int(self.height) + 1) & ~1
        return krakl_rect(x: Int32(x0), y: Int32(y0), width: Int32(x1 - x0), height: Int32(y1 - y0)).clipped(width: width, height: height)
    }
}
