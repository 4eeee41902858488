#!/usr/bin/env python3
"""A desktop notification server for tests: owns org.freedesktop.Notifications on the bus
at --address (a private dbus-daemon the test started), prints "ready" once it owns the name,
then one JSON line per Notify call (app_name, replaces_id, summary, body, expire_timeout)."""
import argparse
import asyncio
import json
import sys

from dbus_next.aio import MessageBus
from dbus_next.service import ServiceInterface, method


class Notifications(ServiceInterface):
    def __init__(self):
        super().__init__("org.freedesktop.Notifications")
        self.last_id = 0

    @method()
    def Notify(self, app_name: "s", replaces_id: "u", app_icon: "s", summary: "s", body: "s",
               actions: "as", hints: "a{sv}", expire_timeout: "i") -> "u":
        self.last_id += 1
        print(json.dumps({"event": "notify", "app_name": app_name, "replaces_id": replaces_id,
                          "summary": summary, "body": body, "expire_timeout": expire_timeout}), flush=True)
        return self.last_id

    @method()
    def GetCapabilities(self) -> "as":
        return ["body"]

    @method()
    def GetServerInformation(self) -> "ssss":
        return ["krakl-test", "krakl", "1", "1.2"]


async def main(address):
    bus = await MessageBus(bus_address=address).connect()
    bus.export("/org/freedesktop/Notifications", Notifications())
    await bus.request_name("org.freedesktop.Notifications")
    print("ready", flush=True)
    await asyncio.get_running_loop().create_future()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    try:
        asyncio.run(main(parser.parse_args().address))
    except KeyboardInterrupt:
        sys.exit(0)
