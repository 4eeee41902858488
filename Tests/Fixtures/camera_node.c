/*
 * A camera for the tests and the bench: a PipeWire Video/Source node with a webcam's
 * properties (media.role Camera and a product name, as WirePlumber gives a V4L2 camera)
 * that plays a looping clip of raw 1280x720 frames (Tests/Fixtures/camera_clip.sh) at 30 fps.
 *
 *   camera_node FOLDER [YUY2|NV12] [DESCRIPTION] [NODE_NAME]
 *
 * FOLDER holds f00.yuv, f01.yuv, ... (read again at every loop, so a bench can swap what the
 * camera shows by replacing FOLDER's files or a symbolic link on the way). Like a V4L2 node it
 * drives the graph itself (PW_STREAM_FLAG_DRIVER, a timer at the frame rate), so a consumer
 * gets frames whenever it connects: GStreamer's pipewiresink in provide mode, tried first, sent
 * no frames at all to a consumer that connected late in some runs, and one frame only when fed
 * by a non-live source. Runs until killed; prints "streaming" once a consumer is linked.
 *
 * Build: cc -O1 camera_node.c -o camera_node $(pkg-config --cflags --libs libpipewire-0.3)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipewire/pipewire.h>
#include <spa/param/video/format-utils.h>
#include <spa/pod/builder.h>

#define WIDTH 1280
#define HEIGHT 720
#define RATE 30

struct camera {
    struct pw_main_loop *loop;
    struct pw_stream *stream;
    struct spa_hook listener;
    struct spa_source *timer;
    const char *folder;
    int nv12;
    size_t frame_size;
    uint32_t stride;
    unsigned index;
    unsigned char *frame;
};

/* The next frame from FOLDER into `frame`; on a missing file the clip starts again. */
static int next_frame(struct camera *c)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/f%02u.yuv", c->folder, c->index);
        FILE *file = fopen(path, "rb");
        if (file) {
            size_t got = fread(c->frame, 1, c->frame_size, file);
            fclose(file);
            c->index++;
            if (got == c->frame_size) return 0;
        }
        if (c->index == 0) return -1;
        c->index = 0;
    }
    return -1;
}

static void on_process(void *data)
{
    struct camera *c = data;
    struct pw_buffer *b = pw_stream_dequeue_buffer(c->stream);
    if (!b) return;
    struct spa_buffer *buf = b->buffer;
    struct spa_data *d = &buf->datas[0];
    if (d->data && d->maxsize >= c->frame_size && next_frame(c) == 0) {
        memcpy(d->data, c->frame, c->frame_size);
        d->chunk->offset = 0;
        d->chunk->size = c->frame_size;
        d->chunk->stride = c->stride;
    } else {
        d->chunk->size = 0;
    }
    pw_stream_queue_buffer(c->stream, b);
}

static void on_timeout(void *data, uint64_t expirations)
{
    struct camera *c = data;
    (void)expirations;
    pw_stream_trigger_process(c->stream);
}

static void on_state_changed(void *data, enum pw_stream_state old, enum pw_stream_state state, const char *error)
{
    struct camera *c = data;
    (void)old;
    if (state == PW_STREAM_STATE_STREAMING) {
        struct timespec first = { 0, 1 }, interval = { 0, 1000000000 / RATE };
        pw_loop_update_timer(pw_main_loop_get_loop(c->loop), c->timer, &first, &interval, false);
        printf("streaming\n");
        fflush(stdout);
    } else {
        pw_loop_update_timer(pw_main_loop_get_loop(c->loop), c->timer, NULL, NULL, false);
    }
    if (state == PW_STREAM_STATE_ERROR) fprintf(stderr, "camera_node: stream error: %s\n", error ? error : "?");
}

static void on_param_changed(void *data, uint32_t id, const struct spa_pod *param)
{
    struct camera *c = data;
    if (id != SPA_PARAM_Format || !param) return;
    uint8_t buffer[1024];
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, sizeof buffer);
    const struct spa_pod *params[1];
    params[0] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamBuffers, SPA_PARAM_Buffers,
        SPA_PARAM_BUFFERS_buffers, SPA_POD_CHOICE_RANGE_Int(4, 2, 8),
        SPA_PARAM_BUFFERS_blocks, SPA_POD_Int(1),
        SPA_PARAM_BUFFERS_size, SPA_POD_Int((int32_t)c->frame_size),
        SPA_PARAM_BUFFERS_stride, SPA_POD_Int((int32_t)c->stride),
        SPA_PARAM_BUFFERS_dataType, SPA_POD_CHOICE_FLAGS_Int((1 << SPA_DATA_MemFd) | (1 << SPA_DATA_MemPtr)));
    pw_stream_update_params(c->stream, params, 1);
}

static const struct pw_stream_events events = {
    PW_VERSION_STREAM_EVENTS,
    .state_changed = on_state_changed,
    .param_changed = on_param_changed,
    .process = on_process,
};

int main(int argc, char *argv[])
{
    if (argc < 2) {
        fprintf(stderr, "usage: camera_node FOLDER [YUY2|NV12] [DESCRIPTION] [NODE_NAME]\n");
        return 2;
    }
    struct camera c = { .folder = argv[1] };
    c.nv12 = argc > 2 && strcmp(argv[2], "NV12") == 0;
    const char *description = argc > 3 ? argv[3] : "HD Webcam";
    const char *name = argc > 4 ? argv[4] : "krakl-test-camera";
    c.stride = c.nv12 ? WIDTH : WIDTH * 2;
    c.frame_size = c.nv12 ? (size_t)WIDTH * HEIGHT * 3 / 2 : (size_t)WIDTH * HEIGHT * 2;
    c.frame = malloc(c.frame_size);
    if (!c.frame || next_frame(&c) != 0) {
        fprintf(stderr, "camera_node: no readable %s/f00.yuv of %zu bytes\n", c.folder, c.frame_size);
        return 1;
    }
    c.index = 0;

    pw_init(&argc, &argv);
    c.loop = pw_main_loop_new(NULL);
    c.timer = pw_loop_add_timer(pw_main_loop_get_loop(c.loop), on_timeout, &c);
    c.stream = pw_stream_new_simple(pw_main_loop_get_loop(c.loop), name,
        pw_properties_new(PW_KEY_MEDIA_CLASS, "Video/Source", PW_KEY_MEDIA_ROLE, "Camera", PW_KEY_MEDIA_TYPE, "Video",
                          PW_KEY_MEDIA_CATEGORY, "Capture", PW_KEY_NODE_NAME, name, PW_KEY_NODE_DESCRIPTION, description, NULL),
        &events, &c);

    uint8_t buffer[1024];
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, sizeof buffer);
    const struct spa_pod *params[1];
    params[0] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_Format, SPA_PARAM_EnumFormat,
        SPA_FORMAT_mediaType, SPA_POD_Id(SPA_MEDIA_TYPE_video),
        SPA_FORMAT_mediaSubtype, SPA_POD_Id(SPA_MEDIA_SUBTYPE_raw),
        SPA_FORMAT_VIDEO_format, SPA_POD_Id(c.nv12 ? SPA_VIDEO_FORMAT_NV12 : SPA_VIDEO_FORMAT_YUY2),
        SPA_FORMAT_VIDEO_size, SPA_POD_Rectangle(&SPA_RECTANGLE(WIDTH, HEIGHT)),
        SPA_FORMAT_VIDEO_framerate, SPA_POD_Fraction(&SPA_FRACTION(RATE, 1)));
    int status = pw_stream_connect(c.stream, PW_DIRECTION_OUTPUT, PW_ID_ANY,
                                   PW_STREAM_FLAG_DRIVER | PW_STREAM_FLAG_MAP_BUFFERS, params, 1);
    if (status < 0) {
        fprintf(stderr, "camera_node: cannot connect: %s\n", strerror(-status));
        return 1;
    }
    pw_main_loop_run(c.loop);
    pw_stream_destroy(c.stream);
    pw_main_loop_destroy(c.loop);
    free(c.frame);
    pw_deinit();
    return 0;
}
