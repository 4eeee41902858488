/*
 * libpipewire-0.3 (Debian libpipewire-0.3-dev) for the PipeWire backend.
 *
 * Much of PipeWire's client API is macros (pw_core_sync, pw_loop_add_io,
 * ...) and SPA pods are built with variadic inline functions; Swift can
 * call neither. These static inline helpers wrap exactly those, and read
 * the buffer metadata (header flags, damage, crop, cursor) into plain
 * structs. Everything else the backend calls directly.
 */
#ifndef KRAKL_PIPEWIRE_SHIM_H
#define KRAKL_PIPEWIRE_SHIM_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <pipewire/pipewire.h>
#include <spa/buffer/meta.h>
#include <spa/param/video/format-utils.h>
#include <spa/pod/builder.h>

/* Properties of our capture stream. `node.dont-reconnect`: when the
 * screen's node goes away the stream ends instead of being linked to some
 * other video source (a camera, say). */
static inline struct pw_properties *krakl_pw_stream_properties(void)
{
    return pw_properties_new(PW_KEY_MEDIA_TYPE, "Video", PW_KEY_MEDIA_CATEGORY, "Capture",
                             PW_KEY_MEDIA_ROLE, "Screen", PW_KEY_NODE_DONT_RECONNECT, "true", NULL);
}

/* The same for a camera read for a join code: role Camera, so a session
 * manager or portal that restricts cameras sees what this stream is. */
static inline struct pw_properties *krakl_pw_camera_stream_properties(void)
{
    return pw_properties_new(PW_KEY_MEDIA_TYPE, "Video", PW_KEY_MEDIA_CATEGORY, "Capture",
                             PW_KEY_MEDIA_ROLE, "Camera", PW_KEY_NODE_DONT_RECONNECT, "true", NULL);
}

static inline struct pw_properties *krakl_pw_properties_empty(void) { return pw_properties_new(NULL, NULL); }

/* The formats we accept: packed 32-bit RGB in memory (no DMA-BUF
 * modifier, so a producer that offers both picks its memory path), any
 * size, any frame rate. Returns the number of params written (1). */
static inline uint32_t krakl_pw_format_params(uint8_t *buffer, uint32_t size, const struct spa_pod **params)
{
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, size);
    params[0] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_Format, SPA_PARAM_EnumFormat,
        SPA_FORMAT_mediaType, SPA_POD_Id(SPA_MEDIA_TYPE_video),
        SPA_FORMAT_mediaSubtype, SPA_POD_Id(SPA_MEDIA_SUBTYPE_raw),
        SPA_FORMAT_VIDEO_format, SPA_POD_CHOICE_ENUM_Id(5, SPA_VIDEO_FORMAT_BGRx, SPA_VIDEO_FORMAT_BGRx,
                                                         SPA_VIDEO_FORMAT_BGRA, SPA_VIDEO_FORMAT_RGBx, SPA_VIDEO_FORMAT_RGBA),
        SPA_FORMAT_VIDEO_size, SPA_POD_CHOICE_RANGE_Rectangle(&SPA_RECTANGLE(1920, 1080), &SPA_RECTANGLE(1, 1),
                                                              &SPA_RECTANGLE(16384, 16384)),
        SPA_FORMAT_VIDEO_framerate, SPA_POD_CHOICE_RANGE_Fraction(&SPA_FRACTION(30, 1), &SPA_FRACTION(0, 1),
                                                                  &SPA_FRACTION(1000, 1)));
    return params[0] ? 1 : 0;
}

/* The formats we accept from a camera: what V4L2 webcams send raw (YUY2,
 * UYVY, NV12, I420) and packed RGB, in memory; 1280x720 preferred (the size
 * QR codes held at arm's length read well at, and what the scan's numbers
 * were measured at), any rate. MJPG is not offered: a camera that only
 * sends JPEG at a size picks a raw format at a smaller one. */
static inline uint32_t krakl_pw_camera_format_params(uint8_t *buffer, uint32_t size, const struct spa_pod **params)
{
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, size);
    params[0] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_Format, SPA_PARAM_EnumFormat,
        SPA_FORMAT_mediaType, SPA_POD_Id(SPA_MEDIA_TYPE_video),
        SPA_FORMAT_mediaSubtype, SPA_POD_Id(SPA_MEDIA_SUBTYPE_raw),
        SPA_FORMAT_VIDEO_format, SPA_POD_CHOICE_ENUM_Id(7, SPA_VIDEO_FORMAT_YUY2, SPA_VIDEO_FORMAT_YUY2,
                                                         SPA_VIDEO_FORMAT_UYVY, SPA_VIDEO_FORMAT_NV12, SPA_VIDEO_FORMAT_I420,
                                                         SPA_VIDEO_FORMAT_BGRx, SPA_VIDEO_FORMAT_RGBx),
        SPA_FORMAT_VIDEO_size, SPA_POD_CHOICE_RANGE_Rectangle(&SPA_RECTANGLE(1280, 720), &SPA_RECTANGLE(1, 1),
                                                              &SPA_RECTANGLE(8192, 8192)),
        SPA_FORMAT_VIDEO_framerate, SPA_POD_CHOICE_RANGE_Fraction(&SPA_FRACTION(30, 1), &SPA_FRACTION(0, 1),
                                                                  &SPA_FRACTION(1000, 1)));
    return params[0] ? 1 : 0;
}

/* The negotiated frame rate of raw video, as num/denom (0/1 when variable). */
static inline int krakl_pw_parse_framerate(const struct spa_pod *param, uint32_t *num, uint32_t *denom)
{
    struct spa_video_info_raw info;
    memset(&info, 0, sizeof info);
    if (!param || spa_format_video_raw_parse(param, &info) < 0) return -EINVAL;
    *num = info.framerate.num;
    *denom = info.framerate.denom;
    return 0;
}

/* Size of a cursor meta holding a w x h 32-bit bitmap. */
static inline int32_t krakl_pw_cursor_meta_size(int32_t w, int32_t h)
{
    return (int32_t)(sizeof(struct spa_meta_cursor) + sizeof(struct spa_meta_bitmap)) + w * h * 4;
}

/* After the format is fixed: buffers in shared memory (MemFd, or MemPtr),
 * and the metadata we read: header, damage, crop, and the cursor when
 * `cursor_meta`. Returns the number of params written. */
static inline uint32_t krakl_pw_buffer_params(uint8_t *buffer, uint32_t size, const struct spa_pod **params, bool cursor_meta)
{
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, size);
    uint32_t n = 0;
    params[n++] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_ParamBuffers, SPA_PARAM_Buffers,
        SPA_PARAM_BUFFERS_buffers, SPA_POD_CHOICE_RANGE_Int(4, 2, 16),
        SPA_PARAM_BUFFERS_blocks, SPA_POD_Int(1),
        SPA_PARAM_BUFFERS_dataType, SPA_POD_CHOICE_FLAGS_Int((1 << SPA_DATA_MemFd) | (1 << SPA_DATA_MemPtr)));
    params[n++] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_Header),
        SPA_PARAM_META_size, SPA_POD_Int(sizeof(struct spa_meta_header)));
    params[n++] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_VideoCrop),
        SPA_PARAM_META_size, SPA_POD_Int(sizeof(struct spa_meta_region)));
    params[n++] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
        SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_VideoDamage),
        SPA_PARAM_META_size, SPA_POD_CHOICE_RANGE_Int(sizeof(struct spa_meta_region) * 16,
                                                      sizeof(struct spa_meta_region) * 1,
                                                      sizeof(struct spa_meta_region) * 16));
    if (cursor_meta)
        params[n++] = (const struct spa_pod *)spa_pod_builder_add_object(&b,
            SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
            SPA_PARAM_META_type, SPA_POD_Id(SPA_META_Cursor),
            SPA_PARAM_META_size, SPA_POD_CHOICE_RANGE_Int(krakl_pw_cursor_meta_size(64, 64),
                                                          krakl_pw_cursor_meta_size(1, 1),
                                                          krakl_pw_cursor_meta_size(256, 256)));
    for (uint32_t i = 0; i < n; i++)
        if (!params[i]) return 0;
    return n;
}

/* The negotiated raw video format. Returns 0, or a negative errno when
 * `param` is not raw video. */
static inline int krakl_pw_parse_format(const struct spa_pod *param, uint32_t *format, uint32_t *width, uint32_t *height)
{
    uint32_t media_type = 0, media_subtype = 0;
    if (!param || spa_format_parse(param, &media_type, &media_subtype) < 0) return -EINVAL;
    if (media_type != SPA_MEDIA_TYPE_video || media_subtype != SPA_MEDIA_SUBTYPE_raw) return -ENOTSUP;
    struct spa_video_info_raw info;
    memset(&info, 0, sizeof info);
    if (spa_format_video_raw_parse(param, &info) < 0) return -EINVAL;
    *format = info.format;
    *width = info.size.width;
    *height = info.size.height;
    return 0;
}

/* True when the buffer's header marks it corrupted (or its chunk is). */
static inline bool krakl_pw_buffer_corrupted(struct spa_buffer *buffer)
{
    struct spa_meta_header *h = (struct spa_meta_header *)spa_buffer_find_meta_data(buffer, SPA_META_Header, sizeof *h);
    if (h && (h->flags & SPA_META_HEADER_FLAG_CORRUPTED)) return true;
    return buffer->n_datas > 0 && buffer->datas[0].chunk && (buffer->datas[0].chunk->flags & SPA_CHUNK_FLAG_CORRUPTED);
}

/* The crop region, when the buffer has a valid one: returns true. */
static inline bool krakl_pw_buffer_crop(struct spa_buffer *buffer, struct spa_region *out)
{
    struct spa_meta_region *crop = (struct spa_meta_region *)spa_buffer_find_meta_data(buffer, SPA_META_VideoCrop, sizeof *crop);
    if (!crop || !spa_meta_region_is_valid(crop)) return false;
    *out = crop->region;
    return true;
}

/* Copies up to `max` damage rectangles into `out`. Returns -1 when the
 * buffer carries no damage metadata (the whole frame may have changed),
 * else how many valid rectangles it has (the list ends at the first empty
 * one; more than `max` returns max + 1, meaning "too many: use the whole
 * frame"). */
static inline int krakl_pw_buffer_damage(struct spa_buffer *buffer, struct spa_region *out, int max)
{
    struct spa_meta *meta = spa_buffer_find_meta(buffer, SPA_META_VideoDamage);
    if (!meta || meta->size < sizeof(struct spa_meta_region)) return -1;
    int count = 0;
    struct spa_meta_region *r;
    spa_meta_for_each(r, meta) {
        if (!spa_meta_region_is_valid(r)) break;
        if (count == max) return max + 1;
        out[count++] = r->region;
    }
    return count;
}

/* The cursor as the metadata gives it. */
struct krakl_pw_cursor {
    uint32_t id;          /* 0: no cursor information in this buffer */
    int32_t x, y;         /* position of the hotspot on the screen */
    int32_t hotspot_x, hotspot_y;
    bool has_bitmap;      /* a new image follows (else: unchanged) */
    uint32_t format;      /* spa_video_format of the image */
    uint32_t width, height;
    int32_t stride;
    const uint8_t *pixels; /* NULL with has_bitmap: the cursor is invisible */
};

static inline bool krakl_pw_buffer_cursor(struct spa_buffer *buffer, struct krakl_pw_cursor *out)
{
    memset(out, 0, sizeof *out);
    struct spa_meta *meta = spa_buffer_find_meta(buffer, SPA_META_Cursor);
    if (!meta || meta->size < sizeof(struct spa_meta_cursor)) return false;
    struct spa_meta_cursor *c = (struct spa_meta_cursor *)meta->data;
    if (!spa_meta_cursor_is_valid(c)) return false;
    out->id = c->id;
    out->x = c->position.x;
    out->y = c->position.y;
    out->hotspot_x = c->hotspot.x;
    out->hotspot_y = c->hotspot.y;
    if (c->bitmap_offset >= sizeof *c && c->bitmap_offset + sizeof(struct spa_meta_bitmap) <= meta->size) {
        struct spa_meta_bitmap *bitmap = SPA_PTROFF(c, c->bitmap_offset, struct spa_meta_bitmap);
        if (bitmap->format != 0) {
            out->has_bitmap = true;
            out->format = bitmap->format;
            out->width = bitmap->size.width;
            out->height = bitmap->size.height;
            out->stride = bitmap->stride;
            uint64_t end = (uint64_t)c->bitmap_offset + bitmap->offset + (uint64_t)bitmap->stride * bitmap->size.height;
            if (bitmap->offset >= sizeof *bitmap && bitmap->stride >= (int32_t)(bitmap->size.width * 4) && end <= meta->size)
                out->pixels = SPA_PTROFF(bitmap, bitmap->offset, const uint8_t);
        }
    }
    return true;
}

/* The macros of pw_core, pw_registry and pw_loop, as functions. */
static inline int krakl_pw_core_add_listener(struct pw_core *core, struct spa_hook *hook, const struct pw_core_events *events, void *data)
{
    pw_core_add_listener(core, hook, events, data);
    return 0;
}

static inline int krakl_pw_core_sync(struct pw_core *core, int seq) { return pw_core_sync(core, PW_ID_CORE, seq); }

static inline struct pw_registry *krakl_pw_core_get_registry(struct pw_core *core)
{
    return pw_core_get_registry(core, PW_VERSION_REGISTRY, 0);
}

static inline void krakl_pw_registry_add_listener(struct pw_registry *registry, struct spa_hook *hook,
                                                  const struct pw_registry_events *events, void *data)
{
    pw_registry_add_listener(registry, hook, events, data);
}

static inline void krakl_pw_proxy_destroy(void *proxy) { pw_proxy_destroy((struct pw_proxy *)proxy); }

static inline struct spa_source *krakl_pw_loop_add_io(struct pw_loop *loop, int fd, spa_source_io_func_t func, void *data)
{
    return pw_loop_add_io(loop, fd, SPA_IO_IN | SPA_IO_ERR | SPA_IO_HUP, false, func, data);
}

static inline struct spa_source *krakl_pw_loop_add_event(struct pw_loop *loop, spa_source_event_func_t func, void *data)
{
    return pw_loop_add_event(loop, func, data);
}

static inline int krakl_pw_loop_signal_event(struct pw_loop *loop, struct spa_source *source)
{
    return pw_loop_signal_event(loop, source);
}

static inline void krakl_pw_loop_destroy_source(struct pw_loop *loop, struct spa_source *source)
{
    pw_loop_destroy_source(loop, source);
}

/* The properties dictionary's value for `key`, or NULL. */
static inline const char *krakl_pw_dict_lookup(const struct spa_dict *dict, const char *key)
{
    return dict ? spa_dict_lookup(dict, key) : NULL;
}

#endif
