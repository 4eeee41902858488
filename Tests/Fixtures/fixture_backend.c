/* Test fixture: a minimal C backend whose defects are switched on at build
 * time, so the loader's refusals and the conformance suite's failures can
 * be shown against real shared libraries. Built by the tests with cc.
 *
 *   -DNO_ENTRY          export no krakl_backend_v1 (exports something else)
 *   -DENTRY_V2          export krakl_backend_v2 instead (a future major ABI)
 *   -DABI_MAJOR=2       declare another major version in the table
 *   -DTABLE_SIZE=N      declare struct_size N
 *   -DNULL_START        leave start NULL
 *   -DBIGGER_TABLE      a table from a newer minor: extra members at the end
 *   -DFAIL_CREATE       create() fails with -ENODEV and a message
 *                       (-DFAIL_CREATE_ERRNO=E... picks another errno)
 *   -DLATE_FRAMES       keep delivering after stop() returns
 *   -DBAD_DAMAGE        report a damage rectangle outside the frame
 *   -DBAD_STRIDE        report a stride smaller than width * 4
 *   -DBAD_FORMAT        report a pixel format the ABI does not define
 */
#include "krakl_backend.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef ABI_MAJOR
#define ABI_MAJOR KRAKL_ABI_MAJOR
#endif

enum { W = 64, H = 48 };

struct krakl_source {
    const krakl_host *host;
    pthread_t thread;
    volatile int running;
    int started;
    uint8_t pixels[W * H * 4];
    uint64_t last_ns;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *run(void *arg) {
    struct krakl_source *s = arg;
    for (int i = 0; s->running; i++) {
        memset(s->pixels, i & 0xff, sizeof s->pixels);
        krakl_rect damage = {0, 0, W, H};
#ifdef BAD_DAMAGE
        damage.x = W - 8; damage.width = 16;
#endif
        krakl_frame f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.format = KRAKL_FORMAT_BGRX;
#ifdef BAD_FORMAT
        f.format = 99;
#endif
        f.width = W;
        f.height = H;
        f.plane_count = 1;
        f.stride[0] = W * 4;
#ifdef BAD_STRIDE
        f.stride[0] = W * 2;
#endif
        f.plane[0] = s->pixels;
        uint64_t t = now_ns();
        f.timestamp_ns = t > s->last_ns ? t : s->last_ns + 1;
        s->last_ns = f.timestamp_ns;
        f.sequence = (uint64_t)i;
        f.damage_count = i == 0 ? 0 : 1;
        f.damage = i == 0 ? NULL : &damage;
        s->host->frame(s->host->host_data, &f);
        usleep(10000);
    }
    return NULL;
}

static int create(const char *options, const krakl_host *host, krakl_source **out) {
    (void)options;
    static const char *const known[] = {"frames"};
    int rc = host->check_options(host->host_data, known, 1);
    if (rc < 0) return rc;
#ifdef FAIL_CREATE
    host->log(host->host_data, KRAKL_LOG_ERROR, "fixture: no such device /dev/krakl0; plug it in");
#ifdef FAIL_CREATE_ERRNO
    return -FAIL_CREATE_ERRNO;
#else
    return -ENODEV;
#endif
#endif
    struct krakl_source *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->host = host;
    *out = s;
    return 0;
}

__attribute__((unused)) static int start(krakl_source *s) {
    s->running = 1;
    if (pthread_create(&s->thread, NULL, run, s) != 0) return -EAGAIN;
    s->started = 1;
    return 0;
}

static int stop(krakl_source *s) {
    if (!s->started) return 0;
#ifdef LATE_FRAMES
    /* Wrong on purpose: returns while the thread still delivers. */
    s->started = 0;
    pthread_detach(s->thread);
    return 0;
#endif
    s->running = 0;
    pthread_join(s->thread, NULL);
    s->started = 0;
    return 0;
}

static void destroy(krakl_source *s) {
    stop(s);
#ifdef LATE_FRAMES
    s->running = 0;
    usleep(50000);
#endif
    free(s);
}

#ifdef BIGGER_TABLE
struct bigger { krakl_backend base; int (*future_call)(krakl_source *); const char *future_text; };
static int future_call(krakl_source *s) { (void)s; return 0; }
static const struct bigger table = {
    { sizeof(struct bigger), (ABI_MAJOR << 16) | 7, "fixture", "fixture from a newer minor ABI", create, start, stop, destroy },
    future_call, "ignored by a 1.0 host",
};
#define TABLE (&table.base)
#else
static const krakl_backend table = {
#ifdef TABLE_SIZE
    TABLE_SIZE,
#else
    sizeof(krakl_backend),
#endif
    (ABI_MAJOR << 16) | KRAKL_ABI_MINOR, "fixture", "test fixture backend", create,
#ifdef NULL_START
    NULL,
#else
    start,
#endif
    stop, destroy,
};
#define TABLE (&table)
#endif

#if defined(NO_ENTRY)
const krakl_backend *krakl_backend_entry(void) { return TABLE; }
#elif defined(ENTRY_V2)
const krakl_backend *krakl_backend_v2(void) { return TABLE; }
#else
const krakl_backend *krakl_backend_v1(void) { return TABLE; }
#endif
