/* Screen content for the room benchmark, drawn by the X server on the root
 * window at 30 fps until killed, carrying the frame stamp of
 * docs/frame-stamp.md (frame number and CLOCK_MONOTONIC ms at the moment it
 * was drawn) so a receiver can time draw -> decoded.
 *   xroom DISPLAY static     a page of text-like glyphs, stamped once
 *   xroom DISPLAY typing     three glyph cells a frame, like a terminal, stamp redrawn with them
 *   xroom DISPLAY scrolling  the page moves up 16 px a frame, a new line of glyphs at the bottom
 *
 * The scene depends only on the frame number, so the same steps drawn into
 * memory are the picture as drawn, for judging what a receiver decoded:
 *   xroom --reference WxH SCENE FRAMES OUT
 * reads frame numbers (one a line, never decreasing; repeats allowed) from
 * FRAMES and writes, for each, the W x H luma plane of that frame to OUT
 * (8 bits a pixel, BT.601 limited range with libyuv's ARGBToI420 rounding,
 * which krakl-agent and Chromium use; every colour of the scenes is a grey,
 * so the matrix does not matter, only the range). The stamp rows (y < 32)
 * hold the frame number but time 0: a comparison leaves them out. */
#define _POSIX_C_SOURCE 200809L
#include <X11/Xlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Where the scene is drawn: the root window, or a grey picture in memory (one byte a pixel). */
struct canvas {
    Display *d;
    Window w;
    GC gc;
    uint8_t *grey;
    int width, height;
};

static void fill(struct canvas *c, uint32_t rgb, int x, int y, int w, int h) {
    if (!c->grey) {
        XSetForeground(c->d, c->gc, rgb);
        XFillRectangle(c->d, c->w, c->gc, x, y, (unsigned)w, (unsigned)h);
        return;
    }
    int x1 = x + w > c->width ? c->width : x + w, y1 = y + h > c->height ? c->height : y + h;
    for (int row = y < 0 ? 0 : y; row < y1; row++)
        for (int col = x < 0 ? 0 : x; col < x1; col++) c->grey[(size_t)row * c->width + col] = (uint8_t)(rgb & 0xff);
}

/* Below the stamp rows, everything moves up a line (16 px). */
static void scroll_up(struct canvas *c) {
    if (!c->grey) {
        XCopyArea(c->d, c->w, c->w, c->gc, 0, 48, (unsigned)c->width, (unsigned)(c->height - 48), 0, 32);
        return;
    }
    memmove(c->grey + (size_t)32 * c->width, c->grey + (size_t)48 * c->width, (size_t)(c->height - 48) * c->width);
}

static uint32_t seed = 12345;
static uint32_t next_random(void) { seed = seed * 1664525u + 1013904223u; return seed >> 8; }

/* One 8x16 cell: a glyph-like mark (a few strokes) in light grey on the dark background, or a space. */
static void glyph(struct canvas *c, int x, int y) {
    uint32_t r = next_random();
    if (r % 5 == 0) return;
    uint32_t colour = 0xb0b0b0 + (r & 0x3f) * 0x010101;
    fill(c, colour, x + 1, y + 3 + (r >> 4) % 3, 1 + (r >> 6) % 5, 8 + (r >> 9) % 3);
    fill(c, colour, x + 1 + (r >> 11) % 4, y + 6, 3, 1 + (r >> 13) % 2);
}

static void line_of_glyphs(struct canvas *c, int y) {
    int length = (int)(next_random() % (unsigned)(c->width / 8));
    for (int col = 0; col < length; col++) glyph(c, col * 8, y);
}

static uint8_t crc8(const uint8_t *bytes, int count) {
    uint8_t crc = 0;
    for (int i = 0; i < count; i++) {
        crc ^= bytes[i];
        for (int k = 0; k < 8; k++) crc = (uint8_t)(crc & 0x80 ? (crc << 1) ^ 0x07 : crc << 1);
    }
    return crc;
}

static void stamp(struct canvas *c, uint32_t frame, uint32_t ms) {
    uint8_t bytes[9] = {frame >> 24, frame >> 16, frame >> 8, frame, ms >> 24, ms >> 16, ms >> 8, ms, 0};
    bytes[8] = crc8(bytes, 8);
    int per_row = c->width / 16;
    for (int i = 0; i < 74; i++) {
        int bit = i == 0 ? 1 : i == 1 ? 0 : (bytes[(i - 2) / 8] >> (7 - (i - 2) % 8)) & 1;
        fill(c, bit ? 0xffffff : 0x000000, (i % per_row) * 16, (i / per_row) * 16, 16, 16);
    }
}

static uint32_t now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint32_t)((uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000);
}

/* The page every scene starts from (frame 0 without its stamp). */
static void first_page(struct canvas *c) {
    fill(c, 0x1e1e1e, 0, 0, c->width, c->height);
    for (int y = 32; y + 16 <= c->height; y += 16) line_of_glyphs(c, y);
}

/* What changes from one frame to the next (its stamp aside); *col and *row are the typing cursor. */
static void next_frame(struct canvas *c, int typing, int *col, int *row) {
    if (typing) {
        for (int i = 0; i < 3; i++) {
            fill(c, 0x1e1e1e, *col * 8, *row * 16, 8, 16);
            glyph(c, *col * 8, *row * 16);
            if (++*col >= c->width / 8) { *col = 0; if (++*row >= c->height / 16) *row = 2; }
        }
    } else {
        scroll_up(c);
        fill(c, 0x1e1e1e, 0, c->height - 16, c->width, 16);
        line_of_glyphs(c, c->height - 16);
    }
}

static int reference(const char *size, const char *scene, const char *frames_path, const char *out_path) {
    struct canvas c = {0};
    if (sscanf(size, "%dx%d", &c.width, &c.height) != 2 || c.width < 64 || c.height < 64) { fprintf(stderr, "xroom: bad size %s\n", size); return 2; }
    int typing = strcmp(scene, "typing") == 0, scrolling = strcmp(scene, "scrolling") == 0;
    FILE *frames = fopen(frames_path, "r"), *out = fopen(out_path, "wb");
    c.grey = malloc((size_t)c.width * c.height);
    uint8_t *luma = malloc((size_t)c.width * c.height);
    if (!frames || !out || !c.grey || !luma) { fprintf(stderr, "xroom: cannot open %s or %s\n", frames_path, out_path); return 1; }
    first_page(&c);
    uint32_t drawn = 0;
    int col = 0, row = 2;
    unsigned long wanted;
    while (fscanf(frames, "%lu", &wanted) == 1) {
        if (wanted < drawn || wanted > 10000000) { fprintf(stderr, "xroom: frame %lu out of order or too far\n", wanted); return 1; }
        /* A static scene never changes after frame 0. */
        while (drawn < wanted && (typing || scrolling)) { next_frame(&c, typing, &col, &row); drawn++; }
        stamp(&c, (uint32_t)wanted, 0);
        for (size_t i = 0; i < (size_t)c.width * c.height; i++) luma[i] = (uint8_t)((220u * c.grey[i] + 0x1080u) >> 8);
        if (fwrite(luma, 1, (size_t)c.width * c.height, out) != (size_t)c.width * c.height) { fprintf(stderr, "xroom: cannot write %s\n", out_path); return 1; }
    }
    return fclose(out) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "--reference") == 0) return reference(argv[2], argv[3], argv[4], argv[5]);
    if (argc != 3) { fprintf(stderr, "usage: xroom DISPLAY static|typing|scrolling\n       xroom --reference WxH SCENE FRAMES OUT\n"); return 2; }
    struct canvas c = {0};
    c.d = XOpenDisplay(argv[1]);
    if (!c.d) { fprintf(stderr, "xroom: cannot open %s\n", argv[1]); return 1; }
    c.w = DefaultRootWindow(c.d);
    c.width = DisplayWidth(c.d, DefaultScreen(c.d));
    c.height = DisplayHeight(c.d, DefaultScreen(c.d));
    c.gc = XCreateGC(c.d, c.w, 0, NULL);
    first_page(&c);
    uint32_t frame = 0;
    stamp(&c, frame, now_ms());
    XSync(c.d, False);
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
        next_frame(&c, typing, &col, &row);
        stamp(&c, frame, now_ms());
        XSync(c.d, False);
    }
}
