import Foundation
import KraklCore

/// Capture → I420 → libvpx → an EncodedFrameSink, driven by damage.
///
/// The capture thread calls `submit` with each frame: its damaged areas are
/// converted into a staging picture (the hand-off slot) and the damage is
/// added to what is pending. The encoder thread takes the slot when the
/// frame-rate cap allows: it copies only the pending damage into its own
/// picture and encodes with an active map of the changed blocks. A frame
/// that arrives before the previous one was taken overwrites it (latest
/// wins) and its damage merges in (counted as skipped). Capture never waits
/// for an encode, only for the short copy out of the slot.
public final class EncoderPipeline: @unchecked Sendable {
    public let settings: EncoderSettings
    public let statistics = EncoderStatistics()
    /// Creates the output once the first frame's size is known.
    public typealias OutputFactory = (_ codec: VideoCodec, _ width: Int, _ height: Int) throws(EncoderError) -> EncodedFrameSink

    private let makeOutput: OutputFactory
    private let onFailure: (EncoderError) -> Void
    private let converter = FrameConverter()
    private let condition = NSCondition()
    private let finished = DispatchSemaphore(value: 0)
    // The slot, guarded by `condition`.
    private var staging: I420Image?
    private var pendingDamage = DamageAccumulator()
    private var pendingTimestamp: UInt64 = 0
    private var pending = false
    private var keyframeRequested = false
    private var requestedBitrate: Int?
    private var stopping = false
    private var started = false
    private var inputDump: UnsafeMutablePointer<FILE>?
    /// Frames a rolling refresh band takes to sweep the picture (0.5 s at 30 fps).
    static let refreshSweep = 15

    /// - Parameters:
    ///   - dumpInput: a file to receive every encoded picture as raw I420
    ///     (for PSNR checks against the decoded output).
    ///   - onFailure: called once, on the encoder thread, if encoding fails.
    public init(settings: EncoderSettings, dumpInput: String? = nil, output: @escaping OutputFactory,
                onFailure: @escaping (EncoderError) -> Void) throws(EncoderError) {
        guard settings.maximumFps > 0, settings.maximumSize.width >= 16, settings.maximumSize.height >= 16 else {
            throw EncoderError("the frame-rate cap and maximum size must be positive (at least 16×16)")
        }
        self.settings = settings
        makeOutput = output
        self.onFailure = onFailure
        if let dumpInput {
            guard let file = fopen(dumpInput, "wb") else { throw EncoderError("cannot write \(dumpInput): \(String(cString: strerror(errno)))") }
            inputDump = file
        }
    }

    deinit { if let inputDump { fclose(inputDump) } }

    /// Starts the encoder thread.
    public func start() {
        condition.lock()
        defer { condition.unlock() }
        guard !started else { return }
        started = true
        let thread = Thread { [self] in
            self.run()
            self.finished.signal()
        }
        thread.name = "krakl-encoder"
        thread.start()
    }

    /// Capture thread: takes a checked frame (borrowed for this call only).
    public func submit(_ frame: FrameInfo) {
        let cpuStart = threadCpuNanoseconds()
        let size = outputSize(width: frame.width, height: frame.height, maximum: settings.maximumSize)
        condition.lock()
        if staging?.width != size.width || staging?.height != size.height {
            staging = I420Image(width: size.width, height: size.height)
            pendingDamage.addWhole()
        }
        let skipped = pending
        if let rects = converter.convert(frame, into: staging!) {
            rects.forEach { pendingDamage.add($0) }
        } else {
            pendingDamage.addWhole()
        }
        pendingTimestamp = frame.raw.timestamp_ns
        pending = true
        condition.signal()
        condition.unlock()
        statistics.recordCapture(conversionCpuNs: threadCpuNanoseconds() - cpuStart, skippedPrevious: skipped)
    }

    /// Any thread: the next encoded frame is a keyframe.
    public func requestKeyframe() {
        condition.lock()
        keyframeRequested = true
        condition.signal()
        condition.unlock()
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
        condition.signal()
        condition.unlock()
        if wasStarted { finished.wait() }
    }

    // MARK: encoder thread

    private struct Work {
        var damage = DamageAccumulator()
        var timestampNs: UInt64 = 0
        var keyframe = false
        var refresh = false
        var newSize: (Int, Int)?
        var bitrate: Int?
    }

    private func run() {
        var encoder: VpxEncoder?
        var output: EncodedFrameSink?
        var picture: I420Image?
        var lastEncodeNs: UInt64 = 0
        var lastCaptureNs: UInt64 = 0 // capture time of the last picture encoded
        var lastKeyframeNs: UInt64 = 0
        var lastPts: Int64 = -1
        let minimumInterval = UInt64(1e9 / settings.maximumFps)
        let refreshNs = UInt64(settings.refreshInterval * 1e9)
        let keyframeNs = UInt64(settings.keyframeInterval * 1e9)

        // Damage of a frame libvpx dropped: the next frame must encode it too.
        var carried = DamageAccumulator()
        var refreshRow = 0
        loop: while true {
            guard var work = takeWork(picture: &picture, lastEncodeNs: lastEncodeNs, lastCaptureNs: lastCaptureNs,
                                      minimumInterval: minimumInterval, refreshNs: refreshNs) else { break }
            work.damage.merge(carried)
            carried.clear()
            let now = MonotonicClock.nanoseconds()
            do throws(EncoderError) {
                guard let image = picture else { continue }
                if let size = work.newSize {
                    encoder = try VpxEncoder(codec: settings.codec, width: size.0, height: size.1, bitrateKbps: settings.bitrateKbps,
                                             fps: settings.maximumFps, threads: settings.threads)
                    if output == nil { output = try makeOutput(settings.codec, size.0, size.1) }
                    work.keyframe = true
                }
                guard let encoder, let output else { continue }
                if let bitrate = work.bitrate { try encoder.setBitrate(kbps: bitrate) }
                if keyframeNs > 0 && now - lastKeyframeNs >= keyframeNs { work.keyframe = true }

                // libvpx budgets each frame by the pts step from the previous one
                // (it derives the frame rate from it). Real capture times would
                // hand a refresh after an idle second a whole second's budget
                // (measured: a 169 KB refresh at 2.5 Mbit/s) and make the budget
                // follow capture jitter, so libvpx gets a steady clock of one
                // frame interval per encoded frame. Containers and RTP use the
                // capture timestamps, not this.
                let step = Int64(90_000 / settings.maximumFps)
                lastPts = lastPts < 0 ? 0 : lastPts + step
                let pts = lastPts
                let duration = UInt(step)
                var map: [UInt8]?
                var share = 1.0
                if !work.damage.whole && !work.keyframe {
                    (map, share) = work.damage.macroblockMap(width: image.width, height: image.height)
                    // A rolling band of block rows rides along with the damage, so
                    // areas that stopped changing still get refined (the first
                    // picture is coarse under CBR) and a lost packet heals within
                    // a sweep: every row comes round every `refreshSweep` frames.
                    let cols = (image.width + 15) / 16, rows = (image.height + 15) / 16
                    let band = max(1, (rows + Self.refreshSweep - 1) / Self.refreshSweep)
                    if refreshRow >= rows { refreshRow = 0 }   // the picture shrank since the band's last step
                    for row in refreshRow..<min(rows, refreshRow + band) {
                        for col in 0..<cols { map![row * cols + col] = 1 }
                    }
                    refreshRow = refreshRow + band >= rows ? 0 : refreshRow + band
                    share = Double(map!.reduce(0) { $0 + Int($1) }) / Double(cols * rows)
                }
                let encodeStart = MonotonicClock.nanoseconds()
                let packets = try encoder.encode(image, pts: pts, duration: duration, keyframe: work.keyframe, activeMap: map)
                let encodeNs = MonotonicClock.nanoseconds() - encodeStart
                if packets.isEmpty {
                    carried = work.damage
                    statistics.recordDrop()
                    if work.keyframe { keyframePending() }
                    continue
                }
                if let inputDump {
                    var bytes: [UInt8] = []
                    image.appendPacked(to: &bytes)
                    fwrite(bytes, 1, bytes.count, inputDump)
                }
                for packet in packets {
                    try output.write(EncodedFrame(data: packet.data, keyframe: packet.keyframe, timestampNs: work.timestampNs,
                                                  width: image.width, height: image.height, codec: settings.codec))
                    if packet.keyframe { lastKeyframeNs = now }
                    statistics.record(.init(bytes: packet.data.count, keyframe: packet.keyframe, refresh: work.refresh,
                                            activeShare: share, encodeNs: encodeNs, timestampNs: work.timestampNs))
                }
                lastEncodeNs = now
                if !work.refresh { lastCaptureNs = work.timestampNs }
            } catch {
                onFailure(error)
                break loop
            }
        }
        statistics.setEncoderCpu(threadCpuNanoseconds())
        if let inputDump { fflush(inputDump) }
        do throws(EncoderError) {
            try output?.finish()
        } catch {
            onFailure(error)
        }
    }

    /// Whether the frame-rate cap lets a frame be encoded now: an interval since the last encode
    /// began, or (for a pending capture) an interval, less a quarter of slack, between its capture
    /// and that of the last picture encoded.
    ///
    /// Judged on take times alone, a frame that arrives a little early (capture jitter, or the
    /// previous take ran late) waits for the cap, every later frame inherits that wait, and
    /// nothing wins it back: measured at 30 fps from a 30 fps source, capture → encoded drifted
    /// to 24 ms for a 5 ms encode (4.5 ms with this rule). The slack lets a source at the cap
    /// through at once while a faster one is still held to it.
    static func frameRateCapAllows(now: UInt64, lastEncodeNs: UInt64, lastCaptureNs: UInt64, pendingCaptureNs: UInt64?,
                                   interval: UInt64) -> Bool {
        if now >= lastEncodeNs + interval { return true }
        // Backends' timestamps are theirs: compared without arithmetic that could overflow on a bogus one.
        guard let capture = pendingCaptureNs, capture > lastCaptureNs else { return false }
        return capture - lastCaptureNs >= interval - interval / 4
    }

    /// Waits for something to encode and takes it out of the slot; nil when stopping.
    private func takeWork(picture: inout I420Image?, lastEncodeNs: UInt64, lastCaptureNs: UInt64, minimumInterval: UInt64,
                          refreshNs: UInt64) -> Work? {
        condition.lock()
        defer { condition.unlock() }
        while true {
            // Stopping drains the slot: the last captured picture is encoded too.
            if stopping && !pending { return nil }
            let now = MonotonicClock.nanoseconds()
            let capOpen = Self.frameRateCapAllows(now: now, lastEncodeNs: lastEncodeNs, lastCaptureNs: lastCaptureNs,
                                                  pendingCaptureNs: pending ? pendingTimestamp : nil, interval: minimumInterval)
            let refreshDue = picture != nil && refreshNs > 0 && now >= lastEncodeNs + refreshNs
            if (pending && (capOpen || stopping)) || (keyframeRequested && (pending || picture != nil) && capOpen) || refreshDue { break }
            // Sleep until the cap opens (something is pending) or a refresh is due.
            // A keyframe request before the first capture has nothing to encode
            // yet: it waits, untimed, for that capture like everything else.
            var wake: UInt64?
            if pending || (keyframeRequested && picture != nil) { wake = lastEncodeNs + minimumInterval }
            if picture != nil && refreshNs > 0 { wake = min(wake ?? .max, lastEncodeNs + refreshNs) }
            if let wake {
                _ = condition.wait(until: Date(timeIntervalSinceNow: Double(wake > now ? wake - now : 0) / 1e9))
            } else {
                condition.wait()
            }
        }
        var work = Work()
        work.bitrate = requestedBitrate
        requestedBitrate = nil
        work.keyframe = keyframeRequested
        keyframeRequested = false
        if pending, let staging {
            if picture?.width != staging.width || picture?.height != staging.height {
                picture = I420Image(width: staging.width, height: staging.height)
                work.newSize = (staging.width, staging.height)
                pendingDamage.addWhole()
            }
            if pendingDamage.whole {
                picture!.copy(PixelRect(x: 0, y: 0, width: staging.width, height: staging.height), from: staging)
            } else {
                for rect in pendingDamage.rects { picture!.copy(rect, from: staging) }
            }
            work.damage = pendingDamage
            work.timestampNs = pendingTimestamp
            pendingDamage.clear()
            pending = false
        } else {
            // Nothing new: refresh (or a requested keyframe of) the current picture.
            work.damage.addWhole()
            work.timestampNs = MonotonicClock.nanoseconds()
            work.refresh = !work.keyframe
        }
        return work
    }
}

