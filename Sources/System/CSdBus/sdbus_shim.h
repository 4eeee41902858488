/*
 * sd-bus (libsystemd, Debian libsystemd-dev) for the PipeWire backend's
 * ScreenCast portal client.
 *
 * Why sd-bus rather than libdbus-1: every sd-bus call returns 0 or a
 * negative errno, which is exactly the backend ABI's error convention;
 * a bus connection is a plain object with no process-wide set-up
 * (libdbus wants dbus_threads_init and shares connections unless told
 * not to), so several sources can each own one; and its message API has
 * non-variadic calls for everything the portal needs
 * (sd_bus_message_append_basic, open/close_container, read_basic,
 * enter/exit_container, peek_type, sd_bus_match_signal), which Swift can
 * call directly. The variadic conveniences (sd_bus_call_method,
 * sd_bus_message_append) are not used.
 */
#ifndef KRAKL_SDBUS_SHIM_H
#define KRAKL_SDBUS_SHIM_H

#include <systemd/sd-bus.h>

#endif
