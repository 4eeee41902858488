import FrameStamp
import Glibc
import KraklBackendABI

/// What a producer did for one frame interval.
enum Produced {
    case unchanged
    /// The picture changed; empty damage means the whole frame.
    case changed(damage: [krakl_rect])
    case ended(String)
    case failed(String)
}

/// Makes the pictures of a file-backend source, one per frame interval.
protocol FrameProducer: AnyObject {
    /// Updates the picture. `whole` asks for a complete frame (the first
    /// after start), stamped with `sequence` and `timestampNs`.
    func next(whole: Bool, sequence: UInt64, timestampNs: UInt64) -> Produced
    /// Points `frame`'s format, size and planes at the current picture.
    func describe(_ frame: inout krakl_frame)
    /// Goes back to the beginning (a start after the source ended).
    func rewind()
}

/// A synthetic scene on a BGRx canvas, with the frame stamp on top.
final class PatternProducer: FrameProducer {
    let canvas: Canvas
    let scene: Scene
    let stampArea: krakl_rect
    private var drawn = false

    init(scene name: SceneName, width: Int, height: Int, speed: Int, seed: UInt64) {
        canvas = Canvas(width: width, height: height)
        let stamp = FrameStamp.area(width: width, height: height)!
        stampArea = rect(stamp.x, stamp.y, stamp.width, stamp.height)
        // The scene gets everything below the stamp's block rows.
        scene = name.make(area: rect(0, stamp.height, width, height - stamp.height), speed: speed, seed: seed)
    }

    func next(whole: Bool, sequence: UInt64, timestampNs: UInt64) -> Produced {
        var damage: [krakl_rect] = []
        if !drawn {
            scene.drawAll(canvas)
            drawn = true
        } else if !whole {
            guard let changed = scene.advance(canvas) else { return stamp(sequence, timestampNs, damage: []) }
            if changed.isEmpty { return .unchanged }
            damage = changed + [stampArea]
        }
        return stamp(sequence, timestampNs, damage: damage)
    }

    private func stamp(_ sequence: UInt64, _ timestampNs: UInt64, damage: [krakl_rect]) -> Produced {
        let stamp = FrameStamp(frameNumber: UInt32(truncatingIfNeeded: sequence),
                               captureTimeMs: UInt32(truncatingIfNeeded: timestampNs / 1_000_000))
        stamp.draw(into: canvas.pixels, width: canvas.width, height: canvas.height, stride: canvas.stride)
        return .changed(damage: damage)
    }

    func describe(_ frame: inout krakl_frame) {
        frame.format = KRAKL_FORMAT_BGRX.rawValue
        frame.width = UInt32(canvas.width)
        frame.height = UInt32(canvas.height)
        frame.plane_count = 1
        frame.stride.0 = UInt32(canvas.stride)
        frame.plane.0 = UnsafePointer(canvas.pixels)
    }

    func rewind() {}
}

/// Plays a Y4M file as I420 frames; damage is the 16×16 tiles (8×8 in
/// chroma) that differ from the previous frame.
final class Y4MProducer: FrameProducer {
    let reader: Y4MReader
    let loop: Bool
    private var current: UnsafeMutablePointer<UInt8>
    private var previous: UnsafeMutablePointer<UInt8>
    private var hasPrevious = false
    static let tile = 16

    init(reader: Y4MReader, loop: Bool) {
        self.reader = reader
        self.loop = loop
        current = .allocate(capacity: reader.frameSize)
        previous = .allocate(capacity: reader.frameSize)
    }

    deinit {
        current.deallocate()
        previous.deallocate()
    }

    func next(whole: Bool, sequence: UInt64, timestampNs: UInt64) -> Produced {
        swap(&current, &previous)
        do throws(Y4MReader.Failure) {
            if try !reader.read(into: current) {
                guard loop, hasPrevious else {
                    swap(&current, &previous)
                    return .ended("end of file")
                }
                reader.rewind()
                guard try reader.read(into: current) else { return .ended("end of file") }
            }
        } catch {
            swap(&current, &previous)
            return .failed(error.message)
        }
        defer { hasPrevious = true }
        if whole || !hasPrevious { return .changed(damage: []) }
        let damage = changedTiles()
        return damage.isEmpty ? .unchanged : .changed(damage: damage)
    }

    /// Runs of changed tiles along each tile row, as rectangles.
    func changedTiles() -> [krakl_rect] {
        let w = reader.width, h = reader.height, cw = (w + 1) / 2, ch = (h + 1) / 2
        let tile = Self.tile
        func differs(_ tx: Int, _ ty: Int) -> Bool {
            let x0 = tx * tile, y0 = ty * tile, x1 = min(w, x0 + tile), y1 = min(h, y0 + tile)
            for y in y0..<y1 where memcmp(current + y * w + x0, previous + y * w + x0, x1 - x0) != 0 { return true }
            let cx0 = x0 / 2, cx1 = (x1 + 1) / 2, cy0 = y0 / 2, cy1 = (y1 + 1) / 2
            for plane in 0..<2 {
                let base = w * h + plane * cw * ch
                for y in cy0..<cy1 where memcmp(current + base + y * cw + cx0, previous + base + y * cw + cx0, cx1 - cx0) != 0 { return true }
            }
            return false
        }
        var rects: [krakl_rect] = []
        for ty in 0..<((h + tile - 1) / tile) {
            var tx = 0
            let tilesWide = (w + tile - 1) / tile
            while tx < tilesWide {
                guard differs(tx, ty) else { tx += 1; continue }
                let start = tx
                while tx < tilesWide && differs(tx, ty) { tx += 1 }
                let x = start * tile, y = ty * tile
                rects.append(rect(x, y, min(w, tx * tile) - x, min(h, y + tile) - y))
            }
        }
        return rects
    }

    func describe(_ frame: inout krakl_frame) {
        let w = reader.width, h = reader.height, cw = (w + 1) / 2, ch = (h + 1) / 2
        frame.format = KRAKL_FORMAT_I420.rawValue
        frame.width = UInt32(w)
        frame.height = UInt32(h)
        frame.plane_count = 3
        frame.stride = (UInt32(w), UInt32(cw), UInt32(cw), 0)
        frame.plane = (UnsafePointer(current), UnsafePointer(current + w * h), UnsafePointer(current + w * h + cw * ch), nil)
    }

    func rewind() {
        reader.rewind()
        hasPrevious = false
    }
}
