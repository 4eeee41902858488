#ifndef KRAKL_ZERO_FILL_H
#define KRAKL_ZERO_FILL_H
#include <stddef.h>

/// Large zero fills turned into page releases (see zero_fill.c): how many
/// memset calls took that path and how many bytes they covered.
typedef struct {
    unsigned long calls;
    unsigned long long bytes;
} krakl_zero_fill_stats;

krakl_zero_fill_stats krakl_zero_fill_read_stats(void);

/// Forgets the fills this thread made so far; call before the library call
/// whose buffer `krakl_zero_fill_take` is to find.
void krakl_zero_fill_forget(void);

/// The start of the latest fill of exactly `bytes` bytes that this thread
/// released since `krakl_zero_fill_forget`, or NULL; each is given out once.
/// VpxEncoder finds libvpx's VP8 token buffer this way (its size follows from
/// the picture's), to give its pages back after a frame that filled many.
void *krakl_zero_fill_take(size_t bytes);

/// Linked only into the agent executable; the tests call this to prove the
/// process's memset is ours (0 when the interposition did not happen).
int krakl_zero_fill_is_active(void);

#endif
