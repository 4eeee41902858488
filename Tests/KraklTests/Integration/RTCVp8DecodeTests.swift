import Foundation
import Testing
@testable import KraklRTC

/// The VP8 packetizer judged by a real decoder: libvpx frames from
/// krakl-agent's IVF recording are packetized, sent through the RTP codec,
/// reassembled by an independent reading of RFC 7741 §4, and ffmpeg must
/// decode the result to the same pictures as the original file.
@Suite(.serialized, .tags(.integration)) struct RTCVp8DecodeTests {
    struct IvfFile {
        var header: [UInt8]
        var frames: [(pts: UInt64, data: [UInt8])]

        init(_ bytes: [UInt8]) throws {
            try #require(bytes.count >= 32 && Array(bytes[0..<4]) == Array("DKIF".utf8), "not an IVF file")
            let headerSize = Int(bytes[6]) | Int(bytes[7]) << 8
            header = Array(bytes[0..<headerSize])
            frames = []
            var at = headerSize
            while at + 12 <= bytes.count {
                let size = (0..<4).reduce(0) { $0 | Int(bytes[at + $1]) << (8 * $1) }
                let pts = (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[at + 4 + $1]) << (8 * UInt64($1)) }
                try #require(at + 12 + size <= bytes.count, "IVF frame runs past the end")
                frames.append((pts, Array(bytes[(at + 12)..<(at + 12 + size)])))
                at += 12 + size
            }
        }

        var bytes: [UInt8] {
            var out = header
            for f in frames {
                out += (0..<4).map { UInt8(truncatingIfNeeded: f.data.count >> (8 * $0)) }
                out += (0..<8).map { UInt8(truncatingIfNeeded: f.pts >> (8 * UInt64($0))) }
                out += f.data
            }
            return out
        }
    }

    /// RFC 7741 §4.2 read from the spec: X, S and PID in byte 0; I/L/T/K in the extension byte;
    /// a 7- or 15-bit PictureID (M bit), TL0PICIDX, TID/KEYIDX.
    struct BadDescriptor: Error { var why: String }

    static func depacketize(_ payload: [UInt8]) throws -> (start: Bool, partition: Int, pictureID: Int?, data: [UInt8]) {
        func need(_ n: Int) throws { if payload.count < n { throw BadDescriptor(why: "\(payload.count) bytes, descriptor needs \(n)") } }
        try need(1)
        var i = 1
        let x = payload[0] & 0x80 != 0, s = payload[0] & 0x10 != 0, pid = Int(payload[0] & 0x07)
        var pictureID: Int?
        if x {
            try need(i + 1)
            let ext = payload[i]
            i += 1
            if ext & 0x80 != 0 {
                try need(i + 1)
                if payload[i] & 0x80 != 0 {
                    try need(i + 2)
                    pictureID = Int(payload[i] & 0x7F) << 8 | Int(payload[i + 1])
                    i += 2
                } else {
                    pictureID = Int(payload[i])
                    i += 1
                }
            }
            if ext & 0x40 != 0 { i += 1 }
            if ext & 0x30 != 0 { i += 1 }
        }
        try need(i + 1)
        return (s, pid, pictureID, Array(payload[i...]))
    }

    static func frameMD5s(_ path: String) throws -> [String] {
        let result = try Harness.run("/usr/bin/ffmpeg", ["-v", "error", "-i", path, "-f", "framemd5", "-"], timeout: 60)
        try #require(result.status == 0, "ffmpeg could not decode \(path): \(result.stderr)")
        return result.stdout.split(separator: "\n").filter { !$0.hasPrefix("#") }.map(String.init)
    }

    @Test func packetizedRecordingDecodesToTheSamePictures() throws {
        try Harness.requireBuild()
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/ffmpeg"), "ffmpeg is needed (scripts/setup installs it)")
        let dir = try Harness.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let original = dir + "/original.ivf", rebuilt = dir + "/rebuilt.ivf"
        let registry = try Harness.registryForThisBuild(in: dir)
        let run = try Harness.run(Harness.agent, ["--plugins", registry, "--option", "scene=scrolling", "--option", "width=640",
                                                  "--option", "height=360", "--frames", "30", "--keyframe-interval", "1",
                                                  "--record", original, "--quiet"], timeout: 120)
        try #require(run.status == 0, "krakl-agent failed: \(run.stderr)")
        let ivf = try IvfFile(Array(try Data(contentsOf: URL(fileURLWithPath: original))))
        try #require(ivf.frames.count >= 25, "expected about 30 frames, got \(ivf.frames.count)")

        // Small payloads so every frame spans several packets.
        var sender = RtpVideoSender(codec: .vp8, ssrc: 0x1234, payloadType: 96, maxPayloadSize: 300, initialSequenceNumber: 65500,
                                    clock: RtpClock(baseTimestamp: 0xFFFF_0000), initialPictureID: 0x7FF0)
        sender.mid = (1, "0")
        var wire: [[UInt8]] = []
        for (index, frame) in ivf.frames.enumerated() {
            let packets = sender.packets(frame: frame.data, keyframe: frame.data[0] & 1 == 0,
                                         captureNanoseconds: UInt64(index) * 33_333_333, width: 640, height: 360)
            wire += packets.map { $0.serialized() }
        }

        // Receive: parse each datagram, collect frames from S=1 PID=0 to the marker.
        var rebuiltFrames: [[UInt8]] = [], current: [UInt8]? = nil
        var lastSeq: UInt16?, frameTimestamp: UInt32?, pictureIDs: [Int] = []
        for datagram in wire {
            let packet = try RtpPacket(parsing: datagram)
            #expect(packet.serialized().count <= 300 + 12 + 8)
            if let lastSeq { #expect(packet.sequenceNumber == lastSeq &+ 1, "sequence numbers are consecutive") }
            lastSeq = packet.sequenceNumber
            let d = try Self.depacketize(packet.payload)
            if d.start && d.partition == 0 {
                #expect(current == nil, "a new frame starts only after the previous marker")
                current = []
                frameTimestamp = packet.timestamp
                pictureIDs.append(try #require(d.pictureID))
            }
            #expect(packet.timestamp == frameTimestamp, "all packets of a frame share its timestamp")
            current! += d.data
            if packet.marker {
                rebuiltFrames.append(current!)
                current = nil
            }
        }
        #expect(rebuiltFrames.count == ivf.frames.count)
        #expect(pictureIDs == (0..<ivf.frames.count).map { (0x7FF0 + $0) & 0x7FFF })
        var copy = ivf
        copy.frames = zip(ivf.frames, rebuiltFrames).map { ($0.pts, $1) }
        try Data(copy.bytes).write(to: URL(fileURLWithPath: rebuilt))

        let want = try Self.frameMD5s(original), got = try Self.frameMD5s(rebuilt)
        #expect(want.count == ivf.frames.count)
        #expect(got == want)
    }
}
