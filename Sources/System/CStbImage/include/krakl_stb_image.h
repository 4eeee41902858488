#ifndef KRAKL_STB_IMAGE_H
#define KRAKL_STB_IMAGE_H
// stb_image (Debian libstb-dev), compiled here with PNG, JPEG and binary PNM
// only and every stbi_ symbol static: a second stb_image in the process (a
// backend, a library) cannot clash with this one. These wrappers are the
// only way in.
#include <stdio.h>

/// The header's width, height and channel count without decoding pixels
/// (stbi_info_from_file); the file position is left where it was. 1 if the
/// header is a known format, else 0 (see krakl_image_failure_reason).
int krakl_image_info(FILE *file, int *width, int *height, int *channels);

/// Decodes the whole image as 8-bit gray (stbi_load_from_file with 1
/// component: luma from RGB). NULL on failure; free with krakl_image_free.
unsigned char *krakl_image_load_gray(FILE *file, int *width, int *height);

void krakl_image_free(void *pixels);

/// Why the last call on this thread failed (stb's short reason, e.g. "outofdata").
const char *krakl_image_failure_reason(void);

#endif
