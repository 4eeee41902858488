#!/usr/bin/env python3
"""A person in the room for `krakl-bench roomshare`: waits until --display
publishes in the Janus VideoRoom, subscribes with aiortc, decodes --seconds
of video and prints one JSON line:

  listed_ms, first_frame_ms   CLOCK_MONOTONIC ms (the bench's clock too)
  frames, stamps              decoded frames; distinct frame stamps read
  latency_ms                  draw -> decoded for each distinct stamp, in order,
                              with the stamp's draw time (ms after the first frame)
  bytes, bytes_steady, steady_seconds
                              bytes received on the transport (RTP, RTCP, DTLS) in all, and from 2 s after
                              the first frame to the end (and that span)
  sizes                       decoded frame sizes seen, with their counts

With --samples PATH: from 2 s after the first frame, every 0.5 s, the frame
on show (the last decoded) is kept, once however often it is on show; at the
end their luma planes (--sample-size, scaled to it when the publisher sent
another size) are written to PATH one after another, and the report gets
  samples                     [[ms after the first frame, plane index in PATH,
                              frame number of its stamp or null], ...]
for the bench to judge against the picture as drawn (bench/xroom.c
--reference). Copies only during the session; the file is written after it.

Run with /opt/krakl-venv/bin/python (aiortc); the fixtures' Janus helpers and
stamp reader are reused.
"""
import argparse
import asyncio
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "Tests", "Fixtures"))
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.mediastreams import MediaStreamError  # noqa: E402
from aiortc_receiver import read_stamp  # noqa: E402
from janus_room import Handle  # noqa: E402


async def bytes_received(pc):
    # The transport's bytes: aiortc's inbound-rtp stats count packets only.
    return sum(stat.bytesReceived for stat in (await pc.getStats()).values() if stat.type == "transport")


def luma(frame, size):
    """The luma plane of `frame` as width x height bytes (no row padding), scaled to `size` if it differs."""
    width, height = size
    if (frame.width, frame.height) != size:
        frame = frame.reformat(width=width, height=height, format="yuv420p")
    plane = frame.planes[0]
    data = bytes(plane)
    if plane.line_size == width:
        return data[:width * height]
    return b"".join(data[row * plane.line_size:row * plane.line_size + width] for row in range(height))


async def watch(room, publisher_id, seconds, handle, sample_size):
    loop = asyncio.get_running_loop()
    frames = []
    sizes = {}
    on_show = [None]          # the last decoded frame
    samples, planes = [], []  # (ms after the first frame, plane index); the kept planes
    subscriber = await loop.run_in_executor(None, Handle)
    subscriber.message({"request": "join", "room": room, "ptype": "subscriber", "streams": [{"feed": publisher_id}]})
    attached = await loop.run_in_executor(None, subscriber.wait_event, lambda e: "jsep" in e)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    ended = asyncio.Event()

    async def collect(track):
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic() * 1000
                if not frames:
                    print(json.dumps({"first_frame_ms": now}), flush=True)   # the bench starts its window from here
                plane = frame.planes[0]
                frames.append((now, read_stamp(bytes(plane), plane.line_size, frame.width, frame.height)))
                on_show[0] = frame
                size = "%dx%d" % (frame.width, frame.height)
                sizes[size] = sizes.get(size, 0) + 1
        except MediaStreamError:
            pass
        finally:
            ended.set()

    @pc.on("track")
    def on_track(track):
        if track.kind == "video":
            asyncio.ensure_future(collect(track))

    await pc.setRemoteDescription(RTCSessionDescription(sdp=attached["jsep"]["sdp"], type="offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    subscriber.message({"request": "start"}, jsep={"type": "answer", "sdp": pc.localDescription.sdp})
    end = time.monotonic() + seconds
    steady_bytes, steady_at = None, None
    kept, next_sample = None, None
    while time.monotonic() < end and not ended.is_set():
        await asyncio.sleep(0.1)
        if steady_at is None and frames and time.monotonic() * 1000 >= frames[0][0] + 2000:
            steady_bytes, steady_at = await bytes_received(pc), time.monotonic()
            next_sample = steady_at
        if sample_size and next_sample is not None and time.monotonic() >= next_sample:
            next_sample += 0.5
            if on_show[0] is not kept:
                kept = on_show[0]
                planes.append(luma(kept, sample_size))
            samples.append((round(time.monotonic() * 1000 - frames[0][0]), len(planes) - 1))
    total = await bytes_received(pc)
    finished = time.monotonic()
    await pc.close()
    subscriber.keepalive()
    return (frames, sizes, samples, planes, total, (total - steady_bytes if steady_bytes is not None else None),
            (finished - steady_at if steady_at else None))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", type=int, required=True)
    parser.add_argument("--display", required=True)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--samples", help="write sampled luma planes here (see above)")
    parser.add_argument("--sample-size", default="1920x1080")
    args = parser.parse_args()
    sample_size = tuple(int(v) for v in args.sample_size.split("x")) if args.samples else None
    handle = Handle()
    print(json.dumps({"waiting": True}), flush=True)
    listed = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not listed:
        participants = handle.request({"request": "listparticipants", "room": args.room}).get("participants", [])
        listed = [p for p in participants if p.get("display") == args.display and p.get("publisher")]
        if not listed:
            time.sleep(0.02)
    report = {"listed_ms": time.monotonic() * 1000 if listed else None}
    if listed:
        frames, sizes, samples, planes, total, steady, span = asyncio.run(watch(args.room, listed[0]["id"], args.seconds, handle, sample_size))
        first = frames[0][0] if frames else None
        seen, latency = set(), []
        for at, stamp in frames:
            if stamp and stamp[0] not in seen:
                seen.add(stamp[0])
                delay = (int(at) - stamp[1]) % (1 << 32)   # stamps hold CLOCK_MONOTONIC ms modulo 2^32
                latency.append((round(at - first), delay if delay < 60_000 else None))
        report.update({"first_frame_ms": first, "frames": len(frames), "stamps": len(seen), "latency_ms": latency,
                       "bytes": total, "bytes_steady": steady, "steady_seconds": span, "sizes": sizes})
        if args.samples:
            with open(args.samples, "wb") as out:
                for plane in planes:
                    out.write(plane)
            stamps = [read_stamp(plane, sample_size[0], sample_size[0], sample_size[1]) for plane in planes]
            report["samples"] = [[at, index, stamps[index][0] if stamps[index] else None] for at, index in samples]
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
