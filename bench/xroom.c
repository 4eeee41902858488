/* Screen content for the room benchmark, drawn by the X server on the root
 * window at 30 fps until killed, carrying the frame stamp of
 * docs/frame-stamp.md (frame number and CLOCK_MONOTONIC ms at the moment it
 * was drawn) so a receiver can time draw -> decoded.
 *   xroom DISPLAY static     a page of text-like glyphs, stamped once
 *   xroom DISPLAY typing     three glyph cells a frame, like a terminal, stamp redrawn with them
 *   xroom DISPLAY scrolling  the page moves up 16 px a frame, a new line of glyphs at the bottom */
#define _POSIX_C_SOURCE 200809L
#include <X11/Xlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static uint32_t seed = 12345;
static uint32_t next_random(void) { seed = seed * 1664525u + 1013904223u; return seed >> 8; }

/* One 8x16 cell: a glyph-like mark (a few strokes) in light grey on the dark background, or a space. */
static void glyph(Display *d, Window w, GC gc, int x, int y) {
    uint32_t r = next_random();
    if (r % 5 == 0) return;
    XSetForeground(d, gc, 0xb0b0b0 + (r & 0x3f) * 0x010101);
    XFillRectangle(d, w, gc, x + 1, y + 3 + (r >> 4) % 3, 1 + (r >> 6) % 5, 8 + (r >> 9) % 3);
    XFillRectangle(d, w, gc, x + 1 + (r >> 11) % 4, y + 6, 3, 1 + (r >> 13) % 2);
}

static void line_of_glyphs(Display *d, Window w, GC gc, int y, int width) {
    int length = (int)(next_random() % (unsigned)(width / 8));
    for (int col = 0; col < length; col++) glyph(d, w, gc, col * 8, y);
}

static uint8_t crc8(const uint8_t *bytes, int count) {
    uint8_t crc = 0;
    for (int i = 0; i < count; i++) {
        crc ^= bytes[i];
        for (int k = 0; k < 8; k++) crc = (uint8_t)(crc & 0x80 ? (crc << 1) ^ 0x07 : crc << 1);
    }
    return crc;
}

static void stamp(Display *d, Window w, GC gc, uint32_t frame, int width) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint32_t ms = (uint32_t)((uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000);
    uint8_t bytes[9] = {frame >> 24, frame >> 16, frame >> 8, frame, ms >> 24, ms >> 16, ms >> 8, ms, 0};
    bytes[8] = crc8(bytes, 8);
    int per_row = width / 16;
    for (int i = 0; i < 74; i++) {
        int bit = i == 0 ? 1 : i == 1 ? 0 : (bytes[(i - 2) / 8] >> (7 - (i - 2) % 8)) & 1;
        XSetForeground(d, gc, bit ? 0xffffff : 0x000000);
        XFillRectangle(d, w, gc, (i % per_row) * 16, (i / per_row) * 16, 16, 16);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: xroom DISPLAY static|typing|scrolling\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xroom: cannot open %s\n", argv[1]); return 1; }
    Window root = DefaultRootWindow(d);
    int w = DisplayWidth(d, DefaultScreen(d)), h = DisplayHeight(d, DefaultScreen(d));
    GC gc = XCreateGC(d, root, 0, NULL);
    XSetForeground(d, gc, 0x1e1e1e);
    XFillRectangle(d, root, gc, 0, 0, (unsigned)w, (unsigned)h);
    for (int y = 32; y + 16 <= h; y += 16) line_of_glyphs(d, root, gc, y, w);
    uint32_t frame = 0;
    stamp(d, root, gc, frame, w);
    XSync(d, False);
    int typing = strcmp(argv[2], "typing") == 0, scrolling = strcmp(argv[2], "scrolling") == 0;
    if (!typing && !scrolling) for (;;) { struct timespec hour = {3600, 0}; nanosleep(&hour, NULL); }
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    int col = 0, row = 2;
    for (;;) {
        next.tv_nsec += 33333333;
        if (next.tv_nsec >= 1000000000) { next.tv_nsec -= 1000000000; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        frame++;
        if (typing) {
            for (int i = 0; i < 3; i++) {
                XSetForeground(d, gc, 0x1e1e1e);
                XFillRectangle(d, root, gc, col * 8, row * 16, 8, 16);
                glyph(d, root, gc, col * 8, row * 16);
                if (++col >= w / 8) { col = 0; if (++row >= h / 16) row = 2; }
            }
        } else {
            /* Below the stamp rows, everything moves up a line; a new line comes in at the bottom. */
            XCopyArea(d, root, root, gc, 0, 48, (unsigned)w, (unsigned)(h - 48), 0, 32);
            XSetForeground(d, gc, 0x1e1e1e);
            XFillRectangle(d, root, gc, 0, h - 16, (unsigned)w, 16);
            line_of_glyphs(d, root, gc, h - 16, w);
        }
        stamp(d, root, gc, frame, w);
        XSync(d, False);
    }
}
