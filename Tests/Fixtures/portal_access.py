#!/usr/bin/python3
"""A stand-in org.freedesktop.impl.portal.Access backend for the test stack (scripts/pipewire-stack
--camera-portal ANSWER): xdg-desktop-portal exports its Camera interface only when some portal
backend offers Access, and asks it (AccessDialog) whether a program may use the camera. A desktop
shows a dialog there; this answers at once with ANSWER (allow: 0, deny: 1) and prints each call, so
a test can see that the portal asked.

Usage: portal_access.py allow|deny   (on the session bus of DBUS_SESSION_BUS_ADDRESS)
Uses python3-gi's Gio (GDBus), which Debian ships with the GStreamer bindings the tests use.
"""
import sys

from gi.repository import Gio, GLib

NAME = "org.freedesktop.impl.portal.desktop.krakltest"
INTERFACE = """
<node>
  <interface name="org.freedesktop.impl.portal.Access">
    <method name="AccessDialog">
      <arg type="o" name="handle" direction="in"/>
      <arg type="s" name="app_id" direction="in"/>
      <arg type="s" name="parent_window" direction="in"/>
      <arg type="s" name="title" direction="in"/>
      <arg type="s" name="subtitle" direction="in"/>
      <arg type="s" name="body" direction="in"/>
      <arg type="a{sv}" name="options" direction="in"/>
      <arg type="u" name="response" direction="out"/>
      <arg type="a{sv}" name="results" direction="out"/>
    </method>
  </interface>
</node>
"""


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("allow", "deny"):
        sys.exit("usage: portal_access.py allow|deny")
    response = 0 if sys.argv[1] == "allow" else 1
    loop = GLib.MainLoop()

    def on_call(connection, sender, path, interface, method, parameters, invocation):
        handle, app_id, _parent, title, _subtitle, _body, _options = parameters.unpack()
        print(f"AccessDialog app_id={app_id!r} title={title!r} -> {response}", flush=True)
        invocation.return_value(GLib.Variant("(ua{sv})", (response, {})))

    def on_bus(connection, _name):
        info = Gio.DBusNodeInfo.new_for_xml(INTERFACE).interfaces[0]
        connection.register_object("/org/freedesktop/portal/desktop", info, on_call, None, None)

    def on_name(_connection, name):
        print("ready", name, flush=True)

    def on_lost(_connection, name):
        print("lost the name", name, flush=True)
        loop.quit()

    Gio.bus_own_name(Gio.BusType.SESSION, NAME, Gio.BusNameOwnerFlags.NONE, on_bus, on_name, on_lost)
    loop.run()


if __name__ == "__main__":
    main()
