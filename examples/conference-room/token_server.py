#!/usr/bin/env python3
"""The development conference room's backend (scripts/dev-room starts it).

FOR DEVELOPMENT ONLY. It plays the part a real conference backend plays for
docs/join-codes.md, and nothing more: it asks nobody who they are.

- serves the conference page (this folder) and Debian's browser libraries
  (janus.js, adapter.js, qrcode.js from /usr/share/javascript);
- owns one Janus VideoRoom room, made with a secret that stays here;
- mints join-code tokens (HS256, Twilio-shaped) for the page, signed with a
  secret that stays here too;
- ends the meeting (destroys the room with its secret) when the page asks.

The page never sees either secret: it gets the token, the Janus URL and the
room, and writes the join code itself (docs/join-codes.md).

API (JSON in and out):
  GET  /api/room          {"kind", "janus", "room", "iceServers"}; makes the
                          room again if a past "End meeting" destroyed it
  POST /api/screen-token  {"identity": NAME} -> {"token", "expires"}
  POST /api/end-meeting   {} -> {"ended": true}

Run with a Python that has pyjwt (/opt/krakl-venv/bin/python).
"""
import argparse
import errno
import json
import os
import random
import secrets
import signal
import sys
import threading
import time
import unicodedata
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import jwt
except ImportError:
    sys.exit("token_server: pyjwt is missing: run it with /opt/krakl-venv/bin/python (scripts/setup makes that venv)")

PAGE_FOLDER = os.path.dirname(os.path.abspath(__file__))
PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
              "/conference.js": ("conference.js", "text/javascript; charset=utf-8"),
              "/conference.css": ("conference.css", "text/css; charset=utf-8")}
# Debian's browser libraries, served where Debian's javascript-common would serve them.
LIBRARIES = {"/javascript/janus-gateway/janus.js": "/usr/share/javascript/janus-gateway/janus.js",
             "/javascript/webrtc-adapter/adapter.js": "/usr/share/javascript/webrtc-adapter/adapter.js",
             "/javascript/qrcode-generator/qrcode.js": "/usr/share/javascript/qrcode-generator/qrcode.js"}
MAX_BODY = 4096


class JanusError(Exception):
    pass


class Janus:
    """The few VideoRoom requests the backend makes, over Janus's HTTP API, each
    in a short-lived session (create, attach, request, destroy)."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def _post(self, path, body):
        body = dict(body, transaction="%016x" % random.getrandbits(64))
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                answer = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise JanusError("Janus at %s does not answer: %s" % (self.base, error)) from None
        if answer.get("janus") == "error":
            raise JanusError("Janus refused %s: %s" % (body.get("janus"), answer.get("error", {}).get("reason")))
        return answer

    def videoroom(self, body):
        session = self._post("", {"janus": "create"})["data"]["id"]
        try:
            handle = self._post("/%d" % session, {"janus": "attach", "plugin": "janus.plugin.videoroom"})["data"]["id"]
            reply = self._post("/%d/%d" % (session, handle), {"janus": "message", "body": body})
            data = reply.get("plugindata", {}).get("data", {})
            if data.get("videoroom") == "event" and "error" in data:
                raise JanusError("VideoRoom refused %s: %s (%s)" % (body.get("request"), data["error"], data.get("error_code")))
            return data
        finally:
            try:
                self._post("/%d" % session, {"janus": "destroy"})
            except JanusError:
                pass


class Room:
    """The one room of this development meeting and its two secrets."""

    def __init__(self, janus, room, janus_url_for_page, ttl):
        self.janus = janus
        self.room = room
        self.janus_url = janus_url_for_page
        self.ttl = ttl
        # Never sent anywhere but to Janus (room) or used anywhere but here (signing).
        self.room_secret = secrets.token_urlsafe(24)
        self.signing_secret = secrets.token_urlsafe(32)
        self.lock = threading.Lock()

    def ensure(self):
        """Makes the room unless it is there (after "End meeting" it is not)."""
        with self.lock:
            if self.janus.videoroom({"request": "exists", "room": self.room}).get("exists"):
                return
            # A realistic bitrate: Janus's stock rooms cap publishers at 128 kbit/s (docs/testing.md, "Traps").
            self.janus.videoroom({"request": "create", "room": self.room, "secret": self.room_secret,
                                  "description": "krakl development room", "bitrate": 2_500_000,
                                  "publishers": 12, "videocodec": "vp8,vp9", "is_private": False})

    def end(self):
        with self.lock:
            self.janus.videoroom({"request": "destroy", "room": self.room, "secret": self.room_secret})

    def token(self, identity):
        now = int(time.time())
        claims = {"jti": secrets.token_hex(8), "iss": "SKdev", "sub": "ACdev", "iat": now, "nbf": now,
                  "exp": now + self.ttl, "grants": {"identity": identity, "video": {"room": str(self.room)}}}
        token = jwt.encode(claims, self.signing_secret, algorithm="HS256",
                           headers={"typ": "JWT", "cty": "twilio-fpa;v=1"})
        return token, claims["exp"]


def identity_problem(name):
    """Why a display name cannot be a token identity (docs/join-codes.md), or None."""
    if not name.strip():
        return "type a name for the screen"
    if len(name) > 64:
        return "the name is longer than 64 characters"
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069":
            return "the name holds a control character, a line break or a direction override"
    return None


def make_handler(room, quiet):
    class Handler(BaseHTTPRequestHandler):
        server_version = "krakl-dev-room"

        def log_message(self, format, *args):
            if not quiet:
                sys.stderr.write("dev-room: %s\n" % (format % args))

        def send(self, status, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path in PAGE_FILES:
                name, content_type = PAGE_FILES[path]
                with open(os.path.join(PAGE_FOLDER, name), "rb") as file:
                    return self.send(200, file.read(), content_type)
            if path in LIBRARIES:
                try:
                    with open(LIBRARIES[path], "rb") as file:
                        return self.send(200, file.read(), "text/javascript; charset=utf-8")
                except OSError:
                    return self.send(404, {"error": "%s is not installed (scripts/setup installs it)" % LIBRARIES[path]})
            if path == "/api/room":
                try:
                    room.ensure()
                except JanusError as error:
                    return self.send(502, {"error": str(error)})
                return self.send(200, {"kind": "janus", "janus": room.janus_url, "room": room.room, "iceServers": []})
            self.send(404, {"error": "no such page"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self.send(413, {"error": "request too large"})
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                return self.send(400, {"error": "the request is not a JSON object"})
            path = self.path.split("?", 1)[0]
            try:
                if path == "/api/screen-token":
                    identity = body.get("identity")
                    problem = identity_problem(identity) if isinstance(identity, str) else "identity must be a string"
                    if problem:
                        return self.send(400, {"error": problem})
                    room.ensure()
                    token, expires = room.token(identity.strip())
                    # The token is a credential: the log says who asked, never the token.
                    sys.stderr.write("dev-room: minted a token for %r (room %s, valid %d s)\n" % (identity.strip(), room.room, room.ttl))
                    return self.send(200, {"token": token, "expires": expires})
                if path == "/api/end-meeting":
                    room.end()
                    sys.stderr.write("dev-room: the meeting in room %s was ended\n" % room.room)
                    return self.send(200, {"ended": True})
            except JanusError as error:
                return self.send(502, {"error": str(error)})
            self.send(404, {"error": "no such API"})

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--janus", default="http://127.0.0.1:8088/janus", help="Janus HTTP API, as the page and the agent reach it")
    parser.add_argument("--room", type=int, default=4242)
    parser.add_argument("--ttl", type=int, default=3600, help="seconds a token is valid")
    parser.add_argument("--quiet", action="store_true", help="no request log")
    parser.add_argument("--pid-file", help="write this process's id there (scripts/dev-room stops it by that)")
    args = parser.parse_args()
    if args.pid_file:
        with open(args.pid_file, "w") as file:
            file.write("%d\n" % os.getpid())

    room = Room(Janus(args.janus), args.room, args.janus, args.ttl)
    try:
        room.ensure()
    except JanusError as error:
        sys.exit("dev-room: %s" % error)
    try:
        server = ThreadingHTTPServer((args.address, args.port), make_handler(room, args.quiet))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            sys.exit("dev-room: port %d on %s is taken; choose another with --port" % (args.port, args.address))
        sys.exit("dev-room: cannot listen on %s:%d: %s" % (args.address, args.port, error.strerror))
    server.daemon_threads = True
    # SIGTERM (scripts/dev-room stopping it) is a normal end, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("dev-room: token server listening on %s:%d (room %d)" % (args.address, args.port, args.room), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
