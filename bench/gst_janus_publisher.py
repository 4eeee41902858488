#!/usr/bin/python3
"""A GStreamer webrtcbin publisher in a Janus VideoRoom: the peer krakl-agent
is measured against in `krakl-bench roomshare`.

  gst_janus_publisher.py --room R --display D --x-display :N [--bitrate KBPS]

Pipeline: ximagesrc use-damage=true ! videoconvert ! vp8enc deadline=1 (the
realtime settings the encoder bench gives GStreamer) ! rtpvp8pay !
webrtcbin. Signalling: Janus's HTTP API (http://127.0.0.1:8088/janus inside
the bench's namespace): join as a publisher, wait for ICE gathering to end
(the offer then carries every candidate, as krakl's does), `publish` with the
offer, set Janus's answer (its candidates are in it). Runs until SIGTERM or
SIGINT. Prints {"published": true} once the answer is set.

Run with /usr/bin/python3 (Debian's python3-gi and gir1.2-gst-plugins-bad-1.0).
"""
import argparse
import json
import random
import signal
import sys
import threading
import time
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstWebRTC", "1.0")
gi.require_version("GstSdp", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

BASE = "http://127.0.0.1:8088/janus"


def post(path, body):
    body = dict(body, transaction="%016x" % random.getrandbits(64))
    request = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


class Janus:
    def __init__(self):
        self.session = post("", {"janus": "create"})["data"]["id"]
        self.handle = post("/%d" % self.session, {"janus": "attach", "plugin": "janus.plugin.videoroom"})["data"]["id"]
        threading.Thread(target=self.keepalive, daemon=True).start()

    def keepalive(self):
        while True:
            time.sleep(20)
            try:
                post("/%d" % self.session, {"janus": "keepalive"})
            except OSError:
                return

    def message(self, body, jsep=None):
        request = {"janus": "message", "body": body}
        if jsep:
            request["jsep"] = jsep
        return post("/%d/%d" % (self.session, self.handle), request)

    def wait_event(self, predicate, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            url = "%s/%d?maxev=10&rid=%d" % (BASE, self.session, int(time.time() * 1000))
            with urllib.request.urlopen(url, timeout=35) as reply:
                events = json.loads(reply.read())
            for event in events if isinstance(events, list) else [events]:
                if predicate(event):
                    return event
        raise TimeoutError("no matching Janus event")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", type=int, required=True)
    parser.add_argument("--display", required=True)
    parser.add_argument("--x-display", required=True)
    parser.add_argument("--bitrate", type=int, default=2500)
    args = parser.parse_args()
    Gst.init(None)
    pipeline = Gst.parse_launch(
        "ximagesrc display-name=%s use-damage=true show-pointer=false ! video/x-raw,framerate=30/1 ! videoconvert ! "
        "vp8enc deadline=1 cpu-used=6 end-usage=cbr target-bitrate=%d lag-in-frames=0 keyframe-max-dist=3000 "
        "error-resilient=partitions ! rtpvp8pay pt=96 picture-id-mode=15-bit ! "
        "application/x-rtp,media=video,encoding-name=VP8,payload=96,clock-rate=90000 ! "
        "webrtcbin name=rtc bundle-policy=max-bundle" % (args.x_display, args.bitrate * 1000))
    rtc = pipeline.get_by_name("rtc")
    # No UPnP port mapping (multicast SSDP): candidates are the namespace's own addresses only.
    # The references are kept to the end: pygobject drops one it was never given for webrtcbin's ice-agent.
    ice = rtc.get_property("ice-agent")
    nice = ice.get_property("agent")
    nice.set_property("upnp", False)
    janus = Janus()
    janus.message({"request": "join", "room": args.room, "ptype": "publisher", "display": args.display})
    janus.wait_event(lambda e: e.get("plugindata", {}).get("data", {}).get("videoroom") == "joined")
    loop = GLib.MainLoop()
    gathered = threading.Event()
    rtc.connect("notify::ice-gathering-state",
                lambda element, _: gathered.set() if element.get_property("ice-gathering-state") == GstWebRTC.WebRTCICEGatheringState.COMPLETE else None)

    def answered(sdp_text):
        _, message = GstSdp.SDPMessage.new_from_text(sdp_text)
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, message)
        rtc.emit("set-remote-description", answer, Gst.Promise.new())
        print(json.dumps({"published": True}), flush=True)

    def publish():
        if not gathered.wait(10):
            print("gst_janus_publisher: ICE gathering did not complete", file=sys.stderr, flush=True)
            GLib.idle_add(loop.quit)
            return
        offer = rtc.get_property("local-description").sdp.as_text()
        janus.message({"request": "publish", "audio": False, "video": True}, jsep={"type": "offer", "sdp": offer})
        event = janus.wait_event(lambda e: "jsep" in e, 15)
        GLib.idle_add(answered, event["jsep"]["sdp"])

    def offer_created(promise, _):
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply and reply.has_field("offer") else None
        if offer is None:
            print("gst_janus_publisher: webrtcbin made no offer: %s" % (reply.to_string() if reply else None), file=sys.stderr, flush=True)
            GLib.idle_add(loop.quit)
            return
        rtc.emit("set-local-description", offer, Gst.Promise.new())
        threading.Thread(target=publish, daemon=True).start()

    rtc.connect("on-negotiation-needed", lambda element: element.emit("create-offer", None, Gst.Promise.new_with_change_func(offer_created, None)))
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    bus = pipeline.get_bus()
    bus.add_signal_watch()
    bus.connect("message::error", lambda _, m: (print("gst_janus_publisher: %s" % m.parse_error()[0].message, file=sys.stderr, flush=True), loop.quit()))
    pipeline.set_state(Gst.State.PLAYING)
    loop.run()
    pipeline.set_state(Gst.State.NULL)
    del nice, ice
    try:
        janus.message({"request": "leave"})
    except OSError:
        pass


if __name__ == "__main__":
    main()
