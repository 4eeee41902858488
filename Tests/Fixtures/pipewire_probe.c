/*
 * pipewire_probe.c: drives a capture backend through the public header
 * alone, for the PipeWire tests, which must run the backend as the
 * unprivileged user of the headless stack (the test runner is root).
 *
 *   pipewire_probe LIB.so [key=value ...]
 *
 * Creates a source with the options (numbers and true/false as JSON
 * values, anything else as a string), starts it, and prints one line per
 * callback on stdout:
 *   created | create-failed <errno>
 *   frame seq=S size=WxH format=F damage=N area=A center=RRGGBB corner=RRGGBB
 *   event source-ended|format-changed|error error=E size=WxH message=...
 *   log LEVEL message
 * Commands on stdin, one a line: stop, start, quit (also end of input).
 * Exits 0, or 3 when create() failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "krakl_backend.h"

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int option_count;
static char **option_keys, **option_values;

static void say(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    pthread_mutex_lock(&out_lock);
    vprintf(format, args);
    putchar('\n');
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
    va_end(args);
}

static void on_log(void *data, int level, const char *message)
{
    (void)data;
    say("log %d %s", level, message ? message : "");
}

/* The pixel at (x, y) as 0xRRGGBB, for the packed 32-bit formats. */
static unsigned pixel(const krakl_frame *f, uint32_t x, uint32_t y)
{
    const uint8_t *p = f->plane[0] + (size_t)y * f->stride[0] + (size_t)x * 4;
    int red_first = f->format == KRAKL_FORMAT_RGBX || f->format == KRAKL_FORMAT_RGBA;
    unsigned r = red_first ? p[0] : p[2], b = red_first ? p[2] : p[0];
    return r << 16 | (unsigned)p[1] << 8 | b;
}

static void on_frame(void *data, const krakl_frame *f)
{
    (void)data;
    unsigned long long area = 0;
    for (uint32_t i = 0; i < f->damage_count; i++) area += (unsigned long long)f->damage[i].width * f->damage[i].height;
    if (f->damage_count == 0) area = (unsigned long long)f->width * f->height;
    say("frame seq=%llu size=%ux%u format=%u damage=%u area=%llu center=%06x corner=%06x ts=%llu",
        (unsigned long long)f->sequence, f->width, f->height, f->format, f->damage_count, area,
        pixel(f, f->width / 2, f->height / 2), pixel(f, 10, 10), (unsigned long long)f->timestamp_ns);
}

static void on_event(void *data, const krakl_event *e)
{
    (void)data;
    const char *kind = e->type == KRAKL_EVENT_SOURCE_ENDED ? "source-ended"
                     : e->type == KRAKL_EVENT_FORMAT_CHANGED ? "format-changed" : "error";
    say("event %s error=%d size=%ux%u message=%s", kind, e->error, e->width, e->height, e->message ? e->message : "");
}

static const char *on_option(void *data, const char *key)
{
    (void)data;
    for (int i = 0; i < option_count; i++)
        if (strcmp(option_keys[i], key) == 0) return option_values[i];
    return NULL;
}

static int on_check_options(void *data, const char *const *known, size_t count)
{
    (void)data;
    for (int i = 0; i < option_count; i++) {
        int found = 0;
        for (size_t k = 0; k < count; k++) found |= strcmp(known[k], option_keys[i]) == 0;
        if (!found) {
            say("log 0 unknown option %s", option_keys[i]);
            return -EINVAL;
        }
    }
    return 0;
}

static int is_json_literal(const char *v)
{
    if (!strcmp(v, "true") || !strcmp(v, "false") || !strcmp(v, "null")) return 1;
    char *end;
    strtod(v, &end);
    return *v && !*end;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIB.so [key=value ...]\n", argv[0]);
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        say("load-failed %s", dlerror());
        return 4;
    }
    krakl_backend_entry_fn entry = (krakl_backend_entry_fn)dlsym(library, KRAKL_BACKEND_ENTRY_SYMBOL);
    const krakl_backend *backend = entry ? entry() : NULL;
    if (!backend) {
        say("load-failed no entry symbol");
        return 4;
    }

    option_count = argc - 2;
    option_keys = calloc((size_t)option_count + 1, sizeof *option_keys);
    option_values = calloc((size_t)option_count + 1, sizeof *option_values);
    size_t json_size = 16;
    for (int i = 0; i < option_count; i++) json_size += strlen(argv[i + 2]) * 2 + 8;
    char *json = malloc(json_size);
    strcpy(json, "{");
    for (int i = 0; i < option_count; i++) {
        char *pair = argv[i + 2], *eq = strchr(pair, '=');
        if (!eq) {
            fprintf(stderr, "option %s is not key=value\n", pair);
            return 2;
        }
        *eq = 0;
        option_keys[i] = pair;
        option_values[i] = eq + 1;
        sprintf(json + strlen(json), "%s\"%s\":%s%s%s", i ? "," : "", pair,
                is_json_literal(eq + 1) ? "" : "\"", eq + 1, is_json_literal(eq + 1) ? "" : "\"");
    }
    strcat(json, "}");

    krakl_host host = {
        .struct_size = sizeof host,
        .abi_version = KRAKL_ABI_VERSION,
        .log = on_log,
        .frame = on_frame,
        .event = on_event,
        .option = on_option,
        .check_options = on_check_options,
    };
    krakl_source *source = NULL;
    int status = backend->create(json, &host, &source);
    if (status < 0) {
        say("create-failed %d", status);
        return 3;
    }
    say("created");
    status = backend->start(source);
    say("started %d", status);

    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "stop", 4)) say("stopped %d", backend->stop(source));
        else if (!strncmp(line, "start", 5)) say("started %d", backend->start(source));
        else if (!strncmp(line, "quit", 4)) break;
    }
    backend->stop(source);
    backend->destroy(source);
    say("destroyed");
    free(json);
    return 0;
}
