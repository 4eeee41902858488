// libyuv ships no pkg-config file; its headers are in /usr/include.
#include <libyuv.h>
