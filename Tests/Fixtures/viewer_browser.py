#!/usr/bin/env python3
"""A person watching krakl-agent's built-in viewer page in headless Chromium.

Drives /usr/bin/chromium through /usr/bin/chromedriver with selenium, one command at a time so
a test can act in between. JSON commands on stdin, one a line; each answered with one JSON line
on stdout ({"ok": true, ...} or {"ok": false, "error": ...}):

  {"cmd": "open", "url": U, "timeout": T}   load the page; wait (at most T s) until it shows video
                                             whose frame stamp can be read, or the page ends
  {"cmd": "watch", "seconds": S}            S s of video: every presented frame's stamp
                                             (requestVideoFrameCallback), getStats numbers, and
                                             capture → presented latency per frame
  {"cmd": "state"}                          the page's own state (window.kraklViewer) and stats
  {"cmd": "restart", "timeout": T}          ICE restart through the page's window.kraklRestartIce()
                                             (WHEP PATCH); waits (at most T s) until the selected
                                             pair has the new ICE credentials and stamps advance;
                                             ICE/DTLS getStats before and after, and timings
  {"cmd": "leave"}                          leave the page (about:blank): it DELETEs its session
  {"cmd": "await_text", "text": X, "timeout": T}   wait (at most T s) until the page's status says X;
                                             every status text seen meanwhile
  {"cmd": "await_restart", "count": N, "timeout": T}  wait (at most T s) until the page has done its
                                             Nth ICE restart by itself and stamps newer than the
                                             last one before its PATCH are presented
  {"cmd": "vanish"}                         SIGKILL Chromium: the tab is gone without a DELETE
                                             or a DTLS close (only ICE consent can tell the agent)
  {"cmd": "quit"}                           leave the page, close the browser, end

Before the page's own script runs, a script added over the DevTools protocol (1) records every
RTCPeerConnection the page makes, for getStats, and (2) hooks the video's
requestVideoFrameCallback: for each presented frame, its presentationTime (ms on the
performance.now() clock, whose origin is the navigation's start) and the frame stamp read from
the frame's top rows (docs/frame-stamp.md's reader, CLOCK_MONOTONIC ms of the capture). The
clocks are put together by a few selenium round trips (the shortest one's midpoint), the way
the /clock endpoint of docs/testing.md ("Chromium") does it, so latency = presentation - capture on one clock.
"""
import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

HOOKS = r"""
(() => {
  const Original = window.RTCPeerConnection;
  window.__kraklPeers = [];
  window.RTCPeerConnection = class extends Original {
    constructor(...args) {
      super(...args);
      window.__kraklPeers.push(this);
      // Where the first frame's time goes (ms on the page's clock).
      const marks = window.__kraklMarks;
      marks.created = performance.now();
      this.addEventListener('icegatheringstatechange', () => {
        if (this.iceGatheringState === 'complete') marks.gathered = performance.now();
      });
      this.addEventListener('connectionstatechange', () => {
        if (this.connectionState === 'connected' && !marks.connected) marks.connected = performance.now();
      });
      this.addEventListener('track', () => { if (!marks.track) marks.track = performance.now(); });
    }
  };
  window.__kraklMarks = {};
  const originalFetch = window.fetch;
  window.fetch = function (resource, options) {
    const marks = window.__kraklMarks;
    const post = options && options.method === 'POST';
    if (post) marks.posted = performance.now();
    const answer = originalFetch.apply(this, arguments);
    if (post) answer.then(() => { marks.answered = performance.now(); }, () => {});
    return answer;
  };
  %READ_STAMP%
  window.__kraklFrames = [];
  function hook() {
    const video = document.getElementById('video');
    if (!video || !video.requestVideoFrameCallback) return;
    const canvas = document.createElement('canvas');
    let ctx = null;
    const onFrame = (now, meta) => {
      const w = meta.width, h = meta.height;
      // The stamp's rows only (one 16-px row of blocks from 1184 px wide, more when narrower).
      const rows = Math.min(h, Math.ceil(74 / Math.max(1, Math.floor(w / 16))) * 16);
      if (canvas.width !== w || canvas.height !== rows) { canvas.width = w; canvas.height = rows; ctx = null; }
      ctx = ctx || canvas.getContext('2d', { willReadFrequently: true });
      ctx.drawImage(video, 0, 0, w, rows, 0, 0, w, rows);
      const stamp = readStamp(ctx, w);
      if (window.__kraklFrames.length < 100000) {
        window.__kraklFrames.push({ p: meta.presentationTime, w, h, presented: meta.presentedFrames,
                                    frame: stamp ? stamp.frame : null, captureMs: stamp ? stamp.captureMs : null });
      }
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
  }
  document.addEventListener('DOMContentLoaded', hook);
})();
"""

# docs/frame-stamp.md's reader, shared with conference_browser.py.
HOOKS = HOOKS.replace("%READ_STAMP%", open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "frame_stamp.js")).read())

STATS = r"""
const done = arguments[arguments.length - 1];
const pc = (window.__kraklPeers || []).slice(-1)[0];
if (!pc) { done(null); return; }
pc.getStats().then((report) => {
  const out = { connectionState: pc.connectionState };
  const byId = {};
  let pairId = null;
  report.forEach((s) => {
    byId[s.id] = s;
    if (s.type === 'inbound-rtp' && s.kind === 'video') {
      for (const key of ['framesDecoded', 'framesReceived', 'framesDropped', 'keyFramesDecoded', 'freezeCount',
                         'totalFreezesDuration', 'pauseCount', 'totalPausesDuration', 'jitterBufferDelay',
                         'jitterBufferEmittedCount', 'packetsReceived', 'packetsLost', 'nackCount', 'pliCount',
                         'firCount', 'frameWidth', 'frameHeight', 'framesPerSecond', 'bytesReceived', 'totalDecodeTime']) {
        out[key] = s[key];
      }
    }
    if (s.type === 'transport' && s.selectedCandidatePairId) pairId = s.selectedCandidatePairId;
  });
  const pair = byId[pairId];
  if (pair) {
    const local = byId[pair.localCandidateId] || {}, remote = byId[pair.remoteCandidateId] || {};
    out.pair = { local: (local.address || local.ip) + ':' + local.port + ' ' + local.candidateType,
                 remote: (remote.address || remote.ip) + ':' + remote.port + ' ' + remote.candidateType,
                 rtt: pair.currentRoundTripTime };
  }
  done(out);
}).catch((e) => done({ error: String(e) }));
"""

ICE_STATS = r"""
const done = arguments[arguments.length - 1];
const pc = (window.__kraklPeers || []).slice(-1)[0];
if (!pc) { done(null); return; }
pc.getStats().then((report) => {
  const byId = {};
  report.forEach((s) => { byId[s.id] = s; });
  const out = { iceConnectionState: pc.iceConnectionState, connectionState: pc.connectionState };
  report.forEach((s) => {
    if (s.type !== 'transport') return;
    for (const key of ['dtlsState', 'iceState', 'selectedCandidatePairChanges', 'srtpCipher', 'tlsVersion', 'dtlsRole',
                       'iceLocalUsernameFragment', 'bytesReceived', 'packetsReceived']) out[key] = s[key];
    const mine = byId[s.localCertificateId], theirs = byId[s.remoteCertificateId];
    out.localFingerprint = mine ? mine.fingerprint : null;
    out.remoteFingerprint = theirs ? theirs.fingerprint : null;
    const pair = byId[s.selectedCandidatePairId];
    if (pair) {
      const local = byId[pair.localCandidateId] || {}, remote = byId[pair.remoteCandidateId] || {};
      out.pair = { id: pair.id, localUfrag: local.usernameFragment || null, remoteUfrag: remote.usernameFragment || null,
                   local: (local.address || local.ip) + ':' + local.port + ' ' + local.candidateType,
                   remote: (remote.address || remote.ip) + ':' + remote.port + ' ' + remote.candidateType };
    }
  });
  done(out);
}).catch((e) => done({ error: String(e) }));
"""

RESTART = r"""
const done = arguments[arguments.length - 1];
if (!window.kraklRestartIce) { done({ restarted: false, why: 'the page has no kraklRestartIce' }); return; }
window.kraklRestartIce().then((r) => done(r), (e) => done({ restarted: false, why: String(e) }));
"""

PAGE_STATE = ("return window.kraklViewer ? {text: kraklViewer.text, ended: kraklViewer.ended, offerSent: kraklViewer.offerSent,"
              " answered: kraklViewer.answered, restarts: kraklViewer.restarts} : null")


def monotonic_ms():
    return time.monotonic() * 1000  # CLOCK_MONOTONIC on Linux: the agent's stamps' clock


class Viewer:
    def __init__(self, args):
        self.profile = tempfile.mkdtemp(prefix="krakl-viewer-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run", "--disable-gpu",
                     "--disable-extensions", "--autoplay-policy=no-user-gesture-required",
                     "--window-size=%s" % args.window.replace("x", ","), "--user-data-dir=" + self.profile):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.service = Service("/usr/bin/chromedriver")
        self.driver = webdriver.Chrome(service=self.service, options=options)
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOKS})
        self.frames_taken = 0
        self.vanished = False

    def frames(self):
        """Frames presented since the last call."""
        frames = self.driver.execute_script("return window.__kraklFrames ? window.__kraklFrames.slice(arguments[0]) : []",
                                            self.frames_taken)
        self.frames_taken += len(frames)
        return frames

    def stats(self):
        return self.driver.execute_async_script(STATS)

    def clock_offset(self):
        """CLOCK_MONOTONIC ms minus performance.now() ms (the round trip with the least delay)."""
        best = None
        for _ in range(12):
            before = monotonic_ms()
            now = self.driver.execute_script("return performance.now()")
            after = monotonic_ms()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) / 2 - now)
        return best[1], best[0]

    def open(self, command):
        started = monotonic_ms()
        self.driver.set_page_load_timeout(command.get("timeout", 30))
        # A URL differing only in its fragment would not load the page again (same document).
        self.driver.get("about:blank")
        self.frames_taken = 0
        started = monotonic_ms()
        self.driver.get(command["url"])
        deadline = time.monotonic() + command.get("timeout", 30)
        seen = []
        state = None
        while time.monotonic() < deadline:
            state = self.driver.execute_script(PAGE_STATE)
            seen += self.frames()
            if any(f["frame"] is not None for f in seen) or (state and state["ended"]):
                break
            time.sleep(0.05)
        offset, rtt = self.clock_offset()
        stamped = [f for f in seen if f["frame"] is not None]
        # The performance.now() clock starts at the navigation, so presentationTime is "page opened → shown".
        return {"playing": bool(stamped), "state": state, "waited_ms": monotonic_ms() - started,
                "first_frame_ms": seen[0]["p"] if seen else None,
                "first_stamped_ms": stamped[0]["p"] if stamped else None,
                "first_latency_ms": (stamped[0]["p"] + offset - unwrap(stamped[0]["captureMs"], stamped[0]["p"] + offset))
                if stamped else None,
                "size": "%sx%s" % (seen[0]["w"], seen[0]["h"]) if seen else None, "clock_rtt_ms": rtt,
                "marks": self.driver.execute_script("return window.__kraklMarks || {}")}

    def watch(self, command):
        before = self.stats()
        self.frames()  # from now on
        time.sleep(command.get("seconds", 3))
        frames = self.frames()
        after = self.stats()
        offset, rtt = self.clock_offset()
        stamped = [f for f in frames if f["frame"] is not None]
        numbers = [f["frame"] for f in stamped]
        times = [f["p"] for f in frames]
        latencies = sorted(round(f["p"] + offset - unwrap(f["captureMs"], f["p"] + offset), 2) for f in stamped)
        return {
            "presented": len(frames), "stamps_read": len(stamped), "distinct_frames": len(set(numbers)),
            "first_frame": numbers[0] if numbers else None, "last_frame": numbers[-1] if numbers else None,
            "decreasing": sum(1 for a, b in zip(numbers, numbers[1:]) if b < a),
            "sizes": sorted({"%dx%d" % (f["w"], f["h"]) for f in frames}),
            "latency_ms": latencies, "clock_rtt_ms": rtt,
            # The longest time the picture stood still (headless Chromium merges some callbacks: ~2 frames is normal).
            "max_gap_ms": max((b - a for a, b in zip(times, times[1:])), default=None),
            "stats_before": before, "stats": after, "state": self.driver.execute_script(PAGE_STATE),
        }

    def state(self, command):
        return {"state": self.driver.execute_script(PAGE_STATE), "stats": self.stats()}

    def restart(self, command):
        """ICE restart from the page; then waits for the new generation's pair and advancing stamps."""
        before = self.driver.execute_async_script(ICE_STATS)
        frames = self.frames()
        stamped_before = [f["frame"] for f in frames if f["frame"] is not None]
        result = self.driver.execute_async_script(RESTART)
        times = (result or {}).get("times") or {}
        deadline = time.monotonic() + command.get("timeout", 20)
        after, switched_ms, seen = None, None, []
        while time.monotonic() < deadline:
            after = self.driver.execute_async_script(ICE_STATS)
            seen += self.frames()
            pair, old = (after or {}).get("pair") or {}, (before or {}).get("pair") or {}
            if switched_ms is None and pair.get("localUfrag") and pair.get("localUfrag") != old.get("localUfrag"):
                switched_ms = self.driver.execute_script("return performance.now()")
            patched = times.get("patched", 0)
            last_before = max([f["frame"] for f in seen if f["frame"] is not None and f["p"] < patched] + stamped_before[-1:] or [-1])
            advanced = [f for f in seen if f["frame"] is not None and f["p"] >= times.get("applied", patched) and f["frame"] > last_before]
            if switched_ms is not None and len(advanced) >= 5:
                break
            time.sleep(0.1)
        patched = times.get("patched")
        last_before = max([f["frame"] for f in seen if f["frame"] is not None and patched is not None and f["p"] < patched]
                          + stamped_before[-1:] or [-1])
        after_patch = [f for f in seen if f["frame"] is not None and patched is not None and f["p"] >= patched and f["frame"] > last_before]
        return {"restarted": bool(result and result.get("restarted")), "result": result, "before": before, "after": after,
                "patch_answered_ms": times["answered"] - patched if patched is not None and "answered" in times else None,
                "patch_to_pair_switch_ms": switched_ms - patched if switched_ms is not None and patched is not None else None,
                "patch_to_next_frame_ms": after_patch[0]["p"] - patched if after_patch else None,
                "frames_after_patch": len(after_patch), "last_frame_before": last_before,
                "decreasing": sum(1 for a, b in zip([f["frame"] for f in seen if f["frame"] is not None],
                                                    [f["frame"] for f in seen if f["frame"] is not None][1:]) if b < a),
                "state": self.driver.execute_script(PAGE_STATE)}

    def page_restart_state(self):
        return self.driver.execute_script(
            "const v = window.kraklViewer; return v ? {text: v.text, restarts: v.restarts, times: v.restartTimes, ended: v.ended} : null")

    def await_text(self, command):
        deadline = time.monotonic() + command.get("timeout", 20)
        texts, state = [], None
        while time.monotonic() < deadline:
            state = self.page_restart_state() or {}
            if state.get("text") not in texts:
                texts.append(state.get("text"))
            if state.get("text") == command["text"]:
                break
            time.sleep(0.05)
        return {"found": (state or {}).get("text") == command["text"], "texts": texts, "state": state}

    def await_restart(self, command):
        deadline = time.monotonic() + command.get("timeout", 30)
        texts, seen, state, newer, last_before = [], [], None, [], -1
        while time.monotonic() < deadline:
            state = self.page_restart_state() or {}
            if state.get("text") not in texts:
                texts.append(state.get("text"))
            seen += self.frames()
            times = state.get("times") or {}
            if state.get("restarts", 0) >= command.get("count", 1) and "applied" in times:
                stamped = [f for f in seen if f["frame"] is not None]
                last_before = max([f["frame"] for f in stamped if f["p"] < times["patched"]] or [-1])
                newer = [f for f in stamped if f["p"] >= times["patched"] and f["frame"] > last_before]
                if len(newer) >= 5:
                    break
            if state.get("ended"):
                break
            time.sleep(0.05)
        times = (state or {}).get("times") or {}
        return {"restarts": (state or {}).get("restarts"), "texts": texts, "state": state, "times": times,
                "frames_after_patch": len(newer), "last_frame_before": last_before,
                "patch_to_next_frame_ms": newer[0]["p"] - times["patched"] if newer and "patched" in times else None,
                "asked_to_next_frame_ms": newer[0]["p"] - times["asked"] if newer and "asked" in times else None,
                "ice": self.driver.execute_async_script(ICE_STATS)}

    def vanish(self, command):
        # Every process under chromedriver (the browser, its renderers and helpers), killed at once:
        # no pagehide, no DELETE, no DTLS close_notify.
        victims = descendants(self.service.process.pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return {"killed": len(victims)}

    def leave(self, command):
        # Leaving the page, as closing its tab does: pagehide, and the page DELETEs its session (keepalive).
        self.driver.get("about:blank")
        return {}

    def close(self):
        try:
            if self.vanished:
                raise RuntimeError("gone")
            # The page's DELETE (fetch keepalive) must be answered before the browser goes: quitting at
            # once could cut it. pagehide (what leaving the page fires) runs it on the page, where its
            # answer shows in kraklViewer.released; that is waited for (bounded), then the page is left.
            pending = self.driver.execute_script(
                "const s = window.kraklViewer; if (!s || !s.resource) return false;"
                " dispatchEvent(new PageTransitionEvent('pagehide', {persisted: false})); return true;")
            deadline = time.monotonic() + 5
            while pending and time.monotonic() < deadline:
                if self.driver.execute_script("return window.kraklViewer ? kraklViewer.released : 0") is not None:
                    break
                time.sleep(0.05)
            self.leave({})
        except Exception:
            pass
        try:
            self.driver.quit()
        except Exception:
            try:
                self.service.stop()
            except Exception:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def unwrap(capture_ms, presented_ms):
    """The capture time (CLOCK_MONOTONIC ms modulo 2^32, as stamped) nearest before `presented_ms`."""
    base = presented_ms - (presented_ms % 2**32)
    value = base + capture_ms
    return value - 2**32 if value > presented_ms + 2**31 else value


def descendants(root):
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo and len(found) < 1000:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", default="1280x900")
    args = parser.parse_args()
    viewer = Viewer(args)
    print(json.dumps({"ok": True, "ready": True, "browser": viewer.driver.capabilities.get("browserVersion")}), flush=True)
    commands = {"open": viewer.open, "watch": viewer.watch, "state": viewer.state, "leave": viewer.leave, "vanish": viewer.vanish,
                "restart": viewer.restart, "await_text": viewer.await_text, "await_restart": viewer.await_restart}
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command["cmd"] == "quit":
                break
            try:
                reply = {"ok": True, "cmd": command["cmd"]}
                reply.update(commands[command["cmd"]](command))
            except Exception as error:  # the test reads the failure; the session goes on
                reply = {"ok": False, "cmd": command.get("cmd"), "error": "%s: %s" % (type(error).__name__, error)}
            print(json.dumps(reply), flush=True)
            if command["cmd"] == "vanish":
                viewer.vanished = True
                break
    finally:
        viewer.close()


if __name__ == "__main__":
    main()
