#!/usr/bin/env python3
"""A standard WHEP player that is not krakl's page: aiortc 1.16 speaking plain HTTP.

draft-ietf-wish-whep as any player does it: POST the recvonly offer (Content-Type
application/sdp, all candidates included, optional Bearer token) to the endpoint, take the
201's answer and Location, decode the video for --seconds, then DELETE the Location.
It knows nothing of krakl beyond the endpoint's URL; the frame stamp (docs/frame-stamp.md)
is read from each decoded frame to show the video advances.

usage: whep_player.py ENDPOINT [--token T] [--seconds S]
Prints one line: {"report": {...}}. Exit 0 when the session ran (the test judges the numbers),
1 when the POST was refused (the status and body are in the report).

Run it with /opt/krakl-venv/bin/python inside a network namespace with 127.0.0.2 (aioice drops
127.0.0.1 from its host candidates; docs/testing.md, "aiortc").
"""
import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aiortc_receiver import collect_stamped_frames  # noqa: E402

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402


def http(method, url, token, body=None, content_type=None):
    """(status, headers, body text) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=body.encode() if body is not None else None, method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode(errors="replace")


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--token")
    parser.add_argument("--seconds", type=float, default=3)
    args = parser.parse_args()

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    frames = []  # (arrival ms, stamp frame or None, width, height)
    started = time.monotonic()
    states = []

    @pc.on("connectionstatechange")
    def on_state():
        states.append([round((time.monotonic() - started) * 1000, 1), pc.connectionState])

    track_ended = asyncio.Event()

    @pc.on("track")
    def on_track(track):
        if track.kind == "video":
            asyncio.ensure_future(collect_stamped_frames(track, frames, track_ended))

    await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers before it returns
    loop = asyncio.get_running_loop()
    status, headers, body = await loop.run_in_executor(
        None, http, "POST", args.endpoint, args.token, pc.localDescription.sdp, "application/sdp")
    report = {"post_status": status, "content_type": headers.get("Content-Type"), "location": headers.get("Location"),
              "etag": headers.get("ETag")}
    if status != 201:
        report["body"] = body.strip()[:300]
        await pc.close()
        print(json.dumps({"report": report}), flush=True)
        sys.exit(1)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
    first_frame = None
    deadline = time.monotonic() + args.seconds + 10
    # Up to 10 s to the first frame, then --seconds of video.
    while time.monotonic() < deadline:
        if frames and first_frame is None:
            first_frame = time.monotonic()
            deadline = first_frame + args.seconds
        await asyncio.sleep(0.05)
    # The session's end, as a player ends it: DELETE its resource (relative to the endpoint).
    resource = urllib.parse.urljoin(args.endpoint, headers.get("Location") or "")
    report["delete_status"] = (await loop.run_in_executor(None, http, "DELETE", resource, args.token))[0]
    await pc.close()
    stamps = [f[1] for f in frames if f[1] is not None]
    report.update({
        "first_frame_ms": round((first_frame - started) * 1000, 1) if first_frame else None,
        "frames_decoded": len(frames),
        "stamps_read": len(stamps),
        "distinct_stamps": len(set(stamps)),
        "first_stamp": stamps[0] if stamps else None,
        "last_stamp": stamps[-1] if stamps else None,
        "decreasing": sum(1 for a, b in zip(stamps, stamps[1:]) if b < a),
        "sizes": sorted({"%dx%d" % (f[2], f[3]) for f in frames}),
        "states": states,
    })
    print(json.dumps({"report": report}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
