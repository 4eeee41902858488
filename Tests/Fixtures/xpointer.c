/* Test helper: moves the pointer of an X display like a real device would
 * (XTest), so the server emits raw motion. Usage: xpointer DISPLAY X Y */
#include <X11/Xlib.h>
#include <X11/extensions/XTest.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: xpointer DISPLAY X Y\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xpointer: cannot open %s\n", argv[1]); return 1; }
    XTestFakeMotionEvent(d, -1, atoi(argv[2]), atoi(argv[3]), CurrentTime);
    XSync(d, False);
    XCloseDisplay(d);
    return 0;
}
