/*
 * portal_wlr_dmabuf_shim.c: an LD_PRELOAD library for xdg-desktop-portal-wlr
 * 0.7 on a pixman (software) wlroots, loaded into the portal process only
 * by scripts/pipewire-stack.
 *
 * xdg-desktop-portal-wlr 0.7.0 fails ScreenCast.Start ("unable to receive a
 * valid format from wlr_screencopy") because it waits for a linux_dmabuf
 * event on zwlr_screencopy_frame_v1 that a compositor without a GPU
 * renderer never sends (fixed upstream in 0.8). This library wraps
 * wl_proxy_add_listener: for screencopy frames it installs a copy of the
 * portal's listener whose `buffer` handler calls the portal's own and then
 * its `linux_dmabuf` handler with the same size and the matching DRM
 * format. The portal then sees both buffer kinds, and since a pixman
 * compositor cannot import a dmabuf it falls back to shared memory as
 * designed. Nothing else is touched.
 *
 * Build: cc -shared -fPIC -O2 portal_wlr_dmabuf_shim.c -o shim.so -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <wayland-client-core.h>

/* zwlr_screencopy_frame_v1's events, in protocol order (version 3). */
typedef void (*buffer_fn)(void *, struct wl_proxy *, uint32_t, uint32_t, uint32_t, uint32_t);
typedef void (*dmabuf_fn)(void *, struct wl_proxy *, uint32_t, uint32_t, uint32_t);

enum { EVENT_BUFFER = 0, EVENT_LINUX_DMABUF = 5, EVENT_COUNT = 7 };

/* The listener the portal gets back from wl_proxy_get_listener: our copy
 * of its table, followed by a pointer to its original table. */
struct wrapped_listener {
    void (*events[EVENT_COUNT])(void);
    void (*const *original)(void);
};

typedef int (*add_listener_fn)(struct wl_proxy *, void (**)(void), void *);

/* wl_shm formats 0 and 1 are the only ones that differ from DRM fourccs. */
static uint32_t drm_format(uint32_t shm_format)
{
    if (shm_format == 0) return 0x34325241; /* 'AR24' ARGB8888 */
    if (shm_format == 1) return 0x34325258; /* 'XR24' XRGB8888 */
    return shm_format;
}

static void on_buffer(void *data, struct wl_proxy *frame, uint32_t format, uint32_t width, uint32_t height, uint32_t stride)
{
    const struct wrapped_listener *wrapped = wl_proxy_get_listener(frame);
    buffer_fn buffer = (buffer_fn)wrapped->original[EVENT_BUFFER];
    dmabuf_fn dmabuf = (dmabuf_fn)wrapped->original[EVENT_LINUX_DMABUF];
    if (buffer) buffer(data, frame, format, width, height, stride);
    if (dmabuf) dmabuf(data, frame, drm_format(format), width, height);
}

/* The portal uses one static listener table for every frame; keep one
 * wrapped copy per distinct original table (a handful at most). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct wrapped_listener *wrapped_tables[8];

static struct wrapped_listener *wrap(void (**original)(void))
{
    struct wrapped_listener *found = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < sizeof wrapped_tables / sizeof *wrapped_tables && !found; i++) {
        if (wrapped_tables[i] && wrapped_tables[i]->original == (void (*const *)(void))original) found = wrapped_tables[i];
        else if (!wrapped_tables[i]) {
            struct wrapped_listener *table = calloc(1, sizeof *table);
            if (!table) break;
            memcpy(table->events, original, sizeof table->events);
            table->events[EVENT_BUFFER] = (void (*)(void))on_buffer;
            table->original = (void (*const *)(void))original;
            wrapped_tables[i] = found = table;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

int wl_proxy_add_listener(struct wl_proxy *proxy, void (**implementation)(void), void *data)
{
    static add_listener_fn real;
    if (!real) real = (add_listener_fn)dlsym(RTLD_NEXT, "wl_proxy_add_listener");
    if (proxy && implementation && wl_proxy_get_version(proxy) >= 3
        && strcmp(wl_proxy_get_class(proxy), "zwlr_screencopy_frame_v1") == 0) {
        struct wrapped_listener *table = wrap(implementation);
        if (table) return real(proxy, table->events, data);
    }
    return real(proxy, implementation, data);
}
