internal import CZbar

/// zbar's image scanner set up for join codes: QR only (every other
/// symbology off: fewer false reads, less work) and binary mode, so zbar
/// hands over the payload's bytes as they are instead of guessing a
/// character set and converting (`ZBAR_CFG_BINARY`, zbar ≥ 0.23).
///
/// Not thread-safe: one scanner per thread.
public final class QRScanner {
    private let scanner: OpaquePointer

    /// - Parameter invertedToo: when a picture holds no code, look again with light and dark swapped
    ///   (`ZBAR_CFG_TEST_INVERTED`): a page in dark mode shows its code light on dark, which zbar
    ///   does not read otherwise. It costs a second pass only over pictures with nothing in them.
    public init(invertedToo: Bool = false) {
        guard let scanner = zbar_image_scanner_create() else { fatalError("zbar_image_scanner_create: out of memory") }
        self.scanner = scanner
        // Symbology 0 (ZBAR_NONE) applies a setting to all of them.
        zbar_image_scanner_set_config(scanner, zbar_symbol_type_t(rawValue: 0), ZBAR_CFG_ENABLE, 0)
        zbar_image_scanner_set_config(scanner, ZBAR_QRCODE, ZBAR_CFG_ENABLE, 1)
        zbar_image_scanner_set_config(scanner, ZBAR_QRCODE, ZBAR_CFG_BINARY, 1)
        if invertedToo { zbar_image_scanner_set_config(scanner, zbar_symbol_type_t(rawValue: 0), ZBAR_CFG_TEST_INVERTED, 1) }
    }

    deinit { zbar_image_scanner_destroy(scanner) }

    /// Scans a Y800 picture (`zbar_scan_image`) and returns every QR
    /// payload found, as raw bytes, in zbar's order. The same code seen
    /// twice comes back twice.
    public func scan(_ image: GrayImage) -> [[UInt8]] {
        image.pixels.withUnsafeBufferPointer { scan(gray: $0, width: image.width, height: image.height) }
    }

    /// As `scan(_:)`, over `width * height` bytes the caller owns (stride =
    /// width). zbar reads them only during this call.
    public func scan(gray: UnsafeBufferPointer<UInt8>, width: Int, height: Int) -> [[UInt8]] {
        precondition(width > 0 && height > 0 && gray.count >= width * height, "scan: \(gray.count) bytes for \(width)x\(height)")
        guard let zimage = zbar_image_create() else { return [] }
        defer { zbar_image_destroy(zimage) }
        // fourcc('Y','8','0','0'): zbar_fourcc is a macro Swift cannot call.
        let y800 = UInt(UInt8(ascii: "Y")) | UInt(UInt8(ascii: "8")) << 8 | UInt(UInt8(ascii: "0")) << 16 | UInt(UInt8(ascii: "0")) << 24
        zbar_image_set_format(zimage, UInt(y800))
        zbar_image_set_size(zimage, UInt32(width), UInt32(height))
        // No cleanup handler: zbar must not free memory it does not own.
        zbar_image_set_data(zimage, gray.baseAddress, UInt(width * height), nil)
        guard zbar_scan_image(scanner, zimage) > 0 else { return [] }
        var payloads: [[UInt8]] = []
        var symbol = zbar_image_first_symbol(zimage)
        while let current = symbol {
            if zbar_symbol_get_type(current) == ZBAR_QRCODE, let data = zbar_symbol_get_data(current) {
                let count = Int(zbar_symbol_get_data_length(current))
                payloads.append(data.withMemoryRebound(to: UInt8.self, capacity: count) { Array(UnsafeBufferPointer(start: $0, count: count)) })
            }
            symbol = zbar_symbol_next(current)
        }
        return payloads
    }
}
