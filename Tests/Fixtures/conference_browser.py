#!/usr/bin/env python3
"""A person at the development conference page (scripts/dev-room), in Chromium.

Drives /usr/bin/chromium through /usr/bin/chromedriver with selenium, one
command at a time so a test can do things in between (start the agent).
Reads JSON commands from stdin, one a line; answers each with one JSON line
on stdout ({"ok": true, ...} or {"ok": false, "error": ...}):

  {"cmd": "open"}                                  load the page, wait until it is in the room
  {"cmd": "share", "name": N, "screenshot": PATH}  "Share a screen" as N, wait for the QR code,
                                                   save a screenshot of the page to PATH
  {"cmd": "watch", "name": N, "seconds": S, "timeout": T}
                                                   wait (at most T s) for a tile labelled N
                                                   showing video, then read the frame stamp
                                                   from its pixels for S s; getStats numbers
  {"cmd": "end"}                                   press "End meeting"; t_ms is when (CLOCK_MONOTONIC)
  {"cmd": "restart"}                               after the end: "Start a new meeting", back in the room
  {"cmd": "gone", "name": N, "timeout": T}         wait (at most T s) until no tile is labelled N

"share" with "return_code": true also answers with the code itself, for a
test to hand to the agent (never printed there: the token is a credential).
  {"cmd": "quit"}

Options: --url (the page), --headed (a real window on $DISPLAY, for --scan
tests; default headless), --window WxH. Run inside the namespace that holds
Janus (docs/testing.md, "Janus"), with /opt/krakl-venv/bin/python (selenium).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

# docs/frame-stamp.md's reader (frame_stamp.js), run on a canvas holding the tile's current frame.
READ_STAMP = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "frame_stamp.js")).read()

# The tile labelled arguments[0] (by its visible label), its video's size and stamp.
SAMPLE_TILE = READ_STAMP + r"""
const name = arguments[0];
const tile = [...document.querySelectorAll('#tiles .tile')].find((t) => t.querySelector('.label').textContent === name);
if (!tile) return { tile: false, labels: [...document.querySelectorAll('#tiles .tile .label')].map((l) => l.textContent) };
const video = tile.querySelector('video');
const w = video.videoWidth, h = video.videoHeight;
if (!w || !h || video.readyState < 2) return { tile: true, playing: false, readyState: video.readyState };
const canvas = window.__stampCanvas || (window.__stampCanvas = document.createElement('canvas'));
canvas.width = w; canvas.height = h;
const ctx = canvas.getContext('2d', { willReadFrequently: true });
ctx.drawImage(video, 0, 0, w, h);
return { tile: true, playing: true, width: w, height: h, stamp: readStamp(ctx, w) };
"""


def monotonic_ms():
    return time.monotonic() * 1000  # CLOCK_MONOTONIC on Linux, the test's clock


def browser(args, profile):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    if not args.headed:
        options.add_argument("--headless=new")
    else:
        options.add_argument("--kiosk")  # the page alone on the screen, for a scanner looking at it
    for flag in ("--no-sandbox", "--disable-dev-shm-usage", "--no-first-run", "--disable-gpu",
                 "--autoplay-policy=no-user-gesture-required", "--window-position=0,0",
                 "--window-size=%s" % args.window.replace("x", ","),
                 "--user-data-dir=" + profile):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def wait_until(predicate, seconds, step=0.05):
    """Polls `predicate` (bounded); its last value."""
    deadline = time.monotonic() + seconds
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step)
        value = predicate()
    return value


def status_text(driver):
    return driver.find_element(By.ID, "status").text


def do_open(driver, args, command):
    driver.get(args.url)
    joined = wait_until(lambda: status_text(driver).startswith("In room"), command.get("timeout", 15))
    return {"joined": bool(joined), "status": status_text(driver)}


def do_share(driver, args, command):
    driver.find_element(By.ID, "share-screen").click()
    name_field = driver.find_element(By.ID, "share-name")
    name_field.clear()
    name_field.send_keys(command["name"])
    driver.find_element(By.ID, "make-code").click()
    shown = wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#join-qr svg") and
                       driver.find_element(By.ID, "join").is_displayed(), 10)
    if not shown:
        error = driver.find_element(By.ID, "share-error")
        return {"shown": False, "error": error.text if error.is_displayed() else "no QR code appeared"}
    code = driver.find_element(By.ID, "join-code").get_attribute("value")
    # The QR code in view for the screenshot (and a person's camera).
    driver.execute_script("document.getElementById('join-qr').scrollIntoView({block: 'center'})")
    if command.get("screenshot"):
        driver.save_screenshot(command["screenshot"])
    # The code is a credential: its length and start only, unless the test asks for it.
    reply = {"shown": True, "code_length": len(code), "code_start": code[:24],
             "expiry": driver.find_element(By.ID, "join-expiry").text}
    if command.get("return_code"):
        reply["code"] = code
    return reply


def do_watch(driver, args, command):
    name = command["name"]
    started = monotonic_ms()
    first = wait_until(lambda: (lambda s: s if s.get("playing") else None)(driver.execute_script(SAMPLE_TILE, name)),
                       command.get("timeout", 30))
    report = {"tile_seen": bool(first), "waited_ms": monotonic_ms() - started}
    if not first:
        report["last"] = driver.execute_script(SAMPLE_TILE, name)
        return report
    samples = []
    end = time.monotonic() + command.get("seconds", 3)
    stats_before = driver.execute_async_script("window.devRoom.videoStats(arguments[0]).then(arguments[1])", name)
    while time.monotonic() < end:
        sample = driver.execute_script(SAMPLE_TILE, name)
        samples.append({"t_ms": monotonic_ms(), "stamp": sample.get("stamp"),
                        "size": "%sx%s" % (sample.get("width"), sample.get("height"))})
        time.sleep(0.05)
    stats = driver.execute_async_script("window.devRoom.videoStats(arguments[0]).then(arguments[1])", name)
    frames = [s["stamp"]["frame"] for s in samples if s["stamp"]]
    report.update({
        "samples": len(samples),
        "stamps_read": len(frames),
        "distinct_frames": len(set(frames)),
        "first_frame": frames[0] if frames else None,
        "last_frame": frames[-1] if frames else None,
        "decreasing": sum(1 for a, b in zip(frames, frames[1:]) if b < a),
        "sizes": sorted({s["size"] for s in samples}),
        # Capture time to a canvas read, same machine (an upper bound of latency: the read is polled).
        "stamp_age_ms": sorted(round(s["t_ms"] % 2**32 - s["stamp"]["captureMs"], 1) for s in samples if s["stamp"]),
        "stats_before": stats_before,
        "stats": stats,
        "labels": labels(driver),
    })
    return report


def do_end(driver, args, command):
    button = driver.find_element(By.ID, "end-meeting")
    t_ms = monotonic_ms()
    button.click()
    ended = wait_until(lambda: status_text(driver) == "The meeting was ended.", command.get("timeout", 10))
    return {"t_ms": t_ms, "ended_shown": bool(ended), "status": status_text(driver),
            "tiles_after": len(driver.find_elements(By.CSS_SELECTOR, "#tiles .tile"))}


def do_restart(driver, args, command):
    driver.find_element(By.ID, "end-meeting").click()  # labelled "Start a new meeting" after the end
    joined = wait_until(lambda: status_text(driver).startswith("In room"), command.get("timeout", 15))
    return {"joined": bool(joined), "status": status_text(driver)}


def labels(driver):
    # In one script: a tile removed between finding and reading it would be a stale element.
    return driver.execute_script("return [...document.querySelectorAll('#tiles .tile .label')].map((l) => l.textContent)")


def do_gone(driver, args, command):
    started = monotonic_ms()
    gone = wait_until(lambda: command["name"] not in labels(driver), command.get("timeout", 10))
    return {"gone": bool(gone), "waited_ms": monotonic_ms() - started, "labels": labels(driver)}


COMMANDS = {"open": do_open, "share": do_share, "watch": do_watch, "end": do_end, "restart": do_restart, "gone": do_gone}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8089/")
    parser.add_argument("--headed", action="store_true")
    parser.add_argument("--window", default="1280x1000")
    args = parser.parse_args()
    profile = tempfile.mkdtemp(prefix="krakl-chromium-")
    try:
        run(args, profile)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def run(args, profile):
    driver = browser(args, profile)
    print(json.dumps({"ok": True, "ready": True, "browser": driver.capabilities.get("browserVersion")}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command["cmd"] == "quit":
                break
            try:
                reply = {"ok": True, "cmd": command["cmd"]}
                reply.update(COMMANDS[command["cmd"]](driver, args, command))
            except Exception as error:  # the test reads the failure, the session goes on
                reply = {"ok": False, "cmd": command.get("cmd"), "error": "%s: %s" % (type(error).__name__, error)}
            try:
                reply["console"] = [e["message"][:300] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")][-10:]
            except Exception:
                pass
            print(json.dumps(reply), flush=True)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
