/*
 * bouncing_box.c: an example krakl-agent capture backend in plain C99.
 *
 * It draws a box bouncing over a plain background and delivers it as BGRX
 * frames with damage rectangles. It needs nothing but krakl_backend.h, libc
 * and pthreads, so it is a starting point to copy for a real backend:
 * replace move_box() with "grab the screen and find what changed".
 * Build with the Makefile next to it; docs/backend-guide.md explains it all.
 *
 * Options: width, height (16..4096, default 320x240), fps (1..240, default
 * 30), frames (end after this many frames per start; 0, the default, runs
 * until stopped).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread_condattr_setclock */

#include "krakl_backend.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BOX_SIZE 48
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static const uint8_t background[4] = {0x40, 0x20, 0x10, 0}; /* B G R x: dark blue */
static const uint8_t box_colour[4] = {0x20, 0x90, 0xf0, 0}; /* orange */

/* Everything lives here, never in globals: the host may run several sources
 * of this backend at once. */
struct krakl_source {
    const krakl_host *host;
    long width, height, fps, frames;
    uint8_t *pixels;            /* BGRX, stride = width * 4 */
    int box, box_x, box_y, dx, dy;
    uint64_t last_timestamp_ns; /* kept across stop/start: timestamps never repeat */
    uint64_t sequence;

    pthread_t thread;
    bool thread_live;           /* created and not yet joined */
    pthread_mutex_t lock;       /* guards `stopping` */
    pthread_cond_t wake;        /* on CLOCK_MONOTONIC, so stop() cuts a wait short */
    bool stopping;
};

static void log_error(const krakl_host *host, const char *message)
{
    host->log(host->host_data, KRAKL_LOG_ERROR, message);
}

/* Strict on purpose: "32O" or "320.5" is a typo the user should hear about,
 * not a number strtol quietly truncates. */
static int read_option(const krakl_host *host, const char *key, long min, long max,
                       const char *allowed, long *value)
{
    const char *text = host->option(host->host_data, key);
    if (text == NULL)
        return 0; /* not given: keep the default */
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (!(isdigit((unsigned char)text[0]) || text[0] == '-') || *end != '\0' ||
        errno == ERANGE || v < min || v > max) {
        char message[200];
        snprintf(message, sizeof message,
                 "bouncing-box: option \"%s\" is \"%s\"; it must be %s",
                 key, text, allowed);
        log_error(host, message);
        return -EINVAL;
    }
    *value = v;
    return 0;
}

static void fill_rect(krakl_source *s, int x, int y, int w, int h, const uint8_t colour[4])
{
    for (int row = y; row < y + h; row++) {
        uint8_t *p = s->pixels + (size_t)row * (size_t)s->width * 4 + (size_t)x * 4;
        for (int col = 0; col < w; col++, p += 4)
            memcpy(p, colour, 4);
    }
}

static int create(const char *options_json, const krakl_host *host, krakl_source **out)
{
    (void)options_json; /* host->option() hands us the same options, already parsed */
    /* A host struct from another ABI version may be shorter than ours;
     * never read a member past its struct_size. */
    if (host == NULL || out == NULL || !KRAKL_HAS_FIELD(host, krakl_host, check_options) ||
        !host->log || !host->frame || !host->event || !host->option || !host->check_options) {
        if (host != NULL && KRAKL_HAS_FIELD(host, krakl_host, log) && host->log)
            log_error(host, "bouncing-box: the host lacks ABI 1.0 callbacks; update krakl-agent");
        return -EINVAL;
    }

    static const char *const known[] = {"width", "height", "fps", "frames"};
    int err = host->check_options(host->host_data, known, sizeof known / sizeof known[0]);
    if (err != 0)
        return err; /* check_options already logged which key is wrong */

    long width = 320, height = 240, fps = 30, frames = 0;
    if ((err = read_option(host, "width", 16, 4096, "a whole number from 16 to 4096", &width)) ||
        (err = read_option(host, "height", 16, 4096, "a whole number from 16 to 4096", &height)) ||
        (err = read_option(host, "fps", 1, 240, "a whole number from 1 to 240", &fps)) ||
        (err = read_option(host, "frames", 0, LONG_MAX,
                           "a whole number, 0 (run until stopped) or more", &frames)))
        return err;

    krakl_source *s = calloc(1, sizeof *s);
    uint8_t *pixels = malloc((size_t)width * (size_t)height * 4);
    if (s == NULL || pixels == NULL) {
        free(s);
        free(pixels);
        log_error(host, "bouncing-box: out of memory for the frame buffer; try a smaller width/height");
        return -ENOMEM;
    }
    *s = (krakl_source){.host = host, .width = width, .height = height, .fps = fps,
                        .frames = frames, .pixels = pixels, .dx = 3, .dy = 2};
    s->box = (int)MIN(MIN(width, height), BOX_SIZE);

    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&s->lock, NULL);

    fill_rect(s, 0, 0, (int)width, (int)height, background);
    fill_rect(s, s->box_x, s->box_y, s->box, s->box, box_colour);
    *out = s;
    return 0;
}

/* Moves the box one step and returns the area that changed: the union of
 * its old and new places. One rectangle over-reports two small corners, which
 * is allowed; missing a changed pixel is not. The box never leaves the
 * frame, so neither does the union. */
static krakl_rect move_box(krakl_source *s)
{
    int old_x = s->box_x, old_y = s->box_y;
    int max_x = (int)s->width - s->box, max_y = (int)s->height - s->box;
    if (s->box_x + s->dx < 0 || s->box_x + s->dx > max_x) s->dx = -s->dx;
    if (s->box_y + s->dy < 0 || s->box_y + s->dy > max_y) s->dy = -s->dy;
    s->box_x += s->dx;
    s->box_y += s->dy;
    if (s->box_x < 0 || s->box_x > max_x) s->box_x = old_x; /* box as wide as the frame */
    if (s->box_y < 0 || s->box_y > max_y) s->box_y = old_y;

    fill_rect(s, old_x, old_y, s->box, s->box, background);
    fill_rect(s, s->box_x, s->box_y, s->box, s->box, box_colour);

    int x0 = MIN(old_x, s->box_x), y0 = MIN(old_y, s->box_y);
    return (krakl_rect){x0, y0, MAX(old_x, s->box_x) + s->box - x0,
                        MAX(old_y, s->box_y) + s->box - y0};
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *capture_thread(void *arg)
{
    krakl_source *s = arg;
    const krakl_host *host = s->host;
    const uint64_t period = 1000000000u / (uint64_t)s->fps;
    uint64_t deadline = now_ns(); /* absolute, so pacing does not drift */
    long delivered = 0;

    for (;;) {
        struct timespec until = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
        pthread_mutex_lock(&s->lock);
        while (!s->stopping && pthread_cond_timedwait(&s->wake, &s->lock, &until) != ETIMEDOUT)
            ; /* woken early: either stop() or spurious */
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        if (stopping)
            break;

        krakl_rect damage = move_box(s);
        uint64_t t = now_ns();
        s->last_timestamp_ns = t > s->last_timestamp_ns ? t : s->last_timestamp_ns + 1;
        krakl_frame frame = {
            .struct_size = sizeof frame, .format = KRAKL_FORMAT_BGRX,
            .width = (uint32_t)s->width, .height = (uint32_t)s->height, .plane_count = 1,
            .stride = {(uint32_t)s->width * 4}, .plane = {s->pixels},
            .timestamp_ns = s->last_timestamp_ns, .sequence = ++s->sequence,
            /* The first frame after start is whole: the host has not seen
             * (or has dropped) whatever came before. */
            .damage_count = delivered == 0 ? 0 : 1, .damage = delivered == 0 ? NULL : &damage,
        };
        host->frame(host->host_data, &frame);

        if (++delivered == s->frames) {
            char message[64];
            snprintf(message, sizeof message, "delivered %ld frames", delivered);
            krakl_event ended = {.struct_size = sizeof ended,
                                 .type = KRAKL_EVENT_SOURCE_ENDED, .message = message};
            host->event(host->host_data, &ended);
            break; /* no frame may follow SOURCE_ENDED */
        }

        /* Fell behind (slow host callback)? Skip the missed ticks instead of
         * sending a burst to catch up. */
        deadline += period;
        uint64_t now = now_ns();
        if (deadline < now)
            deadline = now;
    }
    return NULL;
}

static int start(krakl_source *s)
{
    if (s->thread_live) {
        log_error(s->host, "bouncing-box: start() called twice without stop()");
        return -EBUSY;
    }
    s->stopping = false; /* no thread is running, so no lock needed */
    int err = pthread_create(&s->thread, NULL, capture_thread, s);
    if (err != 0) {
        log_error(s->host, "bouncing-box: cannot create the capture thread; check ulimit -u");
        return -err;
    }
    s->thread_live = true;
    return 0;
}

static int stop(krakl_source *s)
{
    /* The thread may have ended on its own after SOURCE_ENDED; it still
     * needs joining, and then there is nothing more to do. */
    if (!s->thread_live)
        return 0;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    s->thread_live = false;
    return 0;
}

static void destroy(krakl_source *s)
{
    if (s == NULL)
        return;
    stop(s);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s->pixels);
    free(s);
}

const krakl_backend *krakl_backend_v1(void)
{
    static const krakl_backend table = {
        .struct_size = sizeof table,
        .abi_version = KRAKL_ABI_VERSION,
        .name = "bouncing-box",
        .description = "Example third-party backend in C: a box bouncing over a plain background",
        .create = create,
        .start = start,
        .stop = stop,
        .destroy = destroy,
    };
    return &table;
}
