#!/usr/bin/env python3
"""A WHIP endpoint (RFC 9725) on aiortc, for krakl's WHIP driver tests.

It is an independent implementation of the server side: Python's
http.server for HTTP, pyjwt for the Bearer token (HS256 signature checked
with --secret, `grants.video.room` checked against --room; an empty
`video` grant means any room), aiortc as the receiving peer.

HTTP listens on 127.0.0.1 (loopback) in the namespace the script starts in;
with --netns NAME the main thread then enters that network namespace
(setns), so aiortc's ICE sockets live there (aioice drops 127.0.0.1 from
its host candidates; the namespace carries 127.0.0.2, docs/testing.md, "aiortc").

Paths: POST {--path} (the endpoint; default /whip/endpoint/ROOM), POST
/whip/final/ROOM (where redirects lead, on either port), PATCH and DELETE
/whip/resource/ID.

Output: one JSON object per line on stdout: {"event": "ready", "port": P,
"second_port": Q} first, then an event per request and per peer state
change, and {"report": {...}} when stdin ends or --seconds pass.

Modes (flags) make it misbehave the ways servers do: see --help.
"""
import argparse
import signal
import ssl
import asyncio
import ctypes
import json
import os
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import jwt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp
from aiortc.mediastreams import MediaStreamError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aiortc_receiver import read_stamp  # noqa: E402

CLONE_NEWNET = 0x40000000
output_lock = threading.Lock()


def emit(obj):
    obj.setdefault("t_ms", round(time.monotonic() * 1000, 1))  # CLOCK_MONOTONIC, as the test's clock
    with output_lock:
        print(json.dumps(obj), flush=True)


def enter_netns(name):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


class State:
    def __init__(self, args, loop):
        self.args = args
        self.loop = loop
        self.lock = threading.Lock()
        self.status_left = args.status_count
        self.sessions = {}      # id -> {"pc", "ufrag", "answer", "etag"}
        self.requests = []
        self.deletes = []
        self.frames = 0
        self.stamps = []
        self.frame_ms = []  # CLOCK_MONOTONIC ms at which each frame was decoded
        self.peers = []     # (resource id, RTCPeerConnection), for SIGUSR1
        self.stop = threading.Event()
        self.port = 0
        self.second_port = 0


STATE = None


def check_token(header, secret, room):
    """(ok, detail, claims): the Bearer token's HS256 signature and room grant."""
    if not header:
        return False, "no Authorization header", None
    if not header.startswith("Bearer "):
        return False, "not a Bearer token", None
    token = header[len("Bearer "):].strip()
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], options={"verify_aud": False})
    except jwt.PyJWTError as error:
        return False, f"invalid token: {error}", None
    video = (claims.get("grants") or {}).get("video")
    if not isinstance(video, dict):
        return False, "token has no video grant", claims
    granted = video.get("room")
    if granted is not None and granted != room:
        return False, f"token is for room {granted!r}, not {room!r}", claims
    return True, "ok", claims


async def consume(track, state):
    try:
        while True:
            frame = await track.recv()
            plane = frame.planes[0]
            stamp = read_stamp(bytes(plane), plane.line_size, frame.width, frame.height)
            with state.lock:
                state.frames += 1
                if len(state.frame_ms) < 20000:
                    state.frame_ms.append(round(time.monotonic() * 1000, 1))
                if stamp is not None and len(state.stamps) < 10000:
                    state.stamps.append(stamp[0])
    except MediaStreamError:
        emit({"event": "track-ended"})


async def make_answer(offer, state, resource_id):
    # Who publishes, as a WHIP server learns it: the offer's s= line and its msid stream id.
    lines = offer.replace("\r\n", "\n").split("\n")
    emit({"event": "offer", "id": resource_id,
          "session_name": next((l[2:] for l in lines if l.startswith("s=")), None),
          "msid": next((l[len("a=msid:"):].split(" ")[0] for l in lines if l.startswith("a=msid:")), None),
          "candidates": sdp_lines(offer, "a=candidate:"), "end_of_candidates": "a=end-of-candidates" in lines,
          "trickle": "a=ice-options:trickle" in lines})
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))

    @pc.on("connectionstatechange")
    def on_state():
        emit({"event": "peer", "id": resource_id, "state": pc.connectionState})
        if pc.connectionState == "connected":
            emit(dict({"event": "pair", "id": resource_id}, **nominated_pair(pc)))

    @pc.on("track")
    def on_track(track):
        asyncio.ensure_future(consume(track, state))

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    await pc.setLocalDescription(await pc.createAnswer())
    state.peers.append((resource_id, pc))
    if state.args.close_after is not None:
        async def close_later():
            await asyncio.sleep(state.args.close_after)
            emit({"event": "closing", "id": resource_id})
            await pc.close()  # aiortc's DTLS stop sends close_notify (rtcdtlstransport.py stop())
        asyncio.ensure_future(close_later())
    return pc, pc.localDescription.sdp


def nominated_pair(pc):
    """The pair aioice nominated: which of its remote candidates carries the media, and whether it
    was signalled (host, srflx, relay: from the offer or a trickle PATCH) or only learned from the
    publisher's checks (prflx)."""
    try:
        connection = pc.getTransceivers()[0].sender.transport.transport._connection
        pair = connection._nominated.get(1)
        return {"remote_type": pair.remote_candidate.type, "remote": "%s:%d" % (pair.remote_candidate.host, pair.remote_candidate.port),
                "local_type": pair.local_candidate.type}
    except Exception as error:  # aioice internals: report what went wrong rather than fail the run
        return {"error": repr(error)}


async def apply_trickle(pc, candidates, mid, end):
    """Trickled candidates to aiortc as a browser's addIceCandidate would take them; None = end-of-candidates."""
    applied = 0
    for value in candidates:
        candidate = candidate_from_sdp(value)
        candidate.sdpMid = mid
        await pc.addIceCandidate(candidate)
        applied += 1
    if end:
        await pc.addIceCandidate(None)
    return applied


def sdp_lines(text, prefix):
    return [line.strip()[len(prefix):] for line in text.splitlines() if line.strip().startswith(prefix)]


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1: libcurl sends "Expect: 100-continue" with a body, which only a 1.1 server answers
    # at once (a 1.0 server makes it wait a second before sending the body).
    protocol_version = "HTTP/1.1"

    def log_message(self, *arguments):
        pass

    def reply(self, status, body=b"", headers=()):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def record(self, extra=None):
        state = STATE
        auth = self.headers.get("Authorization")
        entry = {"event": "request", "method": self.command, "path": urlparse(self.path).path,
                 "port": self.server.server_address[1], "token": bool(auth),
                 "content_type": self.headers.get("Content-Type"), "if_match": self.headers.get("If-Match")}
        if extra:
            entry.update(extra)
        with state.lock:
            state.requests.append(entry)
        emit(dict(entry))
        return entry

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length).decode(errors="replace") if length else ""

    def do_POST(self):
        state, args = STATE, STATE.args
        path = urlparse(self.path).path
        offer = self.body()
        second = self.server.server_address[1] == state.second_port
        entry = self.record()
        final = f"/whip/final/{args.room}"
        if path == args.path and not second:
            if args.hang:
                state.stop.wait(args.seconds)
                self.close_connection = True
                return
            if args.redirect:
                target = {"relative": f"../final/{args.room}",
                          "absolute": f"http://127.0.0.1:{state.port}{final}",
                          "other-origin": f"http://127.0.0.1:{state.second_port}{final}",
                          "loop": args.path}[args.redirect]
                self.reply(args.redirect_status, f"moved to {target}\n", [("Location", target)])
                return
            with state.lock:
                forced = args.status is not None and state.status_left > 0
                if forced:
                    state.status_left -= 1
            if forced:
                headers = [("Content-Type", "text/plain")]
                if args.retry_after is not None:
                    headers.append(("Retry-After", args.retry_after))
                self.reply(args.status, f"whip test server says {args.status}\nsecond line\n", headers)
                return
        elif path != final:
            self.reply(404, "no such WHIP endpoint\n", [("Content-Type", "text/plain")])
            return
        if not (second and args.second_port_open):
            ok, detail, claims = check_token(self.headers.get("Authorization"), args.secret, args.room)
            emit({"event": "auth", "ok": ok, "detail": detail,
                  "identity": (claims or {}).get("grants", {}).get("identity") if claims else None})
            if not ok:
                self.reply(401, f"{detail}\n", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
                return
        if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/sdp":
            self.reply(415, "the offer must be application/sdp\n", [("Content-Type", "text/plain")])
            return
        resource_id = secrets.token_hex(6)
        try:
            pc, answer = asyncio.run_coroutine_threadsafe(make_answer(offer, state, resource_id), state.loop).result(30)
        except Exception as error:  # the offer was unusable for aiortc
            self.reply(400, f"cannot answer the offer: {error}\n", [("Content-Type", "text/plain")])
            return
        etag = f'"{resource_id}-1"'
        with state.lock:
            state.sessions[resource_id] = {"pc": pc, "ufrag": sdp_lines(offer, "a=ice-ufrag:")[:1], "answer": answer, "etag": etag}
        entry_out = {"event": "answered", "id": resource_id}
        headers = [("ETag", etag)]
        if not args.no_location:
            location = f"/whip/resource/{resource_id}"
            if args.location_absolute:
                location = f"http://127.0.0.1:{self.server.server_address[1]}{location}"
            headers.append(("Location", location))
        for link in args.link:
            headers.append(("Link", link))
        if args.garbage_body:
            headers.append(("Content-Type", "text/html"))
            body = "<html><body>Welcome to nginx!</body></html>\n"
        else:
            headers.append(("Content-Type", "application/sdp"))
            body = answer
        emit(entry_out)
        self.reply(201, body, headers)

    def do_PATCH(self):
        state, args = STATE, STATE.args
        path = urlparse(self.path).path
        fragment = self.body()
        ufrags = sdp_lines(fragment, "a=ice-ufrag:")
        candidates = sdp_lines(fragment, "a=candidate:")
        end = "a=end-of-candidates" in [l.strip() for l in fragment.splitlines()]
        mid = (sdp_lines(fragment, "a=mid:") or [None])[0]
        self.record({"ufrag": ufrags[0] if ufrags else None, "candidates": candidates, "end_of_candidates": end,
                     "mid": mid, "m_line": bool([l for l in fragment.splitlines() if l.startswith("m=")]),
                     "at": time.monotonic()})
        session_id = path.rsplit("/", 1)[-1]
        with state.lock:
            session = state.sessions.get(session_id) if path.startswith("/whip/resource/") else None
        if session is None:
            self.reply(404, "no such WHIP resource\n")
            return
        if args.patch_status is not None:
            self.reply(args.patch_status, f"PATCH answered {args.patch_status} by the test server\n", [("Content-Type", "text/plain")])
            return
        if (self.headers.get("Content-Type") or "").lower() != "application/trickle-ice-sdpfrag":
            self.reply(415, "PATCH needs application/trickle-ice-sdpfrag\n")
            return
        if ufrags and ufrags[:1] != session["ufrag"]:
            # An ICE restart. aiortc cannot restart ICE in place, so this answers with fresh
            # credentials and the old candidates: enough to check the exchange, not a real restart.
            ufrag, pwd = secrets.token_hex(4), secrets.token_hex(12)
            answer = session["answer"]
            lines = [f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}"]
            lines += [l.strip() for l in answer.splitlines() if l.startswith("m=")][:1]
            lines += ["a=mid:" + m for m in sdp_lines(answer, "a=mid:")[:1]]
            lines += ["a=candidate:" + c for c in sdp_lines(answer, "a=candidate:")]
            lines.append("a=end-of-candidates")
            etag = f'"{session_id}-{secrets.token_hex(2)}"'
            with state.lock:
                session["ufrag"] = ufrags[:1]
                session["etag"] = etag
            emit({"event": "restart", "id": session_id, "ufrag": ufrag, "pwd": pwd, "etag": etag})
            self.reply(200, "".join(l + "\r\n" for l in lines), [("Content-Type", "application/trickle-ice-sdpfrag"), ("ETag", etag)])
            return
        if candidates or end:
            try:
                applied = asyncio.run_coroutine_threadsafe(apply_trickle(session["pc"], candidates, mid or "0", end), state.loop).result(10)
                emit({"event": "trickled", "id": session_id, "applied": applied, "end": end})
            except Exception as error:  # a candidate aiortc cannot take: 400, as a browser's addIceCandidate would throw
                self.reply(400, f"cannot use the candidates: {error}\n", [("Content-Type", "text/plain")])
                return
        self.reply(204)

    def do_DELETE(self):
        state = STATE
        path = urlparse(self.path).path
        self.record()
        session_id = path.rsplit("/", 1)[-1]
        with state.lock:
            session = state.sessions.pop(session_id, None) if path.startswith("/whip/resource/") else None
            if session is not None:
                state.deletes.append(session_id)
        if session is None:
            self.reply(404, "no such WHIP resource\n")
            return
        emit({"event": "delete", "id": session_id})
        asyncio.run_coroutine_threadsafe(session["pc"].close(), state.loop)
        self.reply(200)


def serve(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def serve_stun():
    """A STUN server (RFC 5389 binding, aioice's codec: not ours) on 127.0.0.2 in a thread; returns its port.
    Each request is logged as {"event": "stun", "from": "ip:port"}."""
    from aioice import stun
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.2", 0))

    def answer():
        while True:
            data, addr = sock.recvfrom(2048)
            try:
                request = stun.parse_message(data)
            except ValueError:
                continue
            if request.message_method != stun.Method.BINDING or request.message_class != stun.Class.REQUEST:
                continue
            response = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.RESPONSE,
                                    transaction_id=request.transaction_id)
            response.attributes["XOR-MAPPED-ADDRESS"] = addr
            sock.sendto(bytes(response), addr)
            emit({"event": "stun", "from": "%s:%d" % addr})

    threading.Thread(target=answer, daemon=True).start()
    return sock.getsockname()[1]


async def main():
    global STATE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--secret", required=True, help="HS256 key the Bearer token must be signed with")
    parser.add_argument("--room", required=True, help="the room this endpoint serves (grants.video.room)")
    parser.add_argument("--path", help="the endpoint path (default /whip/endpoint/ROOM)")
    parser.add_argument("--netns", help="enter this network namespace for aiortc after binding HTTP")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--status", type=int, help="answer POSTs to the endpoint with this status ...")
    parser.add_argument("--status-count", type=int, default=1 << 30, help="... this many times, then normally")
    parser.add_argument("--retry-after", help="Retry-After value sent with --status")
    parser.add_argument("--redirect", choices=["relative", "absolute", "other-origin", "loop"],
                        help="redirect the endpoint's POST to /whip/final/ROOM (on the second port for other-origin)")
    parser.add_argument("--redirect-status", type=int, default=307)
    parser.add_argument("--second-port-open", action="store_true", help="the second port answers without a token")
    parser.add_argument("--no-location", action="store_true", help="201 without Location")
    parser.add_argument("--location-absolute", action="store_true")
    parser.add_argument("--garbage-body", action="store_true", help="201 with an HTML body")
    parser.add_argument("--hang", action="store_true", help="never answer the POST")
    parser.add_argument("--link", action="append", default=[], help="a Link header value (repeatable)")
    parser.add_argument("--close-after", type=float, help="close the peer connection this many seconds after answering")
    parser.add_argument("--patch-status", type=int, help="answer every PATCH with this status (e.g. 405)")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve the endpoint's port over TLS with this certificate")
    parser.add_argument("--stun", action="store_true",
                        help="answer STUN binding requests on 127.0.0.2 (in the namespace) and name that server in a "
                             "Link rel=\"ice-server\" header of every 201")
    args = parser.parse_args()
    args.path = args.path or f"/whip/endpoint/{args.room}"

    loop = asyncio.get_running_loop()
    STATE = State(args, loop)
    ThreadingHTTPServer.daemon_threads = True
    main_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    second_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    STATE.port = main_server.server_address[1]
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls[0], args.tls[1])
        main_server.socket = context.wrap_socket(main_server.socket, server_side=True)
    STATE.second_port = second_server.server_address[1]
    if args.netns:
        enter_netns(args.netns)  # the listening sockets stay on the namespace they were made in
    serve(main_server)
    serve(second_server)
    if args.stun:
        args.link.append(f"<stun:127.0.0.2:{serve_stun()}>; rel=\"ice-server\"")
    # SIGUSR1: close every peer connection now (DTLS close_notify), as a room whose host ended it;
    # a test sends it once the agent shares, instead of a --close-after timer.
    async def close_all():
        for resource_id, pc in list(STATE.peers):
            emit({"event": "closing", "id": resource_id})
            await pc.close()
    # The test runner's children inherit its blocked signals: unblock this one first.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    loop.add_signal_handler(signal.SIGUSR1, lambda: asyncio.ensure_future(close_all()))
    emit({"event": "ready", "port": STATE.port, "second_port": STATE.second_port})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        await asyncio.wait_for(reader.read(), timeout=args.seconds)
    except asyncio.TimeoutError:
        pass
    STATE.stop.set()
    with STATE.lock:
        sessions = list(STATE.sessions.values())
    for session in sessions:
        await session["pc"].close()
    with STATE.lock:
        report = {"requests": len(STATE.requests), "deletes": STATE.deletes, "frames": STATE.frames,
                  "stamps_in_order": STATE.stamps == sorted(STATE.stamps), "stamped": len(STATE.stamps),
                  "frame_ms": STATE.frame_ms}
    emit({"report": report})
    main_server.shutdown()
    second_server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
