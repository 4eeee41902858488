import Dispatch
import FoundationEssentials
import Glibc
import KraklBase
import KraklHost

/// Capture → I420 → libvpx → an EncodedFrameSink, driven by damage.
///
/// There is one I420 picture (the slot). The capture thread calls `submit` with each frame: its
/// damaged areas are converted into the picture and added to what is pending. The encoder thread
/// takes the pending damage when the frame-rate cap allows and encodes the picture with an active
/// map of the changed blocks. A frame that arrives before the previous one was taken overwrites it
/// (latest wins) and its damage merges in (counted as skipped).
///
/// While libvpx reads the picture (inside `vpx_codec_encode`, which copies it into its own
/// lookahead first but gives no way in between) capture waits for it, on `encoderReading`, not on
/// the lock: keyframe requests and bitrate changes from the network thread never wait for an
/// encode. Waiting costs a capture at most one encode; a second picture to convert into meanwhile
/// cost 3.1 MB at 1080p (issue 27: the room's resident memory), and the encoder could only take
/// that picture by a swap whose stale areas the next capture had to repair.
///
/// Backend timestamps pass a PresentationClock on the way in, so the outputs
/// only ever see increasing times; keyframe requests are held to one per
/// `settings.keyframeRequestSpacing` (FrameRateCap holds frames to `--max-fps`).
/// @unchecked Sendable: what the capture and encoder threads share is under `condition` (the
/// picture's pixels: the encoder reads them only while `encoderReading`, when capture does not
/// write); the libvpx context is the encoder thread's alone.
public final class EncoderPipeline: @unchecked Sendable {
    public let settings: EncoderSettings
    public let statistics = EncoderStatistics()
    /// Creates the output once the first frame's size is known.
    public typealias OutputFactory = (_ codec: VideoCodec, _ width: Int, _ height: Int) throws(EncoderError) -> EncodedFrameSink

    private let makeOutput: OutputFactory
    private let onFailure: (EncoderError) -> Void
    private let converter = FrameConverter()
    private let condition = Condition()
    private let finished = DispatchSemaphore(value: 0)
    // The slot, guarded by `condition`.
    /// The one picture: the latest frame, where capture converts and libvpx reads.
    private var picture: I420Image?
    /// The encoder thread is encoding `picture` (outside the lock); capture waits until it is done.
    private var encoderReading = false
    private var pendingDamage = DamageAccumulator()
    private var pendingTimestamp: UInt64 = 0
    private var pending = false
    private var keyframeRequested = false
    /// Requests so far (`requestKeyframe`), to tell which ones a keyframe that went out has served.
    private var keyframeRequestCount: UInt64 = 0
    private var requestedBitrate: Int?
    private var stopping = false
    private var started = false
    private var clock = PresentationClock()
    private var warnedAboutTimestamps = false
    private var outputMade = false
    private var failed = false
    private let inputDump: OutputFile?
    private let frameLog: FrameLog?
    private let onWarning: (String) -> Void

    /// - Parameters:
    ///   - dumpInput: a file to receive every encoded picture as raw I420
    ///     (for PSNR checks against the decoded output); opened here.
    ///   - frameLog: receives a row per encoded frame as it is encoded; the pipeline closes it.
    ///   - onFailure: called once, on the encoder thread, if encoding or an output fails.
    ///   - onWarning: called once, the first time a backend timestamp had to be corrected.
    public init(settings: EncoderSettings, dumpInput: String? = nil, frameLog: FrameLog? = nil, output: @escaping OutputFactory,
                onFailure: @escaping (EncoderError) -> Void, onWarning: @escaping (String) -> Void = { _ in }) throws(EncoderError) {
        guard settings.maximumFps > 0, settings.maximumSize.width >= 16, settings.maximumSize.height >= 16 else {
            throw EncoderError("the frame-rate cap and maximum size must be positive (at least 16×16)")
        }
        self.settings = settings
        makeOutput = output
        self.onFailure = onFailure
        self.onWarning = onWarning
        self.frameLog = frameLog
        inputDump = try dumpInput.map { (path) throws(EncoderError) in try OutputFile(path: path) }
    }

    /// Whether the output exists (it is made at the first picture, when its size is known).
    public var outputStarted: Bool {
        condition.lock()
        defer { condition.unlock() }
        return outputMade
    }

    /// Starts the encoder thread.
    public func start() {
        condition.lock()
        defer { condition.unlock() }
        guard !started else { return }
        started = true
        startThread(name: "krakl-encoder") { [self] in
            self.run()
            self.finished.signal()
        }
    }

    /// Capture thread: takes a checked frame (borrowed for this call only).
    public func submit(_ frame: FrameInfo) {
        let cpuStart = threadCpuNanoseconds()
        let size = outputSize(width: frame.width, height: frame.height, maximum: settings.maximumSize)
        let arrived = MonotonicClock.nanoseconds()
        condition.lock()
        while encoderReading && !stopping { condition.wait() }
        // After finish() nothing more is encoded (a backend that overran stop() may still deliver).
        guard !stopping else {
            condition.unlock()
            return
        }
        let (time, problem) = clock.stamp(capture: frame.raw.timestamp_ns, hostNs: arrived)
        var warning: String?
        if let problem {
            if !warnedAboutTimestamps { warning = problem }
            warnedAboutTimestamps = true
        }
        if picture?.width != size.width || picture?.height != size.height {
            picture = I420Image(width: size.width, height: size.height)
            pendingDamage.addWhole()
        }
        let skipped = pending
        if let rects = converter.convert(frame, into: picture!) {
            rects.forEach { pendingDamage.add($0) }
        } else {
            pendingDamage.addWhole()
        }
        pendingTimestamp = time
        pending = true
        condition.broadcast()
        condition.unlock()
        if problem != nil { statistics.recordCorrectedTimestamp() }
        if let warning {
            onWarning("\(warning); the recording uses the host's clock from there (later corrections are counted in the summary, not logged)")
        }
        statistics.recordCapture(conversionCpuNs: threadCpuNanoseconds() - cpuStart, skippedPrevious: skipped)
    }

    /// Any thread: a keyframe soon. At most one per `settings.keyframeRequestSpacing`: a request
    /// within that time of the last keyframe is served when the spacing has passed, and requests
    /// that arrive while one is waiting merge into it.
    public func requestKeyframe() {
        condition.lock()
        let merged = keyframeRequested
        keyframeRequested = true
        keyframeRequestCount &+= 1
        condition.signal()
        condition.unlock()
        if merged { statistics.recordCoalescedKeyframeRequest() }
    }

    /// A keyframe just went out: requests that came while it was being encoded are served by it (it
    /// reaches the receiver after they were made). Without this, a session's transport coming up while
    /// the first 1080p keyframe was in libvpx (~100 ms) asked for a second one, and its 400 KB held up
    /// the frames behind it (measured: pacer wait mean 128 ms, latency p99 670 ms in the first seconds).
    /// Only requests made before the keyframe was handed to the sinks count: one made during the
    /// hand-over may come from a sink it had already passed (a viewer added then).
    private func keyframeServed(requestsUpTo count: UInt64) {
        condition.lock()
        let served = keyframeRequested && keyframeRequestCount <= count
        if served { keyframeRequested = false }
        condition.unlock()
        if served { statistics.recordCoalescedKeyframeRequest() }
    }

    /// A keyframe libvpx dropped is asked for again.
    private func keyframePending() {
        condition.lock()
        keyframeRequested = true
        condition.unlock()
    }

    /// Any thread: a new target bitrate from the next frame on.
    public func setBitrate(kbps: Int) {
        condition.lock()
        requestedBitrate = kbps
        condition.unlock()
    }

    /// Stops the encoder thread after the frame in hand and completes the
    /// output. Call after capture has stopped.
    public func finish() {
        condition.lock()
        stopping = true
        let wasStarted = started
        started = true  // never starts after this
        condition.broadcast()  // the encoder thread, and a capture waiting for an encode
        condition.unlock()
        if wasStarted {
            finished.wait()
        } else {
            closeLogs()
        }
    }

    /// Reports the first failure only: one failing disk fails every later write too.
    private func fail(_ error: EncoderError) {
        condition.lock()
        let first = !failed
        failed = true
        condition.unlock()
        if first { onFailure(error) }
    }

    private func closeLogs() {
        do throws(EncoderError) {
            try inputDump?.close()
            try frameLog?.close()
        } catch {
            fail(error)
        }
    }

    // MARK: encoder thread

    private struct Work {
        var damage = DamageAccumulator()
        var timestampNs: UInt64 = 0
        var keyframe = false
        var refresh = false
        /// The frame of no blocks after a keyframe or the last refinement pass (`EncoderSettings.followStillFrames`).
        var followUp = false
        var newSize: (Int, Int)?
        var bitrate: Int?
    }

    /// What the encoder thread carries from one frame to the next (its own; never shared).
    private struct EncoderThreadState {
        var encoder: VpxEncoder?
        var output: EncodedFrameSink?
        var picture: I420Image?
        var lastEncodeNs: UInt64 = 0
        var cap: FrameRateCap
        var lastKeyframeNs: UInt64?
        var lastPts: Int64 = -1
        /// Refinement after settling (refresh interval 0): made with the first picture's size.
        var refinement: SettleRefinement?
        /// Damage of a frame libvpx dropped: the next frame must encode it too.
        var carried = DamageAccumulator()
        var followUpAt: UInt64?
        var band = RefinementBand(width: 16, height: 16)
    }

    /// One frame interval at the frame-rate cap.
    private var frameIntervalNs: UInt64 { UInt64(1e9 / settings.maximumFps) }

    private func run() {
        var state = EncoderThreadState(cap: FrameRateCap(interval: frameIntervalNs))
        while var work = takeWork(picture: &state.picture, cap: &state.cap, lastKeyframeNs: state.lastKeyframeNs,
                                  refreshAt: refreshAt(state), followUpAt: state.followUpAt) {
            state.followUpAt = nil
            work.damage.merge(state.carried)
            state.carried.clear()
            do throws(EncoderError) {
                try encodeStep(&work, &state, now: MonotonicClock.nanoseconds())
            } catch {
                doneReading()
                fail(error)
                break
            }
            doneReading()
        }
        statistics.setEncoderCpu(threadCpuNanoseconds())
        // What was recorded before a failure is completed too (best effort: the first error is the one reported).
        do throws(EncoderError) {
            try state.output?.finish()
        } catch {
            fail(error)
        }
        closeLogs()
    }

    /// The encoder is out of libvpx: capture may write into the picture again.
    private func doneReading() {
        condition.lock()
        encoderReading = false
        condition.broadcast()
        condition.unlock()
    }

    /// When the current picture is due again unchanged: the refresh interval, or the next
    /// refinement pass after settling.
    private func refreshAt(_ state: EncoderThreadState) -> UInt64? {
        let refreshNs = settings.refreshInterval.inNanoseconds
        if refreshNs > 0 { return state.lastEncodeNs + refreshNs }
        return settings.refineAfterSettling ? state.refinement?.nextPassNs : nil
    }

    /// One piece of work: encoded, written to the output, and the refinement moved on.
    private func encodeStep(_ work: inout Work, _ state: inout EncoderThreadState, now: UInt64) throws(EncoderError) {
        guard let image = state.picture, let prepared = try prepareEncoder(for: image, &work, &state, now: now) else { return }
        let (encoder, output) = prepared
        // libvpx budgets each frame by the pts step from the previous one
        // (it derives the frame rate from it). Real capture times would
        // hand a refresh after an idle second a whole second's budget
        // (measured: a 169 KB refresh at 2.5 Mbit/s) and make the budget
        // follow capture jitter, so libvpx gets a steady clock of one
        // frame interval per encoded frame. Containers and RTP use the
        // capture timestamps, not this.
        let step = Int64(90_000 / settings.maximumFps)
        state.lastPts = state.lastPts < 0 ? 0 : state.lastPts + step
        let (map, share) = activeMap(for: work, image: image, band: &state.band)
        let encodeStart = MonotonicClock.nanoseconds()
        let packets = try encoder.encode(image, pts: state.lastPts, duration: UInt(step), keyframe: work.keyframe, activeMap: map)
        let encodeNs = MonotonicClock.nanoseconds() - encodeStart
        let quantizer = encoder.lastQuantizer()
        if packets.isEmpty {
            dropped(work, &state, now: now)
            return
        }
        state.band.encoded(map: map, quantizer: quantizer)
        if let inputDump {
            var bytes: [UInt8] = []
            image.appendPacked(to: &bytes)
            try inputDump.write(bytes)
        }
        let written = EncodedRow(share: share, encodeNs: encodeNs, quantizer: quantizer, width: image.width, height: image.height)
        try write(packets, of: work, as: written, to: output, &state, now: now)
        state.lastEncodeNs = now
        if work.followUp {
            // Neither a change nor a pass: the refinement stays where it was.
        } else if work.refresh {
            refinementPassed(&state, at: now, bytes: packets.reduce(0) { $0 + $1.data.count }, quantizer: quantizer)
        } else {
            if state.refinement == nil || work.newSize != nil {
                state.refinement = SettleRefinement(frameIntervalNs: frameIntervalNs, width: image.width, height: image.height)
            }
            state.refinement?.changed(atNs: now)
        }
    }

    /// A new size makes the encoder (and, the first time, the output) and asks for a keyframe; then
    /// the refinement band's size, a new bitrate and the periodic keyframe are applied. Nil before
    /// there is an encoder and an output to encode into.
    private func prepareEncoder(for image: I420Image, _ work: inout Work, _ state: inout EncoderThreadState,
                                now: UInt64) throws(EncoderError) -> (VpxEncoder, EncodedFrameSink)? {
        if let size = work.newSize {
            state.encoder = try VpxEncoder(codec: settings.codec, width: size.0, height: size.1, bitrateKbps: settings.bitrateKbps,
                                           fps: settings.maximumFps, threads: settings.threads, vp8Profile: settings.vp8Profile)
            if state.output == nil {
                state.output = try makeOutput(settings.codec, size.0, size.1)
                condition.lock()
                outputMade = true
                condition.unlock()
            }
            work.keyframe = true
        }
        guard let encoder = state.encoder, let output = state.output else { return nil }
        if state.band.grid != BlockGrid(width: image.width, height: image.height) {
            state.band = RefinementBand(width: image.width, height: image.height)
        }
        if let bitrate = work.bitrate { try encoder.setBitrate(kbps: bitrate) }
        let keyframeNs = settings.keyframeInterval.inNanoseconds
        if keyframeNs > 0 && now - (state.lastKeyframeNs ?? 0) >= keyframeNs { work.keyframe = true }
        return (encoder, output)
    }

    /// The blocks libvpx is to encode (nil: all of them) and their share of the picture.
    private func activeMap(for work: Work, image: I420Image, band: inout RefinementBand) -> (map: [UInt8]?, share: Double) {
        guard !work.damage.whole && !work.keyframe else { return (nil, 1.0) }
        var (map, _) = work.damage.macroblockMap(width: image.width, height: image.height)
        // The band of rows that refines what stopped changing (the first picture is
        // coarse under CBR) rides along, less its blocks that already converged.
        band.add(to: &map)
        return (map, Double(map.reduce(0) { $0 + Int($1) }) / Double(map.count))
    }

    /// libvpx dropped the frame: its damage goes into the next one, and what it was for is tried again.
    private func dropped(_ work: Work, _ state: inout EncoderThreadState, now: UInt64) {
        state.carried = work.damage
        statistics.recordDrop()
        if work.keyframe { keyframePending() }
        // A dropped pass counts as one that changed nothing, so the next is a frame
        // interval away rather than due again at once.
        if work.refresh { refinementPassed(&state, at: now, bytes: 0, quantizer: nil) }
        // The frame that lets a receiver show a keyframe must come: try again.
        if work.followUp { state.followUpAt = MonotonicClock.nanoseconds() + frameIntervalNs }
    }

    /// What an encoded picture's statistics rows share.
    private struct EncodedRow {
        var share: Double
        var encodeNs: UInt64
        var quantizer: Int?
        var width: Int
        var height: Int
    }

    /// Hands the packets to the output and records them; a keyframe serves the requests made before it.
    private func write(_ packets: [(data: [UInt8], keyframe: Bool)], of work: Work, as encoded: EncodedRow, to output: EncodedFrameSink,
                       _ state: inout EncoderThreadState, now: UInt64) throws(EncoderError) {
        let requestsBeforeWrite = condition.withLock { keyframeRequestCount }
        for packet in packets {
            try output.write(EncodedFrame(data: packet.data, keyframe: packet.keyframe, timestampNs: work.timestampNs,
                                          width: encoded.width, height: encoded.height, codec: settings.codec))
            if packet.keyframe {
                state.lastKeyframeNs = now
                keyframeServed(requestsUpTo: requestsBeforeWrite)
                if settings.followStillFrames { state.followUpAt = MonotonicClock.nanoseconds() + frameIntervalNs }
            }
            let row = EncoderStatistics.Frame(bytes: packet.data.count, keyframe: packet.keyframe, refresh: work.refresh,
                                              activeShare: encoded.share, encodeNs: encoded.encodeNs, timestampNs: work.timestampNs,
                                              quantizer: encoded.quantizer)
            statistics.record(row)
            try frameLog?.append(row)
        }
    }

    /// A refinement pass went out (or was dropped: then it changed nothing); the last one gets
    /// the frame that lets a receiver show it.
    private func refinementPassed(_ state: inout EncoderThreadState, at now: UInt64, bytes: Int, quantizer: Int?) {
        guard state.refinement?.passed(atNs: now, bytes: bytes, quantizer: quantizer) == true else { return }
        // The picture converged and the encoder goes quiet: the token pages the passes filled go back.
        state.encoder?.releaseTokenPages()
        if settings.followStillFrames { state.followUpAt = MonotonicClock.nanoseconds() + frameIntervalNs }
    }

    /// Waits for something to encode and takes it out of the slot; nil when stopping.
    private func takeWork(picture: inout I420Image?, cap: inout FrameRateCap, lastKeyframeNs: UInt64?,
                          refreshAt: UInt64?, followUpAt: UInt64?) -> Work? {
        condition.lock()
        defer { condition.unlock() }
        let keyframeSpacing = settings.keyframeRequestSpacing.inNanoseconds
        var keyframeNow = false, refreshDue = false, followUpDue = false
        while true {
            // Stopping drains the slot: the last captured picture is encoded too.
            if stopping && !pending { return nil }
            let now = MonotonicClock.nanoseconds()
            let capOpen = cap.allows(now: now)
            let keyframeOpensAt = lastKeyframeNs.map { $0 &+ keyframeSpacing } ?? 0
            keyframeNow = keyframeRequested && now >= keyframeOpensAt
            refreshDue = picture != nil && refreshAt.map { now >= $0 } ?? false
            followUpDue = picture != nil && followUpAt.map { now >= $0 } ?? false
            if (pending && (capOpen || stopping)) || (keyframeNow && (pending || picture != nil) && capOpen) || refreshDue || followUpDue { break }
            // Sleep until the cap opens (something is pending), a held keyframe request may be
            // served, or a refresh is due. A keyframe request before the first capture has
            // nothing to encode yet: it waits, untimed, for that capture like everything else.
            var wake: UInt64?
            if pending { wake = cap.opensAt() }
            if keyframeRequested && picture != nil { wake = min(wake ?? .max, max(cap.opensAt(), keyframeOpensAt)) }
            if picture != nil, let refreshAt { wake = min(wake ?? .max, refreshAt) }
            if picture != nil, let followUpAt { wake = min(wake ?? .max, followUpAt) }
            if let wake {
                _ = condition.wait(until: Date(timeIntervalSinceNow: Double(wake > now ? wake - now : 0) / 1e9))
            } else {
                condition.wait()
            }
        }
        cap.take(now: MonotonicClock.nanoseconds())
        var work = Work()
        work.bitrate = requestedBitrate
        requestedBitrate = nil
        // A request still inside the spacing stays pending: this picture goes out as a delta frame.
        work.keyframe = keyframeNow
        if keyframeNow { keyframeRequested = false }
        if pending, let latest = self.picture {
            if picture?.width != latest.width || picture?.height != latest.height {
                work.newSize = (latest.width, latest.height)
                pendingDamage.addWhole()
            }
            picture = latest
            work.damage = pendingDamage
            work.timestampNs = pendingTimestamp
            pendingDamage.clear()
            pending = false
        } else if !work.keyframe, !refreshDue, followUpDue {
            // Nothing new after a keyframe: the frame of no blocks that lets a receiver show it.
            work.timestampNs = clock.stamp(hostNs: MonotonicClock.nanoseconds())
            work.followUp = true
        } else {
            // Nothing new: refresh (or a requested keyframe of) the current picture.
            work.damage.addWhole()
            work.timestampNs = clock.stamp(hostNs: MonotonicClock.nanoseconds())
            work.refresh = !work.keyframe
        }
        // Every piece of work hands `picture` to libvpx (a frame of no blocks too).
        encoderReading = true
        return work
    }
}

