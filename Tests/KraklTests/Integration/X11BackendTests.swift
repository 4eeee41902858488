import Foundation
import KraklBackendABI
import Testing
@testable import KraklBase
@testable import KraklHost

/// The X11 backend against a real X server (Xvfb started by the test).
@Suite("X11 backend under Xvfb", .serialized, .tags(.integration))
struct X11BackendTests {
    func options(_ x: XvfbServer, _ extra: [String: JSON] = [:]) -> [String: JSON] {
        var options: [String: JSON] = ["display": .string(x.display), "cursor": .bool(false)]
        extra.forEach { options[$0.key] = $0.value }
        return options
    }

    /// The Y, U and V samples at (x, y) of an I420 frame (the backend keeps the screen in I420).
    func yuv(_ frame: CapturedFrame, _ x: Int, _ y: Int) -> (y: Int, u: Int, v: Int) {
        let chroma = (y / 2) * ((frame.width + 1) / 2) + x / 2
        return (Int(frame.planes[0][y * frame.width + x]), Int(frame.planes[1][chroma]), Int(frame.planes[2][chroma]))
    }

    /// 0xRRGGBB in BT.601 limited range, as libyuv's ARGBToI420 computes it.
    static func expected(_ rgb: UInt32) -> (y: Int, u: Int, v: Int) {
        let r = Int(rgb >> 16 & 0xFF), g = Int(rgb >> 8 & 0xFF), b = Int(rgb & 0xFF)
        return ((66 * r + 129 * g + 25 * b + 0x1080) >> 8, (112 * b - 74 * g - 38 * r + 0x8080) >> 8, (112 * r - 94 * g - 18 * b + 0x8080) >> 8)
    }

    /// Whether (x, y) shows the colour `rgb`: its luma, and the chroma of its 2×2 block (which the
    /// test points lie wholly inside one colour), within one step of `expected` (libyuv's rounding).
    func shows(_ frame: CapturedFrame, _ x: Int, _ y: Int, _ rgb: UInt32) -> Bool {
        let got = yuv(frame, x, y), want = Self.expected(rgb)
        return frame.format == KRAKL_FORMAT_I420.rawValue && abs(got.y - want.y) <= 1 && abs(got.u - want.u) <= 1 && abs(got.v - want.v) <= 1
    }

    func describe(_ frame: CapturedFrame, _ x: Int, _ y: Int) -> String { "\(yuv(frame, x, y))" }

    /// Every rectangle covers whole 2×2 chroma blocks (an odd edge of the frame aside).
    func evenAligned(_ rects: [krakl_rect], width: Int, height: Int) -> Bool {
        rects.allSatisfy { r in
            r.x % 2 == 0 && r.y % 2 == 0 && (r.width % 2 == 0 || Int(r.x + r.width) == width) && (r.height % 2 == 0 || Int(r.y + r.height) == height)
        }
    }

    @Test func conformance() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let result = try Harness.agent(["conformance", Harness.library("BackendX11"), "--option", "display=\(x.display)"], timeout: 120)
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(!result.stdout.contains("FAIL"), "\(result.stdout)")
    }

    /// Pixels are exact, damage covers a drawn rectangle and is small, and
    /// a static screen delivers nothing after the first frame.
    @Test func pixelsDamageAndStaticScreen() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        try x.fill(x: 100, y: 100, width: 200, height: 150, rgb: "ff8000")
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        let first = collector.frames[0]
        #expect(first.width == 1024 && first.height == 768 && first.damage.isEmpty)
        #expect(first.format == KRAKL_FORMAT_I420.rawValue, "format \(first.format)")
        #expect(shows(first, 150, 150, 0xFF8000), "inside: \(describe(first, 150, 150)), want \(Self.expected(0xFF8000))")
        #expect(shows(first, 10, 10, 0x336699), "background: \(describe(first, 10, 10)), want \(Self.expected(0x336699))")
        // The edges of the drawn rectangle: its outermost pixels have its luma, their neighbours outside the background's.
        #expect(yuv(first, 100, 100).y == Self.expected(0xFF8000).y && yuv(first, 299, 249).y == Self.expected(0xFF8000).y)
        #expect(yuv(first, 99, 100).y == Self.expected(0x336699).y && yuv(first, 300, 249).y == Self.expected(0x336699).y)

        // Nothing drawn for 5 s: no further frame (an observation window).
        _ = collector.waitForFrames(2, timeout: 5)
        #expect(collector.frameCount == 1, "\(collector.frameCount) frames from a static screen")

        try x.fill(x: 600, y: 400, width: 40, height: 30, rgb: "00ff00")
        #expect(collector.waitForFrames(2, timeout: 10))
        let second = collector.frames[1]
        #expect(shows(second, 620, 415, 0x00FF00), "\(describe(second, 620, 415))")
        #expect(evenAligned(second.damage, width: 1024, height: 768), "damage \(second.damage) splits chroma blocks")
        let covers = second.damage.contains { $0.x <= 600 && $0.y <= 400 && $0.x + $0.width >= 640 && $0.y + $0.height >= 430 }
            || second.damage.count > 1 // may be split along tile rows; checked by pixels below
        #expect(covers, "damage \(second.damage) does not cover the 40x30 change")
        let diff = FrameDiff(first, second)
        #expect(diff.uncovered(by: second.damage) == nil, "a changed pixel lies outside the damage")
        let area = second.damage.reduce(0) { $0 + Int($1.width * $1.height) }
        #expect(area > 0 && area < 1024 * 768 / 50, "damage area \(area) px for a 40x30 change")
        try source.stop()
    }

    /// Damage larger than the 256 KB scratch segment is read in bands of rows
    /// (full-width damage too): both land exactly, edges included, with no
    /// seam between bands.
    @Test func largeDamageIsReadInBandsAndFullWidthInPlace() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        // 700x500 BGRx is 1.4 MB: six bands through the scratch.
        try x.fill(x: 100, y: 100, width: 700, height: 500, rgb: "c01020")
        #expect(collector.waitUntil(timeout: 10) { frames in frames.last.map { self.shows($0, 799, 599, 0xC01020) } ?? false },
                "the large rectangle's far corner never arrived")
        let banded = try #require(collector.frames.last)
        for (px, py) in [(100, 100), (799, 100), (100, 599), (450, 350), (799, 599)] {
            #expect(shows(banded, px, py, 0xC01020), "(\(px), \(py)): \(describe(banded, px, py))")
        }
        for (px, py) in [(99, 100), (800, 599), (100, 99), (799, 600)] {
            #expect(shows(banded, px, py, 0x336699), "outside at (\(px), \(py)): \(describe(banded, px, py))")
        }
        // Every row of the rectangle is the colour, across the boundaries of the bands (the 704-px-wide
        // read of the coalesced tiles goes in bands of 92 rows).
        let inside = Self.expected(0xC01020)
        let wrongRow = (100..<600).first { row in yuv(banded, 450, row).y != inside.y || abs(yuv(banded, 450, row).u - inside.u) > 1 }
        #expect(wrongRow == nil, "row \(wrongRow ?? -1) at x 450: \(describe(banded, 450, wrongRow ?? 0))")
        let before = collector.frameCount
        try x.fill(x: 0, y: 300, width: 1024, height: 200, rgb: "10c020")
        #expect(collector.waitUntil(timeout: 10) { frames in frames.count > before && self.shows(frames.last!, 1023, 499, 0x10C020) },
                "the full-width band never arrived")
        let band = try #require(collector.frames.last)
        for (px, py) in [(0, 300), (1023, 300), (0, 499), (1023, 499), (512, 400)] {
            #expect(shows(band, px, py, 0x10C020), "(\(px), \(py)): \(describe(band, px, py))")
        }
        #expect(shows(band, 512, 299, 0xC01020) && shows(band, 512, 500, 0xC01020) && shows(band, 0, 299, 0x336699),
                "rows next to the band changed")
        try source.stop()
    }

    @Test func cursorIsDrawnAndItsMovesAreDamage() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x, ["cursor": .bool(true)]))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        // Xvfb's default cursor (an X) sits in the middle of the screen: some pixel near it is not the background.
        let first = collector.frames[0]
        var drawn = false
        for y in 370..<400 { for x in 500..<530 where !shows(first, x, y, 0x336699) { drawn = true } }
        #expect(drawn, "no cursor pixels near the screen centre")

        // Moving the pointer delivers a frame whose damage covers the old and
        // the new cursor place, and nothing else changed.
        try x.movePointer(x: 100, y: 600)
        #expect(collector.waitForFrames(2, timeout: 10), "no frame after the pointer moved")
        let moved = collector.frames[1]
        let diff = FrameDiff(first, moved)
        #expect(diff.changedCount > 0 && diff.uncovered(by: moved.damage) == nil, "changed pixels outside the damage \(moved.damage)")
        #expect(moved.damage.contains { $0.x <= 100 && $0.x + $0.width > 100 && $0.y <= 600 && $0.y + $0.height > 600 }, "new place not in \(moved.damage)")
        #expect(moved.damage.contains { $0.x < 530 && $0.x + $0.width > 500 && $0.y < 400 && $0.y + $0.height > 370 }, "old place not in \(moved.damage)")
        #expect(evenAligned(moved.damage, width: 1024, height: 768), "cursor damage \(moved.damage) splits chroma blocks")
        // The old place is the background again (the cursor's pixels were restored, Y, U and V).
        var left = false
        for y in 370..<400 { for x in 500..<530 where !shows(moved, x, y, 0x336699) { left = true } }
        #expect(!left, "cursor pixels left at the old place")
        var near = false
        for y in 590..<620 { for x in 90..<120 where !shows(moved, x, y, 0x336699) { near = true } }
        #expect(near, "no cursor pixels at its new place")
        try source.stop()
    }

    /// The fallbacks (no MIT-SHM: XGetImage; no XDamage: whole frames at the
    /// frame rate) pass conformance and deliver the same pixels.
    @Test(arguments: [["shm=false"], ["damage=false"], ["shm=false", "damage=false"]])
    func fallbacksConformAndReadTheSamePixels(options: [String]) throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        try x.fill(x: 100, y: 100, width: 200, height: 150, rgb: "ff8000")
        let result = try Harness.agent(["conformance", Harness.library("BackendX11"), "--option", "display=\(x.display)"] + options.flatMap { ["--option", $0] }, timeout: 120)
        #expect(result.status == 0 && !result.stdout.contains("FAIL"), "\(result.stdout)\(result.stderr)")
        var extra: [String: JSON] = [:]
        for option in options { let kv = option.split(separator: "="); extra[String(kv[0])] = .bool(kv[1] == "true") }
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: self.options(x, extra))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        #expect(shows(collector.frames[0], 150, 150, 0xFF8000) && shows(collector.frames[0], 10, 10, 0x336699),
                "\(describe(collector.frames[0], 150, 150)) \(describe(collector.frames[0], 10, 10))")
        if options.contains("damage=false") {
            // Whole frames at the frame rate, changed or not.
            #expect(collector.waitForFrames(5, timeout: 10), "the no-XDamage fallback delivers every interval")
        }
        try source.stop()
    }

    /// An odd-sized area (a region): its last column and row have chroma samples of their own
    /// (I420's (w+1)/2 × (h+1)/2, converted from those pixels alone), and damage at that edge
    /// ends at the frame's edge.
    @Test func oddSizedRegionKeepsItsLastColumnAndRow() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        try x.fill(x: 100, y: 100, width: 200, height: 150, rgb: "ff8000")
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x, ["region": .string("201x101+99+99")]))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        let first = try #require(collector.frames.first)
        #expect(first.width == 201 && first.height == 101)
        // Region (200, 100) is screen (299, 199), inside the rectangle; region column 0 is screen column 99, outside.
        #expect(shows(first, 200, 100, 0xFF8000), "corner: \(describe(first, 200, 100))")
        #expect(yuv(first, 0, 50).y == Self.expected(0x336699).y && yuv(first, 1, 50).y == Self.expected(0xFF8000).y, "\(describe(first, 0, 50))")

        try x.fill(x: 290, y: 190, width: 20, height: 20, rgb: "00ff00")
        #expect(collector.waitForFrames(2, timeout: 10))
        let second = collector.frames[1]
        #expect(shows(second, 200, 100, 0x00FF00), "corner: \(describe(second, 200, 100))")
        #expect(evenAligned(second.damage, width: 201, height: 101), "damage \(second.damage)")
        #expect(second.damage.allSatisfy { $0.x + $0.width <= 201 && $0.y + $0.height <= 101 }, "damage \(second.damage) outside the frame")
        #expect(FrameDiff(first, second).uncovered(by: second.damage) == nil, "a changed pixel lies outside the damage \(second.damage)")
        try source.stop()
    }

    /// Isolated (krakl-backend-host: frames go through a ring of shared buffers, each refreshed only
    /// where it is out of date, plane by plane), the I420 pictures are byte for byte those of the
    /// backend loaded into the process, after a run of partial changes at odd places.
    @Test func isolatedFramesAreTheSameAsInProcess() throws {
        try Harness.requireBuild()
        try #require(FileManager.default.isExecutableFile(atPath: Harness.buildDir + "/krakl-backend-host"), "missing krakl-backend-host")
        guard let x = try XvfbServer() else { return }
        let (direct, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x))
        defer { try? source.destroy() }
        var object = JSONObject()
        for (key, value) in options(x).sorted(by: { $0.key < $1.key }) { object[key] = value }
        let ringed = FrameCollector()
        let isolated = try IsolatedBackendSource(libraryPath: Harness.library("BackendX11"), backendName: "x11", options: object, sink: ringed,
                                                 logger: { _, _, _ in }, settings: IsolationSettings())
        defer { try? isolated.destroy() }
        try isolated.start()
        #expect(direct.waitForFrames(1, timeout: 10) && ringed.waitForFrames(1, timeout: 10))
        let colours: [UInt32] = [0xFF8000, 0x00FF00, 0xC01020, 0x1020C0, 0xFFFFFF]
        for (i, colour) in colours.enumerated() {
            try x.fill(x: 37 + 150 * i, y: 51 + 90 * i, width: 101, height: 77, rgb: String(format: "%06x", colour))
        }
        let (lastX, lastY) = (37 + 150 * 4 + 50, 51 + 90 * 4 + 38)
        for collector in [direct, ringed] {
            #expect(collector.waitUntil(timeout: 10) { $0.last.map { self.shows($0, lastX, lastY, 0xFFFFFF) } ?? false }, "the last change never arrived")
        }
        let a = try #require(direct.frames.last), b = try #require(ringed.frames.last)
        #expect(ringed.frames.dropFirst().contains { !$0.damage.isEmpty }, "no partial frame came through the ring")
        #expect(a.format == b.format && a.width == b.width && a.height == b.height)
        for plane in 0..<3 { #expect(a.planes[plane] == b.planes[plane], "plane \(plane) differs") }
        try isolated.stop()
        try source.stop()
    }

    @Test func monitorsAndRegions() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let xrandr = try #require(Harness.which("xrandr"))
        let set = try Harness.run(xrandr, ["--display", x.display, "--setmonitor", "left", "512/100x768/100+0+0", "none"])
        try #require(set.status == 0, "xrandr: \(set.stderr)")
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x, ["monitor": .string("left")]))
        #expect(collector.waitForFrames(1, timeout: 10))
        #expect(collector.frames.first?.width == 512 && collector.frames.first?.height == 768)
        try source.destroy()
        let (regionFrames, regionSource) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x, ["region": .string("200x100+50+60")]))
        #expect(regionFrames.waitForFrames(1, timeout: 10))
        #expect(regionFrames.frames.first?.width == 200 && regionFrames.frames.first?.height == 100)
        try regionSource.destroy()

        // `krakl-agent sources` lists the screen and the monitor, with the option value that selects each.
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let listed = try Harness.agent(["sources", "--plugins", registry, "--backend", "x11", "--option", "display=\(x.display)"])
        #expect(listed.status == 0, "\(listed.stderr)")
        #expect(listed.stdout.contains("screen") && listed.stdout.contains("1024x768"), "\(listed.stdout)")
        #expect(listed.stdout.contains("left") && listed.stdout.contains("512x768+0+0") && listed.stdout.contains("monitor=left"), "\(listed.stdout)")
        let failed = try Harness.agent(["sources", "--plugins", registry, "--backend", "x11", "--option", "display=:189"])
        #expect(failed.status == 15 && failed.stderr.contains("could not list its sources"), "\(failed.stderr)")
    }

    /// The screen changes size (a new XRandR mode on Xvfb): FORMAT_CHANGED,
    /// then whole frames at the new size.
    @Test func resizeSendsFormatChangedAndContinues() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let xrandr = try #require(Harness.which("xrandr"))
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        #expect(collector.frames.first?.width == 1024)
        for step in [["--newmode", "800x600", "40", "800", "840", "968", "1056", "600", "601", "605", "628"],
                     ["--addmode", "screen", "800x600"], ["--output", "screen", "--mode", "800x600"]] {
            let result = try Harness.run(xrandr, ["--display", x.display] + step)
            try #require(result.status == 0, "xrandr \(step): \(result.stderr)")
        }
        #expect(collector.waitUntil(timeout: 10) { $0.last?.width == 800 }, "no 800-wide frame after the mode change")
        let resized = try #require(collector.frames.first { $0.width == 800 })
        #expect(resized.height == 600 && resized.damage.isEmpty, "the first frame at the new size is whole")
        #expect(collector.events.contains { $0.kind == .formatChanged && $0.width == 800 && $0.height == 600 }, "\(collector.events)")
        try source.stop()
    }

    @Test func badOptionsAreClearErrors() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        // Exit 17: what to capture is not there; 16: an option was rejected.
        let cases: [([String], String, Int32)] = [
            (["display=:189"], "cannot open X display :189", 17),
            (["display=\(x.display)", "monitor=nowhere"], "no monitor \"nowhere\"", 17),
            (["display=\(x.display)", "region=400x400+800+600"], "lies outside the 1024x768 screen", 16),
            (["display=\(x.display)", "region=wide"], "use WIDTHxHEIGHT+X+Y", 16),
        ]
        for (options, message, status) in cases {
            let result = try Harness.agent(["--plugins", registry, "--backend", "x11", "--no-record", "--frames", "1"] + options.flatMap { ["--option", $0] })
            #expect(result.status == status && result.stderr.contains(message), "\(options): exit \(result.status): \(result.stderr)")
        }
    }

    /// The X server goes away: the source ends with a clear message and the
    /// agent itself stays alive to say so and exit normally.
    @Test func lostDisplayEndsTheSourceNotTheAgent() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        let agent = try RunningAgent(["--plugins", registry, "--backend", "x11", "--option", "display=\(x.display)", "--no-record"])
        #expect(agent.read(until: " fps |"), "no status line: \(agent.output)")
        x.kill()
        #expect(agent.read(until: "summary:", timeout: 20), "\(agent.output)")
        #expect(Harness.waitForExit(agent.process, seconds: 10))
        #expect(agent.process.terminationReason == .exit && agent.process.terminationStatus == 0, "status \(agent.process.terminationStatus)")
        #expect(agent.output.contains("the source ended: the X display \(x.display) went away"), "\(agent.output)")
    }
}
