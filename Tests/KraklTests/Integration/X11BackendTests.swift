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

    /// The BGRx pixel at (x, y) of a frame, as 0xRRGGBB.
    func pixel(_ frame: CapturedFrame, _ x: Int, _ y: Int) -> UInt32 {
        let p = (y * frame.width + x) * 4
        return UInt32(frame.planes[0][p + 2]) << 16 | UInt32(frame.planes[0][p + 1]) << 8 | UInt32(frame.planes[0][p])
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
        #expect(pixel(first, 150, 150) == 0xFF8000, "inside: \(String(pixel(first, 150, 150), radix: 16))")
        #expect(pixel(first, 10, 10) == 0x336699, "background: \(String(pixel(first, 10, 10), radix: 16))")

        // Nothing drawn for 5 s: no further frame (an observation window).
        _ = collector.waitForFrames(2, timeout: 5)
        #expect(collector.frameCount == 1, "\(collector.frameCount) frames from a static screen")

        try x.fill(x: 600, y: 400, width: 40, height: 30, rgb: "00ff00")
        #expect(collector.waitForFrames(2, timeout: 10))
        let second = collector.frames[1]
        #expect(pixel(second, 620, 415) == 0x00FF00)
        let covers = second.damage.contains { $0.x <= 600 && $0.y <= 400 && $0.x + $0.width >= 640 && $0.y + $0.height >= 430 }
            || second.damage.count > 1 // may be split along tile rows; checked by pixels below
        #expect(covers, "damage \(second.damage) does not cover the 40x30 change")
        let diff = FrameDiff(first, second)
        #expect(diff.uncovered(by: second.damage) == nil, "a changed pixel lies outside the damage")
        let area = second.damage.reduce(0) { $0 + Int($1.width * $1.height) }
        #expect(area > 0 && area < 1024 * 768 / 50, "damage area \(area) px for a 40x30 change")
        try source.stop()
    }

    /// Damage larger than the 256 KB scratch segment is read in bands of rows,
    /// full-width damage in place: both land exactly, edges included.
    @Test func largeDamageIsReadInBandsAndFullWidthInPlace() throws {
        try Harness.requireBuild()
        guard let x = try XvfbServer() else { return }
        let (collector, source) = try FrameCollector.start(library: Harness.library("BackendX11"), options: options(x))
        defer { try? source.destroy() }
        #expect(collector.waitForFrames(1, timeout: 10))
        // 700x500 BGRx is 1.4 MB: six bands through the scratch.
        try x.fill(x: 100, y: 100, width: 700, height: 500, rgb: "c01020")
        #expect(collector.waitUntil(timeout: 10) { frames in frames.last.map { self.pixel($0, 799, 599) == 0xC01020 } ?? false },
                "the large rectangle's far corner never arrived")
        let banded = try #require(collector.frames.last)
        for (px, py) in [(100, 100), (799, 100), (100, 599), (450, 350), (799, 599)] {
            #expect(pixel(banded, px, py) == 0xC01020, "(\(px), \(py)): \(String(pixel(banded, px, py), radix: 16))")
        }
        for (px, py) in [(99, 100), (800, 599), (100, 99), (799, 600)] {
            #expect(pixel(banded, px, py) == 0x336699, "outside at (\(px), \(py)): \(String(pixel(banded, px, py), radix: 16))")
        }
        let before = collector.frameCount
        try x.fill(x: 0, y: 300, width: 1024, height: 200, rgb: "10c020")
        #expect(collector.waitUntil(timeout: 10) { frames in frames.count > before && self.pixel(frames.last!, 1023, 499) == 0x10C020 },
                "the full-width band never arrived")
        let band = try #require(collector.frames.last)
        for (px, py) in [(0, 300), (1023, 300), (0, 499), (1023, 499), (512, 400)] {
            #expect(pixel(band, px, py) == 0x10C020, "(\(px), \(py)): \(String(pixel(band, px, py), radix: 16))")
        }
        #expect(pixel(band, 512, 299) == 0xC01020 && pixel(band, 512, 500) == 0xC01020 && pixel(band, 0, 299) == 0x336699,
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
        for y in 370..<400 { for x in 500..<530 where pixel(first, x, y) != 0x336699 { drawn = true } }
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
        var near = false
        for y in 590..<620 { for x in 90..<120 where pixel(moved, x, y) != 0x336699 { near = true } }
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
        #expect(pixel(collector.frames[0], 150, 150) == 0xFF8000 && pixel(collector.frames[0], 10, 10) == 0x336699)
        if options.contains("damage=false") {
            // Whole frames at the frame rate, changed or not.
            #expect(collector.waitForFrames(5, timeout: 10), "the no-XDamage fallback delivers every interval")
        }
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
