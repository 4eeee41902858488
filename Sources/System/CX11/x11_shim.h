// Xlib with the extensions the X11 backend uses (Debian: libx11-dev,
// libxext-dev, libxdamage-dev, libxfixes-dev, libxrandr-dev, libxi-dev).
#include <X11/Xlib.h>
#include <X11/Xutil.h>
#include <X11/extensions/XShm.h>
#include <X11/extensions/Xdamage.h>
#include <X11/extensions/Xfixes.h>
#include <X11/extensions/Xrandr.h>
#include <X11/extensions/XInput2.h>
#include <sys/ipc.h>
#include <sys/shm.h>
