/*
 * k3w64 across ISA paths: prints the digest of many inputs (random lengths, misaligned
 * starts, streaming splits at multiples of 64) one per line, and checks three known answers
 * from tests/oracle/k3w64.py. `make check-arm` runs it built for the host's scalar path and
 * for aarch64 NEON (under qemu) and requires identical output.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3io.h"

static uint32_t seed = 2026;
static uint32_t rnd(void) {
  seed ^= seed << 13;
  seed ^= seed >> 17;
  seed ^= seed << 5;
  return seed;
}

int main(void) {
  enum { MAX = 200000 };
  unsigned char *buf = malloc(MAX + 64);
  int bad = 0;
  memset(buf, 0, MAX + 64);
  if (k3io_hash(buf, 1 << 17) == 0) bad = 1; /* touch */
  unsigned char *z = calloc(1 << 20, 1);
  if (k3io_hash(z, 0) != 0x162f836b41da2824ULL) bad = 1, printf("known answer: empty\n");
  if (k3io_hash(z, 1 << 20) != 0x0cde937b77b285e2ULL) bad = 1, printf("known answer: 1 MiB of zeros\n");
  memset(z, 255, 65539);
  if (k3io_hash(z, 65539) != 0x122afc8df474fa6bULL) bad = 1, printf("known answer: 65539 x 0xff\n");
  free(z);
  for (int i = 0; i < MAX + 64; i++) buf[i] = (unsigned char)rnd();
  for (int c = 0; c < 400; c++) {
    uint32_t len = c < 130 ? (uint32_t)c : rnd() % MAX, off = rnd() % 64;
    uint64_t one = k3io_hash(buf + off, len);
    /* the same bytes streamed in random multiples of 64 */
    uint64_t s[K3IO_HASH_STATE];
    k3io_hash_init(s);
    uint32_t at = 0;
    while (at < len) {
      uint32_t n = (rnd() % 40) * 64;
      if (n >= len - at || rnd() % 8 == 0) n = len - at;
      k3io_hash_update(s, buf + off + at, n);
      at += n;
    }
    if (k3io_hash_digest(s) != one) bad = 1, printf("streamed differs at case %d\n", c);
    printf("%u %u %016llx\n", len, off, (unsigned long long)one);
  }
  free(buf);
  if (bad) printf("hash_check: FAILED\n");
  return bad;
}
