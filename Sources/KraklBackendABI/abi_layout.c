// Pins the ABI 1.0 layout on x86_64/aarch64 (LP64): a field moved or a type
// changed by mistake breaks every backend already built, so it must break
// this build first. New fields go after the last one asserted here.
#include "krakl_backend.h"

#if defined(__LP64__)
_Static_assert(sizeof(krakl_rect) == 16, "krakl_rect layout");
_Static_assert(offsetof(krakl_frame, format) == 4, "krakl_frame.format");
_Static_assert(offsetof(krakl_frame, stride) == 20, "krakl_frame.stride");
_Static_assert(offsetof(krakl_frame, plane) == 40, "krakl_frame.plane");
_Static_assert(offsetof(krakl_frame, timestamp_ns) == 72, "krakl_frame.timestamp_ns");
_Static_assert(offsetof(krakl_frame, damage) == 96, "krakl_frame.damage");
_Static_assert(sizeof(krakl_frame) == 112, "krakl_frame size (ABI 1.0)");
_Static_assert(sizeof(krakl_cursor) == 56, "krakl_cursor size (ABI 1.0)");
_Static_assert(sizeof(krakl_event) == 40, "krakl_event size (ABI 1.0)");
_Static_assert(offsetof(krakl_host, source_found) == 56, "krakl_host: 1.0 ends at 56");
_Static_assert(sizeof(krakl_host) == 64, "krakl_host size (ABI 1.1)");
_Static_assert(offsetof(krakl_backend, list_sources) == 56, "krakl_backend: 1.0 ends at 56");
_Static_assert(sizeof(krakl_backend) == 64, "krakl_backend size (ABI 1.1)");
#endif

// A C target needs one translation unit; this is it.
uint32_t krakl_abi_version_of_host(void) { return KRAKL_ABI_VERSION; }
