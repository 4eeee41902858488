/* What krakl-backend-host needs from Linux that Swift cannot call directly
 * (syscall is variadic, memfd_create and the seals need _GNU_SOURCE). */
#ifndef KRAKL_BACKEND_HOST_SHIM_H
#define KRAKL_BACKEND_HOST_SHIM_H

/* A sealable, close-on-exec memfd of `size` bytes whose size is then sealed
 * (no shrink, no grow, no further seals), so the agent may map it without
 * fearing SIGBUS from a later truncation. Returns the fd or -errno. */
int krakl_sealed_memfd(const char *name, unsigned long long size);

/* Closes every descriptor from `first` up (not the ones below). */
void krakl_close_from(int first);

#endif
