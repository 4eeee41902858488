#!/usr/bin/env python3
"""bench/portal_gst.py: a ScreenCast portal session for GStreamer.

    python3 bench/portal_gst.py [--cursor hidden|embedded|metadata] [--timeout S] -- PROGRAM ARG...

Opens a session on org.freedesktop.portal.ScreenCast (CreateSession ->
SelectSources (a monitor) -> Start -> OpenPipeWireRemote), then replaces
itself with PROGRAM (e.g. gst-launch-1.0), with `{fd}` and `{node}` in its
arguments replaced by the PipeWire descriptor and the stream's node id:

    python3 bench/portal_gst.py -- gst-launch-1.0 pipewiresrc fd={fd} path={node} ! video/x-raw ! fakesink

PROGRAM inherits both the PipeWire descriptor and this process's D-Bus
connection: the portal ends a session when its owner leaves the bus, so the
connection has to live as long as PROGRAM. Used by `krakl-bench pipewire`
(bench/PipeWireBench.swift) to put pipewiresrc on the same kind of portal
stream the krakl-agent PipeWire backend reads. Needs dbus-next
(/opt/krakl-venv). Exit status 3 when the portal refuses or does not answer.
"""
import asyncio
import os
import sys

from dbus_next import BusType, Message, MessageType, Variant
from dbus_next.aio import MessageBus

DESTINATION = "org.freedesktop.portal.Desktop"
OBJECT = "/org/freedesktop/portal/desktop"
SCREENCAST = "org.freedesktop.portal.ScreenCast"
CURSOR_MODES = {"hidden": 1, "embedded": 2, "metadata": 4}


class PortalError(Exception):
    pass


class Portal:
    def __init__(self, bus, timeout):
        self.bus = bus
        self.timeout = timeout
        self.sender = bus.unique_name.lstrip(":").replace(".", "_")
        self.counter = 0
        self.waiting = {}
        bus.add_message_handler(self._on_message)

    def _on_message(self, message):
        if (message.message_type == MessageType.SIGNAL and message.interface == "org.freedesktop.portal.Request"
                and message.member == "Response"):
            future = self.waiting.get(message.path)
            if future is not None and not future.done():
                future.set_result(message.body)

    async def _bus_call(self, member, signature, body):
        reply = await self.bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                            interface="org.freedesktop.DBus", member=member, signature=signature, body=body))
        if reply.message_type == MessageType.ERROR:
            raise PortalError(f"{member}: {reply.error_name} {reply.body}")

    async def call(self, member, signature, body):
        reply = await self.bus.call(Message(destination=DESTINATION, path=OBJECT, interface=SCREENCAST,
                                            member=member, signature=signature, body=body))
        if reply.message_type == MessageType.ERROR:
            raise PortalError(f"{member}: {reply.error_name}: {' '.join(map(str, reply.body))}")
        return reply

    async def request(self, member, signature, arguments, options):
        """A method answered through a Request object: subscribed to its
        Response (path known from handle_token) before the call."""
        self.counter += 1
        token = f"kraklbench{os.getpid()}_{self.counter}"
        path = f"{OBJECT}/request/{self.sender}/{token}"
        rule = f"type='signal',interface='org.freedesktop.portal.Request',member='Response',path='{path}'"
        await self._bus_call("AddMatch", "s", [rule])
        future = asyncio.get_running_loop().create_future()
        self.waiting[path] = future
        try:
            options = dict(options, handle_token=Variant("s", token))
            reply = await self.call(member, signature + "a{sv}", arguments + [options])
            if reply.body and reply.body[0] != path:  # a portal that picks its own request path
                self.waiting[reply.body[0]] = future
                await self._bus_call("AddMatch", "s", [rule.replace(path, reply.body[0])])
            try:
                code, results = await asyncio.wait_for(future, self.timeout)
            except asyncio.TimeoutError:
                raise PortalError(f"{member}: no answer within {self.timeout} s") from None
        finally:
            await self._bus_call("RemoveMatch", "s", [rule])
        if code != 0:
            raise PortalError(f"{member}: response {code} ({'cancelled or denied' if code == 1 else 'failed'})")
        return results


async def open_stream(cursor, timeout):
    bus = await MessageBus(bus_type=BusType.SESSION, negotiate_unix_fd=True).connect()
    portal = Portal(bus, timeout)
    created = await portal.request("CreateSession", "", [], {"session_handle_token": Variant("s", f"kraklbenchs{os.getpid()}")})
    session = created["session_handle"].value
    await portal.request("SelectSources", "o", [session], {"types": Variant("u", 1), "cursor_mode": Variant("u", CURSOR_MODES[cursor])})
    started = await portal.request("Start", "os", [session, ""], {})
    streams = started["streams"].value
    if not streams:
        raise PortalError("Start: no streams")
    node = streams[0][0]
    reply = await portal.call("OpenPipeWireRemote", "oa{sv}", [session, {}])
    fd = reply.unix_fds[reply.body[0]]
    return bus, session, node, fd


def main(argv):
    cursor, timeout = "embedded", 30.0
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--cursor" and argv and argv[0] in CURSOR_MODES:
            cursor = argv.pop(0)
        elif flag == "--timeout" and argv:
            timeout = float(argv.pop(0))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    program = argv[1:]
    if not program:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        bus, session, node, fd = asyncio.run(open_stream(cursor, timeout))
    except (PortalError, OSError) as error:
        print(f"portal_gst: {error}", file=sys.stderr)
        return 3
    os.set_inheritable(fd, True)
    os.set_inheritable(bus._sock.fileno(), True)  # the session lives as long as this connection
    arguments = [a.replace("{fd}", str(fd)).replace("{node}", str(node)) for a in program]
    print(f"portal_gst: session {session}, node {node}, fd {fd}: exec {' '.join(arguments)}", file=sys.stderr, flush=True)
    os.execvp(arguments[0], arguments)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
