import BackendKit
import KraklBackendABI
import Testing

/// The pointer drawing both capture backends share: damage for its old and
/// new place, clipping at the picture's edge, both alpha conventions, and
/// the picture exactly as before once the delivery is over.
@Suite(.tags(.unit)) struct CursorSpriteTests {
    let width = 16, height = 8

    func picture() -> [UInt8] { (0..<(16 * 8 * 4)).map { UInt8(truncatingIfNeeded: $0 * 7) } }

    @Test func damageCoversTheOldAndNewPlaceAndNothingWhenItStaysPut() {
        var sprite = CursorSprite()
        let image = (pixels: [UInt32](repeating: 0xFF00_00FF, count: 4), width: 2, height: 2, alpha: CursorSprite.Alpha.premultiplied)
        let first = sprite.update(image: image, left: 3, top: 2, pictureWidth: width, pictureHeight: height)
        #expect(first.map { [$0.x, $0.y, $0.width, $0.height] } == [[3, 2, 2, 2]])
        #expect(sprite.update(image: nil, left: 3, top: 2, pictureWidth: width, pictureHeight: height).isEmpty, "no move, no new image: no damage")
        let moved = sprite.update(image: nil, left: 15, top: 7, pictureWidth: width, pictureHeight: height)
        #expect(moved.map { [$0.x, $0.y, $0.width, $0.height] } == [[3, 2, 2, 2], [15, 7, 1, 1]], "old place, and the new one clipped at the corner")
        let gone = sprite.update(image: nil, left: 40, top: 40, pictureWidth: width, pictureHeight: height)
        #expect(gone.map { [$0.x, $0.y] } == [[15, 7]], "off the picture: only the old place")
        #expect(sprite.rect == nil)
    }

    @Test(arguments: [CursorSprite.Alpha.premultiplied, .straight])
    func drawBlendsAndRestorePutsBackEveryByte(alpha: CursorSprite.Alpha) {
        var sprite = CursorSprite()
        // One opaque red pixel, one transparent, two half-covered white pixels.
        let half: UInt32 = alpha == .premultiplied ? 0x8080_8080 : 0x80FF_FFFF
        _ = sprite.update(image: ([0xFFFF_0000, 0x0000_0000, half, half], 2, 2, alpha), left: 4, top: 1, pictureWidth: width, pictureHeight: height)
        var pixels = picture()
        let original = pixels
        let stride = width * 4
        let under = pixels.withUnsafeMutableBufferPointer { sprite.draw(into: $0.baseAddress!, stride: stride) }
        let at = { (x: Int, y: Int) in Array(pixels[(y * stride + x * 4)..<(y * stride + x * 4 + 3)]) }
        #expect(at(4, 1) == [0, 0, 255], "opaque red lands as BGR 0,0,255")
        #expect(at(5, 1) == Array(original[(1 * stride + 20)..<(1 * stride + 23)]), "a transparent pixel leaves the picture alone")
        let blended = at(4, 2), before = Array(original[(2 * stride + 16)..<(2 * stride + 19)])
        for (b, o) in zip(blended, before) {
            let expected = 128 + Int(o) * 127 / 255
            #expect(abs(Int(b) - expected) <= 1, "half-covered white: \(b) for \(o)")
        }
        pixels.withUnsafeMutableBufferPointer { sprite.restore(under!, into: $0.baseAddress!, stride: stride) }
        #expect(pixels == original, "after restore the picture is as it was")
    }
}
