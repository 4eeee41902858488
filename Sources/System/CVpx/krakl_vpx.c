#include "krakl_vpx.h"

#include <stddef.h>

vpx_codec_iface_t *krakl_vpx_encoder_iface(int codec) {
    switch (codec) {
    case 8: return vpx_codec_vp8_cx();
    case 9: return vpx_codec_vp9_cx();
    default: return NULL;
    }
}

vpx_codec_err_t krakl_vpx_encoder_init(vpx_codec_ctx_t *ctx, int codec, const vpx_codec_enc_cfg_t *cfg) {
    vpx_codec_iface_t *iface = krakl_vpx_encoder_iface(codec);
    if (iface == NULL) return VPX_CODEC_INVALID_PARAM;
    return vpx_codec_enc_init(ctx, iface, cfg, 0);
}

vpx_codec_err_t krakl_vpx_control_int(vpx_codec_ctx_t *ctx, int control, int value) {
    return vpx_codec_control_(ctx, control, value);
}

vpx_codec_err_t krakl_vpx_last_quantizer(vpx_codec_ctx_t *ctx, int *quantizer) {
    return vpx_codec_control(ctx, VP8E_GET_LAST_QUANTIZER_64, quantizer);
}

vpx_codec_err_t krakl_vpx_set_active_map(vpx_codec_ctx_t *ctx, unsigned char *map, unsigned rows, unsigned cols) {
    vpx_active_map_t active = {map, rows, cols};
    return vpx_codec_control(ctx, VP8E_SET_ACTIVEMAP, &active);
}

extern void krakl_zero_fill_forget(void) __attribute__((weak));
extern void *krakl_zero_fill_take(size_t bytes) __attribute__((weak));

void krakl_vpx_zero_fill_forget(void) {
    if (krakl_zero_fill_forget) krakl_zero_fill_forget();
}

void *krakl_vpx_zero_fill_take(size_t bytes) {
    return krakl_zero_fill_take ? krakl_zero_fill_take(bytes) : NULL;
}
