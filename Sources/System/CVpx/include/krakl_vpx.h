// The few libvpx calls Swift cannot make directly: vpx_codec_enc_init and
// vpx_codec_control are macros (the latter over a variadic function).
#ifndef KRAKL_VPX_H
#define KRAKL_VPX_H

#include <vpx/vp8cx.h>
#include <vpx/vpx_encoder.h>

/// 8 for VP8, 9 for VP9; NULL for anything else.
vpx_codec_iface_t *krakl_vpx_encoder_iface(int codec);

/// vpx_codec_enc_init() for `codec` (8 or 9).
vpx_codec_err_t krakl_vpx_encoder_init(vpx_codec_ctx_t *ctx, int codec, const vpx_codec_enc_cfg_t *cfg);

/// vpx_codec_control() for controls that take an int or unsigned int.
vpx_codec_err_t krakl_vpx_control_int(vpx_codec_ctx_t *ctx, int control, int value);
/// VP8E_GET_LAST_QUANTIZER_64: the last frame's quantizer on the 0-63 scale of
/// rc_min_quantizer/rc_max_quantizer, for VP8 and VP9 alike.
vpx_codec_err_t krakl_vpx_last_quantizer(vpx_codec_ctx_t *ctx, int *quantizer);

/// VP8E_SET_ACTIVEMAP: `map` is rows x cols macroblocks (16x16), 1 = encode,
/// 0 = keep from the previous frame; NULL turns the map off.
vpx_codec_err_t krakl_vpx_set_active_map(vpx_codec_ctx_t *ctx, unsigned char *map, unsigned rows, unsigned cols);

/// The agent's memset (Sources/System/ZeroFill) keeps note of the large zero fills it turned into
/// page releases; these reach it when the program links it and do nothing otherwise (weak symbols:
/// krakl-rtc-probe has no ZeroFill). `forget` before vpx_codec_enc_init, `take` after it finds the
/// buffer of `bytes` that libvpx cleared during it (NULL when none).
void krakl_vpx_zero_fill_forget(void);
void *krakl_vpx_zero_fill_take(size_t bytes);

#endif
