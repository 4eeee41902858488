#!/usr/bin/env python3
"""Where a krakl-agent's resident memory is, by part (issue 27 part 3).

    bench/smaps_parts.py PID [--allocations DIR]   # a running process
    bench/smaps_parts.py FILE.smaps ...            # copies of /proc/PID/smaps (FILE.status beside: VmRSS, VmHWM)

Prints VmRSS / VmHWM (from /proc/PID/status, or FILE.status) and Rss per part,
summed over the mappings /proc/PID/smaps lists. Libraries are told apart by
file name. Anonymous memory is one lump in smaps (glibc's arenas, and the
kernel merges neighbouring mappings). With --allocations DIR (the agent ran
with bench/alloc_log.c preloaded and KRAKL_ALLOC_LOG=DIR), the live
allocations of 1 MB or more are read from DIR/alloc-PID.log and their resident
pages counted in /proc/PID/pagemap (root), and the lump is split by
allocation size at 1080p, as the LD_PRELOAD shim of issue 17 found them:
  3428391 bytes   a libvpx frame buffer (1984x1152 I420 with VP8's 32 px border), 11 of them
  50135063        libvpx's token buffer
  1102091, 1048609, 6220800   other libvpx state
  3110464         an I420 picture: the X11 backend's or the pipeline's (1920x1080, 64 bytes over for alignment)
Several FILEs print one column each.
"""
import os
import re
import sys

SWIFT_RUNTIME = ("libswiftCore", "libswift_Concurrency", "libswift_StringProcessing", "libswift_RegexParser",
                 "libswiftSynchronization", "libswiftGlibc", "libswiftDispatch", "libdispatch", "libBlocksRuntime",
                 "libswiftRuntime", "libswift_Volatile", "libswift_Builtin_float", "libswiftObservation")
FOUNDATION = ("libFoundation.", "libFoundationEssentials", "lib_FoundationICU", "libFoundationInternationalization",
              "libFoundationNetworking", "libFoundationXML", "lib_FoundationCollections")
PARTS = ["libvpx frame buffers", "libvpx token buffer", "libvpx other state", "I420 pictures (X11 backend's, pipeline's)",
         "X11 shared memory (SYSV)", "heap ([heap], main arena)", "main thread stack", "other anonymous (Swift objects, malloc arenas, thread stacks)",
         "Swift runtime (file)", "Foundation + ICU (file)", "libvpx + libyuv code (file)", "other libraries (file)",
         "krakl-agent and its backends (file)", "other", "other allocations of 1 MB or more"]


LIBVPX_FRAME, LIBVPX_TOKENS, LIBVPX_STATE, PICTURE = 3428391, 50135063, {1102091, 1048609, 6220800}, {3110400, 3110464}


def part_of(path):
    name = os.path.basename(path)
    if path == "":
        return PARTS[7]
    if path.startswith("/SYSV"):
        return PARTS[4]
    if path == "[heap]":
        return PARTS[5]
    if path == "[stack]":
        return PARTS[6]
    if path.startswith("["):
        return PARTS[13]
    if name.startswith(FOUNDATION):
        return PARTS[9]
    if name.startswith(SWIFT_RUNTIME):
        return PARTS[8]
    if name.startswith(("libvpx", "libyuv")):
        return PARTS[10]
    if name.startswith(("krakl", "libBackend")):
        return PARTS[12]
    return PARTS[11]


def split_allocations(pid, folder, parts):
    """Moves the resident pages of the live large allocations out of the anonymous lump."""
    live = {}
    with open(os.path.join(folder, f"alloc-{pid}.log")) as f:
        for line in f:
            fields = line.split()
            if fields[0] == "a":
                live[int(fields[1], 16)] = int(fields[2])
            elif fields[0] == "f":
                live.pop(int(fields[1], 16), None)
    page = os.sysconf("SC_PAGE_SIZE")
    found = []
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for start, size in sorted(live.items()):
            first, last = start // page, (start + size - 1) // page
            pagemap.seek(first * 8)
            data = pagemap.read((last - first + 1) * 8)
            present = sum(1 for i in range(0, len(data), 8) if data[i + 7] & 0x80)
            kb = present * page // 1024
            if size == LIBVPX_FRAME:
                part = PARTS[0]
            elif size == LIBVPX_TOKENS:
                part = PARTS[1]
            elif size in LIBVPX_STATE:
                part = PARTS[2]
            elif size in PICTURE:
                part = PARTS[3]
            else:
                part = "other allocations of 1 MB or more"
            parts[part] = parts.get(part, 0) + kb
            parts[PARTS[7]] = parts.get(PARTS[7], 0) - kb
            found.append((size, kb, part))
    return found


def read_smaps(text):
    """(part -> Rss KB, library file name -> Rss KB)"""
    parts, libraries = {}, {}
    path = ""
    for line in text.splitlines():
        head = line.split(None, 1)[0] if line.strip() else ""
        if re.match(r"^[0-9a-f]+-[0-9a-f]+$", head):
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            size = 0
        elif head == "Rss:":
            kb = int(line.split()[1])
            part = part_of(path)
            parts[part] = parts.get(part, 0) + kb
            if path and not path.startswith("["):
                libraries[os.path.basename(path)] = libraries.get(os.path.basename(path), 0) + kb
    return parts, libraries


def read_status(text):
    values = {}
    for key in ("VmRSS", "VmHWM"):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        values[key] = int(m.group(1)) if m else None
    return values


def load(arg):
    if arg.isdigit():
        with open(f"/proc/{arg}/smaps") as f:
            smaps = f.read()
        with open(f"/proc/{arg}/status") as f:
            status = f.read()
        return arg, smaps, status
    with open(arg) as f:
        smaps = f.read()
    status_path = re.sub(r"\.smaps$", "", arg) + ".status"
    status = open(status_path).read() if os.path.exists(status_path) else ""
    return os.path.basename(arg), smaps, status


def mb(kb):
    return "" if kb is None else f"{kb / 1024:.1f}"


def main():
    args = sys.argv[1:]
    folder = None
    if "--allocations" in args:
        i = args.index("--allocations")
        folder = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    columns = [load(a) for a in args]
    parsed = [(name, read_smaps(smaps), read_status(status)) for name, smaps, status in columns]
    found = split_allocations(args[0], folder, parsed[0][1][0]) if folder and args[0].isdigit() else []
    print("| part (MB resident) | " + " | ".join(name for name, _, _ in parsed) + " |")
    print("|---|" + "---:|" * len(parsed))
    for key in ("VmRSS", "VmHWM"):
        print(f"| {key} | " + " | ".join(mb(st[key]) for _, _, st in parsed) + " |")
    for part in PARTS:
        if any(p.get(part) for _, (p, _), _ in parsed):
            print(f"| {part} | " + " | ".join(mb(p.get(part, 0)) for _, (p, _), _ in parsed) + " |")
    print("| sum of Rss | " + " | ".join(mb(sum(p.values())) for _, (p, _), _ in parsed) + " |")
    if found:
        print()
        print("live allocations of 1 MB or more: size (bytes), resident (KB), part")
        for size, kb, part in found:
            print(f"  {size} {kb} {part}")
    print()
    print("Foundation, ICU and the Swift runtime, per library (MB resident):")
    print("| library | " + " | ".join(name for name, _, _ in parsed) + " |")
    print("|---|" + "---:|" * len(parsed))
    names = sorted({n for _, (_, libs), _ in parsed for n in libs if n.startswith(FOUNDATION + SWIFT_RUNTIME)},
                   key=lambda n: -max(libs.get(n, 0) for _, (_, libs), _ in parsed))
    for n in names:
        print(f"| {n} | " + " | ".join(mb(libs.get(n, 0)) for _, (_, libs), _ in parsed) + " |")


if __name__ == "__main__":
    main()
