#!/usr/bin/env python3
"""An independent WebRTC viewer that OFFERS (aiortc 1.16), for krakl's answering publisher.

The mirror of aiortc_receiver.py (whose stamp reader it uses): here aiortc is the offerer, as a
browser opening a WHEP viewer is, and krakl answers.

Protocol on stdin/stdout:
  1. prints the offer SDP (a recvonly video transceiver; with --audio also a recvonly audio one,
     with --datachannel also a data channel; ICE candidates included), then an empty line;
  2. reads the answer SDP from stdin, up to an empty line;
  3. receives and decodes video until the track ends (DTLS close), stdin reaches its end, or
     --seconds pass;
  4. prints one line: {"report": {...}} (frames decoded, stamps read, first/last stamp, ...).

Run it with /opt/krakl-venv/bin/python, inside a network namespace with 127.0.0.2 (aioice drops
127.0.0.1 from its host candidates).
"""
import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aiortc_receiver import collect_stamped_frames, read_stdin_block  # noqa: E402

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--audio", action="store_true", help="also offer to receive audio (krakl must reject it)")
    parser.add_argument("--datachannel", action="store_true", help="also offer a data channel (krakl must reject it)")
    args = parser.parse_args()

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    # Audio after video: aiortc bundles on the first m-section and does not move the BUNDLE tag when
    # an answer rejects it (RFC 8843 §7.3.3), so a rejected first section would leave it without a
    # transport. Browsers do move it; the audio-first shape is covered by RTCSdpAnswerTests.
    if args.audio:
        pc.addTransceiver("audio", direction="recvonly")
    if args.datachannel:
        pc.createDataChannel("chat")
    frames = []  # (arrival ms, stamp frame number or None, width, height)
    track_ended = asyncio.Event()
    started = time.monotonic()
    states = []

    @pc.on("connectionstatechange")
    def on_state():
        states.append([round((time.monotonic() - started) * 1000, 1), pc.connectionState])

    @pc.on("track")
    def on_track(track):
        if track.kind == "video":
            asyncio.ensure_future(collect_stamped_frames(track, frames, track_ended))

    await pc.setLocalDescription(await pc.createOffer())
    sys.stdout.write(pc.localDescription.sdp.replace("\r\n", "\n").rstrip("\n") + "\n\n")
    sys.stdout.flush()

    answer = await read_stdin_block(reader)
    error = None
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    except Exception as e:  # report it rather than die: the test prints it
        error = "%s: %s" % (type(e).__name__, e)

    if error is None:
        stdin_closed = asyncio.ensure_future(reader.read())
        ended = asyncio.ensure_future(track_ended.wait())
        await asyncio.wait([stdin_closed, ended], timeout=args.seconds, return_when=asyncio.FIRST_COMPLETED)
    await pc.close()

    stamps = [f[1] for f in frames if f[1] is not None]
    report = {
        "error": error,
        "frames_decoded": len(frames),
        "stamps_read": len(stamps),
        "distinct_stamps": len(set(stamps)),
        "first_stamp": stamps[0] if stamps else None,
        "last_stamp": stamps[-1] if stamps else None,
        "decreasing": sum(1 for a, b in zip(stamps, stamps[1:]) if b < a),
        "sizes": sorted({"%dx%d" % (f[2], f[3]) for f in frames}),
        "states": states,
        "track_ended": track_ended.is_set(),
    }
    print(json.dumps({"report": report}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
