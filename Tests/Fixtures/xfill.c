/* Test helper for an X display's root window, then exits:
 *   xfill DISPLAY X Y WIDTH HEIGHT RRGGBB   fills a rectangle with a colour
 *   xfill DISPLAY pgm FILE X Y              draws a binary PGM (P5, maxval 255) at X,Y
 *                                           (a QR code for the scan tests) */
#include <X11/Xlib.h>
#include <X11/Xutil.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int draw_pgm(Display *d, Window root, GC gc, const char *path, int x, int y) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "xfill: cannot open %s\n", path); return 1; }
    int w, h, maxval;
    if (fscanf(f, "P5 %d %d %d", &w, &h, &maxval) != 3 || w <= 0 || h <= 0 || w > 16384 || h > 16384 || maxval != 255) {
        fprintf(stderr, "xfill: %s is not a binary 8-bit PGM\n", path);
        fclose(f);
        return 1;
    }
    fgetc(f); /* the one white-space byte after the header */
    unsigned char *gray = malloc((size_t)w * h);
    unsigned int *pixels = malloc((size_t)w * h * 4);
    if (!gray || !pixels || fread(gray, 1, (size_t)w * h, f) != (size_t)w * h) {
        fprintf(stderr, "xfill: %s is truncated\n", path);
        fclose(f);
        return 1;
    }
    fclose(f);
    for (size_t i = 0; i < (size_t)w * h; i++) pixels[i] = gray[i] << 16 | gray[i] << 8 | gray[i];
    free(gray);
    int screen = DefaultScreen(d);
    XImage *image = XCreateImage(d, DefaultVisual(d, screen), (unsigned)DefaultDepth(d, screen), ZPixmap, 0,
                                 (char *)pixels, (unsigned)w, (unsigned)h, 32, 0);
    if (!image) { fprintf(stderr, "xfill: XCreateImage failed\n"); return 1; }
    XPutImage(d, root, gc, image, 0, 0, x, y, (unsigned)w, (unsigned)h);
    XSync(d, False);
    XDestroyImage(image); /* frees pixels */
    return 0;
}

int main(int argc, char **argv) {
    int pgm = argc == 6 && strcmp(argv[2], "pgm") == 0;
    if (argc != 7 && !pgm) { fprintf(stderr, "usage: xfill DISPLAY X Y W H RRGGBB | xfill DISPLAY pgm FILE X Y\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xfill: cannot open %s\n", argv[1]); return 1; }
    Window root = DefaultRootWindow(d);
    GC gc = XCreateGC(d, root, 0, NULL);
    XSetSubwindowMode(d, gc, IncludeInferiors);
    int status = 0;
    if (pgm) {
        status = draw_pgm(d, root, gc, argv[3], atoi(argv[4]), atoi(argv[5]));
    } else {
        XSetForeground(d, gc, strtoul(argv[6], NULL, 16));
        XFillRectangle(d, root, gc, atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]));
        XSync(d, False);
    }
    XFreeGC(d, gc);
    XCloseDisplay(d);
    return status;
}
