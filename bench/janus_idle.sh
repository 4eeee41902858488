#!/usr/bin/env bash
# Is an unchanged screen safe to send nothing for? krakl-rtc-probe publishes a
# 1920x1080 Y4M clip at 1 fps into a Janus VideoRoom (scripts/janus-testbed,
# in a namespace of its own) and an aiortc subscriber decodes it through Janus
# (Tests/Fixtures/janus_room.py --times): the clip stays unchanged for
# STATIC seconds (nothing is encoded or sent: no idle refresh in a room), then
# changes every second for 5 s. Prints the subscriber's decode times (s after
# its first frame), the probe's PLI/keyframe counts and Janus's log lines
# about media or slow links.
#
#   sudo bench/janus_idle.sh [STATIC_SECONDS (30)] [probe args...]
set -euo pipefail
static=${1:-30}; shift || true
repo=$(cd "$(dirname "$0")/.." && pwd)
probe=$repo/.build/release/krakl-rtc-probe
python=/opt/krakl-venv/bin/python
work=$(mktemp -d /tmp/krakl-janus-idle.XXXXXX)
ns=krakl-janus-idle-$$
"$repo/scripts/rtc-netns" add "$ns"
cleanup() {
  ip netns exec "$ns" bash "$repo/scripts/janus-testbed" stop "$work/janus" >/dev/null 2>&1 || true
  "$repo/scripts/rtc-netns" del "$ns"
}
trap cleanup EXIT
ip netns exec "$ns" bash "$repo/scripts/janus-testbed" start "$work/janus" >/dev/null

# The clip: a detailed still (a grid of grey glyph-like blocks), then 5 frames with a moving white box.
"$python" - "$work/clip.y4m" "$static" <<'PY'
import sys
path, still = sys.argv[1], int(sys.argv[2])
w, h = 1920, 1080
row = bytes((16 + ((x * 37) ^ (x >> 3) * 11) % 200) if (x // 8) % 3 else 235 for x in range(w))
y = b"".join(row[(r * 7) % 24:] + row[:(r * 7) % 24] if (r // 16) % 2 else bytes([40]) * w for r in range(h))
uv = bytes([128]) * (w * h // 4)
with open(path, "wb") as f:
    f.write(b"YUV4MPEG2 W%d H%d F1:1 Ip A1:1 C420jpeg\n" % (w, h))
    for i in range(still + 5):
        frame = bytearray(y)
        if i >= still:
            k = i - still
            for r in range(200, 300):
                frame[r * w + 100 + 200 * k: r * w + 300 + 200 * k] = bytes([250]) * 200
        f.write(b"FRAME\n" + bytes(frame) + uv + uv)
PY

mkfifo "$work/answer"
seconds=$((static + 8))
exec 3<>"$work/answer"   # held open both ways until the end, so the probe never reads an early EOF
ip netns exec "$ns" "$probe" --address 127.0.0.2 --seconds "$seconds" --plugins "$repo/plugins.json" \
  --option "path=$work/clip.y4m" --option fps=1 "$@" <"$work/answer" >"$work/probe.out" 2>"$work/probe.err" &
probe_pid=$!
block_ready() { for _ in $(seq 1 300); do grep -q '^$' "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
echo "probe started $(date +%T.%N)"
block_ready "$work/probe.out" || { echo "no offer from the probe" >&2; cat "$work/probe.err" >&2; exit 1; }
sed -n '1,/^$/p' "$work/probe.out" | ip netns exec "$ns" "$python" "$repo/Tests/Fixtures/janus_room.py" \
  --seconds $((seconds + 2)) --times >"$work/answer.out" 2>"$work/room.err" &
room_pid=$!
echo "offer out $(date +%T.%N)"
block_ready "$work/answer.out" || { echo "no answer from Janus" >&2; cat "$work/room.err" >&2; exit 1; }
sed -n '1,/^$/p' "$work/answer.out" >&3
echo "answer in $(date +%T.%N)"
wait "$probe_pid" || true
wait "$room_pid" || true
exec 3>&-
"$python" - "$work/answer.out" "$work/probe.err" <<'PY'
import json, sys
report = next(json.loads(l)["report"] for l in open(sys.argv[1]) if l.startswith('{"report"'))
times = report.get("decoded_ms", [])
first = times[0] if times else 0
print("subscriber decoded %d frames at (s after the first): %s" % (len(times), ", ".join("%.2f" % ((t - first) / 1000) for t in times)))
gaps = [b - a for a, b in zip(times, times[1:])]
print("longest gap %.1f s; the decodes after it are %s s apart" % (max(gaps) / 1000 if gaps else 0,
      ", ".join("%.2f" % (g / 1000) for g in gaps[gaps.index(max(gaps)) + 1:]) if gaps else "-"))
PY
grep -o '"plis_received":[0-9]*\|"keyframes_sent":[0-9]*\|"frames_sent":[0-9]*\|"nacks_received":[0-9]*\|"firs_received":[0-9]*\|"packets_sent":[0-9]*' "$work/probe.out" | tr '\n' ' '; echo
grep -i "no media\|slow\|timeout\|hangup" "$work/janus/janus.log" | tail -5 || true
echo "work folder: $work"
