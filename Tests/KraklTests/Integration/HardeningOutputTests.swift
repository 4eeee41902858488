import Foundation
import KraklBackendABI
import Testing
@testable import KraklBase
@testable import KraklHost
@testable import KraklEncoder

/// Issue 13, the recording run's side: backend timestamps that would have trapped, outputs that
/// fail (or cannot seek) at any point, signals and a closed stdout, memory that grew with the
/// run, keyframe floods, the frame-rate cap, odd Y4M files and runs without a usable frame.
/// Each test drives the real agent on the misbehaving fixture backend (or the file backend) and
/// judges recordings with ffprobe.
@Suite("Hardening: recording outputs, timestamps, signals", .tags(.integration))
struct HardeningOutputTests {
    /// The misbehaving fixture, compiled once, and a plugins.json naming it "bad".
    static let fixture = BuiltOnce {
        let dir = try Harness.temporaryDirectory()
        _ = try Harness.compileBackend(Harness.repoRoot + "/Tests/Fixtures/misbehaving_backend.c", into: dir, name: "misbehaving")
        try "{\"version\": 1, \"default\": \"bad\", \"backends\": {\"bad\": {\"library\": \"libmisbehaving.so\"}}}"
            .write(toFile: dir + "/plugins.json", atomically: true, encoding: .utf8)
        return dir + "/plugins.json"
    }

    /// Runs the agent on the fixture with `misbehave` (and more options), plus `flags`.
    func agent(_ misbehave: String, options: [String] = [], _ flags: [String], timeout: Double = 60) throws -> Harness.Result {
        try Harness.requireBuild()
        let registry = try Self.fixture.get()
        return try Harness.agent(["--record", "krakl-recording.webm", "--plugins", registry, "-q", "-o", "misbehave=\(misbehave)"] + options.flatMap { ["-o", $0] } + flags,
                                 timeout: timeout)
    }

    var haveFfprobe: Bool {
        guard Harness.which("ffprobe") != nil else {
            skipTest("ffprobe is not installed (scripts/setup installs it)")
            return false
        }
        return true
    }

    /// Whether a WebM file was completed: its Segment has a size (a run killed midway leaves it "unknown").
    func segmentSizeIsKnown(_ path: String) throws -> Bool {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)).prefix(64))
        guard let at = (0..<(bytes.count - 12)).first(where: { Array(bytes[$0..<$0 + 4]) == [0x18, 0x53, 0x80, 0x67] }) else { return false }
        return Array(bytes[at + 4..<at + 12]) != [0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
    }

    // MARK: item 1: timestamps

    /// The regression: one timestamp 5 s before the first frame trapped the agent (SIGILL in
    /// WebMWriter) at the next frame. Now it is corrected with one warning, and the recording
    /// plays with increasing times over the run's real length. Timestamps 30 s ahead of the
    /// host's clock and timestamps that never advance are corrected the same way.
    // The host corrects them before the encoder sees them (FrameContract), so its warning is the one shown.
    @Test(arguments: [("ts-back", "is not after the previous frame's"), ("ts-ahead", "ahead of CLOCK_MONOTONIC now"),
                      ("ts-constant", "is not after the previous frame's")])
    func unusableTimestampsAreCorrectedNotTrapped(misbehave: String, warning: String) throws {
        guard haveFfprobe else { return }
        let dir = try Harness.temporaryDirectory()
        let result = try agent(misbehave, options: ["after_ms=300"], ["--seconds", "2", "--record", dir + "/out.webm"])
        #expect(result.status == 0 && !result.timedOut, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.components(separatedBy: warning).count == 2, "one warning: \(result.stderr)")
        #expect(result.stderr.contains("the host uses its own receive times"), "\(result.stderr)")
        let packets = try EncoderRecordingTests.packets(dir + "/out.webm")
        #expect(packets.count >= 30, "\(packets.count) packets")
        let times = packets.map(\.ptsMs)
        #expect(zip(times, times.dropFirst()).allSatisfy { $0 <= $1 }, "times go back: \(times)")
        // Over the run's length (2 s at 30 fps), not squeezed to 0 or stretched by the bad clock.
        let span = (times.last ?? 0) - (times.first ?? 0)
        // A discriminator, not a speed claim: every receive time lies inside the 2 s run on any machine,
        // while ts-back's 5 s jump would stretch the span to ~7 s and ts-ahead's 30 s to ~32 s.
        #expect(span > 1000 && span < 5000, "recording spans \(span) ms for a 2 s run")
        #expect(try segmentSizeIsKnown(dir + "/out.webm"))
    }

    /// IVF used the same subtraction.
    @Test func ivfTakesATimestampBeforeTheFirstFrame() throws {
        guard haveFfprobe else { return }
        let dir = try Harness.temporaryDirectory()
        let result = try agent("ts-back", options: ["after_ms=300"], ["--seconds", "1.5", "--record", dir + "/out.ivf"])
        #expect(result.status == 0, "exit \(result.status): \(result.stderr)")
        let probe = try EncoderRecordingTests.probe(dir + "/out.ivf")
        #expect(probe.contains("codec_name=vp8") && probe.contains("nb_read_frames="), "\(probe)")
    }

    /// The clock itself: behaving timestamps pass unchanged; any other value (back, ahead, the
    /// same, 0, the largest) comes out increasing and near the host's clock, never trapping.
    @Test func presentationClockKeepsTimesIncreasing() {
        var clock = PresentationClock()
        let ms: UInt64 = 1_000_000
        var host: UInt64 = 10_000 * ms
        var times: [UInt64] = []
        let behaving = clock.stamp(capture: host - 2 * ms, hostNs: host)
        #expect(behaving.time == host - 2 * ms && behaving.problem == nil)
        times.append(behaving.time)
        for capture: UInt64 in [host + 31 * ms, 3 * ms, 0, .max, .max, host + 200_000 * ms, host + 200_033 * ms, 1, 1] {
            host += 33 * ms
            let (time, _) = clock.stamp(capture: capture, hostNs: host)
            times.append(time)
        }
        host += 100 * ms
        times.append(clock.stamp(hostNs: host))
        #expect(zip(times, times.dropFirst()).allSatisfy { $0 < $1 }, "\(times)")
        // Ten steps of 33 ms and a refresh 100 ms later: within a second of that, whatever the backend said.
        let span = times.last! - times.first!
        #expect(span < 430 * ms + PresentationClock.tolerance, "span \(span / ms) ms")
        // After a jump, the backend's clock is followed again from its new offset: steps keep its precision.
        var steady = PresentationClock()
        _ = steady.stamp(capture: 5 * ms, hostNs: 1_000 * ms)          // 995 ms behind: corrected
        let a = steady.stamp(capture: 38 * ms, hostNs: 1_034 * ms)
        let b = steady.stamp(capture: 71 * ms, hostNs: 1_066 * ms)
        #expect(a.problem == nil && b.problem == nil && b.time - a.time == 33 * ms)
    }

    /// Writers fed directly (as a future sink may be) with times going back do not trap either.
    @Test func writersTakeTimesGoingBack() throws {
        let dir = try Harness.temporaryDirectory()
        let frames = [UInt64(5_000_000_000), 1, 6_000_000_000, 0].enumerated().map { index, time in
            EncodedFrame(data: [UInt8](repeating: UInt8(index), count: 100), keyframe: index == 0, timestampNs: time,
                         width: 64, height: 64, codec: .vp8)
        }
        let webm = try WebMWriter(path: dir + "/a.webm", codec: .vp8, width: 64, height: 64)
        let ivf = try IVFWriter(path: dir + "/a.ivf", codec: .vp8, width: 64, height: 64)
        for frame in frames {
            try webm.write(frame)
            try ivf.write(frame)
        }
        try webm.finish()
        try ivf.finish()
        #expect(try segmentSizeIsKnown(dir + "/a.webm"))
    }

    // MARK: item 4: outputs that cannot seek, or fail

    /// The regression: recording into a FIFO trapped at the end (ftell is -1 on a pipe). Now a
    /// live WebM (unknown sizes, no Cues) and an IVF (frame count 0) stream through it, and
    /// ffprobe reading the FIFO decodes every frame.
    @Test(arguments: ["webm", "ivf"])
    func recordingIntoAFifoPlays(suffix: String) throws {
        guard haveFfprobe else { return }
        let dir = try Harness.temporaryDirectory()
        let fifo = dir + "/live.\(suffix)"
        try #require(mkfifo(fifo, 0o600) == 0)
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: Harness.which("ffprobe")!)
        reader.arguments = ["-v", "error", "-count_frames", "-show_entries", "stream=codec_name,nb_read_frames", "-of", "default=nw=1", fifo]
        let out = Pipe()
        reader.standardOutput = out
        reader.standardError = FileHandle.nullDevice
        try reader.run()
        defer { if reader.isRunning { reader.terminate() } }
        let result = try agent("none", ["--frames", "30", "--record", fifo, "--stats-json", dir + "/stats.json"], timeout: 30)
        #expect(result.status == 0 && !result.timedOut, "exit \(result.status): \(result.stderr)")
        var text = ""
        readOutput(out.fileHandleForReading.fileDescriptor, into: &text, timeout: 15) { _ in false }
        #expect(Harness.waitForExit(reader, seconds: 10))
        let stats = (try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/stats.json")))) as? [String: Any] ?? [:]
        let encoded = stats["encoded_frames"] as? Int ?? -1
        let captured = stats["captured_frames"] as? Int ?? -1
        // Every frame the encoder wrote plays. Not "30 encoded": on a loaded machine the encoder merges
        // captured frames into later ones (30 captured, 19-22 encoded with two CPU hogs beside it).
        #expect(captured >= 30, "captured \(captured)")
        #expect(encoded >= 1 && text.contains("codec_name=vp8") && text.contains("nb_read_frames=\(encoded)"), "ffprobe: \(text), encoded \(encoded)")
    }

    /// A FIFO that nobody reads would block the encoder's open for ever (and the run's end with
    /// it): the agent waits 10 s for a reader, then fails clearly.
    @Test func aFifoWithoutAReaderFailsClearly() throws {
        let dir = try Harness.temporaryDirectory()
        let fifo = dir + "/nobody.webm"
        try #require(mkfifo(fifo, 0o600) == 0)
        let result = try agent("none", ["--frames", "5", "--record", fifo], timeout: 40)
        #expect(result.status == 23 && !result.timedOut && result.stderr.contains("no process opened the FIFO for reading"),
                "exit \(result.status): \(result.stderr)")
    }

    /// A disk that fills at the recording's first keyframe leaves no file with no frame in it (the
    /// 200 KB left was unreadable while the agent said "what was written before that is complete");
    /// one that fills later says how many frames the recording holds, and ffprobe reads them.
    /// The disk is a tmpfs of the given size in a mount namespace of the run's own (unshare -m).
    @Test(arguments: [(size: "64k", framesExpected: false), (size: "3m", framesExpected: true)])
    func aFullDiskSaysWhatTheRecordingHolds(size: String, framesExpected: Bool) throws {
        try Harness.requireBuild()
        guard let unshare = Harness.which("unshare"), getuid() == 0 else { skipTest("needs root and unshare (util-linux) for a tmpfs"); return }
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: try Harness.temporaryDirectory())
        // The test pattern at 1280x720 changing whole every frame: ~30–80 KB a frame at 2.5 Mbit/s.
        let script = """
            mount -t tmpfs -o size=\(size) tmpfs '\(dir)' || exit 90
            '\(Harness.agent)' --plugins '\(registry)' --backend file -q -o scene=scrolling --seconds 20 --record '\(dir)/r.webm'
            status=$?
            echo "status=$status"
            if [ -e '\(dir)/r.webm' ]; then ffprobe -v error -count_frames -show_entries stream=nb_read_frames -of csv=p=0 '\(dir)/r.webm'; else echo absent; fi
            """
        let result = try Harness.run(unshare, ["-m", "--propagation", "private", "/bin/sh", "-c", script], timeout: 60)
        let said = result.stdout + result.stderr
        #expect(said.contains("status=23"), "\(said)")
        if framesExpected {
            let match = said.range(of: #"r\.webm holds the (\d+) frames? written before that"#, options: .regularExpression)
            let told = match.flatMap { Int(said[$0].split(separator: " ")[3]) } ?? -1
            // ffprobe's count is the line after the status (its warnings go to stderr).
            let lines = result.stdout.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            let read = lines.firstIndex { $0.hasPrefix("status=") }.flatMap { lines.indices.contains($0 + 1) ? Int(lines[$0 + 1]) : nil } ?? -1
            print("disk of \(size): the agent says \(told) frames, ffprobe reads \(read)")
            #expect(told > 0 && read > 0 && read <= told, "\(said)")
        } else {
            #expect(said.contains("r.webm held no frame and was removed") && said.contains("absent"), "\(said)")
        }
    }

    /// Errors that showed only at flush or close were lost (exit 0, no data). Now each output
    /// fails the run with its path and reason, exit 23; a recording that fails mid-run stops
    /// the capture at once (well before --seconds 60), and a path that cannot be opened fails
    /// before capture starts.
    @Test func everyOutputIsCheckedAtWriteFlushAndClose() throws {
        guard FileManager.default.fileExists(atPath: "/dev/full") else {
            skipTest("no /dev/full here")
            return
        }
        let dir = try Harness.temporaryDirectory()
        try FileManager.default.createSymbolicLink(atPath: dir + "/full.webm", withDestinationPath: "/dev/full")
        let full = try agent("none", ["--seconds", "60", "--record", dir + "/full.webm"], timeout: 30)
        #expect(full.status == 23 && !full.timedOut && full.stderr.contains("cannot write \(dir)/full.webm: No space left on device")
                && full.stdout.contains("stopped: writing \(dir)/full.webm failed"), "exit \(full.status): \(full.stdout) \(full.stderr)")

        // Through a symlink of the test's own: an agent that renames over the path (as the old one
        // did) replaces the symlink, not the device.
        try FileManager.default.createSymbolicLink(atPath: dir + "/full.json", withDestinationPath: "/dev/full")
        let stats = try agent("none", ["--frames", "5", "--record", dir + "/a.webm", "--stats-json", dir + "/full.json"])
        #expect(stats.status == 23 && stats.stderr.contains("cannot write \(dir)/full.json: No space left on device"), "exit \(stats.status): \(stats.stderr)")
        #expect(FileManager.default.fileExists(atPath: dir + "/a.webm"), "the recording itself is complete")

        let dump = try agent("none", ["--seconds", "60", "--record", dir + "/b.webm", "--dump-input", "/dev/full"], timeout: 30)
        #expect(dump.status == 23 && !dump.timedOut && dump.stderr.contains("cannot write /dev/full"), "exit \(dump.status): \(dump.stderr)")

        try FileManager.default.createDirectory(atPath: dir + "/folder.webm", withIntermediateDirectories: false)
        for flags in [["--frame-log", "/nonexistent/x.csv"], ["--stats-json", "/nonexistent/s.json"], ["--record", "/nonexistent/r.webm"],
                      ["--record", dir + "/folder.webm"]] {
            let early = try agent("none", ["--frames", "5"] + flags)
            #expect(early.status == 23 && early.stderr.contains("cannot write") && !early.stdout.contains("capturing from"),
                    "\(flags): exit \(early.status): \(early.stdout) \(early.stderr)")
        }
    }

    /// --stats-json and --frame-log were written with FileManager.createFile, which writes a new
    /// file and renames it over the path: a symlink was replaced by a plain file, and (as root)
    /// `--stats-json /dev/full` replaced the device itself. They are written in place now.
    @Test func outputsAreWrittenInPlaceThroughSymlinks() throws {
        let dir = try Harness.temporaryDirectory()
        for name in ["stats.json", "frames.csv"] {
            try Data().write(to: URL(fileURLWithPath: dir + "/real-" + name))
            try FileManager.default.createSymbolicLink(atPath: dir + "/" + name, withDestinationPath: dir + "/real-" + name)
        }
        let result = try agent("none", ["--frames", "10", "--record", dir + "/out.webm", "--stats-json", dir + "/stats.json",
                                        "--frame-log", dir + "/frames.csv"])
        #expect(result.status == 0, "\(result.stderr)")
        for name in ["stats.json", "frames.csv"] {
            let kind = (try FileManager.default.attributesOfItem(atPath: dir + "/" + name))[.type] as? FileAttributeType
            #expect(kind == .typeSymbolicLink, "\(name) is no longer a symlink")
            #expect(((try? Data(contentsOf: URL(fileURLWithPath: dir + "/real-" + name)))?.count ?? 0) > 0, "nothing written through \(name)")
        }
    }

    /// --frame-log rows reach the file while the run goes on (they were all kept in memory and
    /// written at the end).
    @Test func frameLogIsWrittenAsFramesAreEncoded() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let log = dir + "/frames.csv"
        let agent = try RunningAgent(["--plugins", try Self.fixture.get(), "--record", dir + "/out.webm", "--frame-log", log])
        #expect(agent.read(until: "kbit/s p50", count: 2), "no status lines: \(agent.output)")
        let rows = (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n") ?? []
        #expect(rows.first == "time_ms,bytes,keyframe,refresh,active_share,encode_ms,quantizer" && rows.count > 20, "\(rows.count) rows while running")
        #expect(agent.stop() == 0)
    }

    // MARK: item 5: signals and a closed stdout

    /// SIGHUP and SIGPIPE killed the agent with the recording unfinished; SIGQUIT printed a crash
    /// report and went on. Each now ends the run like SIGTERM: exit 0, recording completed.
    @Test(arguments: [(SIGHUP, "hung up (SIGHUP"), (SIGPIPE, "a reader closed its pipe (SIGPIPE)"), (SIGQUIT, "quit (SIGQUIT)"), (SIGTERM, "terminated (SIGTERM)")])
    func signalsFinishTheRecording(number: Int32, reason: String) throws {
        guard haveFfprobe else { return }
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let agent = try RunningAgent(["--plugins", try Self.fixture.get(), "--record", dir + "/out.webm"])
        #expect(agent.read(until: "kbit/s p50"), "no status line: \(agent.output)")
        agent.signal(number)
        agent.read(until: "\u{0}", timeout: 20)   // to the end of its output (bounded)
        #expect(Harness.waitForExit(agent.process, seconds: 10))
        #expect(agent.process.terminationReason == .exit && agent.process.terminationStatus == 0,
                "ended by \(agent.process.terminationReason == .exit ? "exit" : "signal") \(agent.process.terminationStatus)")
        #expect(agent.output.contains("stopped: \(reason)") && agent.output.contains("summary:"), "\(agent.output)")
        #expect(try segmentSizeIsKnown(dir + "/out.webm"))
        // Every frame the encoder wrote is in the finished file (a count, not "at least 20": a loaded
        // machine merges captured frames, and one CI run encoded fewer than 20 before the signal).
        let packets = try EncoderRecordingTests.packets(dir + "/out.webm").count
        let encoded = agent.output.components(separatedBy: "encoded: ").dropFirst().first.flatMap { Int($0.prefix { $0.isNumber }) }
        #expect(packets >= 1 && packets == encoded, "\(packets) packets in the file, the agent said \(encoded.map(String.init) ?? "nothing")")
    }

    /// `krakl-agent | head`: the reader of stdout goes away. The agent used to die of SIGPIPE with
    /// no recording; now a closed stdout ends the run cleanly (exit 0) and the recording is complete.
    @Test func aClosedStdoutEndsTheRunCleanly() throws {
        guard haveFfprobe else { return }
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        var ends: [Int32] = [-1, -1]
        try #require(pipe(&ends) == 0)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Harness.agent)
        process.arguments = ["--plugins", try Self.fixture.get(), "--seconds", "60", "--record", dir + "/out.webm"]
        process.currentDirectoryURL = URL(fileURLWithPath: dir)
        process.standardOutput = FileHandle(fileDescriptor: ends[1], closeOnDealloc: true)
        process.standardError = FileHandle.nullDevice
        try process.run()
        close(ends[1])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        var text = ""
        #expect(readOutput(ends[0], into: &text, timeout: 20) { $0.components(separatedBy: "kbit/s p50").count >= 2 }, "\(text)")
        close(ends[0])   // what head does after its lines
        #expect(Harness.waitForExit(process, seconds: 15), "still running after its stdout closed")
        #expect(process.terminationReason == .exit && process.terminationStatus == 0,
                "ended by \(process.terminationReason == .exit ? "exit" : "signal") \(process.terminationStatus)")
        #expect(try segmentSizeIsKnown(dir + "/out.webm"))
        // Two status lines went out, so frames were encoded; how many depends on the machine's load.
        #expect(try EncoderRecordingTests.packets(dir + "/out.webm").count >= 1)
    }

    // MARK: item 6: statistics in fixed memory

    /// Percentiles from the histogram are the exact nearest-rank ones to within a bucket (1/64).
    @Test func histogramPercentilesMatchNearestRank() {
        var random = SystemRandomNumberGenerator()
        var histogram = LogHistogram()
        var values: [UInt64] = []
        for _ in 0..<20_000 {
            // Latencies from 1 µs to 2 s, spread over the octaves.
            let value = UInt64(pow(10, Double.random(in: 3...9.3, using: &random)))
            values.append(value)
            histogram.add(value)
        }
        values.sort()
        for p in [0.0, 0.5, 0.9, 0.99, 1.0] {
            let exact = Double(values.nearestRank(p)!)
            let estimate = Double(histogram.percentile(p)!)
            #expect(abs(estimate - exact) <= exact / 64 + 1, "p\(p): \(estimate) vs \(exact)")
        }
        #expect(histogram.maximum == values.last! && histogram.count == values.count)
        for value: UInt64 in [0, 1, 31, 32, 33, 1 << 40, .max] {
            var one = LogHistogram()
            one.add(value)
            #expect(one.percentile(0.5) == value, "\(value)")
        }
    }

    /// A backend flooding frames grew the agent by ~350 MB a minute (two arrays per frame).
    /// Now the numbers are fixed-size: over 6 s of flooding the agent's RSS stays flat.
    @Test func floodingFramesDoesNotGrowMemory() throws {
        try Harness.requireBuild()
        let agent = try RunningAgent(["--plugins", try Self.fixture.get(), "-o", "misbehave=flood", "-o", "width=32", "-o", "height=32",
                                      "-o", "after_ms=0", "--no-record"])
        #expect(agent.read(until: " fps |", count: 2), "no status lines: \(agent.output)")
        func rssKB() -> Int {
            let status = procText("/proc/\(agent.process.processIdentifier)/status")
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
        }
        let before = rssKB()
        #expect(agent.read(until: " fps |", count: 8), "no status lines: \(agent.output)")
        let after = rssKB()
        let frames = agent.output.split(separator: "\n").last { $0.contains(" fps |") }.flatMap { Int($0.split(separator: " ").first ?? "") } ?? 0
        #expect(agent.stop() == 0)
        print("flood: \(frames) frames; RSS \(before) kB -> \(after) kB")
        // 16 bytes a frame were kept before; a flood delivers far more than 250,000 frames in 6 s.
        #expect(before > 0 && after - before < 4_000, "RSS grew from \(before) kB to \(after) kB over \(frames) frames")
    }

    // MARK: item 9: keyframe floods, the frame-rate cap, Y4M, suffixes, no usable frame

    /// 8,000 keyframe requests made 154 of 183 frames keyframes. Requests are now served at most
    /// once per 0.3 s (merged in between), and never dropped: a request is answered.
    @Test func keyframeRequestsAreSpacedAndMerged() throws {
        let run = try EncoderPipelineTests.Running(scene: "typing", width: 320, height: 240)
        let (collector, pipeline, source) = (run.collector, run.pipeline, run.source)
        #expect(collector.waitFor(5) >= 5)
        let start = Date()
        var requests = 0
        // 2 s of requests, one every 2 ms (bounded in count and time).
        while Date().timeIntervalSince(start) < 2, requests < 2_000 {
            pipeline.requestKeyframe()
            requests += 1
            usleep(2_000)
        }
        let seconds = Date().timeIntervalSince(start)
        collector.condition.lock()
        let frames = collector.frames.count
        collector.condition.unlock()
        #expect(collector.waitFor(frames + 15) >= frames + 15)
        try source.stop()
        pipeline.finish()
        let keyframes = collector.frames.dropFirst().filter(\.keyframe).count
        let summary = pipeline.statistics.summary()
        print("keyframe flood: \(requests) requests in \(String(format: "%.1f", seconds)) s -> \(keyframes) keyframes in \(collector.frames.count) frames, \(summary.coalescedKeyframeRequests) merged")
        #expect(keyframes >= 3 && Double(keyframes) <= seconds / 0.3 + 2, "\(keyframes) keyframes for \(requests) requests in \(seconds) s")
        #expect(summary.coalescedKeyframeRequests > requests / 2)
    }

    /// The rule before (a capture ¾ of an interval after the last one encoded passes at once),
    /// kept here to measure the new one against.
    static func slackRuleAllows(now: UInt64, lastTake: UInt64, lastCapture: UInt64, capture: UInt64, interval: UInt64) -> Bool {
        now >= lastTake + interval || (capture > lastCapture && capture - lastCapture >= interval - interval / 4)
    }

    /// Simulated sources against both rules: frames arrive at `fps` with ±`jitterMs`, each take
    /// holds the encoder for 5 ms. Returns encoded frames a second over 20 s and the mean wait (ms)
    /// between a frame's arrival and its take.
    static func simulate(fps: Double, jitterMs: Double, newRule: Bool) -> (rate: Double, waitMs: Double) {
        let ms = 1_000_000.0
        let interval = UInt64(1e9 / 30)
        var cap = FrameRateCap(interval: interval)
        var generator = Fuzz.Rng(state: 7)  // the same numbers each run
        var lastTake: UInt64 = 0, lastCapture: UInt64 = 0, busyUntil: UInt64 = 0
        var taken = 0
        var waited = 0.0
        let frames = Int(20 * fps)
        for n in 0..<frames {
            let capture = UInt64(1e9 + Double(n) * 1e9 / fps + Double.random(in: -jitterMs...jitterMs, using: &generator) * ms)
            // Latest wins: a frame not taken before the next arrives is replaced (not counted).
            let nextArrival = UInt64(1e9 + Double(n + 1) * 1e9 / fps - jitterMs * ms)
            var now = max(capture, busyUntil)
            var allowed = false
            while now < nextArrival {
                allowed = newRule ? cap.allows(now: now)
                    : (taken == 0 || slackRuleAllows(now: now, lastTake: lastTake, lastCapture: lastCapture, capture: capture, interval: interval))
                if allowed { break }
                now += 100_000
            }
            guard allowed else { continue }
            if newRule { cap.take(now: now) }
            lastTake = now
            lastCapture = capture
            busyUntil = now + UInt64(5 * ms)
            waited += Double(now - capture) / ms
            taken += 1
        }
        return (Double(taken) / 20, taken > 0 ? waited / Double(taken) : 0)
    }

    /// `--max-fps 30` let a 40 fps source through at 40. The token bucket holds every source to
    /// 30 over time, and a source at the cap with capture jitter is still taken without waiting
    /// (the latency the old slack rule was there for).
    @Test func maxFpsHoldsTheLongRunRate() {
        for (fps, jitter) in [(30.0, 3.0), (40.0, 0.0), (40.0, 3.0), (60.0, 1.0)] {
            let old = Self.simulate(fps: fps, jitterMs: jitter, newRule: false)
            let new = Self.simulate(fps: fps, jitterMs: jitter, newRule: true)
            print(String(format: "source %.0f fps ±%.0f ms, cap 30: before %.1f fps (wait %.2f ms), now %.1f fps (wait %.2f ms)",
                         fps, jitter, old.rate, old.waitMs, new.rate, new.waitMs))
            #expect(new.rate <= 30.2, "\(fps) fps source encoded at \(new.rate) fps")
            if fps == 30 { #expect(new.waitMs < 1, "a 30 fps source waits \(new.waitMs) ms on average") }
        }
    }

    /// Capture → encoded at the cap, in process: the file backend's typing scene at 1080p and
    /// 30 fps into a pipeline capped at 30 (docs/encoder.md had 4.5 ms with the slack rule and
    /// 24 ms with a take-time rule). Printed, not judged: machines are noisy; every frame must
    /// still get through (none held back by the cap).
    @Test func captureToEncodedLatencyAtTheCap() throws {
        final class Timing: EncodedFrameSink, @unchecked Sendable {
            let lock = NSLock()
            var latenciesNs: [UInt64] = []
            func write(_ frame: EncodedFrame) throws(EncoderError) {
                let now = MonotonicClock.nanoseconds()
                lock.withLock { latenciesNs.append(now > frame.timestampNs ? now - frame.timestampNs : 0) }
            }
            func finish() throws(EncoderError) {}
            var count: Int { lock.withLock { latenciesNs.count } }
        }
        try Harness.requireBuild()
        let timing = Timing()
        let pipeline = try EncoderPipeline(settings: EncoderSettings(), output: { _, _, _ in timing }, onFailure: { Issue.record("\($0)") })
        let feeder = EncoderPipelineTests.Feeder(pipeline)
        let library = try BackendLibrary.load(path: Harness.library("BackendFile"), backend: "file")
        var options = JSONObject()
        options["scene"] = .string("typing"); options["width"] = .number("1920"); options["height"] = .number("1080")
        let source = try BackendSource(library: library, backendName: "file", options: options, sink: feeder, logger: { _, _, _ in })
        pipeline.start()
        try source.start()
        let deadline = Date().addingTimeInterval(30)
        while timing.count < 150 && Date() < deadline { usleep(20_000) }
        try source.stop()
        pipeline.finish()
        let sorted = timing.lock.withLock { timing.latenciesNs }.dropFirst(5).sorted()
        let summary = pipeline.statistics.summary()
        print(String(format: "capture -> encoded at 1080p typing, 30 fps source, cap 30: p50 %.1f ms, p99 %.1f ms over %d frames; encode p50 %.1f ms; %d of %d captured frames merged",
                     Double(sorted.nearestRank(0.5) ?? 0) / 1e6, Double(sorted.nearestRank(0.99) ?? 0) / 1e6, sorted.count,
                     summary.encodeMs.p50, summary.skippedFrames, summary.capturedFrames))
        #expect(sorted.count >= 100)
    }

    /// The agent end to end: a 40 fps source recorded with --max-fps 30 for 5 s.
    @Test func maxFpsHoldsARealRun() throws {
        let dir = try Harness.temporaryDirectory()
        let result = try agent("none", options: ["fps=40"], ["--seconds", "5", "--max-fps", "30", "--record", dir + "/out.webm",
                                                           "--stats-json", dir + "/stats.json"])
        #expect(result.status == 0, "\(result.stderr)")
        let stats = (try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/stats.json")))) as? [String: Any] ?? [:]
        let captured = stats["captured_frames"] as? Int ?? 0, encoded = stats["encoded_frames"] as? Int ?? 0
        // The cap: no more encoded than it lets through in 5 s (a rate cap: a slow machine cannot break
        // it). It is exercised only when the source outran it (200 frames nominal; a starved CI machine
        // captured 160–190); when it did not, the run says so rather than failing on the machine's speed.
        let cap = 5 * 30 + 3
        #expect(encoded > 0, "captured \(captured), encoded \(encoded)")
        #expect(encoded <= cap, "encoded \(encoded) of \(captured) captured in 5 s at --max-fps 30")
        if captured <= cap {
            print("NOTE: the source captured only \(captured) frames in 5 s (the cap lets \(cap) through): the cap was not exercised")
        }
    }

    /// A header cut short exited 0 with no frames; bogus frame rates became 30 fps. Each is now
    /// a create() error (exit 16) that names the problem.
    @Test func badY4MHeadersAreClearErrors() throws {
        try Harness.requireBuild()
        let dir = try Harness.temporaryDirectory()
        let registry = try Harness.registryForThisBuild(in: dir)
        let frame = "FRAME\n" + String(repeating: "\u{0}", count: 64 * 64 * 3 / 2)
        let cases: [(String, String, String)] = [
            ("truncated", "YUV4MPEG2 W64 H64 F30", "ends inside its Y4M header"),
            ("noframes", "YUV4MPEG2 W64 H64 F30:1\n", "holds no frame after its header"),
            ("zero", "YUV4MPEG2 W64 H64 F0:0\n" + frame, "frame rate F0:0 is not valid"),
            ("negative", "YUV4MPEG2 W64 H64 F-30:1\n" + frame, "frame rate F-30:1 is not valid"),
            ("huge", "YUV4MPEG2 W64 H64 F1000000:1\n" + frame, "frame rate F1000000:1 is not valid"),
            ("norate", "YUV4MPEG2 W64 H64\n" + frame, "has no frame rate"),
        ]
        for (name, text, message) in cases {
            try text.write(toFile: "\(dir)/\(name).y4m", atomically: true, encoding: .utf8)
            let result = try Harness.agent(["--plugins", registry, "-o", "path=\(dir)/\(name).y4m", "--frames", "1", "--no-record", "-q"])
            #expect(result.status == 16 && result.stderr.contains(message) && result.stderr.split(separator: "\n").count == 1,
                    "\(name): exit \(result.status): \(result.stderr)")
        }
        // A good rate still plays.
        try ("YUV4MPEG2 W64 H64 F30000:1001\n" + frame).write(toFile: dir + "/good.y4m", atomically: true, encoding: .utf8)
        let good = try Harness.agent(["--plugins", registry, "-o", "path=\(dir)/good.y4m", "--frames", "1", "--no-record", "-q"])
        #expect(good.status == 0, "\(good.stderr)")
    }

    /// `--record x.WEBM` was refused (only lower-case suffixes were known).
    @Test func upperCaseSuffixesAreAccepted() throws {
        guard haveFfprobe else { return }
        let dir = try Harness.temporaryDirectory()
        for name in ["OUT.WEBM", "out.Ivf"] {
            let result = try agent("none", ["--frames", "10", "--record", dir + "/" + name])
            #expect(result.status == 0, "\(name): \(result.stderr)")
            #expect(try EncoderRecordingTests.probe(dir + "/" + name).contains("codec_name=vp8"), "\(name)")
        }
    }

    /// Hostile frame fields found by an audit, in the agent's process and isolated: a stride of
    /// 2^32 − 1 trapped the agent (SIGILL in the conversion's 32-bit stride) or crashed the child;
    /// a damage count of 2^32 − 1 over two rectangles crashed the child, which read them before
    /// judging the count. Each frame is now dropped with the reason, and the run goes on.
    @Test(arguments: [("huge-stride", "exceeds KRAKL_MAX_STRIDE", true), ("damage-count-huge", "damage_count 4294967295 exceeds 65536", false)],
          [["--no-isolate"], ["--isolate"]])
    func hostileFrameFieldsAreDroppedNotFatal(behaviour: (String, String, Bool), isolation: [String]) throws {
        let (name, words, everyFrame) = behaviour
        let dir = try Harness.temporaryDirectory()
        let result = try agent(name, ["--seconds", "1", "--record", dir + "/out.webm"] + isolation)
        #expect(!result.timedOut)
        #expect(result.stderr.contains(words), "\(isolation) \(name): \(result.stderr)")
        #expect(!result.stderr.contains("crashed") && !result.stderr.contains("Fatal error"), "\(result.stderr)")
        if everyFrame {
            #expect(result.status == 25, "every frame is unusable: exit \(result.status): \(result.stderr)")
        } else {
            // The first frame (whole, no damage list) is fine; the rest are dropped.
            #expect(result.status == 0, "exit \(result.status): \(result.stderr)")
            #expect(try EncoderRecordingTests.probe(dir + "/out.webm").contains("codec_name=vp8"))
        }
    }

    /// A backend that logs in a loop (5000 lines every frame interval, ~150,000 a second) reaches
    /// the terminal at most at the host's rate: a burst of 200, then 50 a second, with a count of
    /// what was not shown. An audit's backend wrote 160 MB to stderr in 12 s before.
    @Test func aBackendThatLogsInALoopIsHeldToTheLogRate() throws {
        let result = try agent("log-flood", options: ["after_ms=0"], ["--seconds", "2", "--no-record"])
        #expect(result.status == 0, "exit \(result.status): \(result.stderr.suffix(300))")
        let lines = result.stderr.split(separator: "\n")
        let shown = lines.filter { $0.contains("the fixture logs in a loop") }.count
        // 200 + 50 a second over a 2 s run (and its start and end): far below the ~300,000 logged.
        #expect(shown >= 200 && shown <= 200 + 50 * 5, "\(shown) lines shown")
        #expect(lines.contains { $0.contains("log lines from the backend were not shown (it logs more than 50 a second)") },
                "\(result.stderr.suffix(300))")
    }

    @Test func logRateLimitHoldsABurstThenARate() {
        var limit = LogRateLimit(perSecond: 10, burst: 3)
        let second: UInt64 = 1_000_000_000
        #expect((0..<5).map { _ in limit.admit(now: 5 * second).shown } == [true, true, true, false, false])
        // 0.1 s later one token is back; the line that gets through says 2 were held back.
        let next = limit.admit(now: 5 * second + second / 10)
        #expect(next.shown && next.notShownBefore == 2)
        #expect(!limit.admit(now: 5 * second + second / 10).shown)
        // A clock that steps back gives nothing and takes nothing.
        #expect(!limit.admit(now: 4 * second).shown)
        #expect(limit.admit(now: 7 * second).shown, "2 s later the bucket is full again")
    }

    /// Every frame invalid: the run exited 0 and named a recording that did not exist. Now exit
    /// 25, and the summary says no recording was made.
    @Test func aRunWithoutAUsableFrameFails() throws {
        let dir = try Harness.temporaryDirectory()
        let result = try agent("all-invalid", ["--seconds", "1", "--record", dir + "/out.webm"])
        #expect(result.status == 25 && result.stderr.contains("delivered no usable frame"), "exit \(result.status): \(result.stderr)")
        #expect(result.stdout.contains("recording: none") && !result.stdout.contains("recording: \(dir)/out.webm"), "\(result.stdout)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/out.webm"))
    }
}
