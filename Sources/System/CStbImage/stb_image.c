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
#include <string.h>

// stbi_info tries every decoder in turn and keeps the last one's failure
// ("unknown image type"), which hides why a PNG's header was refused (a size
// beyond stb's own limits). So the signature picks the one decoder here.
int krakl_image_info(FILE *file, int *width, int *height, int *channels) {
    unsigned char magic[8] = {0};
    long position = ftell(file);
    size_t got = fread(magic, 1, sizeof magic, file);
    fseek(file, position, SEEK_SET);
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    int (*info)(stbi__context *, int *, int *, int *) = NULL;
    if (got == 8 && memcmp(magic, png, 8) == 0) info = stbi__png_info;
    else if (got >= 2 && magic[0] == 0xFF && magic[1] == 0xD8) info = stbi__jpeg_info;
    else if (got >= 2 && magic[0] == 'P' && (magic[1] == '5' || magic[1] == '6')) info = stbi__pnm_info;
    if (!info) return stbi__err("unknown image type", "not PNG, JPEG or PNM");
    stbi__context context;
    stbi__start_file(&context, file);
    int result = info(&context, width, height, channels) != 0; // the PNM one answers its bit depth
    fseek(file, position, SEEK_SET);
    return result;
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
