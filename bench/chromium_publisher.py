#!/usr/bin/env python3
"""Chromium sharing its screen into a Janus VideoRoom with getDisplayMedia:
the third publisher of `krakl-bench roomshare` (issue 27).

  chromium_publisher.py --room R --display D --x-display :N [--kbps 2500]

Serves bench/chromium_share.html on 127.0.0.1 (a free port; run it inside
the bench's namespace, where Janus's HTTP API is http://127.0.0.1:8088/janus)
and starts Debian's Chromium on the X display (headed: headless Chromium
captures a virtual screen of its own, not the X server's), its window placed
just right of the screen so that it covers none of the scene and is not in
the capture. The page loads and waits. Lines on stdin are commands for it:

  share      getDisplayMedia, contentHint "detail", publish as D (VP8, no audio, --kbps)
  (end of stdin, SIGTERM or SIGINT)
             the page reports the sender's statistics and leaves the room;
             then Chromium is ended (SIGTERM, SIGKILL after 5 s)

Prints JSON lines: {"chromium_pid": P} (the browser process: the bench sums
the CPU and memory of it and everything under it), then whatever the page
reports ({"page": "loaded"}, {"captured": ...}, {"published": true},
{"stats": ...}, {"error": ...}, {"left": true}).

Run with /opt/krakl-venv/bin/python (standard library only).
"""
import argparse
import ctypes
import http.server
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = open(os.path.join(HERE, "chromium_share.html"), "rb").read()

# Chromium as a person would start it (/usr/bin/chromium, Debian's wrapper and default flags), plus
# what running it here needs. The docs (PERFORMANCE.md, issue 27) list these and why.
FLAGS = [
    "--no-sandbox",                      # runs as root
    "--no-first-run", "--no-default-browser-check", "--password-store=basic",
    "--disable-gpu",                     # no GPU here: software compositing, as on a machine without one
    "--disable-background-networking", "--disable-component-update",   # no unrelated work in the window
    "--disable-features=WebRtcHideLocalIpsWithMdns",   # Janus ignores mDNS candidates (docs/testing.md)
    "--auto-select-desktop-capture-source=Entire screen",   # getDisplayMedia picks the screen, no dialog
    "--window-position=1920,0", "--window-size=800,600",    # off the 1920x1080 screen
]

commands = queue.Queue()   # for the page, one a /control request
left = threading.Event()   # the page said it left the room


def emit(obj):
    if isinstance(obj, dict) and obj.get("left"):
        left.set()
    print(json.dumps(obj), flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/control":
            try:
                body = commands.get(timeout=25).encode()
            except queue.Empty:
                body = b"wait"
            self.answer(body, "text/plain")
        elif self.path.split("?")[0] == "/":
            self.answer(PAGE, "text/html")
        else:
            self.send_error(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(min(length, 1 << 20))
        try:
            emit(json.loads(body))
        except ValueError:
            emit({"error": "unreadable report"})
        self.answer(b"", "text/plain")

    def answer(self, body, kind):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", type=int, required=True)
    parser.add_argument("--display", required=True)
    parser.add_argument("--x-display", required=True)
    parser.add_argument("--kbps", type=int, default=2500)
    parser.add_argument("--max-seconds", type=float, default=900, help="end on its own after this long (a bound, not a timer)")
    args = parser.parse_args()
    started = time.monotonic()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/?room=%d&display=%s&kbps=%d" % (server.server_address[1], args.room, args.display, args.kbps)
    profile = tempfile.mkdtemp(prefix="krakl-bench-chromium-")
    environment = dict(os.environ, DISPLAY=args.x_display)
    log = open(os.path.join(profile, "chromium.log"), "wb")
    # Chromium ends with this helper even if the helper is killed (the death signal outlives exec).
    libc = ctypes.CDLL(None, use_errno=True)
    browser = subprocess.Popen(["/usr/bin/chromium", "--user-data-dir=" + profile] + FLAGS + [url],
                               env=environment, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))   # PR_SET_PDEATHSIG
    emit({"chromium_pid": browser.pid})

    ending = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ending.set())

    def read_commands():
        for line in sys.stdin:
            if line.strip() == "share":
                commands.put("share")
        ending.set()
    threading.Thread(target=read_commands, daemon=True).start()
    while not ending.wait(0.2) and time.monotonic() < started + args.max_seconds:
        if browser.poll() is not None:
            emit({"error": "chromium ended with status %s" % browser.returncode})
            break

    # The page leaves the room (bounded), then the browser ends.
    commands.put("stop")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and browser.poll() is None and not left.is_set():
        time.sleep(0.05)
    if browser.poll() is None:
        browser.terminate()
        try:
            browser.wait(5)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait()
    server.shutdown()
    shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
