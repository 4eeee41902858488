/* Test helper: fills a rectangle of an X display's root window with a
 * colour and exits. Usage: xfill DISPLAY X Y WIDTH HEIGHT RRGGBB */
#include <X11/Xlib.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: xfill DISPLAY X Y W H RRGGBB\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xfill: cannot open %s\n", argv[1]); return 1; }
    Window root = DefaultRootWindow(d);
    GC gc = XCreateGC(d, root, 0, NULL);
    XSetForeground(d, gc, strtoul(argv[6], NULL, 16));
    XSetSubwindowMode(d, gc, IncludeInferiors);
    XFillRectangle(d, root, gc, atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]));
    XSync(d, False);
    XFreeGC(d, gc);
    XCloseDisplay(d);
    return 0;
}
