#!/usr/bin/env python3
"""An independent WebRTC receiver for krakl's publisher tests (aiortc 1.16).

Protocol on stdin/stdout (so a test can sit between it and krakl-rtc-probe):
  1. reads the offer SDP from stdin, up to an empty line;
  2. prints the answer SDP (ICE candidates included), then an empty line;
  3. receives and decodes video until the track ends (DTLS close), stdin
     reaches its end, or --seconds pass; prints {"event": "first_frame"} once
     the first frame is decoded;
  4. prints one line: {"report": {...}}.

Each decoded frame's number and capture time are read from the frame stamp
(docs/frame-stamp.md) in the luma plane. With --dump (the encoder's input as
raw I420, krakl-rtc-probe --dump-input), sampled decoded frames are compared
with the source picture carrying the same stamp: PSNR of the luma plane.

Run it with /opt/krakl-venv/bin/python; it needs a non-127.0.0.1 address
(aioice drops 127.0.0.1), e.g. 127.0.0.2 inside a network namespace.
"""
import argparse
import os
import asyncio
import json
import math
import sys
import time

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc import rtcrtpreceiver
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcrtpreceiver import RTCRtpReceiver


class RepairLog:
    """What aiortc did about lost packets, for the report's "repair" object: every NACK it sent (each
    lists every packet it still misses), what arrived, its PLIs and why. Recorded by wrapping aiortc's
    own methods, so it is aiortc's behaviour, not a model of it. Cheap (a few dict updates a packet);
    with KRAKL_AIORTC_PACKET_LOG_DIR=DIR every event is also written to DIR/packets-PID.log at the end,
    one line each (ms since start, then what). "slow_repairs" lists the holes that held frames back for
    more than 200 ms after their first NACK (CLOCK_MONOTONIC ms), with how many NACKs named them: 2 or more means aiortc had to
    ask again (its first NACK, or both resends it brought, were lost), which it does only at a new gap.
    A packet lost on the way (the nftables drop) never shows here: a gap in "arrived" is the loss."""

    def __init__(self):
        self.started = time.monotonic()
        folder = os.environ.get("KRAKL_AIORTC_PACKET_LOG_DIR")
        self.path = os.path.join(folder, "packets-%d.log" % os.getpid()) if folder else None
        self.lines = [] if self.path else None
        self.arrived = set()          # media sequence numbers that arrived (directly or as RTX)
        self.highest = None           # the newest media sequence number seen
        self.nacked = {}              # sequence number -> how many NACKs named it
        self.first_nack = {}          # sequence number -> when a NACK first named it (CLOCK_MONOTONIC ms)
        self.slow = []                # [seq, first NACK ms, arrived ms, NACKs naming it] of holes that held frames back
        self.arrived_nacked = set()   # NACKed packets that came
        self.nacks = 0
        self.rtx = 0
        self.rtx_duplicates = 0       # RTX of a packet that had already arrived
        self.plis = {"jitter_reset": 0, "jitter_overflow": 0, "decode_error": 0}
        self.jitter_pli = False

    def event(self, *fields):
        if self.lines is not None:
            self.lines.append("%.1f %s" % ((time.monotonic() - self.started) * 1000, " ".join(str(f) for f in fields)))

    def install(self):
        log = self
        unwrap = rtcrtpreceiver.unwrap_rtx
        def logged_unwrap(rtx, payload_type, ssrc):
            packet = unwrap(rtx, payload_type, ssrc)
            log.rtx += 1
            if packet.sequence_number in log.arrived:
                log.rtx_duplicates += 1
            log.event("rtx", rtx.sequence_number, "osn", packet.sequence_number)
            return packet
        rtcrtpreceiver.unwrap_rtx = logged_unwrap

        send_nack = RTCRtpReceiver._send_rtcp_nack
        async def logged_nack(self, media_ssrc, lost):
            log.nacks += 1
            now = time.monotonic() * 1000
            for seq in lost:
                log.nacked[seq] = log.nacked.get(seq, 0) + 1
                log.first_nack.setdefault(seq, now)
            log.event("nack", ",".join(str(s) for s in lost))
            return await send_nack(self, media_ssrc, lost)
        RTCRtpReceiver._send_rtcp_nack = logged_nack

        send_pli = RTCRtpReceiver._send_rtcp_pli
        async def logged_pli(self, media_ssrc):
            # The jitter buffer's reason was noted just before; otherwise it was a frame the decoder refused.
            if not log.jitter_pli:
                log.plis["decode_error"] += 1
                log.event("pli", "decode_error")
            log.jitter_pli = False
            return await send_pli(self, media_ssrc)
        RTCRtpReceiver._send_rtcp_pli = logged_pli

        add = JitterBuffer.add
        def logged_add(self, packet):
            if self._is_video:
                log.arrived.add(packet.sequence_number)
                if log.highest is None or 0 < ((packet.sequence_number - log.highest) & 0xFFFF) < 0x8000:
                    log.highest = packet.sequence_number
                seq = packet.sequence_number
                if seq in log.first_nack and seq not in log.arrived_nacked:
                    # A hole filled: aiortc hands frames on strictly in order, so everything behind it waited
                    # from its first NACK on. Kept when that took longer than a resend (200 ms).
                    log.arrived_nacked.add(seq)
                    now = time.monotonic() * 1000
                    if now - log.first_nack[seq] > 200:
                        log.slow.append([seq, round(log.first_nack[seq], 1), round(now, 1), log.nacked[seq]])
                origin = self._origin
                pli, frame = add(self, packet)
                if pli:
                    # aiortc's two reasons (jitterbuffer.py): a packet 100 or more behind the buffer's start
                    # throws the whole buffer away (a reset); a hole that held 512 packets back is dropped
                    # with its frames (an overflow).
                    behind = (origin - packet.sequence_number) & 0xFFFF
                    reason = "jitter_reset" if behind < ((packet.sequence_number - origin) & 0xFFFF) else "jitter_overflow"
                    log.plis[reason] += 1
                    log.jitter_pli = True
                    log.event("pli", reason, "origin", origin, "seq", packet.sequence_number)
                if frame is not None:
                    log.event("frame", frame.timestamp)
                return pli, frame
            return add(self, packet)
        JitterBuffer.add = logged_add

    def packet(self, packet):
        self.event("rtp", packet.ssrc, packet.payload_type, packet.sequence_number, packet.timestamp)

    def report(self):
        never = sorted(s for s in self.nacked if s not in self.arrived)
        # aiortc's NackGenerator stops asking for a packet once the newest is 128 (RTP_HISTORY_SIZE) past it;
        # its jitter buffer then waits for 512 newer packets and asks for a keyframe: a stall of seconds.
        forgotten = [s for s in never if self.highest is not None and ((self.highest - s) & 0xFFFF) >= 128]
        # Packets lost together are named by the same NACKs and forgotten together: one event.
        forgotten_events = len({round(self.first_nack[s], 1) for s in forgotten})
        if self.lines is not None:
            with open(self.path, "w") as out:
                out.write("\n".join(self.lines) + "\n")
        return {
            "nacks_sent": self.nacks,
            "packets_nacked": len(self.nacked),
            "nacked_again": sum(1 for n in self.nacked.values() if n > 1),
            "nacked_never_arrived": never,
            "forgotten": forgotten,
            "forgotten_events": forgotten_events,
            "slow_repairs": self.slow,
            "rtx_received": self.rtx,
            "rtx_duplicates": self.rtx_duplicates,
            "plis_sent": self.plis,
            "log": self.path,
        }


async def collect_stamped_frames(track, frames, ended):
    """Appends (monotonic ms, stamp or None, width, height) for each decoded frame of `track`
    until it ends, then sets `ended` (asyncio.Event). The subscribers and the offerer share it."""
    try:
        while True:
            frame = await track.recv()
            plane = frame.planes[0]
            stamp = read_stamp(bytes(plane), plane.line_size, frame.width, frame.height)
            frames.append((time.monotonic() * 1000, stamp[0] if stamp else None, frame.width, frame.height))
    except MediaStreamError:
        pass
    finally:
        ended.set()


def read_stamp(plane, stride, width, height):
    """The (frame number, capture ms) of a stamped luma plane, or None."""
    per_row = width // 16
    if per_row == 0:
        return None
    bits = []
    for i in range(74):
        x = (i % per_row) * 16 + 4
        y = (i // per_row) * 16 + 4
        if y + 8 > height:
            return None
        total = 0
        for row in range(y, y + 8):
            start = row * stride + x
            total += sum(plane[start:start + 8])
        bits.append(1 if total / 64 >= 128 else 0)
    if bits[0] != 1 or bits[1] != 0:
        return None
    values = []
    for b in range(9):
        v = 0
        for bit in bits[2 + b * 8:10 + b * 8]:
            v = (v << 1) | bit
        values.append(v)
    crc = 0
    for byte in values[:8]:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    if crc != values[8]:
        return None
    word = lambda o: (values[o] << 24) | (values[o + 1] << 16) | (values[o + 2] << 8) | values[o + 3]
    return word(0), word(4)


def psnr(a, b):
    n = min(len(a), len(b))
    if n == 0:
        return None
    se = 0
    for x, y in zip(a[:n], b[:n]):
        d = x - y
        se += d * d
    if se == 0:
        return 99.0
    return 10 * math.log10(255 * 255 / (se / n))


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def read_stdin_block(reader):
    lines = []
    while True:
        line = await reader.readline()
        if not line:
            break
        text = line.decode().rstrip("\r\n")
        if not text.strip():
            if lines:
                break
            continue
        lines.append(text)
    return "\r\n".join(lines) + "\r\n"


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--dump", help="raw I420 frames the encoder saw (for PSNR)")
    parser.add_argument("--psnr-every", type=int, default=15, help="compare every Nth decoded frame")
    args = parser.parse_args()
    if os.environ.get("KRAKL_AIORTC_LOG_DIR"):  # for investigating a session: aiortc's own debug log
        import logging
        logging.basicConfig(filename=os.path.join(os.environ["KRAKL_AIORTC_LOG_DIR"], f"aiortc-{os.getpid()}.log"),
                            level=logging.DEBUG, format="%(relativeCreated)d %(name)s %(message)s")

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    offer = await read_stdin_block(reader)
    # When each frame's last packet came in (RTX included), by RTP timestamp: aiortc's jitter buffer
    # hands a frame to the decoder only once a packet of the next frame arrives, so the decoded time
    # includes that wait; this separates it (the sender's side ends when the frame is complete here).
    # Decoded frames carry the RTP timestamp minus the first one (aiortc's TimestampMapper) as pts.
    last_packet = {}
    first_timestamp = []
    handle_rtp = RTCRtpReceiver._handle_rtp_packet

    repair = RepairLog()
    repair.install()

    async def recording_handle_rtp(self, packet, arrival_time_ms):
        repair.packet(packet)
        if not first_timestamp:
            first_timestamp.append(packet.timestamp)
        last_packet[packet.timestamp] = time.monotonic() * 1000
        return await handle_rtp(self, packet, arrival_time_ms)

    RTCRtpReceiver._handle_rtp_packet = recording_handle_rtp

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    frames = []          # (arrival ms, stamp frame number or None, capture ms or None, width, height, complete ms or None)
    samples = []         # (stamp, width, height, luma bytes) for PSNR
    track_ended = asyncio.Event()
    started = time.monotonic()
    states = []

    @pc.on("connectionstatechange")
    def on_state():
        states.append([round((time.monotonic() - started) * 1000, 1), pc.connectionState])

    async def consume(track):
        try:
            while True:
                frame = await track.recv()
                arrival = time.monotonic() * 1000
                plane = frame.planes[0]
                luma = bytes(plane)
                stamp = read_stamp(luma, plane.line_size, frame.width, frame.height)
                complete = last_packet.get((frame.pts + first_timestamp[0]) % (1 << 32)) if first_timestamp and frame.pts is not None else None
                frames.append((arrival, stamp[0] if stamp else None, stamp[1] if stamp else None, frame.width, frame.height,
                               round(complete, 1) if complete is not None else None))
                if len(frames) == 1:
                    # For a test that starts its faults once a picture is up (RTCPublisherTests' loss cases).
                    print(json.dumps({"event": "first_frame"}), flush=True)
                if args.dump and stamp and len(frames) % args.psnr_every == 1:
                    # Packed luma rows (the decoder's stride may be wider than the picture).
                    packed = b"".join(luma[r * plane.line_size:r * plane.line_size + frame.width] for r in range(frame.height))
                    samples.append((stamp[0], frame.width, frame.height, packed))
        except MediaStreamError:
            pass
        finally:
            track_ended.set()

    @pc.on("track")
    def on_track(track):
        if track.kind == "video":
            asyncio.ensure_future(consume(track))

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    answer = await pc.createAnswer()
    await pc.setLocalDescription(answer)
    sys.stdout.write(pc.localDescription.sdp.replace("\r\n", "\n").rstrip("\n") + "\n\n")
    sys.stdout.flush()

    stdin_closed = asyncio.ensure_future(reader.read())
    ended = asyncio.ensure_future(track_ended.wait())
    await asyncio.wait([stdin_closed, ended], timeout=args.seconds, return_when=asyncio.FIRST_COMPLETED)
    await pc.close()

    stamps = [f[1] for f in frames if f[1] is not None]
    decreasing = sum(1 for a, b in zip(stamps, stamps[1:]) if b < a)
    arrivals = [f[0] for f in frames]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    latencies = []
    for arrival, _, capture, _, _, _ in frames:
        if capture is not None:
            latency = (int(arrival) - capture) % (1 << 32)
            if latency < 10_000:
                latencies.append(latency)
    report = {
        "frames_decoded": len(frames),
        "stamps_read": len(stamps),
        "distinct_stamps": len(set(stamps)),
        "first_stamp": stamps[0] if stamps else None,
        "last_stamp": stamps[-1] if stamps else None,
        "decreasing": decreasing,
        "sizes": sorted({"%dx%d" % (f[3], f[4]) for f in frames}),
        "max_gap_ms": max(gaps) if gaps else None,
        "latency_ms_p50": percentile(latencies, 50),
        "latency_ms_p99": percentile(latencies, 99),
        "states": states,
        "track_ended": track_ended.is_set(),
        # [decoded ms, stamp frame number, stamp capture ms, last packet ms] per decoded frame
        # (CLOCK_MONOTONIC; capture mod 2^32)
        "arrivals": [[round(f[0], 1), f[1], f[2], f[5]] for f in frames],
        "repair": repair.report(),
    }
    if args.dump and samples:
        scores = []
        try:
            with open(args.dump, "rb") as dump:
                data = dump.read()
            width, height = samples[0][1], samples[0][2]
            size = width * height + 2 * ((width + 1) // 2) * ((height + 1) // 2)
            source = {}
            for offset in range(0, len(data) - size + 1, size):
                luma = data[offset:offset + width * height]
                stamp = read_stamp(luma, width, width, height)
                if stamp:
                    source.setdefault(stamp[0], luma)
            for stamp, w, h, luma in samples:
                if stamp in source and w == width and h == height:
                    scores.append(psnr(luma, source[stamp]))
        except OSError as error:
            report["psnr_error"] = str(error)
        scores = [s for s in scores if s is not None]
        report["psnr_samples"] = len(scores)
        report["psnr_y_min"] = min(scores) if scores else None
        report["psnr_y_mean"] = sum(scores) / len(scores) if scores else None
    print(json.dumps({"report": report}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
