/*
 * k3 memory: the library's one allocator (k3_alloc, k3_free; k3.h says what each does). Its
 * own file because both the products (their per-thread scratch) and the caller use it, so
 * every kernel file depends on it and it on none of them.
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#endif
#include "k3.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(_WIN32)
#include <malloc.h> /* _aligned_malloc */
#endif

#define K3_HUGE ((size_t)2 << 20)

void *k3_alloc(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > (uint64_t)SIZE_MAX) return NULL;
#if defined(_WIN32)
  return _aligned_malloc((size_t)bytes, 4096);
#else
  void *p = NULL;
  /* Large buffers (weights, trunk slots, expert slots) are 2 MiB aligned and asked to be
   * backed by huge pages: first touch of fresh memory costs a fault per page, and on a
   * virtual machine that fault is expensive (~15 us per 4 KiB page measured here). */
  size_t align = bytes >= K3_HUGE ? K3_HUGE : 4096;
  if (posix_memalign(&p, align, (size_t)bytes) != 0) return NULL;
#if defined(MADV_HUGEPAGE)
  if (bytes >= K3_HUGE) madvise(p, (size_t)bytes, MADV_HUGEPAGE);
#endif
  return p;
#endif
}

void k3_free(void *p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  free(p);
#endif
}
