/* Test fixture: a C backend, written from krakl_backend.h alone, that breaks
 * the contract in one chosen way, picked at run time by its options, so one
 * library serves every hardening test and the chaos test:
 *
 *   {"misbehave": "NAME", "after_ms": 200, "fps": 30, "width": 320, "height": 240, "seed": 1}
 *
 * Without "misbehave" (or "none") it is a well-behaved source: BGRx frames
 * with a bar moving down the picture, damage naming the bar's old and new
 * rows (the whole frame first), timestamps from CLOCK_MONOTONIC. With
 * "cursor": N (1...1024) every frame carries an N×N cursor image whose byte
 * i of row y is (7 y + i) mod 256 (serial 1).
 *
 * Behaviours ("after_ms" says when the capture thread starts misbehaving):
 *   ts-back          one timestamp 5 s earlier than the first frame's, then on normally
 *   ts-ahead         timestamps 30 s ahead of CLOCK_MONOTONIC from the start
 *   ts-constant      every frame carries the same timestamp
 *   hang-create / hang-start / hang-stop / hang-destroy   that call never returns
 *   slow-stop        stop() takes 1.5 s
 *   create-intmin    create() returns INT32_MIN
 *   create-positive  create() returns 5 (and stores no source)
 *   start-positive   start() returns 7
 *   stop-positive    stop() returns 3
 *   stop-eio         stop() returns -EIO
 *   null-frame       host->frame(NULL) before each real frame
 *   null-event       host->event(NULL) once after start
 *   unknown-event    an event of type 42 once after start
 *   crash-create / crash-start / crash-thread   SIGSEGV there
 *   abort-thread     abort() on the capture thread
 *   exit-thread      exit(3) on the capture thread
 *   partial-first    the first frame after start names a partial damage rectangle
 *   after-stop       frames go on for 300 ms after stop() returned
 *   size-change      the size changes without a FORMAT_CHANGED event
 *   format-no-frame  a FORMAT_CHANGED event whose size never arrives
 *   two-threads      two threads call host->frame at the same time
 *   deliver-in-create a frame and an event from inside create()
 *   flood            frames as fast as the thread can make them (no pacing)
 *   escape-log       log lines and event text full of terminal escape sequences
 *   log-flood        5000 log lines every frame interval after after_ms
 *   error-event      an ERROR event after after_ms, delivery goes on
 *   end              SOURCE_ENDED after after_ms
 *   after-destroy    a thread left behind by destroy() calls host->log and host->frame
 *   list-crash       list_sources() dereferences NULL
 *   list-hang        list_sources() never returns
 *   silent           start() succeeds but no frame ever comes
 *   all-invalid      every frame has a NULL plane pointer (the host drops each one)
 *   huge-stride      every frame's stride is UINT32_MAX (above KRAKL_MAX_STRIDE: dropped)
 *   damage-count-huge every frame after the first says UINT32_MAX damage rectangles
 *                    and points at two (dropped before any rectangle is read)
 *   random           one of the run-time behaviours above, chosen from "seed"
 *   random-safe      the same, without the ones that kill the process
 *                    (crash-*, abort-thread), for runs without isolation
 *
 * The environment variable KRAKL_FIXTURE_CONSTRUCTOR=exit|crash makes the
 * library's constructor exit(4) / SIGSEGV at dlopen (a plugin that takes
 * its loader down).
 */
#define _POSIX_C_SOURCE 200809L
#include "krakl_backend.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const known_keys[] = {"misbehave", "after_ms", "fps", "width", "height", "seed", "cursor"};

static const char *const random_pool[] = {
    "none", "ts-back", "ts-ahead", "ts-constant", "hang-stop", "hang-destroy", "slow-stop",
    "start-positive", "stop-positive", "crash-start", "crash-thread", "abort-thread",
    "partial-first", "after-stop", "size-change", "format-no-frame", "two-threads",
    "flood", "escape-log", "error-event", "end", "after-destroy", "hang-start",
};
/* The first entries of random_pool that do not kill the process. */
static const char *const safe_pool[] = {
    "none", "ts-back", "ts-ahead", "ts-constant", "hang-stop", "hang-destroy", "slow-stop",
    "start-positive", "stop-positive", "partial-first", "after-stop", "size-change",
    "format-no-frame", "two-threads", "flood", "escape-log", "error-event", "end",
    "after-destroy", "hang-start",
};

struct krakl_source {
    const krakl_host *host;
    char mode[32];
    long after_ms;
    int fps, width, height;
    pthread_t thread, second;
    int have_thread, have_second;
    volatile int running;
    uint8_t *pixels;
    int cursor_side;
    uint8_t *cursor_pixels;
    uint64_t first_ns, last_ns;
    uint64_t sequence;
    int frames_since_start;
    int bar;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void hang_forever(void) {
    for (;;) sleep_ms(1000);
}

static void crash(void) {
    /* Pointer and pointee both volatile: with only the pointee volatile, gcc -O1 proved the
     * store hits NULL, called the path unreachable and deleted every crash branch (the
     * crash-* behaviours and KRAKL_FIXTURE_CONSTRUCTOR=crash did nothing). raise() alone is
     * not a crash under the Swift runtime's backtracer (it returns from its handler and
     * execution goes on after raise()), hence the default action first, then abort(). */
    volatile int *volatile nowhere = NULL;
    *nowhere = 1;
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
    abort();
}

static int is(const struct krakl_source *s, const char *mode) { return strcmp(s->mode, mode) == 0; }

static long option_long(const krakl_host *host, const char *key, long fallback) {
    const char *text = host->option(host->host_data, key);
    return text ? strtol(text, NULL, 10) : fallback;
}

static void send_frame(struct krakl_source *s, int width, int height, uint64_t stamp, int partial_first) {
    /* The bar: 8 rows of a new grey level, moving down one bar each frame. */
    int rows = 8;
    int old_bar = s->bar;
    s->bar = (s->bar + rows) % (height - rows);
    uint8_t level = (uint8_t)(s->sequence * 7);
    for (int y = s->bar; y < s->bar + rows && y < height; y++)
        memset(s->pixels + (size_t)y * width * 4, level, (size_t)width * 4);
    krakl_rect damage[2] = {{0, old_bar, width, rows}, {0, s->bar, width, rows}};
    krakl_frame f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.format = KRAKL_FORMAT_BGRX;
    f.width = (uint32_t)width;
    f.height = (uint32_t)height;
    f.plane_count = 1;
    f.stride[0] = (uint32_t)width * 4;
    f.plane[0] = s->pixels;
    f.timestamp_ns = stamp;
    f.sequence = s->sequence++;
    if (is(s, "all-invalid")) f.plane[0] = NULL;
    if (is(s, "huge-stride")) f.stride[0] = UINT32_MAX;
    krakl_cursor cursor;
    if (s->cursor_pixels) {
        memset(&cursor, 0, sizeof cursor);
        cursor.struct_size = sizeof cursor;
        cursor.visible = 1;
        cursor.x = width / 2;
        cursor.y = height / 2;
        cursor.width = cursor.height = (uint32_t)s->cursor_side;
        cursor.stride = (uint32_t)s->cursor_side * 4;
        cursor.pixels = s->cursor_pixels;
        cursor.serial = 1;
        f.cursor = &cursor;
    }
    int first = s->frames_since_start == 0;
    if (!first || partial_first) {
        f.damage_count = 2;
        f.damage = damage;
    }
    if (is(s, "damage-count-huge") && !first) f.damage_count = UINT32_MAX;   /* two rectangles behind it */
    if (is(s, "null-frame")) s->host->frame(s->host->host_data, NULL);
    s->host->frame(s->host->host_data, &f);
    s->frames_since_start++;
}

static void send_event(struct krakl_source *s, uint32_t type, int32_t error, const char *message,
                       uint32_t width, uint32_t height) {
    krakl_event e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    e.type = type;
    e.error = error;
    e.message = message;
    e.format = KRAKL_FORMAT_BGRX;
    e.width = width;
    e.height = height;
    s->host->event(s->host->host_data, &e);
}

/* A well-behaved timestamp: now, but always after the last one. */
static uint64_t next_stamp(struct krakl_source *s) {
    uint64_t t = now_ns();
    if (t <= s->last_ns) t = s->last_ns + 1;
    s->last_ns = t;
    if (!s->first_ns) s->first_ns = t;
    return t;
}

static void *second_thread(void *arg) {
    struct krakl_source *s = arg;
    uint8_t *pixels = calloc((size_t)s->width * s->height, 4);
    while (s->running) {
        krakl_frame f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.format = KRAKL_FORMAT_BGRX;
        f.width = (uint32_t)s->width;
        f.height = (uint32_t)s->height;
        f.plane_count = 1;
        f.stride[0] = (uint32_t)s->width * 4;
        f.plane[0] = pixels;
        f.timestamp_ns = now_ns();
        s->host->frame(s->host->host_data, &f);
        sleep_ms(1);
    }
    free(pixels);
    return NULL;
}

static void *run(void *arg) {
    struct krakl_source *s = arg;
    uint64_t started = now_ns();
    long interval_ms = s->fps > 0 ? 1000 / s->fps : 33;
    int fired = 0;
    uint64_t constant = 0;
    while (s->running) {
        int due = !fired && (long)((now_ns() - started) / 1000000u) >= s->after_ms;
        if (due) {
            fired = 1;
            if (is(s, "crash-thread")) crash();
            if (is(s, "abort-thread")) abort();
            if (is(s, "exit-thread")) exit(3);
            if (is(s, "end")) {
                send_event(s, KRAKL_EVENT_SOURCE_ENDED, 0, "the fixture's time is up", 0, 0);
                s->running = 0;
                break;
            }
            if (is(s, "error-event")) send_event(s, KRAKL_EVENT_ERROR, -EIO, "the fixture reports a read error", 0, 0);
            if (is(s, "null-event")) s->host->event(s->host->host_data, NULL);
            if (is(s, "unknown-event")) send_event(s, 42, 0, "an event of a type no header defines", 0, 0);
            if (is(s, "format-no-frame")) {
                send_event(s, KRAKL_EVENT_FORMAT_CHANGED, 0, NULL, (uint32_t)s->width * 2, (uint32_t)s->height * 2);
            }
            if (is(s, "escape-log")) {
                s->host->log(s->host->host_data, KRAKL_LOG_WARNING, "\x1b]0;pwned title\x07\x1b[2J\x1b[31mred\rover\x08written\x1b[0m");
                send_event(s, KRAKL_EVENT_ERROR, -EIO, "\x1b[2Jcleared \x1b]8;;http://x\x07link\x1b]8;;\x07", 0, 0);
            }
            if (is(s, "two-threads") && !s->have_second) {
                s->have_second = pthread_create(&s->second, NULL, second_thread, s) == 0;
            }
        }
        if (is(s, "log-flood") && fired)
            for (int i = 0; i < 5000; i++) s->host->log(s->host->host_data, KRAKL_LOG_WARNING, "the fixture logs in a loop");
        uint64_t stamp = next_stamp(s);
        if (is(s, "ts-ahead")) stamp += 30000000000ull;
        if (is(s, "ts-back") && fired == 1) {
            fired = 2;
            stamp = s->first_ns > 5000000000ull ? s->first_ns - 5000000000ull : 1;
        }
        if (is(s, "ts-constant")) {
            if (!constant) constant = stamp;
            stamp = constant;
        }
        int width = s->width, height = s->height;
        if (is(s, "size-change") && fired) { width = s->width / 2; height = s->height / 2; }
        if (is(s, "format-no-frame") && fired) {
            /* The announced size never comes: frames keep the old size. */
        }
        if (!is(s, "silent")) send_frame(s, width, height, stamp, is(s, "partial-first"));
        if (!is(s, "flood")) sleep_ms(interval_ms);
    }
    return NULL;
}

static void *after_stop_thread(void *arg) {
    struct krakl_source *s = arg;
    uint64_t until = now_ns() + 300000000ull;
    while (now_ns() < until) {
        send_frame(s, s->width, s->height, next_stamp(s), 0);
        sleep_ms(10);
    }
    return NULL;
}

/* What after-destroy leaves behind: it outlives the source it came from. */
struct orphan {
    const krakl_host *host;
    uint8_t pixels[64 * 48 * 4];
};

static void *orphan_thread(void *arg) {
    struct orphan *o = arg;
    for (int i = 0; i < 20; i++) {
        sleep_ms(10);
        o->host->log(o->host->host_data, KRAKL_LOG_WARNING, "a thread of a destroyed source is still calling");
        krakl_frame f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.format = KRAKL_FORMAT_BGRX;
        f.width = 64;
        f.height = 48;
        f.plane_count = 1;
        f.stride[0] = 64 * 4;
        f.plane[0] = o->pixels;
        f.timestamp_ns = now_ns();
        o->host->frame(o->host->host_data, &f);
    }
    free(o);
    return NULL;
}

static int fixture_create(const char *options_json, const krakl_host *host, krakl_source **out) {
    (void)options_json;
    if (host->check_options(host->host_data, known_keys, sizeof known_keys / sizeof *known_keys) != 0) return -EINVAL;
    struct krakl_source *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->host = host;
    const char *mode = host->option(host->host_data, "misbehave");
    snprintf(s->mode, sizeof s->mode, "%s", mode ? mode : "none");
    s->after_ms = option_long(host, "after_ms", 200);
    s->fps = (int)option_long(host, "fps", 30);
    s->width = (int)option_long(host, "width", 320);
    s->height = (int)option_long(host, "height", 240);
    if (s->width < 32 || s->height < 32 || s->width > 4096 || s->height > 4096 || s->fps < 1 || s->fps > 1000) {
        host->log(host->host_data, KRAKL_LOG_ERROR, "width/height must be 32...4096 and fps 1...1000");
        free(s);
        return -EINVAL;
    }
    if (is(s, "random") || is(s, "random-safe")) {
        unsigned seed = (unsigned)option_long(host, "seed", 1);
        srand(seed);
        if (is(s, "random"))
            snprintf(s->mode, sizeof s->mode, "%s", random_pool[rand() % (int)(sizeof random_pool / sizeof *random_pool)]);
        else
            snprintf(s->mode, sizeof s->mode, "%s", safe_pool[rand() % (int)(sizeof safe_pool / sizeof *safe_pool)]);
        s->after_ms = rand() % 1000;
        char line[96];
        snprintf(line, sizeof line, "random misbehaviour %s after %ld ms", s->mode, s->after_ms);
        host->log(host->host_data, KRAKL_LOG_INFO, line);
    }
    s->pixels = calloc((size_t)s->width * s->height, 4);
    if (!s->pixels) { free(s); return -ENOMEM; }
    if (is(s, "hang-create")) hang_forever();
    if (is(s, "crash-create")) crash();
    if (is(s, "create-intmin")) { free(s->pixels); free(s); return INT32_MIN; }
    if (is(s, "create-positive")) { free(s->pixels); free(s); return 5; }
    if (is(s, "deliver-in-create")) {
        send_frame(s, s->width, s->height, next_stamp(s), 0);
        send_event(s, KRAKL_EVENT_ERROR, -EIO, "an event from inside create()", 0, 0);
    }
    s->cursor_side = (int)option_long(host, "cursor", 0);
    if (s->cursor_side > 0 && s->cursor_side <= 1024) {
        size_t row = (size_t)s->cursor_side * 4;
        s->cursor_pixels = malloc(row * (size_t)s->cursor_side);
        for (size_t y = 0; s->cursor_pixels && y < (size_t)s->cursor_side; y++)
            for (size_t i = 0; i < row; i++) s->cursor_pixels[y * row + i] = (uint8_t)(7 * y + i);
    }
    *out = s;
    return 0;
}

static int fixture_start(krakl_source *s) {
    if (s->running) return -EBUSY;
    if (is(s, "hang-start")) hang_forever();
    if (is(s, "crash-start")) crash();
    s->frames_since_start = 0;
    s->running = 1;
    if (pthread_create(&s->thread, NULL, run, s) != 0) {
        s->running = 0;
        return -EAGAIN;
    }
    s->have_thread = 1;
    return is(s, "start-positive") ? 7 : 0;
}

static int fixture_stop(krakl_source *s) {
    if (is(s, "hang-stop")) hang_forever();
    if (is(s, "slow-stop")) sleep_ms(1500);
    s->running = 0;
    if (s->have_thread) { pthread_join(s->thread, NULL); s->have_thread = 0; }
    if (s->have_second) { pthread_join(s->second, NULL); s->have_second = 0; }
    if (is(s, "after-stop")) {
        pthread_t late;
        if (pthread_create(&late, NULL, after_stop_thread, s) == 0) pthread_detach(late);
    }
    if (is(s, "stop-eio")) return -EIO;
    return is(s, "stop-positive") ? 3 : 0;
}

static void fixture_destroy(krakl_source *s) {
    if (is(s, "hang-destroy")) hang_forever();
    s->running = 0;
    if (s->have_thread) pthread_join(s->thread, NULL);
    if (s->have_second) pthread_join(s->second, NULL);
    if (is(s, "after-destroy")) {
        struct orphan *o = calloc(1, sizeof *o);
        pthread_t thread;
        if (o) {
            o->host = s->host;
            if (pthread_create(&thread, NULL, orphan_thread, o) == 0) pthread_detach(thread);
            else free(o);
        }
    }
    /* after-stop's late thread may still use the source: leave it (a leak,
     * which is the least of that backend's problems). */
    if (is(s, "after-stop")) return;
    free(s->pixels);
    free(s->cursor_pixels);
    free(s);
}

static int fixture_list_sources(const char *options_json, const krakl_host *host) {
    (void)options_json;
    const char *mode = host->option(host->host_data, "misbehave");
    if (mode && strcmp(mode, "list-crash") == 0) crash();
    if (mode && strcmp(mode, "list-hang") == 0) hang_forever();
    host->source_found(host->host_data, "fixture", "the misbehaving fixture's only source");
    return 0;
}

__attribute__((constructor)) static void fixture_constructor(void) {
    const char *what = getenv("KRAKL_FIXTURE_CONSTRUCTOR");
    if (!what) return;
    if (strcmp(what, "exit") == 0) exit(4);
    if (strcmp(what, "crash") == 0) crash();
}

static const krakl_backend table = {
    .struct_size = sizeof(krakl_backend),
    .abi_version = KRAKL_ABI_VERSION,
    .name = "misbehaving",
    .description = "Test fixture: breaks the backend contract in one chosen way",
    .create = fixture_create,
    .start = fixture_start,
    .stop = fixture_stop,
    .destroy = fixture_destroy,
    .list_sources = fixture_list_sources,
};

const krakl_backend *krakl_backend_v1(void) { return &table; }
