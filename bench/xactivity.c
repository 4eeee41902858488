/* Screen activity for the X11 capture benchmark, drawn by the X server at
 * 30 fps on the root window until killed.
 *   xactivity DISPLAY static   draws once, then nothing
 *   xactivity DISPLAY typing   three glyph-sized (8x16) cells a frame, like a terminal
 *   xactivity DISPLAY full     the whole screen in a new colour every frame */
#define _POSIX_C_SOURCE 200809L
#include <X11/Xlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: xactivity DISPLAY static|typing|full\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xactivity: cannot open %s\n", argv[1]); return 1; }
    Window root = DefaultRootWindow(d);
    int w = DisplayWidth(d, DefaultScreen(d)), h = DisplayHeight(d, DefaultScreen(d));
    GC gc = XCreateGC(d, root, 0, NULL);
    XSetForeground(d, gc, 0x1e1e1e);
    XFillRectangle(d, root, gc, 0, 0, (unsigned)w, (unsigned)h);
    XSync(d, False);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    unsigned long frame = 0;
    int col = 0, row = 0;
    for (;;) {
        next.tv_nsec += 33333333;
        if (next.tv_nsec >= 1000000000) { next.tv_nsec -= 1000000000; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        frame++;
        if (strcmp(argv[2], "typing") == 0) {
            for (int i = 0; i < 3; i++) {
                XSetForeground(d, gc, (frame * 2654435761u + (unsigned long)i * 40503u) & 0xffffff);
                XFillRectangle(d, root, gc, col * 8, row * 16, 8, 16);
                if (++col >= w / 8) { col = 0; if (++row >= h / 16) row = 0; }
            }
        } else if (strcmp(argv[2], "full") == 0) {
            XSetForeground(d, gc, (frame * 0x10101u) & 0xffffff);
            XFillRectangle(d, root, gc, 0, 0, (unsigned)w, (unsigned)h);
        }
        XSync(d, False);
    }
}
