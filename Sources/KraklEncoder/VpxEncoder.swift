import KraklBase
import KraklHost
import CVpx
import Glibc

extension VideoCodec {
    var libvpxNumber: Int32 { self == .vp8 ? 8 : 9 }
}

/// A failure to set up or run the encoder, said so a person can act on it.
public struct EncoderError: Error, CustomStringConvertible {
    public let message: String
    /// Set when an output (recording, frame log, input dump) could not be opened, written,
    /// flushed or closed: the agent reports those as an output failure (exit 23), not as a
    /// failure of the encoder.
    public let output: (path: String, reason: String)?

    public init(_ message: String) {
        self.message = message
        output = nil
    }

    /// Writing `path` failed; `reason` says how ("No space left on device").
    public init(path: String, reason: String) {
        message = "cannot write \(path): \(reason)"
        output = (path, reason)
    }

    public var description: String { message }
}

/// One compressed picture.
public struct EncodedFrame: Sendable {
    public var data: [UInt8]
    public var keyframe: Bool
    /// Presentation time (CLOCK_MONOTONIC ns): the capture timestamp of the newest frame in it, as
    /// the pipeline's PresentationClock vouched for it (always increasing from frame to frame).
    public var timestampNs: UInt64
    public var width: Int
    public var height: Int
    public var codec: VideoCodec
}

/// libvpx in realtime mode, set up for screen content the way real-time
/// stacks set it up for screen sharing (libwebrtc's screenshare settings
/// are the reference): CBR with a short buffer, no lag, error resilient,
/// screen-content tools, a floor on the quantizer so text stays sharp, a
/// cap on keyframe size so a keyframe does not flood the link.
final class VpxEncoder {
    let codec: VideoCodec
    let width: Int
    let height: Int
    private(set) var bitrateKbps: Int
    private var context = vpx_codec_ctx_t()
    private var config = vpx_codec_enc_cfg_t()
    private var image = vpx_image_t()
    /// libvpx's VP8 token buffer. libvpx sizes it for every macroblock at its worst (1080p: 8160 ×
    /// 384 tokens × 16 bytes ≈ 48 MB) and fills it from its start with each frame's tokens, so what
    /// stays resident is what the largest frame since set-up filled (a detailed 1080p keyframe:
    /// 13 MB) though the frames after it fill a small part. libvpx has no control for it; its set-up
    /// clears the buffer with memset, and the agent's memset (Sources/System/ZeroFill) notes where.
    /// After a frame of `tokenReleaseBytes` or more, every `tokenReleaseFrames` frames, and when a
    /// still picture's refinement is done, the buffer's pages are given back (MADV_DONTNEED: they
    /// read as zeros and cost nothing until touched). This is exact because
    /// libvpx writes a frame's tokens before it reads them and never reads another frame's
    /// (vp8_encode_frame → vp8_tokenize_mb, then vp8_pack_bitstream over this frame's count).
    /// Nil when not found (VP9, or a program without ZeroFill): nothing is given back.
    private(set) var tokenBuffer: UnsafeMutableRawBufferPointer?
    /// Times the token buffer's pages were given back.
    private(set) var tokenReleases = 0
    /// A frame this large filled about 2 MB of tokens or more (a 173 KB keyframe filled 13 MB); the
    /// page faults to fill them again cost less than a millisecond a megabyte.
    static let tokenReleaseBytes = 32 * 1024
    /// Smaller frames keep the pages the largest of them filled since the last release: while
    /// scrolling 1080p at 2.5 Mbit/s (8–30 KB frames) that was 3.3–3.7 MB resident, against about
    /// 1 MB for the frames of the moment. Giving them back every 64 frames (about 2 s at 30 frames/s)
    /// lets the resident part follow what recent frames need; filling ~1 MB again costs under a
    /// millisecond once in 64 frames.
    static let tokenReleaseFrames = 64
    private var framesSinceTokenRelease = 0

    /// - Parameters:
    ///   - threads: encoder threads; 0 picks 2 for ≥ 720p on 4+ cores, else 1.
    ///     (On 2 cores, libvpx's row sync spins against the capture thread:
    ///     measured at 1080p typing, 2 threads took 14 ms a frame, 1 took 3.9.)
    ///   - vp8Profile: the VP8 bitstream version (RFC 6386 §9.1), `EncoderSettings.vp8Profile`.
    ///   - releasesTokenPages: gives the token buffer's pages back after large frames (`tokenBuffer`).
    init(codec: VideoCodec, width: Int, height: Int, bitrateKbps: Int, fps: Double, threads: Int,
         vp8Profile: Int = EncoderSettings.defaultVp8Profile, releasesTokenPages: Bool = true) throws(EncoderError) {
        guard width >= 16, height >= 16, width <= 16384, height <= 16384, width % 2 == 0, height % 2 == 0 else {
            throw EncoderError("cannot encode \(width)x\(height): sizes must be even and from 16 to 16384")
        }
        guard (10...100_000).contains(bitrateKbps) else {
            throw EncoderError("bitrate \(bitrateKbps) kbit/s is outside 10...100000")
        }
        guard (0...3).contains(vp8Profile) else { throw EncoderError("VP8 profile \(vp8Profile) does not exist (0 to 3)") }
        self.codec = codec
        self.width = width
        self.height = height
        self.bitrateKbps = bitrateKbps
        let status = vpx_codec_enc_config_default(krakl_vpx_encoder_iface(codec.libvpxNumber), &config, 0)
        guard status == VPX_CODEC_OK else { throw EncoderError("libvpx has no default \(codec) configuration: \(Self.text(status))") }

        let cores = max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))
        config.g_w = UInt32(width)
        config.g_h = UInt32(height)
        config.g_threads = UInt32(threads > 0 ? threads : (width * height >= 1280 * 720 && cores >= 4 ? 2 : 1))
        config.g_timebase = vpx_rational(num: 1, den: 90_000) // RTP's video clock
        config.g_lag_in_frames = 0                       // realtime: every frame out at once
        if codec == .vp8 { config.g_profile = UInt32(vp8Profile) }
        config.g_error_resilient = vpx_codec_er_flags_t(VPX_ERROR_RESILIENT_DEFAULT) // a lost packet spoils less
        config.rc_end_usage = VPX_CBR
        config.rc_target_bitrate = UInt32(bitrateKbps)
        config.rc_min_quantizer = codec == .vp8 ? 2 : 4  // text stays sharp on a static screen
        config.rc_max_quantizer = 56
        config.rc_undershoot_pct = 100
        config.rc_overshoot_pct = 15
        // Buffer model, ms. libwebrtc's 500/600/1000 left text stuck near the
        // coarse first frame (typing at 1080p, 2.5 Mbit/s: 53 dB PSNR); from
        // 1500 ms on the same run reaches 63.6 dB at the same bitrate, and
        // 1 Mbit/s scrolling stays within +10 % of target.
        config.rc_buf_initial_sz = 1500
        config.rc_buf_optimal_sz = 2000
        config.rc_buf_sz = 2500
        // Over budget, libvpx may drop a frame rather than overshoot (as
        // libwebrtc allows for screen sharing); the pipeline carries a dropped
        // frame's damage into the next one.
        config.rc_dropframe_thresh = 0
        config.kf_mode = VPX_KF_DISABLED                 // keyframes on request only
        config.g_pass = VPX_RC_ONE_PASS

        krakl_vpx_zero_fill_forget()
        let initStatus = krakl_vpx_encoder_init(&context, codec.libvpxNumber, &config)
        guard initStatus == VPX_CODEC_OK else { throw EncoderError("libvpx could not start a \(codec) encoder for \(width)x\(height): \(Self.text(initStatus))") }
        if codec == .vp8 && releasesTokenPages {
            // vp8_alloc_compressor_data: mb_rows × mb_cols × 24 blocks × 16 tokens of 16 bytes (TOKENEXTRA).
            let bytes = BlockGrid(width: width, height: height).count * 24 * 16 * 16
            tokenBuffer = krakl_vpx_zero_fill_take(bytes).map { UnsafeMutableRawBufferPointer(start: $0, count: bytes) }
        }

        // Keyframe size cap, as a share of a frame's average budget: libwebrtc's
        // formula 0.5 * optimal buffer (ms) * fps / 10.
        let maxIntraPct = Int32(max(300, Double(config.rc_buf_optimal_sz) * 0.5 * fps / 10))
        switch codec {
        case .vp8:
            try control(Int32(VP8E_SET_CPUUSED.rawValue), -6)
            try control(Int32(VP8E_SET_SCREEN_CONTENT_MODE.rawValue), 2)  // screen content, stricter rate control
            try control(Int32(VP8E_SET_STATIC_THRESHOLD.rawValue), 100)   // skip blocks that barely changed
            try control(Int32(VP8E_SET_NOISE_SENSITIVITY.rawValue), 0)
            try control(Int32(VP8E_SET_TOKEN_PARTITIONS.rawValue), Int32(VP8_ONE_TOKENPARTITION.rawValue))
            try control(Int32(VP8E_SET_MAX_INTRA_BITRATE_PCT.rawValue), maxIntraPct)
        case .vp9:
            try control(Int32(VP8E_SET_CPUUSED.rawValue), 7)
            try control(Int32(VP9E_SET_TUNE_CONTENT.rawValue), Int32(VP9E_CONTENT_SCREEN.rawValue))
            try control(Int32(VP9E_SET_AQ_MODE.rawValue), 3)              // cyclic refresh
            try control(Int32(VP8E_SET_STATIC_THRESHOLD.rawValue), 1)
            try control(Int32(VP9E_SET_ROW_MT.rawValue), 1)
            try control(Int32(VP9E_SET_TILE_COLUMNS.rawValue), width >= 1280 ? 2 : 0)
            try control(Int32(VP9E_SET_NOISE_SENSITIVITY.rawValue), 0)
            try control(Int32(VP8E_SET_MAX_INTRA_BITRATE_PCT.rawValue), maxIntraPct)
        }
        vpx_img_wrap(&image, VPX_IMG_FMT_I420, UInt32(width), UInt32(height), 1, UnsafeMutablePointer<UInt8>(bitPattern: 1))
    }

    deinit { vpx_codec_destroy(&context) }

    private func control(_ id: Int32, _ value: Int32) throws(EncoderError) {
        let status = krakl_vpx_control_int(&context, id, value)
        guard status == VPX_CODEC_OK else { throw EncoderError("libvpx rejected control \(id)=\(value): \(Self.text(status))") }
    }

    static func text(_ status: vpx_codec_err_t) -> String { String(cString: vpx_codec_err_to_string(status)) }

    /// Changes the target bitrate for the frames that follow.
    func setBitrate(kbps: Int) throws(EncoderError) {
        guard kbps != bitrateKbps else { return }
        config.rc_target_bitrate = UInt32(max(10, kbps))
        let status = vpx_codec_enc_config_set(&context, &config)
        guard status == VPX_CODEC_OK else { throw EncoderError("libvpx refused bitrate \(kbps) kbit/s: \(Self.text(status))") }
        bitrateKbps = kbps
    }

    /// The quantizer libvpx chose for the last frame, 0 (finest) to 63 (`rc_max_quantizer` is 56).
    /// A refresh pass that comes out near the floor means the picture has converged: another pass
    /// would re-send what the receiver already has.
    func lastQuantizer() -> Int? {
        var quantizer: Int32 = -1
        guard krakl_vpx_last_quantizer(&context, &quantizer) == VPX_CODEC_OK, quantizer >= 0 else { return nil }
        return Int(quantizer)
    }

    /// Encodes `picture`. `activeMap` (one byte per 16×16 block, 1 = changed)
    /// limits the work to changed blocks; nil encodes every block.
    func encode(_ picture: I420Image, pts: Int64, duration: UInt, keyframe: Bool, activeMap: [UInt8]?) throws(EncoderError) -> [(data: [UInt8], keyframe: Bool)] {
        precondition(picture.width == width && picture.height == height)
        let grid = BlockGrid(width: width, height: height)
        let rows = UInt32(grid.rows), cols = UInt32(grid.columns)
        var status: vpx_codec_err_t
        if var map = activeMap, !keyframe {
            status = map.withUnsafeMutableBufferPointer { krakl_vpx_set_active_map(&context, $0.baseAddress, rows, cols) }
        } else {
            status = krakl_vpx_set_active_map(&context, nil, rows, cols)
        }
        guard status == VPX_CODEC_OK else { throw EncoderError("libvpx refused the active map: \(Self.text(status))") }

        image.planes.0 = picture.y
        image.planes.1 = picture.u
        image.planes.2 = picture.v
        image.stride.0 = Int32(picture.strideY)
        image.stride.1 = Int32(picture.strideUV)
        image.stride.2 = Int32(picture.strideUV)
        let flags: vpx_enc_frame_flags_t = keyframe ? vpx_enc_frame_flags_t(VPX_EFLAG_FORCE_KF) : 0
        status = vpx_codec_encode(&context, &image, pts, UInt(max(1, duration)), flags, UInt(VPX_DL_REALTIME))
        guard status == VPX_CODEC_OK else {
            let detail = vpx_codec_error_detail(&context).map { String(cString: $0) } ?? ""
            throw EncoderError("libvpx could not encode a frame: \(Self.text(status)) \(detail)")
        }
        var packets: [(data: [UInt8], keyframe: Bool)] = []
        var iterator: vpx_codec_iter_t?
        while let packet = vpx_codec_get_cx_data(&context, &iterator) {
            guard packet.pointee.kind == VPX_CODEC_CX_FRAME_PKT else { continue }
            let frame = packet.pointee.data.frame
            let bytes = UnsafeRawBufferPointer(start: frame.buf, count: frame.sz)
            packets.append((Array(bytes), (frame.flags & UInt32(VPX_FRAME_IS_KEY)) != 0))
        }
        framesSinceTokenRelease += 1
        if packets.reduce(0, { $0 + $1.data.count }) >= Self.tokenReleaseBytes || framesSinceTokenRelease >= Self.tokenReleaseFrames {
            releaseTokenPages()
        }
        return packets
    }

    /// Gives the token buffer's whole pages back (see `tokenBuffer`): after a large frame, and when
    /// the pipeline's refinement of a still picture is done (its passes encode every block).
    func releaseTokenPages() {
        guard let tokenBuffer, let base = tokenBuffer.baseAddress else { return }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = (Int(bitPattern: base) + page - 1) / page * page
        let end = (Int(bitPattern: base) + tokenBuffer.count) / page * page
        guard end > start, madvise(UnsafeMutableRawPointer(bitPattern: start), end - start, MADV_DONTNEED) == 0 else { return }
        tokenReleases += 1
        framesSinceTokenRelease = 0
    }
}
