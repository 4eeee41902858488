import Glibc
internal import CStbImage

/// Reads image files for `krakl-agent --qr`: PNG, JPEG and binary PPM/PGM
/// through stb_image (Debian libstb-dev; see docs/join-codes.md for why).
public enum ImageFile {
    /// Decodes `path` to 8-bit gray. The header is read first
    /// (`stbi_info_from_file`) and a picture over `limits` is refused
    /// before any pixel memory is allocated.
    public static func readGray(path: String, limits: ImageLimits = ImageLimits()) throws(ImageFileError) -> GrayImage {
        guard let file = fopen(path, "rb") else { throw .cannotOpen(path: path, reason: String(cString: strerror(errno))) }
        defer { fclose(file) }
        var status = stat()
        guard fstat(fileno(file), &status) == 0 else { throw .cannotOpen(path: path, reason: String(cString: strerror(errno))) }
        guard status.st_mode & S_IFMT == S_IFREG else { throw .notAFile(path: path) }
        guard status.st_size > 0 else { throw .empty(path: path) }

        var width: Int32 = 0, height: Int32 = 0, channels: Int32 = 0
        guard krakl_image_info(file, &width, &height, &channels) == 1 else {
            let reason = String(cString: krakl_image_failure_reason())
            // stb refuses headers beyond 2^24 a side or 1 GiB of pixels itself.
            if reason == "too large" { throw .tooLarge(path: path, width: nil, height: nil, limits: limits) }
            throw .unknownFormat(path: path)
        }
        let w = Int(width), h = Int(height)
        guard w > 0, h > 0 else { throw .damaged(path: path, reason: "its header says \(w)x\(h) pixels") }
        guard w <= limits.maximumSide, h <= limits.maximumSide, w * h <= limits.maximumPixels else {
            throw .tooLarge(path: path, width: w, height: h, limits: limits)
        }
        var decodedWidth: Int32 = 0, decodedHeight: Int32 = 0
        guard let pixels = krakl_image_load_gray(file, &decodedWidth, &decodedHeight) else {
            let reason = String(cString: krakl_image_failure_reason())
            if reason == "too large" { throw .tooLarge(path: path, width: w, height: h, limits: limits) }
            throw .damaged(path: path, reason: reason)
        }
        defer { krakl_image_free(pixels) }
        // The decoder read the header again; the file must not have changed under us.
        guard Int(decodedWidth) == w, Int(decodedHeight) == h else { throw .damaged(path: path, reason: "its size changed while reading") }
        return GrayImage(width: w, height: h, pixels: Array(UnsafeBufferPointer(start: pixels, count: w * h)))
    }
}
