/*
 * krakl_backend.h: the whole contract between krakl-agent and a capture
 * backend. A backend is a shared library that includes only this header,
 * is built with `cc -shared -fPIC`, and exports one symbol:
 *
 *     const krakl_backend *krakl_backend_v1(void);
 *
 * The "v1" in the symbol is the ABI's major version. An incompatible change
 * gets a new symbol (krakl_backend_v2), so an old agent never calls a new
 * backend's table by mistake. Compatible growth bumps the minor version and
 * only ever appends fields at the END of a struct.
 *
 * Size rule (as in PipeWire SPA, OBS and Linux's copy_struct_from_user):
 * every struct begins with `struct_size`, set by whoever fills it in to
 * sizeof(the struct as they compiled it). A reader copies min(struct_size,
 * sizeof(what it knows)) into a zeroed struct, so fields it has never heard
 * of are ignored and fields the writer did not have read as 0 / NULL.
 * Before using a field added in a later minor version, check
 * KRAKL_HAS_FIELD(ptr, type, field).
 *
 * Threads:
 *   - create, start, stop, destroy of one source are called from one control
 *     thread of the host's (the same thread for the source's whole life), one
 *     at a time, never concurrently for one source. list_sources runs on a
 *     control thread of its own.
 *   - host->frame and host->event are called by the backend from one thread
 *     of its choosing (its capture thread), never two at once for one source,
 *     only from the moment start() is called (also from inside start()) until
 *     stop() returns. Each start() may use a new thread. The host DROPS frames
 *     and events delivered inside create(), before start() or after stop()
 *     returned, and serializes deliveries that overlap; it warns once about
 *     each kind of breach and counts the rest.
 *   - host->log may be called from any thread, from the start of create()
 *     until destroy() returns.
 *   - host->option and host->check_options may be called from any thread
 *     from the start of create() until destroy() returns.
 *   - No host callback may be made after destroy() returns. (The host keeps
 *     the host struct readable and drops such calls, so a stray thread does
 *     not crash the agent; a backend must not rely on that.)
 *
 * Ownership:
 *   - Everything the host passes (options text, host struct, strings) is
 *     borrowed: valid until destroy() returns, never freed by the backend.
 *   - Everything the backend passes to a host callback (a frame, its planes,
 *     damage rectangles, cursor, event message) is borrowed until that
 *     callback returns; the host copies what it keeps. The host never frees
 *     backend memory.
 *
 * Return values: create, start, stop and list_sources return 0 on success
 * or a negative errno, -1 ... -4095 (-EINVAL for bad options, -ENOSYS for
 * "not implemented", -ENODEV for "no such display/device", ...). Before
 * returning an error, log a message at KRAKL_LOG_ERROR saying what went
 * wrong and what the user can do; the host shows the last such message. Any
 * other value (positive, or below -4095) is not defined by the ABI: the host
 * treats it as a failure and reports "returned N, which the ABI does not
 * define". create() returning one has made no source (destroy() is not
 * called); after start() returns one the host calls stop(); stop()
 * returning one is logged and destroy() follows.
 *
 * Watchdog: the host gives each call a time budget. create() 900 s (it may
 * wait for a person at a sharing dialog; keep the backend's own time-outs
 * below that), start() 5 s, stop() 1 s as promised below (the host gives up
 * after 2 s), destroy() 3 s, list_sources() 30 s. A call that overruns is
 * left running on the host's control thread and the source is dead: the
 * host makes no further call into it (it never calls destroy() while stop()
 * is still running), drops its frames, events and log lines, and keeps the
 * memory it handed the backend valid. The agent then finalizes its outputs,
 * reports which call hung and exits with status 22 (a sharing session ends
 * with that reason, or logs it when the session was ending anyway).
 */
#ifndef KRAKL_BACKEND_H
#define KRAKL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRAKL_ABI_MAJOR 1
#define KRAKL_ABI_MINOR 1
/* Swift cannot import this macro (it has a cast): Swift code builds the
 * value from KRAKL_ABI_MAJOR and KRAKL_ABI_MINOR. */
#define KRAKL_ABI_VERSION ((uint32_t)((KRAKL_ABI_MAJOR << 16) | KRAKL_ABI_MINOR))
#define KRAKL_ABI_VERSION_MAJOR(v) ((uint32_t)(v) >> 16)
#define KRAKL_ABI_VERSION_MINOR(v) ((uint32_t)(v) & 0xffffu)

/* The name of the single exported entry symbol, for dlsym(). */
#define KRAKL_BACKEND_ENTRY_SYMBOL "krakl_backend_v1"

/* True when the struct at `ptr` is big enough to hold `field`. */
#define KRAKL_HAS_FIELD(ptr, type, field) \
    ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* ------------------------------------------------------------------------ */
/* Pixels                                                                   */

typedef enum krakl_format {
    KRAKL_FORMAT_INVALID = 0,
    /* Packed 32-bit, one plane, 4 bytes per pixel, bytes in memory order. */
    KRAKL_FORMAT_BGRX = 1, /* B G R x: x is undefined, never read as alpha */
    KRAKL_FORMAT_RGBX = 2, /* R G B x */
    KRAKL_FORMAT_BGRA = 3, /* B G R A, straight (not premultiplied) alpha */
    KRAKL_FORMAT_RGBA = 4, /* R G B A */
    /* Planar 4:2:0, 8-bit, BT.601 limited range unless stated otherwise.
     * Chroma planes are ((width+1)/2) x ((height+1)/2). */
    KRAKL_FORMAT_I420 = 5, /* 3 planes: Y, U (Cb), V (Cr) */
    KRAKL_FORMAT_NV12 = 6, /* 2 planes: Y, interleaved UV */
} krakl_format;

/* A rectangle in frame pixels. x, y >= 0, x + width <= frame width,
 * y + height <= frame height, width and height > 0. Rectangles of one
 * frame may overlap; the host treats their union as changed. */
typedef struct krakl_rect {
    int32_t x;
    int32_t y;
    int32_t width;
    int32_t height;
} krakl_rect;

/* Pointer image to draw on top of the frame (only when the backend did not
 * already draw it into the pixels). BGRA, straight alpha. */
typedef struct krakl_cursor {
    uint32_t struct_size;
    uint32_t visible;      /* 0: hidden; the image fields may be empty */
    int32_t x, y;          /* position of the hotspot, frame pixels */
    int32_t hotspot_x, hotspot_y;
    uint32_t width, height;
    uint32_t stride;       /* bytes per row of `pixels` */
    const uint8_t *pixels; /* NULL when the image did not change since the
                              last frame that carried one (serial equal) */
    uint64_t serial;       /* changes whenever the image changes */
} krakl_cursor;

#define KRAKL_MAX_PLANES 4

/* Host limits. A frame outside them is dropped (the agent counts and
 * reports dropped frames; conformance fails): struct_size below the ABI 1.0
 * krakl_frame (through `cursor`: 112 bytes on LP64), width or height outside
 * 1 ... KRAKL_MAX_FRAME_SIDE, an unknown format, a plane_count that does not
 * match the format, a NULL plane, a stride below the row's bytes or above
 * KRAKL_MAX_STRIDE, timestamp_ns == 0, more than KRAKL_MAX_DAMAGE_RECTS
 * damage rectangles or one outside the frame. The host takes at most
 * KRAKL_MAX_FRAME_RATE frames a second from one source; it drops (and
 * counts) the rest. KRAKL_MAX_STRIDE is twice the widest packed row
 * (KRAKL_MAX_FRAME_SIDE * 4 bytes): room for any alignment a real buffer
 * has, and small enough that stride * rows stays far inside 32 bits. */
#define KRAKL_MAX_FRAME_SIDE 16384
#define KRAKL_MAX_DAMAGE_RECTS 65536
#define KRAKL_MAX_FRAME_RATE 240
#define KRAKL_MAX_STRIDE 131072 /* 2 * 4 * KRAKL_MAX_FRAME_SIDE */

typedef struct krakl_frame {
    uint32_t struct_size;
    uint32_t format;                  /* krakl_format */
    uint32_t width, height;           /* pixels, > 0 */
    uint32_t plane_count;             /* 1 packed, 3 I420, 2 NV12 */
    /* Bytes per row. At least the row's width in bytes: width*4 packed;
     * I420 Y width, U and V (width+1)/2; NV12 Y width, UV 2*((width+1)/2).
     * Every plane must be readable for stride * its rows (height, or
     * (height+1)/2 for chroma planes). */
    uint32_t stride[KRAKL_MAX_PLANES];
    const uint8_t *plane[KRAKL_MAX_PLANES];
    /* CLOCK_MONOTONIC time the picture was captured, nanoseconds, non-zero.
     * Strictly increasing over a source's life, across stop/start too, and
     * near the time of delivery: not after it, and at most 10 s before it.
     * The host keeps its own times sane whatever a backend does: a timestamp
     * that is not after the previous frame's, more than 1 s ahead of
     * CLOCK_MONOTONIC now or more than 10 s behind it is replaced by the
     * time the host received the frame (with one warning), and one a little
     * ahead of that time is clamped to it. */
    uint64_t timestamp_ns;
    /* Backend's own frame counter (gaps are allowed, e.g. after a drop). */
    uint64_t sequence;
    /* Changed areas since the previous frame this source delivered.
     * damage_count == 0 means "the whole frame may have changed". The first
     * frame after each start() and the first frame after a FORMAT_CHANGED
     * event MUST have damage_count == 0; the host treats those frames as
     * wholly damaged whatever they say, and also a frame whose size or
     * format differs from the previous one without a FORMAT_CHANGED event
     * (with one warning). There is no way to say "nothing changed": then
     * deliver no frame at all; the host keeps receivers fed by itself. At
     * most 65536 rectangles. */
    uint32_t damage_count;
    const krakl_rect *damage;
    const krakl_cursor *cursor;       /* NULL: no cursor, or already drawn */
} krakl_frame;

/* ------------------------------------------------------------------------ */
/* Events                                                                   */

typedef enum krakl_event_type {
    /* The source has nothing more to give: file ended, X server gone,
     * portal session closed, sharing revoked. No frame follows it; the host
     * will call stop() and destroy() from its control thread. */
    KRAKL_EVENT_SOURCE_ENDED = 1,
    /* Width, height or format changes from the next frame on (the fields
     * below say to what). The next frame MUST have exactly that format and
     * size, and damage_count == 0; the host logs (once) an announcement the
     * next frame does not match. */
    KRAKL_EVENT_FORMAT_CHANGED = 2,
    /* Something failed that the user should know about; `error` and
     * `message` say what. Delivery may continue (a dropped frame) or a
     * SOURCE_ENDED event may follow. It counts as a failure of the run: the
     * agent's capture run ends with a non-zero exit status (13) even if
     * frames went on. For something recovered from, log a warning instead. */
    KRAKL_EVENT_ERROR = 3,
} krakl_event_type;

typedef struct krakl_event {
    uint32_t struct_size;
    uint32_t type;          /* krakl_event_type */
    int32_t error;          /* negative errno, 0 for none */
    const char *message;    /* human-readable, may be NULL */
    uint32_t format;        /* FORMAT_CHANGED: new format */
    uint32_t width, height; /* FORMAT_CHANGED: new size */
} krakl_event;

/* ------------------------------------------------------------------------ */
/* What the host gives a backend                                            */

typedef enum krakl_log_level {
    KRAKL_LOG_ERROR = 0,
    KRAKL_LOG_WARNING = 1,
    KRAKL_LOG_INFO = 2,
    KRAKL_LOG_DEBUG = 3,
} krakl_log_level;

typedef struct krakl_host {
    uint32_t struct_size;
    uint32_t abi_version;   /* KRAKL_ABI_VERSION the host was built with */
    void *host_data;        /* pass back as the first argument of each call */

    /* Log one line (no trailing newline needed). */
    void (*log)(void *host_data, int level, const char *message);
    /* Deliver a frame. Borrowed until the call returns. */
    void (*frame)(void *host_data, const krakl_frame *frame);
    /* Deliver an event. Borrowed until the call returns. */
    void (*event)(void *host_data, const krakl_event *event);

    /* The source's option `key` as text (strings without quotes, numbers
     * as written, true/false; arrays and objects as JSON text), or NULL when
     * it was not given. "320" and 320 read the same. JSON null is given: it
     * reads as the text "null" (as does the string "null"); by convention a
     * backend treats it as "not given, use the default", so
     * `--option key=null` undoes a plugins.json default. The text stays
     * valid until destroy() returns. Lets a C backend read its options
     * without a JSON parser; the same options also arrive as JSON text in
     * create(). */
    const char *(*option)(void *host_data, const char *key);
    /* Returns 0 when the options are a JSON object whose keys are all in
     * `known_keys` (an array of `count` strings). Otherwise logs an error
     * naming the offending key and the known ones, and returns -EINVAL.
     * Call it first thing in create(): a typo in an option must be an
     * error, not silently ignored. */
    int (*check_options)(void *host_data, const char *const *known_keys, size_t count);

    /* ABI 1.1: what list_sources() reports, one call per source: `name` is
     * what the backend's option for choosing it accepts (e.g. a monitor
     * name), `description` a line for people (size, position). Borrowed
     * until the call returns. */
    void (*source_found)(void *host_data, const char *name, const char *description);
} krakl_host;

/* ------------------------------------------------------------------------ */
/* What a backend gives the host                                            */

typedef struct krakl_source krakl_source; /* the backend's own state */

typedef struct krakl_backend {
    uint32_t struct_size;   /* sizeof(krakl_backend) as the backend built it */
    uint32_t abi_version;   /* KRAKL_ABI_VERSION the backend was built with */
    const char *name;       /* short name, e.g. "file"; static storage */
    const char *description;/* one line for `krakl-agent backends` */

    /* Control thread. May block (open a display, ask the portal). Validates
     * `options_json` (a JSON object as text) and `host`, prepares the
     * source, and delivers nothing yet. `host` stays valid until destroy()
     * returns. On success stores the new source in *out and returns 0; on
     * failure logs why and returns a negative errno, leaving nothing to
     * destroy. */
    int (*create)(const char *options_json, const krakl_host *host, krakl_source **out);

    /* Control thread. Begins delivery; returns without waiting for the
     * first frame (frames and events may come from the moment it is called,
     * also from inside it). Returns 0 or a negative errno (-EBUSY when
     * already started). start() after stop() on the same source must work
     * again, also after a SOURCE_ENDED event (a file starts over). */
    int (*start)(krakl_source *source);

    /* Control thread. Ends delivery and returns within one second. When it
     * returns, no host callback for this source is running or will run
     * until the next start(). Safe to call when not started, and after a
     * SOURCE_ENDED event. Returns 0 or a negative errno. */
    int (*stop)(krakl_source *source);

    /* Control thread. Frees everything create() made; the host calls
     * stop() first when it had started. */
    void (*destroy)(krakl_source *source);

    /* ABI 1.0 ends here. Later minor versions append optional members;
     * the host checks KRAKL_HAS_FIELD and NULL before use. */

    /* ABI 1.1, optional (NULL: the backend cannot list). Control thread.
     * Reports every source the options could select (monitors, windows)
     * through host->source_found, without starting anything; `options_json`
     * and `host` as for create(), valid for this call only. Returns 0 or a
     * negative errno after logging why. */
    int (*list_sources)(const char *options_json, const krakl_host *host);
} krakl_backend;

/* The entry point. Returns a pointer to static storage that stays valid
 * for the life of the process (the host never unloads a backend). The
 * host refuses a table whose major version is not its own, whose
 * struct_size is smaller than ABI 1.0's table, or whose create, start,
 * stop or destroy is NULL; it accepts a newer minor version and ignores
 * the members it does not know. */
typedef const krakl_backend *(*krakl_backend_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KRAKL_BACKEND_H */
