// libzbar 0.23 (Debian libzbar-dev, pkg-config zbar): the image scanner only.
#include <zbar.h>
