#!/usr/bin/env python3
"""The conference's side of a Janus VideoRoom, for the agent's room tests.

What a conference backend and a person in the room do, through Janus's
HTTP API (http://127.0.0.1:8088/janus inside the test's namespace):

  create --room R --secret S              make a room (realistic bitrate)
  watch --room R --display D --seconds N  wait until D publishes, subscribe
                                          with aiortc, decode N s of frames
                                          (reports when D was listed and when
                                          the first frame was decoded)
  end --room R --secret S --how destroy|kick [--display D]
                                          end the meeting, or remove D
  gone --room R --display D               wait until D left the room (polls
                                          every 50 ms; reports when it saw it)
  ice --room R --display D                what Janus's own ICE agent got from D's
                                          publisher handle (admin API, port 7088):
                                          the remote candidates trickled to it,
                                          whether the end of candidates came
                                          (all-trickles), and the selected pair

Each prints one JSON line. Run with /opt/krakl-venv/bin/python (aiortc).
A request Janus refuses (room exists: 427, wrong secret: 433, no such room:
426, …) ends it with exit status 1 and Janus's error in the line.
"""
import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from janus_room import Handle, frame_report, watch_publisher  # noqa: E402


def participants(handle, room):
    return handle.request({"request": "listparticipants", "room": room}).get("participants", [])


def wait_for(predicate, seconds):
    """Polls `predicate` (bounded); returns its last truthy value or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


def refused(reply):
    """Janus's error of a plugin reply (`error_code`, `error`), or None."""
    if isinstance(reply, dict) and "error_code" in reply:
        return {"error_code": reply["error_code"], "error": reply.get("error", "")}
    return None


ADMIN = "http://127.0.0.1:7088/admin"


def admin(path, body):
    """One admin/monitor API request (the testbed enables it on loopback with Janus's stock secret)."""
    body = dict(body, transaction="krakl-%d" % time.monotonic_ns(), admin_secret="janusoverlord")
    request = urllib.request.Request(ADMIN + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.loads(reply.read())


def publisher_ice(room, display):
    """The ICE side of the handle that publishes as `display` in `room`, as Janus reports it."""
    for session in admin("", {"janus": "list_sessions"}).get("sessions", []):
        for handle in admin("/%d" % session, {"janus": "list_handles"}).get("handles", []):
            info = admin("/%d/%d" % (session, handle), {"janus": "handle_info"}).get("info", {})
            specific = info.get("plugin_specific", {})
            if specific.get("type") != "publisher" or specific.get("room") != room or specific.get("display") != display:
                continue
            # Janus 1.x: info.webrtc.ice is the (bundled) session's one ICE component.
            ice = info.get("webrtc", {}).get("ice", {})
            return {"found": True, "flags": info.get("flags", {}),
                    "remote_candidates": ice.get("remote-candidates", []),
                    "selected_pair": ice.get("selected-pair"),
                    "ice_state": ice.get("state")}
    return {"found": False}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["create", "watch", "end", "gone", "ice"])
    parser.add_argument("--room", type=int, required=True)
    parser.add_argument("--secret", default="")
    parser.add_argument("--display", default="")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--how", choices=["destroy", "kick"], default="destroy")
    args = parser.parse_args()
    handle = Handle()
    report = {"command": args.command}
    if args.command == "create":
        created = handle.request({"request": "create", "room": args.room, "secret": args.secret, "bitrate": 2_500_000,
                                  "publishers": 6, "videocodec": "vp8"})
        report["created"] = created.get("videoroom")
        report["refused"] = refused(created)
    elif args.command == "watch":
        listed = wait_for(lambda: [p for p in participants(handle, args.room)
                                   if p.get("display") == args.display and p.get("publisher")], 20)
        report["listed_ms"] = time.monotonic() * 1000
        report["participants"] = participants(handle, args.room)
        report["publisher_listed"] = bool(listed)
        if listed:
            frames = asyncio.run(watch_publisher(args.room, listed[0]["id"], args.seconds, handle))
            report.update(frame_report(frames))
            # CLOCK_MONOTONIC ms of the first decoded frame (time.monotonic is that clock on Linux).
            report["first_frame_ms"] = frames[0][0] if frames else None
    elif args.command == "end":
        report["t_ms"] = time.monotonic() * 1000
        if args.how == "destroy":
            reply = handle.request({"request": "destroy", "room": args.room, "secret": args.secret})
            report["result"] = reply.get("videoroom")
            report["refused"] = refused(reply)
        else:
            target = [p for p in participants(handle, args.room) if p.get("display") == args.display]
            if target:
                reply = handle.request({"request": "kick", "room": args.room, "secret": args.secret, "id": target[0]["id"]})
                report["result"] = reply.get("videoroom")
                report["refused"] = refused(reply)
            else:
                report["result"] = "no such participant"
                report["refused"] = {"error_code": None, "error": f"no participant named {args.display!r} in room {args.room}"}
    elif args.command == "gone":
        # Polling starts now (a line says so, for a caller that times the leave from a signal it sends next).
        print(json.dumps({"polling": True}), flush=True)
        report["gone"] = wait_for(lambda: not any(p.get("display") == args.display for p in participants(handle, args.room)),
                                  args.seconds if args.seconds > 3 else 5) is not None
        report["gone_ms"] = time.monotonic() * 1000
        report["participants"] = participants(handle, args.room)
    elif args.command == "ice":
        report.update(publisher_ice(args.room, args.display))
    print(json.dumps(report), flush=True)
    if report.get("refused"):
        print(f"janus_host.py {args.command}: refused by Janus: {report['refused']['error']} ({report['refused']['error_code']})",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
