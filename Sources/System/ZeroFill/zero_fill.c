// Large zero fills of private anonymous memory become MADV_DONTNEED.
//
// Why: libvpx clears its worst-case VP8 token buffer (1080p: about 50 MB)
// with vpx_calloc = malloc + memset at encoder set-up, which makes every page
// resident at once although a screen frame uses a small part of it; that one
// memset was most of the agent's peak memory. libvpx has no option for it, so
// the agent executable defines memset: shared libraries' calls bind to the
// executable's definition first (ELF symbol interposition).
//
// Why it is exact: for a private anonymous mapping, Linux defines the pages
// after MADV_DONTNEED as zero-fill-on-demand, so the memory reads back as
// zeros, which is all memset(p, 0, n) promises; a page nobody touches again
// costs nothing. Everything else (non-zero fills, small fills, shared or
// file-backed or locked memory, any doubt) goes to glibc's memset.
#include "krakl_zero_fill.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

// glibc's checking memset calls its own memset directly, never the PLT, so it
// reaches the real one without recursion. The limit is read through a
// volatile so the compiler cannot fold the call back into memset().
extern void *__memset_chk(void *s, int c, size_t n, size_t limit);
static volatile size_t no_limit = SIZE_MAX;

enum { zero_fill_min = 4u << 20 };  // below this the maps lookup costs more than it saves

static unsigned long fill_calls;
static unsigned long long fill_bytes;

// The fills released lately, each with the thread that made it, so a caller that
// knows the size of a buffer a library cleared in a call of its own can find it
// again (krakl_zero_fill_take). Guarded by a spin lock: memset must not block.
enum { released_kept = 8 };
static struct { uintptr_t start; size_t bytes; long thread; } released[released_kept];
static unsigned released_next;
static char released_lock;

static void released_acquire(void) { while (__atomic_test_and_set(&released_lock, __ATOMIC_ACQUIRE)) {} }
static void released_release(void) { __atomic_clear(&released_lock, __ATOMIC_RELEASE); }

static void remember(uintptr_t start, size_t bytes) {
    long thread = syscall(SYS_gettid);
    released_acquire();
    released[released_next % released_kept].start = start;
    released[released_next % released_kept].bytes = bytes;
    released[released_next % released_kept].thread = thread;
    released_next++;
    released_release();
}

void krakl_zero_fill_forget(void) {
    long thread = syscall(SYS_gettid);
    released_acquire();
    for (unsigned i = 0; i < released_kept; i++) {
        if (released[i].thread == thread) released[i].bytes = 0;
    }
    released_release();
}

void *krakl_zero_fill_take(size_t bytes) {
    long thread = syscall(SYS_gettid);
    void *found = NULL;
    released_acquire();
    for (unsigned k = 1; k <= released_kept && !found; k++) {
        unsigned i = (released_next - k) % released_kept;
        if (released[i].thread == thread && released[i].bytes == bytes && bytes > 0) {
            found = (void *)released[i].start;
            released[i].bytes = 0;
        }
    }
    released_release();
    return found;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// Reads /proc/self/maps with raw syscalls and a stack buffer (no malloc, no
// stdio: memset may be called from inside either). True when [start, end)
// lies inside one private, writable mapping with no file behind it.
static int is_private_anonymous(uintptr_t start, uintptr_t end) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buffer[4096];
    size_t held = 0;
    int found = 0, done = 0;
    while (!done) {
        ssize_t got = syscall(SYS_read, fd, buffer + held, sizeof buffer - held);
        if (got <= 0) break;
        held += (size_t)got;
        size_t line_start = 0;
        for (size_t i = 0; i < held; i++) {
            if (buffer[i] != '\n') continue;
            // "start-end perms offset dev inode [path]"
            const char *p = buffer + line_start, *line_end = buffer + i;
            uintptr_t lo = 0, hi = 0;
            int d;
            while (p < line_end && (d = hex_digit(*p)) >= 0) { lo = lo * 16 + (uintptr_t)d; p++; }
            if (p < line_end && *p == '-') p++;
            while (p < line_end && (d = hex_digit(*p)) >= 0) { hi = hi * 16 + (uintptr_t)d; p++; }
            if (lo <= start && end <= hi) {
                done = 1;
                if (line_end - p >= 5 && memcmp(p, " rw-p", 5) == 0) {
                    // Skip offset, dev and inode; what follows is the path.
                    int fields = 0;
                    p += 5;
                    while (p < line_end && fields < 3) {
                        while (p < line_end && *p == ' ') p++;
                        const char *field = p;
                        while (p < line_end && *p != ' ') p++;
                        if (fields == 2 && !(p - field == 1 && *field == '0')) break;  // inode 0: no file
                        fields++;
                    }
                    while (p < line_end && *p == ' ') p++;
                    int no_path = p == line_end;
                    int heap = line_end - p == 6 && memcmp(p, "[heap]", 6) == 0;
                    found = fields == 3 && (no_path || heap);
                }
                break;
            }
            if (lo > start) { done = 1; break; }  // maps are sorted: no mapping holds it
            line_start = i + 1;
        }
        if (line_start == 0 && held == sizeof buffer) break;  // a line longer than the buffer
        memmove(buffer, buffer + line_start, held - line_start);
        held -= line_start;
    }
    syscall(SYS_close, fd);
    return found;
}

void *memset(void *s, int c, size_t n) {
    if (c == 0 && n >= zero_fill_min) {
        uintptr_t page = 4096, start = (uintptr_t)s, end = start + n;
        uintptr_t inner_start = (start + page - 1) & ~(page - 1), inner_end = end & ~(page - 1);
        if (inner_end > inner_start && is_private_anonymous(start, end) &&
            madvise((void *)inner_start, inner_end - inner_start, MADV_DONTNEED) == 0) {
            __memset_chk(s, 0, inner_start - start, no_limit);
            __memset_chk((void *)inner_end, 0, end - inner_end, no_limit);
            __atomic_add_fetch(&fill_calls, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&fill_bytes, n, __ATOMIC_RELAXED);
            remember(start, n);
            return s;
        }
    }
    return __memset_chk(s, c, n, no_limit);
}

krakl_zero_fill_stats krakl_zero_fill_read_stats(void) {
    krakl_zero_fill_stats stats = {__atomic_load_n(&fill_calls, __ATOMIC_RELAXED),
                                   __atomic_load_n(&fill_bytes, __ATOMIC_RELAXED)};
    return stats;
}

int krakl_zero_fill_is_active(void) { return 1; }
