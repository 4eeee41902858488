/* LD_PRELOAD shim: logs every allocation of 1 MB or more (and its free) so
 * bench/smaps_parts.py can tell libvpx's buffers and the pipeline's pictures
 * apart inside the anonymous memory /proc/PID/smaps lumps together (glibc's
 * arenas and adjacent mappings merge).
 *
 *   cc -O2 -shared -fPIC bench/alloc_log.c -o alloc_log.so
 *   KRAKL_ALLOC_LOG=DIR LD_PRELOAD=$PWD/alloc_log.so krakl-agent ...
 *
 * writes DIR/alloc-PID.log, a line per event: "a ADDRESS SIZE" or "f ADDRESS"
 * (hex address, decimal size). Only the bench uses it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

enum { minimum = 1 << 20, kept = 1024 };
static int fd = -2;
static void *tracked[kept];
static char lock;

static void note(char kind, void *p, size_t n) {
    if (fd == -2) {
        const char *dir = getenv("KRAKL_ALLOC_LOG");
        fd = -1;
        if (dir) {
            char path[512];
            snprintf(path, sizeof path, "%s/alloc-%d.log", dir, (int)getpid());
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        }
    }
    if (fd < 0) return;
    char line[96];
    int len = kind == 'a' ? snprintf(line, sizeof line, "a %lx %zu\n", (unsigned long)p, n)
                          : snprintf(line, sizeof line, "f %lx\n", (unsigned long)p);
    if (write(fd, line, (size_t)len) < 0) return;
}

static void added(void *p, size_t n) {
    if (!p || n < minimum) return;
    while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {}
    for (int i = 0; i < kept; i++) {
        if (!tracked[i]) { tracked[i] = p; break; }
    }
    __atomic_clear(&lock, __ATOMIC_RELEASE);
    note('a', p, n);
}

static void removed(void *p) {
    if (!p) return;
    int found = 0;
    while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {}
    for (int i = 0; i < kept; i++) {
        if (tracked[i] == p) { tracked[i] = NULL; found = 1; break; }
    }
    __atomic_clear(&lock, __ATOMIC_RELEASE);
    if (found) note('f', p, 0);
}

void *malloc(size_t n) { void *p = __libc_malloc(n); added(p, n); return p; }
void *calloc(size_t c, size_t n) { void *p = __libc_calloc(c, n); added(p, c * n); return p; }
void *realloc(void *old, size_t n) {
    removed(old);
    void *p = __libc_realloc(old, n);
    added(p, n);
    return p;
}
void free(void *p) { removed(p); __libc_free(p); }
void *memalign(size_t a, size_t n) { void *p = __libc_memalign(a, n); added(p, n); return p; }
void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = __libc_memalign(a, n);
    if (!p) return 12; /* ENOMEM */
    added(p, n);
    *out = p;
    return 0;
}
