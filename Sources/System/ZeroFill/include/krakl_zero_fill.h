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

/// Linked only into the agent executable; the tests call this to prove the
/// process's memset is ours (0 when the interposition did not happen).
int krakl_zero_fill_is_active(void);

#endif
