#!/usr/bin/env python3
"""An emulator of Twilio Programmable Video's room signaling (the server side), for krakl's tests.

It speaks what twilio-video.js expects of the real service (docs/rooms.md, "Twilio Video"):
TCMP over a WebSocket (hello/welcome, heartbeats, msg, bye, busy, bad) carrying RSP v2
messages (connect/connected, update, sync/synced, disconnect/disconnected, error), and a
Twilio-shaped REST API (/v1/Rooms...) with HTTP Basic auth. aiortc answers the client's offer
and decodes the published video, reading each frame's stamp (docs/frame-stamp.md). It is an
independent implementation of the server side: aiohttp for HTTP and WebSocket, pyjwt for the
access token (Twilio's format: Tests/Fixtures/twilio_token.py makes them), aiortc for media.

Sockets. The REST socket is bound first, on 127.0.0.1:0 in the namespace the process starts in
(the host's). With --netns NAME the process then enters that network namespace (setns on
/var/run/netns/NAME) and binds the signaling socket on 127.0.0.1:0 there, so aiortc's ICE
sockets are there too (aioice drops 127.0.0.1; the namespace's 127.0.0.2 works, docs/testing.md, "aiortc").
Without --netns both are on 127.0.0.1 where it started. One aiohttp app serves both sockets
(every path on either port); the signaling path is /signaling (ws://127.0.0.1:WS_PORT/signaling,
wss with --tls). ICE host candidates are limited to 127.0.0.0/8 (never the machine's other
addresses) unless --any-address.

Output: one JSON object per line on stdout, each with t_ms (CLOCK_MONOTONIC in ms):
{"event": "ready", "ws_port": P, "rest_port": Q} first, then one line per event, and
{"report": {...}} (the /test/state snapshot) when stdin reaches its end or --seconds pass; exit 0.

Events (the "event" field): ws-open, hello, welcome, iced, client-heartbeat (the first), bad-sent,
busy-cookie, connect, room-created, token-rejected, error-sent, duplicate-identity, track-mapping,
connected, track, pc-state, first-frame, frames (each second while the count grows), track-ended,
ice, participant-update, update-subscribe/-media-signaling/-bandwidth-profile, offer, answer,
reoffer, sync, synced, sync-replaces-socket, sync-token-expired, disconnect, bye, ws-closing
(the server closes), ws-close, client-gone (3 x negotiatedTimeout without a frame: closed 3001),
participant-reconnecting, session-expired, participant-removed, room-completed, completion,
rest, fault, rsp-unexpected, rsp-unknown, session-mismatch, unknown-pc.

Choices where the protocol notes say nothing: a token without identity is 20101; a sync for an
unknown or expired session (and --fault refuse-sync) gets 53002 (the SDK's "signaling session
expires" error), a sync into a completed room 53118; a sync with an expired token still resumes
(logged); `synced` names the session's pc as [{id}] (an SDK client closes the pcs a synced leaves
out; --synced-without-pcs sends []); a connect without a room name or grant room makes a room
named by its SID; after an `error` the server closes (1000) unless the client did within
--error-close-delay; after `bye` the server closes 1000; unknown-type, huge-message,
silent-after-connected and close-after-connected fire --fault-after seconds after connected (the
first socket), bad-json, not-object, connected-without-participant and wrong-answer-revision
replace or alter the answer to the first connect.

Run with /opt/krakl-venv/bin/python (aiortc 1.16, aiohttp, pyjwt).
"""
import argparse
import asyncio
import base64
import collections
import ipaddress
import json
import os
import secrets
import socket
import ssl
import sys
import time
import urllib.parse

import jwt
from aiohttp import WSMsgType, web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.sdp import candidate_from_sdp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aiortc_receiver import read_stamp  # noqa: E402
from whip_server import enter_netns  # noqa: E402  (setns into the test's namespace, as the WHIP server does)

CTY = "twilio-fpa;v=1"

# Messages as twilio-video.js names them (lib/util/twilio-video-errors.js), except where the
# test plan fixed its own wording (20104, 53105).
ERROR_MESSAGES = {
    20101: "Invalid Access Token",
    20102: "Invalid Access Token header",
    20103: "Invalid Access Token issuer/subject",
    20104: "Access Token expired",
    20105: "Access Token not yet valid",
    20106: "Invalid Access Token grants",
    20107: "Invalid Access Token signature",
    53000: "Signaling connection error",
    53001: "Signaling connection disconnected",
    53002: "Signaling connection timed out",
    53003: "Client received an invalid signaling message",
    53004: "Client sent an invalid signaling message",
    53006: "Video server is busy",
    53100: "Room name is invalid",
    53103: "Unable to create Room",
    53104: "Unable to connect to Room",
    53105: "Maximum participants exceeded",
    53106: "Room not found",
    53112: "Status is invalid",
    53113: "Room exists",
    53118: "Room completed",
    53200: "Participant identity is invalid",
    53204: "Participant not found",
    53205: "Participant disconnected because of duplicate identity",
    53403: "Server is unable to apply a remote media description",
    53405: "Media connection failed or Media activity ceased",
}

FAULTS = ["no-welcome", "no-connected", "silent-after-connected", "close-after-connected", "bad-json",
          "not-object", "unknown-type", "connected-without-participant", "wrong-answer-revision",
          "busy-once", "huge-message", "refuse-sync"]


def now_ms():
    return round(time.monotonic() * 1000, 1)


def emit(obj):
    obj.setdefault("t_ms", now_ms())  # CLOCK_MONOTONIC, as the test's clock
    print(json.dumps(obj), flush=True)


def sid(prefix):
    return prefix + secrets.token_hex(16)


def iso_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def restrict_ice_to_loopback():
    """aioice gathers host candidates on every interface; keep only 127.0.0.0/8 (aioice itself drops
    127.0.0.1), so ICE never reaches out of loopback or the test's namespace."""
    import aioice.ice
    original = aioice.ice.get_host_addresses

    def loopback_only(use_ipv4, use_ipv6):
        return [a for a in original(use_ipv4, use_ipv6)
                if ipaddress.ip_address(a).version == 4 and ipaddress.ip_address(a) in ipaddress.ip_network("127.0.0.0/8")]
    aioice.ice.get_host_addresses = loopback_only


# ---------------------------------------------------------------------------------------------
# SDP

def parse_sdp(sdp):
    """Session-level facts and one dict per m-section."""
    sections = []
    session = {"ufrag": None, "bundle": None, "ice_lite": False}
    current = None
    for raw in (sdp or "").replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if line.startswith("m="):
            parts = line[2:].split()
            current = {"kind": parts[0] if parts else None, "port": int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
                       "mid": None, "direction": "sendrecv", "msid_stream": None, "msid_track": None,
                       "codecs": [], "rtpmap": {}, "extmap": {}, "ufrag": None, "candidates": 0}
            sections.append(current)
            continue
        target = current
        if line.startswith("a=ice-ufrag:"):
            if current is None:
                session["ufrag"] = line[len("a=ice-ufrag:"):]
            else:
                current["ufrag"] = line[len("a=ice-ufrag:"):]
        elif line.startswith("a=group:BUNDLE"):
            session["bundle"] = line[len("a=group:BUNDLE"):].split()
        elif line == "a=ice-lite":
            session["ice_lite"] = True
        elif target is None:
            continue
        elif line in ("a=sendonly", "a=recvonly", "a=sendrecv", "a=inactive"):
            target["direction"] = line[2:]
        elif line.startswith("a=mid:"):
            target["mid"] = line[len("a=mid:"):]
        elif line.startswith("a=msid:"):
            parts = line[len("a=msid:"):].split()
            target["msid_stream"] = parts[0] if parts else None
            target["msid_track"] = parts[1] if len(parts) > 1 else None
        elif line.startswith("a=rtpmap:"):
            pt, _, codec = line[len("a=rtpmap:"):].partition(" ")
            target["rtpmap"][pt] = codec
            name = codec.split("/")[0]
            if name.lower() not in ("rtx", "red", "ulpfec", "flexfec-03") and name not in target["codecs"]:
                target["codecs"].append(name)
        elif line.startswith("a=extmap:"):
            ident, _, rest = line[len("a=extmap:"):].partition(" ")
            target["extmap"][ident.split("/")[0]] = rest.split()[0] if rest else ""
        elif line.startswith("a=candidate:"):
            target["candidates"] += 1
    for section in sections:
        if section["ufrag"] is None:
            section["ufrag"] = session["ufrag"]
    return session, sections


def public_sections(sections):
    return [{"kind": s["kind"], "mid": s["mid"], "direction": s["direction"], "msid_track": s["msid_track"],
             "msid_stream": s["msid_stream"], "port": s["port"], "codecs": s["codecs"], "candidates": s["candidates"]}
            for s in sections]


def numbering_kept(client_sections, server_sections):
    """Whether every payload type and header-extension id of the server's SDP means what it meant in
    the client's SDP for the same mid (Chrome rejects a re-offer that renumbers them)."""
    by_mid = {s["mid"]: s for s in client_sections}
    changes = []
    for s in server_sections:
        c = by_mid.get(s["mid"])
        if c is None:
            continue
        for pt, codec in s["rtpmap"].items():
            if pt in c["rtpmap"] and c["rtpmap"][pt].lower() != codec.lower():
                changes.append(f"mid {s['mid']} pt {pt}: {c['rtpmap'][pt]} -> {codec}")
        for ident, uri in s["extmap"].items():
            if ident in c["extmap"] and c["extmap"][ident] != uri:
                changes.append(f"mid {s['mid']} extmap {ident}: {c['extmap'][ident]} -> {uri}")
        client_ids = {uri: ident for ident, uri in c["extmap"].items()}
        for ident, uri in s["extmap"].items():
            if uri in client_ids and client_ids[uri] != ident:
                changes.append(f"mid {s['mid']} {uri}: id {client_ids[uri]} -> {ident}")
    return not changes, changes


def _sdp_blocks(sdp):
    """[session lines, m-section lines...] of an SDP."""
    blocks = [[]]
    for line in (sdp or "").replace("\r\n", "\n").rstrip("\n").split("\n"):
        if line.startswith("m="):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _numbering(block):
    mid, rtpmap, fmtp, extmap = None, {}, {}, {}
    for line in block:
        if line.startswith("a=mid:"):
            mid = line[len("a=mid:"):]
        elif line.startswith("a=rtpmap:"):
            pt, _, codec = line[len("a=rtpmap:"):].partition(" ")
            rtpmap[pt] = codec.strip().lower()
        elif line.startswith("a=fmtp:"):
            pt, _, params = line[len("a=fmtp:"):].partition(" ")
            fmtp[pt] = {k.strip().lower(): v.strip().lower() for k, _, v in
                        (kv.partition("=") for kv in params.split(";")) if k.strip()}
        elif line.startswith("a=extmap:"):
            ident, _, rest = line[len("a=extmap:"):].partition(" ")
            if rest.split():
                extmap[ident.split("/")[0]] = rest.split()[0]
    return mid, rtpmap, fmtp, extmap


def _codec_key(pt, rtpmap, fmtp):
    codec = rtpmap.get(pt, "")
    params = fmtp.get(pt, {})
    name = codec.split("/")[0]
    if name == "h264":
        return codec, params.get("packetization-mode", "0"), params.get("profile-level-id", "")
    if name == "vp9":
        return codec, params.get("profile-id", "0")
    return (codec,)


def keep_client_numbering(sdp, client_sdp):
    """A server re-offer made by aiortc, with each payload type and header-extension id put back to
    the number the client's own SDP gave it for that mid. aiortc numbers its re-offers afresh, and
    Chrome answers a renumbered re-offer without an error but then stops delivering the media
    (twilio-video.js in Chromium 156, checked); the real service keeps the client's numbering.
    Codecs or extensions the client's SDP lacks get numbers it does not use; aiortc takes the
    numbering of the answer, so its receiver follows."""
    client = {}
    used_pts = set()
    for block in _sdp_blocks(client_sdp)[1:]:
        mid, rtpmap, fmtp, extmap = _numbering(block)
        client[mid] = (rtpmap, fmtp, extmap)
        used_pts.update(rtpmap)
        if block and len(block[0].split()) > 3:
            used_pts.update(block[0].split()[3:])
    out = _sdp_blocks(sdp)[:1]
    for block in _sdp_blocks(sdp)[1:]:
        mid, rtpmap, fmtp, extmap = _numbering(block)
        if mid not in client:
            out.append(block)
            continue
        c_rtpmap, c_fmtp, c_extmap = client[mid]
        by_key = {}
        for pt in c_rtpmap:
            if not c_rtpmap[pt].startswith("rtx/"):
                by_key.setdefault(_codec_key(pt, c_rtpmap, c_fmtp), pt)
        c_rtx = {c_fmtp.get(pt, {}).get("apt"): pt for pt in c_rtpmap if c_rtpmap[pt].startswith("rtx/")}
        pt_map = {}
        for pt in rtpmap:
            if not rtpmap[pt].startswith("rtx/") and _codec_key(pt, rtpmap, fmtp) in by_key:
                pt_map[pt] = by_key[_codec_key(pt, rtpmap, fmtp)]
        for pt in rtpmap:
            apt = fmtp.get(pt, {}).get("apt")
            if rtpmap[pt].startswith("rtx/") and apt in pt_map and pt_map[apt] in c_rtx:
                pt_map[pt] = c_rtx[pt_map[apt]]
        fmts = block[0].split()[3:]
        taken = used_pts | set(pt_map.values())
        free = (str(n) for n in list(range(96, 128)) + list(range(35, 64)) if str(n) not in taken)
        for pt in fmts:
            if pt not in pt_map:
                pt_map[pt] = pt if pt not in taken else next(free)
        id_by_uri = {uri: ident for ident, uri in c_extmap.items()}
        new = []
        for line in block:
            if line.startswith("m="):
                head = line.split()[:3]
                line = " ".join(head + [pt_map.get(pt, pt) for pt in fmts])
            elif line.startswith(("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:")):
                prefix, _, rest = line.partition(":")
                pt, _, tail = rest.partition(" ")
                if line.startswith("a=fmtp:") and "apt=" in tail:
                    tail = ";".join(f"apt={pt_map.get(kv.split('=', 1)[1], kv.split('=', 1)[1])}"
                                    if kv.strip().startswith("apt=") else kv for kv in tail.split(";"))
                line = f"{prefix}:{pt_map.get(pt, pt)} {tail}".rstrip()
            elif line.startswith("a=extmap:"):
                ident, _, rest = line[len("a=extmap:"):].partition(" ")
                uri = rest.split()[0] if rest.split() else None
                if uri not in id_by_uri:
                    continue  # an extension the client never offered: left out, not renumbered
                direction = ("/" + ident.split("/", 1)[1]) if "/" in ident else ""
                line = f"a=extmap:{id_by_uri[uri]}{direction} {rest}"
            new.append(line)
        out.append(new)
    return "\r\n".join(line for block in out for line in block) + "\r\n"


# ---------------------------------------------------------------------------------------------
# State

class Room:
    def __init__(self, name, created_by, max_participants):
        self.sid = sid("RM")
        self.name = name
        self.created_by = created_by  # "rest" or "signaling"
        self.status = "in-progress"
        self.date_created = iso_now()
        self.date_updated = self.date_created
        self.end_time = None
        self.started = time.time()
        self.duration = None
        self.max_participants = max_participants
        self.participants = []  # Participant, in joining order

    def active(self):
        return [p for p in self.participants if p.status in ("connected", "reconnecting")]

    def resource(self, base):
        url = f"{base}/v1/Rooms/{self.sid}"
        return {"sid": self.sid, "account_sid": ARGS.account_sid, "unique_name": self.name, "status": self.status,
                "type": "group", "max_participants": self.max_participants or 50, "date_created": self.date_created,
                "date_updated": self.date_updated, "end_time": self.end_time, "duration": self.duration,
                "enable_turn": True, "record_participants_on_connect": False, "video_codecs": ["VP8", "H264"],
                "media_region": "us1", "status_callback": None, "status_callback_method": "POST",
                "audio_only": False, "empty_room_timeout": 5, "unused_room_timeout": 5, "large_room": False,
                "url": url, "links": {"participants": url + "/Participants", "recordings": url + "/Recordings",
                                      "recording_rules": url + "/RecordingRules"}}

    def state(self):
        return {"sid": self.sid, "unique_name": self.name, "status": self.status, "created_by": self.created_by,
                "date_created": self.date_created, "end_time": self.end_time,
                "participants": [p.sid for p in self.participants]}


class Participant:
    def __init__(self, room, identity):
        self.sid = sid("PA")
        self.room = room
        self.identity = identity
        self.session = secrets.token_urlsafe(18)
        self.status = "connected"  # connected | reconnecting | disconnected
        self.removed_reason = None
        self.server_revision = 1  # of this participant as others see it
        self.client_revision = None
        self.tracks = []  # as announced in participant.tracks
        self.track_sids = {}  # announced track id -> MT sid
        self.published_revision = 1
        self.subscribe = None
        self.media_signaling = None
        self.conn = None
        self.conns = []
        self.pc = None
        self.pc_id = None
        self.pc_ids = []
        self.offer_sections = []
        self.client_sdp = None  # the client's last offer, as sent: the numbering a re-offer keeps
        self.offer_revision = None
        self.answer_revision = None
        self.description_revision = None  # the last revision of an offer/answer exchange
        self.server_offer = None  # (revision, sections) of an outstanding server offer
        self.track_mapping = None
        self.offer_kinds = []
        self.pc_states = []
        self.ice = {"ufrag": None, "revision": None, "complete": False, "candidates": [], "updates": 0,
                    "ufrag_mismatches": 0, "rejected": []}
        self.frames = 0
        self.first_frame_t_ms = None
        self.last_frame_t_ms = None
        self.width = None
        self.height = None
        self.sizes = set()
        self.stamps_first = []
        self.stamps_last = collections.deque(maxlen=10)
        self.stamps_read = 0
        self.stamps_decreasing = 0
        self.last_stamp = None
        self.tracks_received = []
        self.reported_frames = 0
        self.disconnect_received = False
        self.bye_received = False
        self.ws_close_code = None
        self.syncs = 0
        self.lost_at = None
        self.expiry = None  # task removing a reconnecting participant
        self.joined_t_ms = now_ms()
        self.date_created = iso_now()
        self.end_time = None
        self.completion = None

    def remote_view(self):
        return {"sid": self.sid, "identity": self.identity, "revision": self.server_revision,
                "state": "disconnected" if self.status == "disconnected" else self.status,
                "tracks": [] if self.status == "disconnected" else
                [{"sid": self.track_sids.get(t.get("id")), "name": t.get("name") or t.get("id"), "kind": t.get("kind"),
                  "enabled": t.get("enabled", True), "priority": t.get("priority", "standard")} for t in self.tracks]}

    def published(self):
        return {"revision": self.published_revision,
                "tracks": [{"id": t.get("id"), "sid": self.track_sids[t.get("id")], "state": "ready"} for t in self.tracks]}

    def rest_status(self):
        return "disconnected" if self.status == "disconnected" else "connected"

    def state(self):
        stamps_last = list(self.stamps_last)
        return {
            "sid": self.sid, "identity": self.identity, "room_sid": self.room.sid, "room_name": self.room.name,
            "status": self.status, "removed_reason": self.removed_reason, "session": self.session,
            "client_revision": self.client_revision, "tracks": self.tracks,
            "published": [{"id": t.get("id"), "sid": self.track_sids.get(t.get("id")), "kind": t.get("kind"),
                           "name": t.get("name")} for t in self.tracks],
            "subscribe": self.subscribe, "media_signaling": self.media_signaling,
            "pc_id": self.pc_id, "pc_ids": self.pc_ids, "pc_states": self.pc_states,
            "offer": {"revision": self.offer_revision, "kinds": self.offer_kinds, "m_sections": public_sections(self.offer_sections)},
            "answer_revision": self.answer_revision, "track_mapping": self.track_mapping,
            "tracks_received": self.tracks_received,
            "frames": {"decoded": self.frames, "first_frame_t_ms": self.first_frame_t_ms, "last_frame_t_ms": self.last_frame_t_ms,
                       "width": self.width, "height": self.height, "sizes": sorted(self.sizes),
                       "stamps_read": self.stamps_read, "stamps_first": self.stamps_first, "stamps_last": stamps_last,
                       "stamps_in_order": self.stamps_decreasing == 0, "stamps_decreasing": self.stamps_decreasing},
            "ice": {"ufrag": self.ice["ufrag"], "revision": self.ice["revision"], "complete": self.ice["complete"],
                    "updates": self.ice["updates"], "candidates_seen": len(self.ice["candidates"]),
                    "candidates": self.ice["candidates"], "ufrag_mismatches": self.ice["ufrag_mismatches"],
                    "rejected": self.ice["rejected"]},
            "disconnect_received": self.disconnect_received, "bye_received": self.bye_received,
            "ws_close_code": self.ws_close_code, "syncs": self.syncs, "connections": [c.id for c in self.conns],
            "completion": self.completion,
        }


class Conn:
    counter = 0

    def __init__(self, ws, request):
        Conn.counter += 1
        self.id = Conn.counter
        self.ws = ws
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        self.port = sockname[1] if sockname else None
        self.tls = request.secure
        self.path = request.path
        self.headers = {k: request.headers.get(k) for k in ("User-Agent", "Origin", "Sec-WebSocket-Protocol",
                                                           "Sec-WebSocket-Extensions", "Authorization") if k in request.headers}
        if "Authorization" in self.headers:
            self.headers["Authorization"] = "(present)"
        self.hellos = []
        self.welcomed = False
        self.negotiated_timeout = None
        self.last_rx = time.monotonic()
        self.last_tx = time.monotonic()
        self.frames_in = 0
        self.msgs_in = 0
        self.heartbeats_in = 0
        self.heartbeats_out = 0
        self.bye = False
        self.disconnect = False
        self.participant = None
        self.silent = False
        self.silent_dropped_in = 0
        self.silent_dropped_out = 0
        self.closed = False
        self.closed_by = None
        self.close_code = None
        self.send_lock = asyncio.Lock()
        self.tasks = []
        self.heartbeat_task = None
        self.closed_event = asyncio.Event()

    def state(self):
        return {"id": self.id, "port": self.port, "tls": self.tls, "path": self.path, "headers": self.headers,
                "hellos": self.hellos, "welcomed": self.welcomed, "negotiated_timeout": self.negotiated_timeout,
                "frames_in": self.frames_in, "msgs_in": self.msgs_in, "heartbeats_in": self.heartbeats_in,
                "heartbeats_out": self.heartbeats_out, "bye": self.bye, "disconnect": self.disconnect,
                "participant": self.participant.sid if self.participant else None, "silent": self.silent,
                "silent_dropped_in": self.silent_dropped_in, "silent_dropped_out": self.silent_dropped_out,
                "closed": self.closed, "closed_by": self.closed_by, "close_code": self.close_code}


class World:
    def __init__(self):
        self.rooms = []
        self.participants = []
        self.conns = []
        self.ws_port = None
        self.rest_port = None
        self.fault_fired = False
        self.hello_count = 0
        self.busy_sent = False
        self.rest_requests = []
        self.errors_sent = []

    def room_by_key(self, key, in_progress_only_by_name=True):
        for room in self.rooms:
            if room.sid == key:
                return room
        named = [r for r in self.rooms if r.name == key]
        live = [r for r in named if r.status == "in-progress"]
        if live:
            return live[-1]
        if not in_progress_only_by_name and named:
            return named[-1]
        return None

    def live_room(self, name):
        for room in reversed(self.rooms):
            if room.name == name and room.status == "in-progress":
                return room
        return None

    def state(self):
        return {"t_ms": now_ms(), "ws_port": self.ws_port, "rest_port": self.rest_port,
                "fault": {"name": ARGS.fault, "fired": self.fault_fired, "error_code": ARGS.error_code},
                "rooms": [r.state() for r in self.rooms],
                "participants": [p.state() for p in self.participants],
                "connections": [c.state() for c in self.conns],
                "hellos": self.hello_count, "errors_sent": self.errors_sent,
                "rest_requests": self.rest_requests}


ARGS = None
WORLD = World()


def fire_fault(name):
    """True (once per run) when --fault is `name`."""
    if ARGS.fault != name or WORLD.fault_fired:
        return False
    WORLD.fault_fired = True
    return True


# ---------------------------------------------------------------------------------------------
# Sending

async def send_frame(conn, obj=None, text=None, force=False):
    if conn.closed or conn.ws.closed:
        return False
    if conn.silent and not force:
        conn.silent_dropped_out += 1
        return False
    data = text if text is not None else json.dumps(obj)
    try:
        async with conn.send_lock:
            await conn.ws.send_str(data)
    except (ConnectionError, RuntimeError) as error:
        emit({"event": "send-failed", "conn": conn.id, "error": str(error)})
        return False
    conn.last_tx = time.monotonic()
    return True


async def send_msg(conn, body):
    return await send_frame(conn, {"type": "msg", "body": body})


async def close_conn(conn, code, reason, why):
    if conn.closed:
        return
    conn.closed_by = conn.closed_by or "server"
    emit({"event": "ws-closing", "conn": conn.id, "code": code, "reason": reason, "why": why})
    try:
        await conn.ws.close(code=code, message=reason.encode())
    except Exception as error:  # noqa: BLE001 (a socket that is already gone)
        emit({"event": "ws-close-failed", "conn": conn.id, "error": str(error)})


async def send_error_and_close(conn, code, message=None, why="error", participant=None):
    message = message or ERROR_MESSAGES.get(code, "Error")
    WORLD.errors_sent.append({"conn": conn.id, "code": code, "message": message, "why": why,
                              "identity": participant.identity if participant else None})
    emit({"event": "error-sent", "conn": conn.id, "code": code, "message": message, "why": why,
          "identity": participant.identity if participant else None})
    await send_msg(conn, {"type": "error", "code": code, "message": message})

    async def later():
        # A short moment for the client's own disconnect/bye/close (the SDK closes at once).
        try:
            await asyncio.wait_for(conn.closed_event.wait(), ARGS.error_close_delay)
        except asyncio.TimeoutError:
            await close_conn(conn, 1000, "error", why)
    conn.tasks.append(asyncio.ensure_future(later()))


# ---------------------------------------------------------------------------------------------
# Tokens

def verify_token(token, room_name):
    """(code, message, claims): code None when the token is good for room_name (None: any room)."""
    if not isinstance(token, str) or not token:
        return 20101, ERROR_MESSAGES[20101], None
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return 20101, ERROR_MESSAGES[20101], None
    if header.get("cty") != CTY or header.get("alg") != "HS256" or header.get("typ", "JWT") != "JWT":
        return 20102, ERROR_MESSAGES[20102], None
    try:
        claims = jwt.decode(token, ARGS.api_key_secret, algorithms=["HS256"],
                            options={"verify_aud": False, "require": ["exp"]})
    except jwt.InvalidSignatureError:
        return 20107, ERROR_MESSAGES[20107], None
    except jwt.ExpiredSignatureError:
        return 20104, ERROR_MESSAGES[20104], None
    except jwt.ImmatureSignatureError:
        return 20105, ERROR_MESSAGES[20105], None
    except jwt.MissingRequiredClaimError:
        return 20104, ERROR_MESSAGES[20104], None
    except jwt.PyJWTError:
        return 20101, ERROR_MESSAGES[20101], None
    if claims.get("iss") != ARGS.api_key_sid or claims.get("sub") != ARGS.account_sid:
        return 20103, ERROR_MESSAGES[20103], claims
    grants = claims.get("grants")
    if not isinstance(grants, dict) or not isinstance(grants.get("video"), dict):
        return 20106, ERROR_MESSAGES[20106], claims
    if not isinstance(grants.get("identity"), str) or not grants["identity"]:
        return 20101, ERROR_MESSAGES[20101] + " (no identity)", claims
    granted = grants["video"].get("room")
    if granted is not None and room_name is not None and granted != room_name:
        return 20106, ERROR_MESSAGES[20106], claims
    return None, "ok", claims


# ---------------------------------------------------------------------------------------------
# Media

async def consume(participant, track, mid):
    try:
        while True:
            frame = await track.recv()
            t = now_ms()
            plane = frame.planes[0]
            stamp = read_stamp(bytes(plane), plane.line_size, frame.width, frame.height)
            participant.frames += 1
            participant.last_frame_t_ms = t
            participant.width, participant.height = frame.width, frame.height
            participant.sizes.add(f"{frame.width}x{frame.height}")
            if stamp is not None:
                number = stamp[0]
                participant.stamps_read += 1
                if participant.last_stamp is not None and number <= participant.last_stamp:
                    participant.stamps_decreasing += 1
                participant.last_stamp = number
                if len(participant.stamps_first) < 10:
                    participant.stamps_first.append(number)
                participant.stamps_last.append(number)
            if participant.first_frame_t_ms is None:
                participant.first_frame_t_ms = t
                emit({"event": "first-frame", "identity": participant.identity, "participant": participant.sid,
                      "mid": mid, "width": frame.width, "height": frame.height,
                      "stamp": stamp[0] if stamp else None, "capture_ms": stamp[1] if stamp else None,
                      "since_connect_ms": round(t - participant.joined_t_ms, 1)})
    except MediaStreamError:
        emit({"event": "track-ended", "identity": participant.identity, "participant": participant.sid, "mid": mid})


async def frames_ticker():
    while True:
        await asyncio.sleep(1.0)
        for p in WORLD.participants:
            if p.frames != p.reported_frames:
                emit({"event": "frames", "identity": p.identity, "participant": p.sid, "frames": p.frames,
                      "fps": p.frames - p.reported_frames, "width": p.width, "height": p.height,
                      "last_stamp": p.last_stamp, "stamps_read": p.stamps_read,
                      "stamps_in_order": p.stamps_decreasing == 0})
                p.reported_frames = p.frames


def make_pc(participant):
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))

    @pc.on("connectionstatechange")
    def on_state():
        participant.pc_states.append([now_ms(), pc.connectionState])
        emit({"event": "pc-state", "identity": participant.identity, "participant": participant.sid,
              "state": pc.connectionState})

    @pc.on("track")
    def on_track(track):
        mid = None
        for transceiver in pc.getTransceivers():
            if transceiver.receiver.track is track:
                mid = transceiver.mid
        section = next((s for s in participant.offer_sections if s["mid"] == mid), None)
        entry = {"kind": track.kind, "mid": mid, "msid_track": section["msid_track"] if section else None}
        participant.tracks_received.append(entry)
        emit({"event": "track", "identity": participant.identity, "participant": participant.sid, **entry})
        if track.kind == "video":
            asyncio.ensure_future(consume(participant, track, mid))
    return pc


async def answer_offer(participant, sdp):
    """Applies a client offer with aiortc and returns the answer SDP."""
    await participant.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
    await participant.pc.setLocalDescription(await participant.pc.createAnswer())
    return participant.pc.localDescription.sdp


def check_track_mapping(participant):
    # A sending m-section is sendonly or sendrecv: twilio-video.js offers its published tracks
    # sendrecv (it offers to receive too), an agent that only publishes offers them sendonly.
    sending = [s for s in participant.offer_sections if s["direction"] in ("sendonly", "sendrecv") and s["port"] != 0]
    msids = [s["msid_track"] for s in sending]
    announced = [t.get("id") for t in participant.tracks]
    missing = [i for i in announced if i not in msids]
    unannounced = [m for m in msids if m not in announced]
    ok = not missing and not unannounced
    participant.track_mapping = {"ok": ok, "announced": announced, "offer_msid_tracks": msids,
                                 "missing": missing, "unannounced": unannounced}
    emit({"event": "track-mapping", "identity": participant.identity, "participant": participant.sid,
          "result": "ok" if ok else "mismatch", "announced": announced, "offer_msid_tracks": msids,
          "missing": missing, "unannounced": unannounced})


# ---------------------------------------------------------------------------------------------
# Participants

async def notify_others(participant):
    """Tells the other participants of the room about participant's new state."""
    for other in participant.room.participants:
        if other is participant or other.status != "connected" or other.conn is None:
            continue
        await send_msg(other.conn, {"type": "update", "participants": [participant.remote_view()]})


async def remove_participant(participant, reason, close_pc=True):
    if participant.status == "disconnected":
        return
    participant.status = "disconnected"
    participant.removed_reason = reason
    participant.end_time = iso_now()
    participant.server_revision += 1
    if participant.expiry is not None:
        participant.expiry.cancel()
        participant.expiry = None
    emit({"event": "participant-removed", "identity": participant.identity, "participant": participant.sid,
          "room": participant.room.name, "reason": reason, "frames": participant.frames})
    if close_pc and participant.pc is not None:
        await participant.pc.close()
    await notify_others(participant)


def schedule_expiry(participant):
    timeout = ARGS.session_timeout

    async def expire():
        await asyncio.sleep(timeout)
        if participant.status == "reconnecting":
            emit({"event": "session-expired", "identity": participant.identity, "participant": participant.sid,
                  "session_timeout": timeout})
            await remove_participant(participant, "session-timeout")
    if participant.expiry is not None:
        participant.expiry.cancel()
    participant.expiry = asyncio.ensure_future(expire())


# ---------------------------------------------------------------------------------------------
# RSP

def collect_connect_log(conn, body):
    pcs = body.get("peer_connections") if isinstance(body.get("peer_connections"), list) else []
    offer = None
    if pcs and isinstance(pcs[0], dict) and isinstance(pcs[0].get("description"), dict):
        offer = pcs[0]["description"]
    sections = parse_sdp(offer.get("sdp"))[1] if offer and isinstance(offer.get("sdp"), str) else []
    participant = body.get("participant") if isinstance(body.get("participant"), dict) else {}
    return {"event": "connect", "conn": conn.id, "room": body.get("name"),
            "version": body.get("version"), "tracks": participant.get("tracks"),
            "participant_revision": participant.get("revision"), "subscribe": body.get("subscribe"),
            "media_signaling": body.get("media_signaling"), "publisher": body.get("publisher"),
            "format": body.get("format"), "ice_servers": body.get("ice_servers"),
            "bandwidth_profile": body.get("bandwidth_profile"),
            "pc_ids": [p.get("id") for p in pcs if isinstance(p, dict)],
            "offer_type": offer.get("type") if offer else None, "offer_revision": offer.get("revision") if offer else None,
            "m_sections": public_sections(sections), "token_present": "token" in body,
            "keys": sorted(body.keys())}


async def handle_connect(conn, body):
    entry = collect_connect_log(conn, body)
    if ARGS.fault == "no-connected":
        WORLD.fault_fired = True
        emit(dict(entry, identity=None))
        emit({"event": "fault", "fault": "no-connected", "conn": conn.id, "detail": "connect left unanswered"})
        return
    room_name = body.get("name") if isinstance(body.get("name"), str) else None
    code, message, claims = verify_token(body.get("token"), room_name)
    identity = ((claims or {}).get("grants") or {}).get("identity")
    entry["identity"] = identity
    emit(entry)
    if ARGS.error_code is not None:
        await send_error_and_close(conn, ARGS.error_code, ARGS.error_message, why="--error-code")
        return
    if code is not None:
        emit({"event": "token-rejected", "conn": conn.id, "stage": "connect", "code": code, "message": message})
        await send_error_and_close(conn, code, message, why="token")
        return
    if room_name is None:
        room_name = claims["grants"]["video"].get("room")
    # Rooms
    room = WORLD.live_room(room_name) if room_name is not None else None
    if room is None:
        if ARGS.require_room_exists:
            await send_error_and_close(conn, 53106, why="room not created by REST")
            return
        room = Room(room_name, "signaling", ARGS.max_participants)
        if room.name is None:
            room.name = room.sid  # an ad-hoc room without a name is named by its SID
        WORLD.rooms.append(room)
        emit({"event": "room-created", "room": room.name, "sid": room.sid, "by": "signaling"})
    # The offer
    pcs = body.get("peer_connections")
    pc_state = pcs[0] if isinstance(pcs, list) and pcs and isinstance(pcs[0], dict) else None
    offer = pc_state.get("description") if pc_state else None
    if not (isinstance(offer, dict) and offer.get("type") == "offer" and isinstance(offer.get("sdp"), str)):
        await send_error_and_close(conn, 53403, why="connect without an offer in peer_connections[0].description")
        return
    # Duplicate identity: the participant already in the room goes.
    for other in list(room.active()):
        if other.identity == identity:
            emit({"event": "duplicate-identity", "identity": identity, "room": room.name, "kicked": other.sid})
            if other.conn is not None and not other.conn.closed:
                await send_error_and_close(other.conn, 53205, why="duplicate identity", participant=other)
            await remove_participant(other, "duplicate-identity")
    limit = ARGS.max_participants
    if limit is not None and len(room.active()) >= limit:
        await send_error_and_close(conn, 53105, why=f"--max-participants {limit}")
        return
    participant = Participant(room, identity)
    participant_body = body.get("participant") if isinstance(body.get("participant"), dict) else {}
    participant.client_revision = participant_body.get("revision")
    participant.tracks = [t for t in (participant_body.get("tracks") or []) if isinstance(t, dict)]
    participant.track_sids = {t.get("id"): sid("MT") for t in participant.tracks}
    participant.subscribe = body.get("subscribe")
    participant.media_signaling = body.get("media_signaling")
    participant.pc_id = pc_state.get("id")
    participant.pc_ids = [p.get("id") for p in pcs if isinstance(p, dict)]
    participant.offer_revision = offer.get("revision")
    participant.client_sdp = offer["sdp"]
    session_info, participant.offer_sections = parse_sdp(offer["sdp"])
    participant.offer_kinds = [s["kind"] for s in participant.offer_sections]
    participant.ice["ufrag"] = session_info["ufrag"] or next((s["ufrag"] for s in participant.offer_sections if s["ufrag"]), None)
    participant.conn = conn
    participant.conns.append(conn)
    conn.participant = participant
    room.participants.append(participant)
    WORLD.participants.append(participant)
    check_track_mapping(participant)
    participant.pc = make_pc(participant)
    try:
        answer = await answer_offer(participant, offer["sdp"])
    except Exception as error:  # noqa: BLE001 (whatever aiortc could not apply)
        emit({"event": "offer-rejected", "identity": identity, "error": f"{type(error).__name__}: {error}"})
        await remove_participant(participant, "offer-rejected")
        await send_error_and_close(conn, 53403, why=f"aiortc: {error}")
        return
    trickled = []
    if ARGS.trickle_answer_candidates:
        # The answer goes out without its candidates; they follow in an update, as a trickling server's would.
        lines = answer.split("\r\n")
        trickled = [line[2:] for line in lines if line.startswith("a=candidate:")]
        kept = []
        for line in lines:
            if line.startswith("a=candidate:") or line == "a=end-of-candidates" or line.startswith("a=rtcp:"):
                continue
            # No default candidate either (RFC 8839 §5.1: port 9 and 0.0.0.0 say "candidates follow").
            if line.startswith("m="):
                parts = line.split(" ")
                parts[1] = "9"
                line = " ".join(parts)
            elif line.startswith("c=IN IP4 "):
                line = "c=IN IP4 0.0.0.0"
            kept.append(line)
        answer = "\r\n".join(kept)
    revision = offer.get("revision")
    participant.answer_revision = revision
    participant.description_revision = revision
    if ARGS.fault == "wrong-answer-revision" and fire_fault("wrong-answer-revision"):
        participant.answer_revision = (revision or 0) + 1
        emit({"event": "fault", "fault": "wrong-answer-revision", "conn": conn.id, "revision": participant.answer_revision})
    connected = {
        "type": "connected", "session": participant.session, "sid": room.sid, "name": room.name,
        "participant": {"sid": participant.sid, "identity": identity, "revision": participant.client_revision,
                        "state": "connected", "tracks": []},
        "participants": [p.remote_view() for p in room.active() if p is not participant],
        "peer_connections": [{"id": participant.pc_id,
                              "description": {"type": "answer", "revision": participant.answer_revision, "sdp": answer}}],
        "published": participant.published(),
        "subscribed": {"revision": 1, "tracks": []},
        "recording": {"revision": 1, "is_recording": False},
        "options": {"session_timeout": ARGS.session_timeout, "signaling_region": "gll", "media_region": "us1"},
    }
    if ARGS.fault == "connected-without-participant" and fire_fault("connected-without-participant"):
        del connected["participant"]
        emit({"event": "fault", "fault": "connected-without-participant", "conn": conn.id})
    sent = "connected"
    if ARGS.fault == "bad-json" and fire_fault("bad-json"):
        sent = "bad-json"
        emit({"event": "fault", "fault": "bad-json", "conn": conn.id})
        await send_frame(conn, text='{"type": "msg", "body": {"type": "connected", "session": ')
    elif ARGS.fault == "not-object" and fire_fault("not-object"):
        sent = "not-object"
        emit({"event": "fault", "fault": "not-object", "conn": conn.id})
        await send_frame(conn, text=json.dumps([{"type": "msg", "body": {"type": "connected"}}]))
    else:
        await send_msg(conn, connected)
    emit({"event": "connected", "conn": conn.id, "identity": identity, "room": room.name, "room_sid": room.sid,
          "participant": participant.sid, "sent": sent, "with_participant": "participant" in connected,
          "answer_revision": participant.answer_revision,
          "published": participant.published()["tracks"], "others": len(connected["participants"]),
          "answer_m_sections": public_sections(parse_sdp(answer)[1])})
    if trickled:
        ufrag = next((line.split(":", 1)[1] for line in answer.split("\r\n") if line.startswith("a=ice-ufrag:")), "")
        # First a candidate for another ufrag (a stale generation: to be ignored), then the real ones.
        await send_msg(conn, {"type": "update", "peer_connections": [{"id": participant.pc_id, "ice": {
            "ufrag": "stale" + ufrag, "revision": 1, "candidates": [{"candidate": "candidate:9 1 udp 1 127.0.0.2 9 typ host", "sdpMid": "0"}]}}]})
        await send_msg(conn, {"type": "update", "peer_connections": [{"id": participant.pc_id, "ice": {
            "ufrag": ufrag, "revision": 2, "complete": True,
            "candidates": [{"candidate": c, "sdpMid": "0", "sdpMLineIndex": 0} for c in trickled]}}]})
        emit({"event": "server-trickled", "identity": identity, "candidates": len(trickled)})
    await notify_others(participant)
    schedule_after_connected(conn, participant)


def schedule_after_connected(conn, participant):
    delay = ARGS.fault_after

    async def fault_later(name, action):
        await asyncio.sleep(delay)
        if conn.closed or not fire_fault(name):
            return
        await action()

    async def silent():
        conn.silent = True
        emit({"event": "fault", "fault": "silent-after-connected", "conn": conn.id, "identity": participant.identity})

    async def close_1011():
        emit({"event": "fault", "fault": "close-after-connected", "conn": conn.id, "identity": participant.identity})
        conn.closed_by = "server"
        await close_conn(conn, 1011, "fault: close-after-connected", "fault")

    async def huge():
        padding = "x" * (2 * 1024 * 1024)
        emit({"event": "fault", "fault": "huge-message", "conn": conn.id, "bytes": len(padding)})
        await send_msg(conn, {"type": "update", "padding": padding})

    async def weird():
        emit({"event": "fault", "fault": "unknown-type", "conn": conn.id})
        await send_frame(conn, {"type": "weird", "body": {"what": "an unknown TCMP type"}})

    actions = {"silent-after-connected": silent, "close-after-connected": close_1011, "huge-message": huge,
               "unknown-type": weird}
    if ARGS.fault in actions and not WORLD.fault_fired:
        conn.tasks.append(asyncio.ensure_future(fault_later(ARGS.fault, actions[ARGS.fault])))
    if ARGS.reoffer_after is not None:
        conn.tasks.append(asyncio.ensure_future(reoffer_later(conn, participant, ARGS.reoffer_after)))


async def reoffer_later(conn, participant, delay):
    await asyncio.sleep(delay)
    if participant.status != "connected" or participant.pc is None or participant.server_offer is not None:
        return
    pc = participant.pc
    if pc.signalingState != "stable":
        emit({"event": "reoffer-skipped", "identity": participant.identity, "signaling_state": pc.signalingState})
        return
    try:
        if ARGS.reoffer_add:
            # A new m-section the client never asked for (as a subscription would add): it must be rejected.
            pc.addTransceiver(ARGS.reoffer_add, direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
    except Exception as error:  # noqa: BLE001
        emit({"event": "reoffer-failed", "identity": participant.identity, "error": str(error)})
        return
    revision = (participant.description_revision or 0) + 1
    sdp = keep_client_numbering(pc.localDescription.sdp, participant.client_sdp)
    sections = parse_sdp(sdp)[1]
    kept, changes = numbering_kept(participant.offer_sections, sections)
    participant.server_offer = (revision, sections)
    emit({"event": "reoffer", "identity": participant.identity, "participant": participant.sid, "revision": revision,
          "numbering_kept": kept, "numbering_changes": changes, "m_sections": public_sections(sections)})
    await send_msg(participant.conn or conn, {"type": "update", "peer_connections": [
        {"id": participant.pc_id, "description": {"type": "offer", "revision": revision, "sdp": sdp}}]})


async def handle_pc_updates(conn, participant, pcs):
    replies = []
    for state in pcs:
        if not isinstance(state, dict):
            continue
        pc_id = state.get("id")
        if pc_id != participant.pc_id:
            emit({"event": "unknown-pc", "identity": participant.identity, "pc_id": pc_id})
            continue
        ice = state.get("ice")
        if isinstance(ice, dict):
            await handle_ice(participant, ice)
        description = state.get("description")
        if isinstance(description, dict):
            reply = await handle_description(participant, description)
            if reply:
                replies.append(reply)
    if replies:
        await send_msg(conn, {"type": "update", "peer_connections": replies})


async def handle_ice(participant, ice):
    participant.ice["updates"] += 1
    ufrag = ice.get("ufrag")
    revision = ice.get("revision")
    candidates = ice.get("candidates") if isinstance(ice.get("candidates"), list) else []
    known = {c["candidate"] for c in participant.ice["candidates"]}
    ufrag_ok = participant.ice["ufrag"] is None or ufrag == participant.ice["ufrag"]
    if not ufrag_ok:
        participant.ice["ufrag_mismatches"] += 1
    stale = participant.ice["revision"] is not None and isinstance(revision, int) and revision <= participant.ice["revision"]
    added = 0
    if ufrag_ok and not stale:
        participant.ice["revision"] = revision
        for c in candidates:
            if not isinstance(c, dict) or not isinstance(c.get("candidate"), str) or c["candidate"] in known:
                continue
            text = c["candidate"]
            try:
                candidate = candidate_from_sdp(text[len("candidate:"):] if text.startswith("candidate:") else text)
                candidate.sdpMid = c.get("sdpMid")
                candidate.sdpMLineIndex = c.get("sdpMLineIndex")
                if candidate.sdpMid is None and candidate.sdpMLineIndex is None:
                    candidate.sdpMLineIndex = 0
                await participant.pc.addIceCandidate(candidate)
                participant.ice["candidates"].append({"candidate": text, "sdpMid": c.get("sdpMid"),
                                                      "sdpMLineIndex": c.get("sdpMLineIndex"), "type": candidate.type,
                                                      "address": candidate.ip, "protocol": candidate.protocol})
                known.add(text)
                added += 1
            except Exception as error:  # noqa: BLE001 (aiortc rejected the candidate)
                participant.ice["rejected"].append({"candidate": text, "error": str(error)})
        if ice.get("complete") and not participant.ice["complete"]:
            participant.ice["complete"] = True
            try:
                await participant.pc.addIceCandidate(None)
            except Exception as error:  # noqa: BLE001
                emit({"event": "ice-end-failed", "identity": participant.identity, "error": str(error)})
    emit({"event": "ice", "identity": participant.identity, "participant": participant.sid, "ufrag": ufrag,
          "ufrag_ok": ufrag_ok, "revision": revision, "stale": stale, "candidates": len(candidates), "added": added,
          "total": len(participant.ice["candidates"]), "complete": bool(ice.get("complete"))})


async def handle_description(participant, description):
    kind = description.get("type")
    revision = description.get("revision")
    pc = participant.pc
    if kind == "answer":
        expected = participant.server_offer[0] if participant.server_offer else None
        ok = expected is not None and revision == expected
        entry = {"event": "answer", "identity": participant.identity, "participant": participant.sid,
                 "revision": revision, "expected_revision": expected, "ok": ok}
        if isinstance(description.get("sdp"), str):
            entry["m_sections"] = public_sections(parse_sdp(description["sdp"])[1])
        if ok and isinstance(description.get("sdp"), str):
            try:
                await pc.setRemoteDescription(RTCSessionDescription(sdp=description["sdp"], type="answer"))
                participant.description_revision = revision
                participant.server_offer = None
                entry["applied"] = True
            except Exception as error:  # noqa: BLE001
                entry["applied"] = False
                entry["error"] = str(error)
        emit(entry)
        return None
    if kind == "offer":
        entry = {"event": "offer", "identity": participant.identity, "participant": participant.sid,
                 "revision": revision, "last_revision": participant.description_revision}
        if not isinstance(description.get("sdp"), str) or (isinstance(revision, int) and participant.description_revision is not None
                                                           and revision <= participant.description_revision):
            entry["ignored"] = True
            emit(entry)
            return None
        session_info, sections = parse_sdp(description["sdp"])
        ufrag = session_info["ufrag"] or next((s["ufrag"] for s in sections if s["ufrag"]), None)
        entry["ice_restart"] = ufrag != participant.ice["ufrag"]
        entry["m_sections"] = public_sections(sections)
        if participant.server_offer is not None:
            # Glare: the server wins (the SDK rolls back and answers the server's offer).
            entry["glare"] = True
            emit(entry)
            return None
        # aiortc fires `track` inside setRemoteDescription: the new sections must be there by
        # then, or a track added by this offer is logged without its msid.
        previous_sections, participant.offer_sections = participant.offer_sections, sections
        try:
            answer = await answer_offer(participant, description["sdp"])
        except Exception as error:  # noqa: BLE001
            participant.offer_sections = previous_sections
            entry["error"] = str(error)
            emit(entry)
            return None
        participant.offer_revision = revision
        participant.client_sdp = description["sdp"]
        participant.answer_revision = revision
        participant.description_revision = revision
        if entry["ice_restart"]:
            participant.ice.update({"ufrag": ufrag, "revision": None, "complete": False})
        emit(entry)
        return {"id": participant.pc_id, "description": {"type": "answer", "revision": revision, "sdp": answer}}
    if kind == "close":
        emit({"event": "pc-close", "identity": participant.identity, "revision": revision})
        return None
    emit({"event": "description", "identity": participant.identity, "type": kind, "revision": revision})
    return None


async def handle_update(conn, body):
    participant = conn.participant
    if participant is None or participant.status == "disconnected":
        emit({"event": "rsp-unexpected", "conn": conn.id, "type": "update", "detail": "no participant on this socket"})
        return
    if body.get("session") != participant.session:
        emit({"event": "session-mismatch", "conn": conn.id, "identity": participant.identity, "type": "update"})
    part = body.get("participant")
    if isinstance(part, dict):
        revision = part.get("revision")
        tracks = [t for t in (part.get("tracks") or []) if isinstance(t, dict)]
        newer = not (isinstance(revision, int) and isinstance(participant.client_revision, int) and revision <= participant.client_revision)
        emit({"event": "participant-update", "identity": participant.identity, "participant": participant.sid,
              "revision": revision, "tracks": tracks, "applied": newer})
        if newer:
            participant.client_revision = revision
            before = [t.get("id") for t in participant.tracks]
            participant.tracks = tracks
            for t in tracks:
                participant.track_sids.setdefault(t.get("id"), sid("MT"))
            if [t.get("id") for t in tracks] != before:
                participant.published_revision += 1
                await send_msg(conn, {"type": "update", "published": participant.published()})
            participant.server_revision += 1
            await notify_others(participant)
    for key in ("subscribe", "media_signaling", "bandwidth_profile"):
        if key in body:
            emit({"event": "update-" + key.replace("_", "-"), "identity": participant.identity, key: body[key]})
            if key == "subscribe":
                participant.subscribe = body[key]
    pcs = body.get("peer_connections")
    if isinstance(pcs, list):
        await handle_pc_updates(conn, participant, pcs)


async def handle_disconnect(conn, body):
    conn.disconnect = True
    participant = conn.participant
    emit({"event": "disconnect", "conn": conn.id, "identity": participant.identity if participant else None,
          "session_ok": participant is not None and body.get("session") == participant.session})
    if participant is not None:
        participant.disconnect_received = True
        await remove_participant(participant, "disconnect")


async def handle_sync(conn, body):
    session = body.get("session")
    participant = next((p for p in WORLD.participants if p.session == session), None) if session else None
    pcs = body.get("peer_connections") if isinstance(body.get("peer_connections"), list) else []
    entry = {"event": "sync", "conn": conn.id, "session_known": participant is not None,
             "identity": participant.identity if participant else None, "room": body.get("name"),
             "token_present": "token" in body, "pc_ids": [p.get("id") for p in pcs if isinstance(p, dict)],
             "participant_revision": (body.get("participant") or {}).get("revision") if isinstance(body.get("participant"), dict) else None}
    if participant is not None:
        entry["status"] = participant.status
        entry["since_lost_ms"] = round((time.monotonic() - participant.lost_at) * 1000, 1) if participant.lost_at else None
    emit(entry)
    if ARGS.fault == "refuse-sync" and fire_fault("refuse-sync"):
        emit({"event": "fault", "fault": "refuse-sync", "conn": conn.id})
        if participant is not None:
            await remove_participant(participant, "sync-refused")
        await send_error_and_close(conn, 53002, why="fault: refuse-sync")
        return
    if participant is None or participant.status == "disconnected":
        if participant is not None and participant.room.status == "completed":
            await send_error_and_close(conn, 53118, why="sync to a completed room")
        else:
            await send_error_and_close(conn, 53002, why="sync for an unknown or expired session")
        return
    code, message, claims = verify_token(body.get("token"), participant.room.name)
    if code is not None and code not in (20104,):  # an expired token still resumes its session
        emit({"event": "token-rejected", "conn": conn.id, "stage": "sync", "code": code, "message": message})
        await send_error_and_close(conn, code, message, why="token")
        return
    if code == 20104:
        emit({"event": "sync-token-expired", "conn": conn.id, "identity": participant.identity})
    old = participant.conn
    if old is not None and old is not conn and not old.closed:
        emit({"event": "sync-replaces-socket", "identity": participant.identity, "old_conn": old.id, "conn": conn.id})
        old.participant = None
        asyncio.ensure_future(close_conn(old, 1000, "replaced by a newer socket", "sync"))
    if participant.expiry is not None:
        participant.expiry.cancel()
        participant.expiry = None
    participant.status = "connected"
    participant.lost_at = None
    participant.conn = conn
    participant.conns.append(conn)
    participant.syncs += 1
    conn.participant = participant
    part = body.get("participant")
    if isinstance(part, dict) and isinstance(part.get("revision"), int):
        if not isinstance(participant.client_revision, int) or part["revision"] > participant.client_revision:
            participant.client_revision = part["revision"]
            tracks = [t for t in (part.get("tracks") or []) if isinstance(t, dict)]
            if [t.get("id") for t in tracks] != [t.get("id") for t in participant.tracks]:
                participant.tracks = tracks
                for t in tracks:
                    participant.track_sids.setdefault(t.get("id"), sid("MT"))
                participant.published_revision += 1
    # The pcs the session keeps: named by id (an SDK client closes the pcs a synced leaves out). A
    # client offer riding on the sync is answered.
    pc_replies = []
    for state in pcs:
        if isinstance(state, dict) and state.get("id") == participant.pc_id and isinstance(state.get("description"), dict):
            reply = await handle_description(participant, state["description"])
            if reply:
                pc_replies.append(reply)
    if ARGS.synced_without_pcs:
        peer_connections = []
    else:
        peer_connections = pc_replies or ([{"id": participant.pc_id}] if participant.pc_id else [])
    synced = {"type": "synced", "session": participant.session, "sid": participant.room.sid, "name": participant.room.name,
              "participant": {"sid": participant.sid, "identity": participant.identity,
                              "revision": participant.client_revision, "state": "connected", "tracks": []},
              "participants": [p.remote_view() for p in participant.room.active() if p is not participant],
              "peer_connections": peer_connections, "published": participant.published(),
              "subscribed": {"revision": 1, "tracks": []}, "recording": {"revision": 1, "is_recording": False},
              "options": {"session_timeout": ARGS.session_timeout, "signaling_region": "gll", "media_region": "us1"}}
    await send_msg(conn, synced)
    emit({"event": "synced", "conn": conn.id, "identity": participant.identity, "participant": participant.sid,
          "syncs": participant.syncs, "peer_connections": [p.get("id") for p in peer_connections],
          "answered_offer": bool(pc_replies), "frames_so_far": participant.frames})
    await notify_others(participant)
    schedule_after_connected(conn, participant)


async def handle_rsp(conn, body, via):
    if not isinstance(body, dict):
        emit({"event": "rsp-invalid", "conn": conn.id, "via": via, "detail": "body is not an object"})
        return
    kind = body.get("type")
    if kind == "connect":
        if conn.participant is not None:
            emit({"event": "rsp-unexpected", "conn": conn.id, "type": "connect", "detail": "second connect on a socket"})
            return
        await handle_connect(conn, body)
    elif kind == "sync":
        await handle_sync(conn, body)
    elif kind == "update":
        await handle_update(conn, body)
    elif kind == "disconnect":
        await handle_disconnect(conn, body)
    else:
        emit({"event": "rsp-unknown", "conn": conn.id, "type": kind, "keys": sorted(body.keys())})


# ---------------------------------------------------------------------------------------------
# TCMP

async def heartbeat_loop(conn):
    """Sends heartbeats after negotiatedTimeout of outgoing silence; judges the client gone after
    3 x negotiatedTimeout without any frame from it."""
    timeout = conn.negotiated_timeout / 1000
    while not conn.closed:
        await asyncio.sleep(min(0.05, timeout / 4))
        now = time.monotonic()
        if now - conn.last_tx >= timeout:
            if await send_frame(conn, {"type": "heartbeat"}):
                conn.heartbeats_out += 1
            else:
                conn.last_tx = now  # dropped (silent): counted in silent_dropped_out
        if conn.silent:
            conn.last_rx = now  # no judgement while the server plays dead
            continue
        if now - conn.last_rx >= 3 * timeout:
            emit({"event": "client-gone", "conn": conn.id, "silent_ms": round((now - conn.last_rx) * 1000, 1),
                  "negotiated_timeout": conn.negotiated_timeout,
                  "identity": conn.participant.identity if conn.participant else None})
            await close_conn(conn, 3001, "heartbeats missed", "client-gone")
            return


async def handle_hello(conn, message):
    WORLD.hello_count += 1
    body = message.get("body")
    info = {"id": message.get("id"), "version": message.get("version"), "timeout": message.get("timeout"),
            "cookie": message.get("cookie"), "body_type": body.get("type") if isinstance(body, dict) else None}
    conn.hellos.append(info)
    entry = {"event": "hello", "conn": conn.id, "n": WORLD.hello_count, **info}
    if isinstance(body, dict) and body.get("type") == "ice":
        entry["ice_body"] = {"version": body.get("version"), "edge": body.get("edge"), "token_present": "token" in body}
    emit(entry)
    if ARGS.fault == "no-welcome":
        WORLD.fault_fired = True
        emit({"event": "fault", "fault": "no-welcome", "conn": conn.id})
        return
    if ARGS.fault == "busy-once":
        if not WORLD.busy_sent:
            WORLD.busy_sent = True
            WORLD.fault_fired = True
            emit({"event": "fault", "fault": "busy-once", "conn": conn.id})
            await send_frame(conn, {"type": "busy", "retryAfter": 200, "keepAlive": True, "cookie": "c1"})
            return
        if WORLD.hello_count == 2:
            emit({"event": "busy-cookie", "conn": conn.id, "echoed": message.get("cookie") == "c1",
                  "cookie": message.get("cookie")})
    if message.get("version") != 2:
        await send_frame(conn, {"type": "bad", "reason": f"unsupported TCMP version {message.get('version')!r}"})
        emit({"event": "bad-sent", "conn": conn.id, "reason": "version"})
        return
    if not isinstance(message.get("id"), str):
        await send_frame(conn, {"type": "bad", "reason": "hello without an id"})
        emit({"event": "bad-sent", "conn": conn.id, "reason": "id"})
        return
    requested = message.get("timeout")
    negotiated = ARGS.max_timeout
    if isinstance(requested, (int, float)) and not isinstance(requested, bool) and requested > 0:
        negotiated = int(min(requested, ARGS.max_timeout))
    first = not conn.welcomed
    conn.welcomed = True
    conn.negotiated_timeout = negotiated
    await send_frame(conn, {"type": "welcome", "id": message["id"], "negotiatedTimeout": negotiated})
    emit({"event": "welcome", "conn": conn.id, "id": message["id"], "negotiated_timeout": negotiated})
    if first:
        conn.heartbeat_task = asyncio.ensure_future(heartbeat_loop(conn))
    if isinstance(body, dict):
        if body.get("type") == "ice":
            servers = [{"urls": u, "username": n, "credential": c} for u, n, c in ARGS.ice_servers]
            await send_msg(conn, {"type": "iced", "ice_servers": servers})
            emit({"event": "iced", "conn": conn.id, "ice_servers": len(servers)})
        elif body.get("type") in ("connect", "sync"):
            await handle_rsp(conn, body, "hello")
        else:
            emit({"event": "hello-body-unknown", "conn": conn.id, "type": body.get("type")})


async def signaling(request):
    ws = web.WebSocketResponse(max_msg_size=32 * 1024 * 1024, timeout=2.0)
    await ws.prepare(request)
    conn = Conn(ws, request)
    WORLD.conns.append(conn)
    emit({"event": "ws-open", "conn": conn.id, "port": conn.port, "tls": conn.tls, "path": conn.path,
          "headers": conn.headers, "query": dict(request.query)})
    try:
        async for frame in ws:
            conn.last_rx = time.monotonic()
            conn.frames_in += 1
            if frame.type == WSMsgType.BINARY:
                await send_frame(conn, {"type": "bad", "reason": "binary frames are not TCMP"})
                emit({"event": "bad-sent", "conn": conn.id, "reason": "binary"})
                continue
            if frame.type != WSMsgType.TEXT:
                continue
            if conn.silent:
                conn.silent_dropped_in += 1
                continue
            try:
                message = json.loads(frame.data)
            except ValueError:
                await send_frame(conn, {"type": "bad", "reason": "not JSON"})
                emit({"event": "bad-sent", "conn": conn.id, "reason": "not JSON", "bytes": len(frame.data)})
                continue
            if not isinstance(message, dict):
                await send_frame(conn, {"type": "bad", "reason": "not a JSON object"})
                emit({"event": "bad-sent", "conn": conn.id, "reason": "not an object"})
                continue
            kind = message.get("type")
            if kind == "hello":
                await handle_hello(conn, message)
            elif kind == "heartbeat":
                conn.heartbeats_in += 1
                if conn.heartbeats_in == 1:
                    emit({"event": "client-heartbeat", "conn": conn.id, "first": True})
            elif kind == "msg":
                conn.msgs_in += 1
                if not conn.welcomed:
                    await send_frame(conn, {"type": "bad", "reason": "msg before hello"})
                    emit({"event": "bad-sent", "conn": conn.id, "reason": "msg before hello"})
                    continue
                await handle_rsp(conn, message.get("body"), "msg")
            elif kind == "bye":
                conn.bye = True
                if conn.participant is not None:
                    conn.participant.bye_received = True
                emit({"event": "bye", "conn": conn.id, "identity": conn.participant.identity if conn.participant else None})
                conn.closed_by = conn.closed_by or "after-bye"
                await close_conn(conn, 1000, "bye", "bye")
            else:
                await send_frame(conn, {"type": "bad", "reason": f"unknown message type {kind!r}"})
                emit({"event": "bad-sent", "conn": conn.id, "reason": "unknown type", "type": kind})
    except Exception as error:  # noqa: BLE001 (log and treat as a lost socket)
        emit({"event": "ws-error", "conn": conn.id, "error": f"{type(error).__name__}: {error}"})
    finally:
        conn.closed = True
        conn.close_code = ws.close_code
        if conn.closed_by is None:
            conn.closed_by = "client"
        conn.closed_event.set()
        if conn.heartbeat_task is not None and not conn.heartbeat_task.done():
            conn.heartbeat_task.cancel()
        participant = conn.participant
        emit({"event": "ws-close", "conn": conn.id, "code": ws.close_code, "by": conn.closed_by, "bye": conn.bye,
              "disconnect": conn.disconnect, "identity": participant.identity if participant else None,
              "silent": conn.silent})
        if participant is not None:
            participant.ws_close_code = ws.close_code
            if participant.conn is conn and participant.status == "connected":
                participant.status = "reconnecting"
                participant.lost_at = time.monotonic()
                participant.server_revision += 1
                emit({"event": "participant-reconnecting", "identity": participant.identity, "participant": participant.sid,
                      "session_timeout": ARGS.session_timeout})
                schedule_expiry(participant)
                await notify_others(participant)
    return ws


# ---------------------------------------------------------------------------------------------
# REST

def rest_base(request):
    return f"http://127.0.0.1:{WORLD.rest_port}"


def rest_error(status, code, message):
    return web.json_response({"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}",
                              "status": status}, status=status)


def authorized(request):
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        return False
    try:
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    return user == ARGS.api_key_sid and password == ARGS.api_key_secret


@web.middleware
async def rest_middleware(request, handler):
    if not request.path.startswith("/v1/"):
        return await handler(request)
    entry = {"method": request.method, "path": request.path, "query": dict(request.query)}
    if request.method == "POST":
        entry["form"] = dict(urllib.parse.parse_qsl(await request.text()))
    ok = authorized(request)
    entry["authorized"] = ok
    WORLD.rest_requests.append(entry)
    emit({"event": "rest", **entry})
    if not ok:
        response = rest_error(401, 20003, "Authenticate")
        response.headers["WWW-Authenticate"] = 'Basic realm="Twilio API"'
        return response
    return await handler(request)


async def form(request):
    return dict(urllib.parse.parse_qsl(await request.text()))


async def rest_create_room(request):
    data = await form(request)
    name = data.get("UniqueName")
    if name is not None and WORLD.live_room(name) is not None:
        return rest_error(400, 53113, "Room exists")
    max_participants = int(data["MaxParticipants"]) if data.get("MaxParticipants", "").isdigit() else ARGS.max_participants
    room = Room(name, "rest", max_participants)
    if room.name is None:
        room.name = room.sid
    WORLD.rooms.append(room)
    emit({"event": "room-created", "room": room.name, "sid": room.sid, "by": "rest", "form": data})
    return web.json_response(room.resource(rest_base(request)), status=201)


async def rest_list_rooms(request):
    rooms = WORLD.rooms
    if "Status" in request.query:
        rooms = [r for r in rooms if r.status == request.query["Status"]]
    if "UniqueName" in request.query:
        rooms = [r for r in rooms if r.name == request.query["UniqueName"]]
    return web.json_response({"rooms": [r.resource(rest_base(request)) for r in rooms],
                              "meta": {"page": 0, "page_size": 50, "key": "rooms"}})


def find_room(request):
    return WORLD.room_by_key(request.match_info["room"])


async def rest_get_room(request):
    room = find_room(request)
    if room is None:
        return rest_error(404, 20404, f"The requested resource {request.path} was not found")
    return web.json_response(room.resource(rest_base(request)))


async def complete_room(room):
    room.status = "completed"
    room.end_time = iso_now()
    room.date_updated = room.end_time
    room.duration = int(time.time() - room.started)
    notified = []
    waits = []
    for participant in list(room.participants):
        if participant.status == "connected" and participant.conn is not None and not participant.conn.closed:
            conn = participant.conn
            await send_msg(conn, {"type": "disconnected", "status": "completed"})
            notified.append(participant.identity)
            waits.append(asyncio.ensure_future(finish_completion(participant, conn)))
        elif participant.status != "disconnected":
            await remove_participant(participant, "room-completed")
    emit({"event": "room-completed", "room": room.name, "sid": room.sid, "notified": notified})
    return waits


async def finish_completion(participant, conn):
    """After `disconnected`: up to 2 s for the client's disconnect, bye and close, then close."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(conn.closed_event.wait(), 2.0)
    except asyncio.TimeoutError:
        pass
    result = {"disconnect": conn.disconnect, "bye": conn.bye,
              "client_closed": conn.closed and conn.closed_by in ("client", "after-bye"),
              "closed_by": conn.closed_by if conn.closed else None, "close_code": conn.close_code,
              "waited_ms": round((time.monotonic() - started) * 1000, 1)}
    participant.completion = result
    emit({"event": "completion", "identity": participant.identity, "participant": participant.sid, **result})
    if not conn.closed:
        await close_conn(conn, 1000, "room completed", "room-completed")
    await remove_participant(participant, "room-completed")


async def rest_update_room(request):
    room = find_room(request)
    if room is None:
        return rest_error(404, 20404, f"The requested resource {request.path} was not found")
    data = await form(request)
    status = data.get("Status")
    if status != "completed":
        return rest_error(400, 53112, ERROR_MESSAGES[53112])
    if room.status != "completed":
        await complete_room(room)
    return web.json_response(room.resource(rest_base(request)))


def participant_resource(request, p):
    url = f"{rest_base(request)}/v1/Rooms/{p.room.sid}/Participants/{p.sid}"
    return {"sid": p.sid, "identity": p.identity, "status": p.rest_status(), "room_sid": p.room.sid,
            "account_sid": ARGS.account_sid, "date_created": p.date_created, "start_time": p.date_created,
            "end_time": p.end_time, "url": url, "links": {"published_tracks": url + "/PublishedTracks",
                                                         "subscribed_tracks": url + "/SubscribedTracks"}}


async def rest_participants(request):
    room = find_room(request)
    if room is None:
        return rest_error(404, 20404, f"The requested resource {request.path} was not found")
    people = room.participants
    if "Status" in request.query:
        people = [p for p in people if p.rest_status() == request.query["Status"]]
    if "Identity" in request.query:
        people = [p for p in people if p.identity == request.query["Identity"]]
    return web.json_response({"participants": [participant_resource(request, p) for p in people],
                              "meta": {"page": 0, "page_size": 50, "key": "participants"}})


def find_participant(request):
    room = find_room(request)
    if room is None:
        return None
    key = request.match_info["participant"]
    return next((p for p in reversed(room.participants) if p.sid == key or p.identity == key), None)


async def rest_participant(request):
    p = find_participant(request)
    if p is None:
        return rest_error(404, 20404, f"The requested resource {request.path} was not found")
    return web.json_response(participant_resource(request, p))


async def rest_published_tracks(request):
    p = find_participant(request)
    if p is None:
        return rest_error(404, 20404, f"The requested resource {request.path} was not found")
    tracks = [] if p.status == "disconnected" else p.tracks
    return web.json_response({"published_tracks": [
        {"sid": p.track_sids.get(t.get("id")), "name": t.get("name") or t.get("id"), "kind": t.get("kind"),
         "enabled": t.get("enabled", True), "participant_sid": p.sid, "room_sid": p.room.sid,
         "date_created": p.date_created,
         "url": f"{rest_base(request)}/v1/Rooms/{p.room.sid}/Participants/{p.sid}/PublishedTracks/{p.track_sids.get(t.get('id'))}"}
        for t in tracks], "meta": {"page": 0, "page_size": 50, "key": "published_tracks"}})


async def test_state(request):
    return web.json_response(WORLD.state())


# ---------------------------------------------------------------------------------------------

def parse_ice_server(text):
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError("--ice-server takes URL,USERNAME,CREDENTIAL")
    return tuple(parts)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--account-sid", required=True, help="AC...: the tokens' sub")
    parser.add_argument("--api-key-sid", required=True, help="SK...: the tokens' iss and the REST user")
    parser.add_argument("--api-key-secret", required=True, help="HS256 key of the tokens and the REST password")
    parser.add_argument("--netns", help="bind the signaling socket (and aiortc) in this network namespace")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve the signaling socket as wss")
    parser.add_argument("--seconds", type=float, default=120, help="run this long at most (default 120)")
    parser.add_argument("--max-timeout", type=int, default=5000, help="cap of negotiatedTimeout, ms (default 5000)")
    parser.add_argument("--session-timeout", type=float, default=30, help="options.session_timeout, s (default 30)")
    parser.add_argument("--ice-server", dest="ice_servers", action="append", default=[], type=parse_ice_server,
                        metavar="URL,USERNAME,CREDENTIAL", help="an RTCIceServer for the iced message (repeatable)")
    parser.add_argument("--require-room-exists", action="store_true",
                        help="connect only to rooms made by POST /v1/Rooms (else 53106)")
    parser.add_argument("--max-participants", type=int, help="more participants in a room get 53105")
    parser.add_argument("--reoffer-after", type=float, help="seconds after connected: a server re-offer (aiortc)")
    parser.add_argument("--trickle-answer-candidates", action="store_true",
                        help="send the answer without candidates and trickle them in an update (plus one for a stale ufrag)")
    parser.add_argument("--reoffer-add", choices=["audio", "video"], help="the re-offer also adds a new m-section of this kind")
    parser.add_argument("--fault", choices=FAULTS, help="misbehave this way (once per run)")
    parser.add_argument("--fault-after", type=float, default=2, help="delay of the timed faults, s (default 2)")
    parser.add_argument("--error-code", type=int, help="answer every connect with this RSP error code")
    parser.add_argument("--error-message", help="... and this message (default: the SDK's message for the code)")
    parser.add_argument("--error-close-delay", type=float, default=1.0,
                        help="after an error: how long the client may take to close before the server does (s)")
    parser.add_argument("--synced-without-pcs", action="store_true",
                        help="synced with peer_connections [] (default: [{id}] for the session's pc)")
    parser.add_argument("--any-address", action="store_true", help="let aioice use every address, not just 127.0.0.0/8")
    return parser.parse_args()


async def main():
    global ARGS
    ARGS = parse_args()
    if not ARGS.any_address:
        restrict_ice_to_loopback()
    loop = asyncio.get_running_loop()

    rest_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    rest_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rest_sock.bind(("127.0.0.1", 0))
    if ARGS.netns:
        enter_netns(ARGS.netns)  # this thread now; the REST socket stays in the host's namespace
    ws_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ws_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ws_sock.bind(("127.0.0.1", 0))
    WORLD.rest_port = rest_sock.getsockname()[1]
    WORLD.ws_port = ws_sock.getsockname()[1]

    app = web.Application(middlewares=[rest_middleware], client_max_size=16 * 1024 * 1024)
    app.router.add_get("/signaling", signaling)
    app.router.add_post("/v1/Rooms", rest_create_room)
    app.router.add_get("/v1/Rooms", rest_list_rooms)
    app.router.add_get("/v1/Rooms/{room}", rest_get_room)
    app.router.add_post("/v1/Rooms/{room}", rest_update_room)
    app.router.add_get("/v1/Rooms/{room}/Participants", rest_participants)
    app.router.add_get("/v1/Rooms/{room}/Participants/{participant}", rest_participant)
    app.router.add_get("/v1/Rooms/{room}/Participants/{participant}/PublishedTracks", rest_published_tracks)
    app.router.add_get("/test/state", test_state)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    ssl_context = None
    if ARGS.tls:
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_context.load_cert_chain(ARGS.tls[0], ARGS.tls[1])
    await web.SockSite(runner, rest_sock, shutdown_timeout=1.0).start()
    await web.SockSite(runner, ws_sock, shutdown_timeout=1.0, ssl_context=ssl_context).start()
    emit({"event": "ready", "ws_port": WORLD.ws_port, "rest_port": WORLD.rest_port,
          "netns": ARGS.netns, "tls": bool(ARGS.tls)})
    ticker = asyncio.ensure_future(frames_ticker())

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        await asyncio.wait_for(reader.read(), timeout=ARGS.seconds)
        why = "stdin"
    except asyncio.TimeoutError:
        why = "seconds"
    ticker.cancel()
    report = WORLD.state()
    report["ended_by"] = why
    emit({"report": report})
    for conn in WORLD.conns:
        if not conn.closed:
            try:
                await asyncio.wait_for(conn.ws.close(code=1001, message=b"server going away"), 1.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
    for participant in WORLD.participants:
        if participant.pc is not None:
            try:
                await asyncio.wait_for(participant.pc.close(), 2.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
    try:
        await asyncio.wait_for(runner.cleanup(), 3.0)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001
        pass


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)
