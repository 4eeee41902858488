/* Keeps a browser's windows off the shared screen, for the room benchmark's
 * Chromium publisher: a minimal window manager on the Xvfb screen that maps
 * every top-level window to the right of the screen (x = screen width), as
 * if on a second monitor. Without it Chromium's "… is sharing your screen"
 * bar (a managed 514x62 window at the bottom centre) covers part of the
 * scene: it is captured, and the root window's drawing under it is lost.
 * It also moves the pointer to the bottom-right corner, so that a publisher
 * that draws the cursor into its frames (Chromium does) shows none of it.
 *   xaside DISPLAY SECONDS     runs until killed, or SECONDS at most
 * Prints "ready" once it manages the screen. */
#define _POSIX_C_SOURCE 200809L
#include <X11/Xlib.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int refused(Display *d, XErrorEvent *e) {
    (void)d;
    /* A window that went away before we moved it: nothing to do. Another manager: fatal (below). */
    if (e->request_code == 2 /* X_ChangeWindowAttributes */ && e->error_code == BadAccess) {
        fprintf(stderr, "xaside: another window manager runs on this screen\n");
        exit(1);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: xaside DISPLAY SECONDS\n"); return 2; }
    Display *d = XOpenDisplay(argv[1]);
    if (!d) { fprintf(stderr, "xaside: cannot open %s\n", argv[1]); return 1; }
    XSetErrorHandler(refused);
    Window root = DefaultRootWindow(d);
    int width = DisplayWidth(d, DefaultScreen(d)), height = DisplayHeight(d, DefaultScreen(d));
    XSelectInput(d, root, SubstructureRedirectMask | SubstructureNotifyMask);
    XWarpPointer(d, None, root, 0, 0, 0, 0, width - 1, height - 1);
    XSync(d, False);
    printf("ready\n");
    fflush(stdout);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    double limit = atof(argv[2]);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = limit - (double)(now.tv_sec - start.tv_sec) - (double)(now.tv_nsec - start.tv_nsec) / 1e9;
        if (left <= 0) return 0;
        if (!XPending(d)) {
            struct pollfd fd = {ConnectionNumber(d), POLLIN, 0};
            poll(&fd, 1, left > 1 ? 1000 : (int)(left * 1000) + 1);
            if (!XPending(d)) continue;
        }
        XEvent e;
        XNextEvent(d, &e);
        if (e.type == MapRequest) {
            XMoveWindow(d, e.xmaprequest.window, width, 0);
            XMapWindow(d, e.xmaprequest.window);
        } else if (e.type == ConfigureRequest) {
            /* Sizes as asked; positions only off the screen. */
            XConfigureRequestEvent *r = &e.xconfigurerequest;
            XWindowChanges changes = {r->x < width ? width : r->x, r->y, r->width, r->height, r->border_width, r->above, r->detail};
            XConfigureWindow(d, r->window, (unsigned)(r->value_mask | CWX), &changes);
        }
        XSync(d, False);
    }
}
