#!/usr/bin/env python3
"""Janus VideoRoom on behalf of krakl-rtc-probe, with aiortc watching (tests).

Sits where a room driver will sit, speaking Janus's HTTP API (Janus 1.1.2,
http://127.0.0.1:8088/janus, started by scripts/janus-testbed inside a
network namespace that holds 127.0.0.2):

  1. reads the probe's offer SDP from stdin, up to an empty line;
  2. creates a room (realistic bitrate: the stock room caps at 128 kbit/s),
     joins it as a publisher with a display name, sends `publish` with the
     offer, and prints Janus's answer SDP and an empty line;
  3. polls `listparticipants` until the publisher shows up as publishing;
  4. subscribes to it with aiortc (Janus offers, aiortc answers, `start`),
     decodes frames for --seconds, reading each frame's stamp
     (docs/frame-stamp.md);
  5. with --destroy, destroys the room at the end (the publisher then gets
     the room's end: an event and a DTLS close_notify);
  6. prints one line: {"report": {...}}.

Run with /opt/krakl-venv/bin/python (aiortc 1.16).
"""
import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aiortc_receiver import collect_stamped_frames, read_stdin_block  # noqa: E402
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402

BASE = "http://127.0.0.1:8088/janus"


def transaction():
    return "%016x" % random.getrandbits(64)


def post(path, body, timeout=5):
    body = dict(body, transaction=transaction())
    request = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def poll_events(session, timeout=5):
    """One long-poll for a session's events (Janus answers within 30 s or with a keepalive)."""
    with urllib.request.urlopen("%s/%d?maxev=10&rid=%d" % (BASE, session, int(time.time() * 1000)),
                                timeout=timeout + 35) as reply:
        data = json.loads(reply.read())
    return data if isinstance(data, list) else [data]


class Handle:
    """A session with one attached videoroom handle; events collected by long-poll."""

    def __init__(self):
        self.session = post("", {"janus": "create"})["data"]["id"]
        self.handle = post("/%d" % self.session, {"janus": "attach", "plugin": "janus.plugin.videoroom"})["data"]["id"]
        self.events = []

    def request(self, body):
        """A synchronous plugin request (create, listparticipants, destroy...)."""
        reply = post("/%d/%d" % (self.session, self.handle), {"janus": "message", "body": body})
        return reply.get("plugindata", {}).get("data", reply)

    def message(self, body, jsep=None):
        """An asynchronous plugin request: the result arrives as an event."""
        message = {"janus": "message", "body": body}
        if jsep:
            message["jsep"] = jsep
        reply = post("/%d/%d" % (self.session, self.handle), message)
        if reply.get("janus") != "ack":
            raise RuntimeError("Janus refused %s: %s" % (body.get("request"), reply))

    def wait_event(self, predicate, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for event in self.events:
                if predicate(event):
                    self.events.remove(event)
                    return event
            self.events += poll_events(self.session, timeout=max(1, int(deadline - time.monotonic())))
        raise TimeoutError("no matching Janus event within %s s; saw %s" % (seconds, self.events[-5:]))

    def keepalive(self):
        post("/%d" % self.session, {"janus": "keepalive"})


def plugin_data(event):
    return event.get("plugindata", {}).get("data", {})


async def watch_publisher(room, publisher_id, seconds, keepalive_handle):
    """Subscribes to a publisher of `room` through Janus with aiortc and decodes it for `seconds`.
    Returns [(monotonic ms, frame number or None, width, height)] a decoded frame each."""
    loop = asyncio.get_running_loop()
    frames = []
    subscriber = await loop.run_in_executor(None, Handle)
    subscriber.message({"request": "join", "room": room, "ptype": "subscriber",
                        "streams": [{"feed": publisher_id}]})
    attached = await loop.run_in_executor(None, subscriber.wait_event, lambda e: "jsep" in e)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    ended = asyncio.Event()

    @pc.on("track")
    def on_track(track):
        if track.kind == "video":
            asyncio.ensure_future(collect_stamped_frames(track, frames, ended))

    await pc.setRemoteDescription(RTCSessionDescription(sdp=attached["jsep"]["sdp"], type="offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    subscriber.message({"request": "start"}, jsep={"type": "answer", "sdp": pc.localDescription.sdp})
    end = time.monotonic() + seconds
    last_keepalive = time.monotonic()
    while time.monotonic() < end and not ended.is_set():
        await asyncio.sleep(0.25)
        if time.monotonic() - last_keepalive >= 20:  # Janus drops a session after 60 s of silence
            await loop.run_in_executor(None, keepalive_handle.keepalive)
            last_keepalive = time.monotonic()
    await pc.close()
    return frames


def frame_report(frames):
    """The numbers the tests judge a decoded publication by."""
    stamps = [f[1] for f in frames if f[1] is not None]
    return {
        "frames_decoded": len(frames),
        "stamps_read": len(stamps),
        "distinct_stamps": len(set(stamps)),
        "decreasing": sum(1 for a, b in zip(stamps, stamps[1:]) if b < a),
        "sizes": sorted({"%dx%d" % (f[2], f[3]) for f in frames}),
    }


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", type=int, default=random.randint(10_000, 99_999))
    parser.add_argument("--display", default="Krakl's screen")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--destroy", action="store_true", help="destroy the room at the end")
    parser.add_argument("--times", action="store_true", help="also report each decoded frame's monotonic ms (bench/janus_idle.sh)")
    args = parser.parse_args()

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    offer = await read_stdin_block(reader)

    report = {"room": args.room}
    publisher = await loop.run_in_executor(None, Handle)
    created = await loop.run_in_executor(None, publisher.request, {
        "request": "create", "room": args.room, "bitrate": 2_500_000, "publishers": 4, "videocodec": "vp8"})
    report["created"] = created.get("videoroom")
    publisher.message({"request": "join", "room": args.room, "ptype": "publisher", "display": args.display})
    joined = await loop.run_in_executor(None, publisher.wait_event, lambda e: plugin_data(e).get("videoroom") == "joined")
    publisher_id = plugin_data(joined)["id"]
    publisher.message({"request": "publish", "audio": False, "video": True}, jsep={"type": "offer", "sdp": offer})
    answered = await loop.run_in_executor(None, publisher.wait_event, lambda e: "jsep" in e)
    sys.stdout.write(answered["jsep"]["sdp"].replace("\r\n", "\n").rstrip("\n") + "\n\n")
    sys.stdout.flush()
    report["publish_reply"] = plugin_data(answered).get("configured")

    # The publisher shows up in the room once its PeerConnection is up.
    deadline = time.monotonic() + 10
    participants = []
    while time.monotonic() < deadline:
        listed = await loop.run_in_executor(None, publisher.request, {"request": "listparticipants", "room": args.room})
        participants = listed.get("participants", [])
        if any(p.get("id") == publisher_id and p.get("publisher") for p in participants):
            break
        await asyncio.sleep(0.05)
    report["participants"] = participants
    report["publisher_listed"] = any(p.get("id") == publisher_id and p.get("publisher") for p in participants)

    frames = []
    if report["publisher_listed"]:
        frames = await watch_publisher(args.room, publisher_id, args.seconds, publisher)

    if args.destroy:
        destroyed = await loop.run_in_executor(None, publisher.request, {"request": "destroy", "room": args.room})
        report["destroyed"] = destroyed.get("videoroom")

    report.update(frame_report(frames))
    if args.times:
        report["decoded_ms"] = [f[0] for f in frames]
    print(json.dumps({"report": report}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
