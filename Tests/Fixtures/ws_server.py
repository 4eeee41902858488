#!/usr/bin/env python3
"""WebSocket servers for the tests of krakl's WebSocket client (RFC 6455).

The well-behaved paths are served by the `websockets` library (an independent
implementation, PyPI); the misbehaving ones by raw asyncio sockets that write
exactly the bytes a broken or hostile server would. One process serves every
path on 127.0.0.1:PORT (with `--tls CERT KEY`, over TLS: wss://); the first stdout line is {"event":"ready","port":P},
then a JSON line per thing a path saw ({"path":…, "event":…}).

Paths (the request path picks the behaviour):
  /echo           echoes text and binary messages; "close:CODE:REASON" makes it
                  close with that code; "ping" makes it ping us and report the pong;
                  "fragments:N:TEXT" sends TEXT in N fragments
  /big            sends one text message of ?bytes=N (default 2 MiB)
  /idle           says nothing and reports pings it gets (websockets answers them)
and raw (the library would refuse to misbehave):
  /raw/no-reply         reads the request, never answers
  /raw/bad-accept       answers 101 with a wrong Sec-WebSocket-Accept
  /raw/status-403       answers 403
  /raw/huge-head        answers 101 followed by 64 KB of headers
  /raw/mid-message      upgrades, sends half of a frame, closes the TCP connection
  /raw/masked           upgrades, sends a masked frame (servers must not)
  /raw/bad-utf8         upgrades, sends a text frame that is not UTF-8
  /raw/reserved-bits    upgrades, sends a frame with RSV1 set
  /raw/control-fragment upgrades, sends a ping without FIN
  /raw/no-close         upgrades, sends "hi", then closes TCP without a close frame
"""
import argparse
import asyncio
import base64
import hashlib
import json
import ssl
import sys
import time

from websockets.asyncio.server import serve

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def emit(obj):
    obj.setdefault("t_ms", round(time.monotonic() * 1000, 1))
    print(json.dumps(obj), flush=True)


async def library_handler(ws):
    path = ws.request.path
    base = path.split("?")[0]
    if base == "/big":
        size = 2 << 20
        if "bytes=" in path:
            size = int(path.split("bytes=")[1])
        try:
            await ws.send("x" * size)
            await ws.wait_closed()
        finally:
            emit({"path": base, "event": "closed", "code": ws.close_code})
        return
    if base == "/idle":
        await ws.wait_closed()
        emit({"path": base, "event": "closed", "code": ws.close_code})
        return
    try:
        async for message in ws:
            if isinstance(message, str) and message.startswith("close:"):
                _, code, reason = message.split(":", 2)
                await ws.close(code=int(code), reason=reason)
                break
            if message == "ping":
                waiter = await ws.ping(b"are-you-there")
                await asyncio.wait_for(waiter, 5)
                emit({"path": base, "event": "pong"})
                await ws.send("pong seen")
                continue
            if isinstance(message, str) and message.startswith("fragments:"):
                _, count, text = message.split(":", 2)
                count = int(count)
                step = max(1, len(text) // count)
                parts = [text[i:i + step] for i in range(0, len(text), step)]
                await ws.send(parts)
                continue
            emit({"path": base, "event": "message", "kind": "text" if isinstance(message, str) else "binary",
                  "length": len(message)})
            await ws.send(message)
    finally:
        emit({"path": base, "event": "closed", "code": ws.close_code, "reason": ws.close_reason})


def accept_for(key):
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def frame(opcode, payload, fin=True, rsv=0, mask=None):
    first = (0x80 if fin else 0) | rsv | opcode
    length = len(payload)
    if length < 126:
        head = bytes([first, (0x80 if mask else 0) | length])
    elif length < 65536:
        head = bytes([first, (0x80 if mask else 0) | 126]) + length.to_bytes(2, "big")
    else:
        head = bytes([first, (0x80 if mask else 0) | 127]) + length.to_bytes(8, "big")
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return head + mask + payload
    return head + payload


async def raw_connection(reader, writer, first_line, head_lines):
    path = first_line.split(" ")[1]
    key = ""
    for line in head_lines:
        if line.lower().startswith("sec-websocket-key:"):
            key = line.split(":", 1)[1].strip()
    emit({"path": path, "event": "request"})
    good = ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_for(key)}\r\n\r\n").encode()
    try:
        if path == "/raw/no-reply":
            await asyncio.sleep(60)
        elif path == "/raw/bad-accept":
            writer.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept_for('not-the-key')}\r\n\r\n").encode())
        elif path == "/raw/status-403":
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        elif path == "/raw/huge-head":
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\n" + b"X-Filler: " + b"a" * 65536 + b"\r\n\r\n")
        else:
            writer.write(good)
            whole = frame(0x1, b"hello, this frame is cut in half")
            if path == "/raw/mid-message":
                writer.write(whole[: len(whole) // 2])
            elif path == "/raw/masked":
                writer.write(frame(0x1, b"masked", mask=b"\x01\x02\x03\x04"))
            elif path == "/raw/bad-utf8":
                writer.write(frame(0x1, b"\xff\xfe not utf-8"))
            elif path == "/raw/reserved-bits":
                writer.write(frame(0x1, b"rsv", rsv=0x40))
            elif path == "/raw/control-fragment":
                writer.write(frame(0x9, b"p", fin=False))
            elif path == "/raw/no-close":
                writer.write(frame(0x1, b"hi"))
            await writer.drain()
            if path not in ("/raw/mid-message", "/raw/no-close"):
                # Report what the client sent back (its close frame's code) before closing.
                try:
                    data = await asyncio.wait_for(reader.read(256), 5)
                    if len(data) >= 8 and data[0] & 0x0F == 0x8:
                        masked = data[6:8]
                        key4 = data[2:6]
                        code = ((masked[0] ^ key4[0]) << 8) | (masked[1] ^ key4[1])
                        emit({"path": path, "event": "client-close", "code": code})
                except asyncio.TimeoutError:
                    emit({"path": path, "event": "client-silent"})
        await writer.drain()
    finally:
        writer.close()


async def dispatch(reader, writer, library_port):
    """Reads the request head; raw paths are served here, the rest is relayed to the library server."""
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = await reader.read(4096)
        if not chunk:
            writer.close()
            return
        head += chunk
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    if lines[0].split(" ")[1].startswith("/raw/"):
        await raw_connection(reader, writer, lines[0], lines[1:])
        return
    upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", library_port)
    upstream_writer.write(head)

    async def pump(source, sink):
        try:
            while True:
                data = await source.read(65536)
                if not data:
                    break
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            try:
                sink.close()
            except Exception:
                pass

    await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", nargs="?", type=float, default=120)
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()
    context = None
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls[0], args.tls[1])
    async with serve(library_handler, "127.0.0.1", 0, max_size=4 << 20, ping_interval=None) as library:
        library_port = library.sockets[0].getsockname()[1]
        front = await asyncio.start_server(lambda r, w: dispatch(r, w, library_port), "127.0.0.1", 0, ssl=context)
        emit({"event": "ready", "port": front.sockets[0].getsockname()[1]})
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, sys.stdin.read)
        await asyncio.wait([done], timeout=args.seconds)


if __name__ == "__main__":
    asyncio.run(main())
