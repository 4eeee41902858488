// The one place stb_image's implementation is compiled. Formats are limited
// to what `krakl-agent --qr` reads: every other decoder is code that could
// have bugs, reachable from any file a person is asked to scan.
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNM
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunused-function"
#endif
#include <stb/stb_image.h>
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
#include "krakl_stb_image.h"

int krakl_image_info(FILE *file, int *width, int *height, int *channels) {
    return stbi_info_from_file(file, width, height, channels);
}

unsigned char *krakl_image_load_gray(FILE *file, int *width, int *height) {
    int channels = 0;
    return stbi_load_from_file(file, width, height, &channels, 1);
}

void krakl_image_free(void *pixels) { stbi_image_free(pixels); }

const char *krakl_image_failure_reason(void) {
    const char *reason = stbi_failure_reason();
    return reason ? reason : "unknown";
}
