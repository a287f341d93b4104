/* k3io: see k3io.h. */
#define _GNU_SOURCE
#include "k3io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef O_DIRECT
#define O_DIRECT 0
#endif

int32_t k3io_open(const char *path, int32_t flags) {
  int base = (flags & K3IO_WRITE) ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
  base |= O_CLOEXEC;
  int fd = -1;
  if ((flags & K3IO_DIRECT) && O_DIRECT != 0) {
    fd = open(path, base | O_DIRECT, 0644);
    if (fd >= 0) return fd;
    if (errno != EINVAL && errno != EOPNOTSUPP) return -errno;
  }
  fd = open(path, base, 0644);
  return fd >= 0 ? fd : -errno;
}

int32_t k3io_is_direct(int32_t fd) {
#if O_DIRECT != 0
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_DIRECT) ? 1 : 0;
#else
  (void)fd;
  return 0;
#endif
}

int32_t k3io_close(int32_t fd) { return close(fd) == 0 ? 0 : -errno; }

int64_t k3io_size(int32_t fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  return (int64_t)st.st_size;
}

int64_t k3io_pread(int32_t fd, void *buf, uint64_t len, uint64_t offset) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}

int64_t k3io_pwrite(int32_t fd, const void *buf, uint64_t len, uint64_t offset) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}

int32_t k3io_sync(int32_t fd) {
#if defined(__APPLE__)
  return fsync(fd) == 0 ? 0 : -errno;
#else
  return fdatasync(fd) == 0 ? 0 : -errno;
#endif
}

int32_t k3io_truncate(int32_t fd, uint64_t len) { return ftruncate(fd, (off_t)len) == 0 ? 0 : -errno; }

/* ---- k3w64 ---------------------------------------------------------------------- */

#if !defined(K3_SCALAR) && defined(__AVX512F__)
#define K3W_AVX512 1
#include <immintrin.h>
#elif !defined(K3_SCALAR) && defined(__AVX2__)
#define K3W_AVX2 1
#include <immintrin.h>
#elif !defined(K3_SCALAR) && defined(__ARM_NEON) && defined(__aarch64__)
#define K3W_NEON 1
#include <arm_neon.h>
#endif

#define K3W_STRIPE 64
#define K3W_BLOCK 16 /* stripes between scrambles */

/* The key: splitmix64 outputs 1..32 from seed 0x6B33773634 (tests/oracle/k3w64.py makes
 * them). Stripe s of a block uses words s..s+7, the scramble 16..23, the digest 24..31. */
static const uint64_t K3W_KEY[32] = {
  0x75ad4e82416e408bULL, 0xc46df4c2ad8b5fd1ULL, 0xf5af07da44c0381cULL, 0x4c83af9198d02a2bULL,
  0x13a87d5e8aab3985ULL, 0x49d02c01b2a604b3ULL, 0x6043bf9550704348ULL, 0xd008b2331b59cffdULL,
  0xa71a0e5765086426ULL, 0xad6f30f477bff4a7ULL, 0x9354d4b721d16911ULL, 0x7b266d23a1ca0f17ULL,
  0x3303f69c07990b2bULL, 0x32bbcdc82076eff0ULL, 0x7619c31e0f9d92d8ULL, 0x675ae638892995eeULL,
  0x42ffffbf9b6cb713ULL, 0x0d70e36a5edb97b4ULL, 0x0f090b585341c661ULL, 0x3bfe26e5fa728f13ULL,
  0x8a86881a86165274ULL, 0x1dc7607c57ec92baULL, 0xa708a0dc269c8904ULL, 0x3ba9e38f07b7f76eULL,
  0xce40fd944f53f696ULL, 0x2d3a5117be4b45d4ULL, 0xb44815d4d4c725efULL, 0xd3b4838498f74caeULL,
  0xef5e067473157e47ULL, 0x5efac7c19450bd14ULL, 0x3df2a8d267f718fdULL, 0xb53a316c7b809ec2ULL,
};

/* Accumulates n stripes at p into acc (8 lanes), stripe j keyed by key + j. Every path
 * does the same integer arithmetic mod 2^64 (sums commute), so they agree bit for bit:
 *   d = word i of the stripe, x = d ^ key[j + i]; acc[i ^ 1] += d; acc[i] += lo32(x) * hi32(x). */
static void k3w_stripes(uint64_t *acc, const unsigned char *p, uint64_t n, const uint64_t *key) {
#if defined(K3W_AVX512)
  __m512i a = _mm512_loadu_si512((const void *)acc);
  for (uint64_t j = 0; j < n; j++, p += K3W_STRIPE) {
    __m512i d = _mm512_loadu_si512((const void *)p);
    __m512i x = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)(key + j)));
    a = _mm512_add_epi64(a, _mm512_mul_epu32(x, _mm512_srli_epi64(x, 32)));
    a = _mm512_add_epi64(a, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)0x4E));
  }
  _mm512_storeu_si512((void *)acc, a);
#elif defined(K3W_AVX2)
  __m256i a0 = _mm256_loadu_si256((const __m256i *)acc), a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
  for (uint64_t j = 0; j < n; j++, p += K3W_STRIPE) {
    __m256i d0 = _mm256_loadu_si256((const __m256i *)p), d1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i x0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)(key + j)));
    __m256i x1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(key + j + 4)));
    a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32)));
    a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(x1, _mm256_srli_epi64(x1, 32)));
    a0 = _mm256_add_epi64(a0, _mm256_shuffle_epi32(d0, 0x4E)); /* swap the 64-bit halves: lane i ^ 1 */
    a1 = _mm256_add_epi64(a1, _mm256_shuffle_epi32(d1, 0x4E));
  }
  _mm256_storeu_si256((__m256i *)acc, a0);
  _mm256_storeu_si256((__m256i *)(acc + 4), a1);
#elif defined(K3W_NEON)
  uint64x2_t a[4];
  for (int q = 0; q < 4; q++) a[q] = vld1q_u64(acc + 2 * q);
  for (uint64_t j = 0; j < n; j++, p += K3W_STRIPE) {
    for (int q = 0; q < 4; q++) {
      uint64x2_t d = vreinterpretq_u64_u8(vld1q_u8(p + 16 * q));
      uint64x2_t x = veorq_u64(d, vld1q_u64(key + j + 2 * q));
      a[q] = vmlal_u32(a[q], vmovn_u64(x), vshrn_n_u64(x, 32));
      a[q] = vaddq_u64(a[q], vextq_u64(d, d, 1));
    }
  }
  for (int q = 0; q < 4; q++) vst1q_u64(acc + 2 * q, a[q]);
#else
  for (uint64_t j = 0; j < n; j++, p += K3W_STRIPE) {
    for (int i = 0; i < 8; i++) {
      uint64_t d, x;
      memcpy(&d, p + 8 * i, 8); /* little-endian hosts only: the trunk format is little-endian */
      x = d ^ key[j + i];
      acc[i ^ 1] += d;
      acc[i] += (x & 0xFFFFFFFFULL) * (x >> 32);
    }
  }
#endif
}

/* After every block of 16 stripes (scalar on every path: once per KiB). */
static void k3w_scramble(uint64_t *acc) {
  for (int i = 0; i < 8; i++) {
    uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= K3W_KEY[16 + i];
    acc[i] = a * 0x9E3779B1ULL;
  }
}

/* State: acc[0..7], s[8] stripe index in the current block, s[9] total length, s[10]
 * 1 once a partial stripe was hashed (the input has ended). */
static void k3w_feed(uint64_t *s, const unsigned char *p, uint64_t n) {
  while (n > 0) {
    uint64_t at = s[8], m = K3W_BLOCK - at < n ? K3W_BLOCK - at : n;
    k3w_stripes(s, p, m, K3W_KEY + at);
    p += m * K3W_STRIPE;
    n -= m;
    s[8] = at + m;
    if (s[8] == K3W_BLOCK) {
      k3w_scramble(s);
      s[8] = 0;
    }
  }
}

void k3io_hash_init(uint64_t *s) {
  static const uint64_t init[8] = {0xC2B2AE3DULL,         0x9E3779B185EBCA87ULL, 0xC2B2AE3D27D4EB4FULL,
                                   0x165667B19E3779F9ULL, 0x85EBCA77C2B2AE63ULL, 0x85EBCA77ULL,
                                   0x27D4EB2F165667C5ULL, 0x9E3779B1ULL};
  memcpy(s, init, sizeof init);
  s[8] = s[9] = s[10] = 0;
}

int32_t k3io_hash_update(uint64_t *s, const void *p, uint64_t len) {
  if (s[10] != 0) return -1;
  const unsigned char *b = (const unsigned char *)p;
  uint64_t n = len / K3W_STRIPE, rest = len - n * K3W_STRIPE;
  k3w_feed(s, b, n);
  s[9] += len;
  if (rest) {
    /* The final partial stripe, zero-padded (the length in the digest tells them apart). */
    unsigned char last[K3W_STRIPE] = {0};
    memcpy(last, b + n * K3W_STRIPE, rest);
    k3w_feed(s, last, 1);
    s[10] = 1;
  }
  return 0;
}

static uint64_t k3w_fold(uint64_t a, uint64_t b) {
  unsigned __int128 p = (unsigned __int128)a * b;
  return (uint64_t)p ^ (uint64_t)(p >> 64);
}

uint64_t k3io_hash_digest(const uint64_t *s) {
  uint64_t h = s[9] * 0x9E3779B185EBCA87ULL;
  for (int j = 0; j < 4; j++) h += k3w_fold(s[2 * j] ^ K3W_KEY[24 + 2 * j], s[2 * j + 1] ^ K3W_KEY[25 + 2 * j]);
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  h ^= h >> 32;
  return h;
}

uint64_t k3io_hash(const void *p, uint64_t len) {
  uint64_t s[K3IO_HASH_STATE];
  k3io_hash_init(s);
  k3io_hash_update(s, p, len);
  return k3io_hash_digest(s);
}

int64_t k3io_pread_hash(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t chunk, uint64_t *out) {
  if (chunk == 0 || chunk >= len) chunk = len;
  else if (chunk % K3W_STRIPE != 0) return -EINVAL;
  uint64_t s[K3IO_HASH_STATE], done = 0;
  k3io_hash_init(s);
  while (done < len) {
    uint64_t want = len - done < chunk ? len - done : chunk;
    int64_t n = k3io_pread(fd, (char *)buf + done, want, offset + done);
    if (n < 0) return n;
    if ((uint64_t)n == want) k3io_hash_update(s, (char *)buf + done, want);
    done += (uint64_t)n;
    if ((uint64_t)n < want) return (int64_t)done; /* end of file: no digest */
  }
  out[0] = k3io_hash_digest(s);
  return (int64_t)done;
}

int32_t k3io_kind(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return errno == ENOENT || errno == ENOTDIR ? K3IO_KIND_MISSING : -errno;
  if (S_ISREG(st.st_mode)) return K3IO_KIND_REGULAR;
  if (S_ISDIR(st.st_mode)) return K3IO_KIND_DIR;
  if (S_ISFIFO(st.st_mode)) return K3IO_KIND_FIFO;
  if (S_ISCHR(st.st_mode)) return K3IO_KIND_CHAR;
  if (S_ISBLK(st.st_mode)) return K3IO_KIND_BLOCK;
  if (S_ISSOCK(st.st_mode)) return K3IO_KIND_SOCKET;
  return K3IO_KIND_OTHER;
}

int64_t k3io_write(int32_t fd, const void *buf, uint64_t len) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = write(fd, (const char *)buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += (uint64_t)n;
  }
  return (int64_t)done;
}

int64_t k3io_read_small(const char *path, void *buf, uint64_t cap) {
  /* O_NONBLOCK: a FIFO put in place of a /proc or /sys file cannot hang the open. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -errno;
  struct stat st;
  int bad = fstat(fd, &st) != 0 ? -errno : !S_ISREG(st.st_mode) ? -EINVAL : 0;
  if (bad != 0) {
    close(fd);
    return bad;
  }
  uint64_t done = 0;
  while (done < cap) {
    ssize_t n = read(fd, (char *)buf + done, cap - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return -e;
    }
    if (n == 0) break;
    done += (uint64_t)n;
  }
  close(fd);
  return (int64_t)done;
}

/* ---- split codec (manifest version 5; docs/formats.md "Split-coded pieces") ------------ */

static uint32_t k3s_rd32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void k3s_wr32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

/* Bytes of block b's codes and low bytes (its escapes follow, one byte each). */
#define K3S_BLOCK_FIXED(w) ((uint64_t)K3IO_SPLIT_BLOCK * (uint64_t)(w) / 8 + K3IO_SPLIT_BLOCK)

/* The stored bytes of a piece coded at width w, given its high-byte histogram; 0 when the
 * coded form would not decode in place (see k3io.h) or is no smaller than raw. dict gets
 * the 2^w - 1 most frequent high bytes (ties: the smaller byte first). */
static uint64_t k3s_plan(const uint64_t *hist, uint64_t nvals, int w, unsigned char *dict, uint64_t *escapes) {
  uint32_t used[256] = {0};
  int ndict = (1 << w) - 1;
  uint64_t covered = 0;
  for (int d = 0; d < ndict; d++) {
    int best = -1;
    for (int v = 0; v < 256; v++) {
      if (!used[v] && (best < 0 || hist[v] > hist[best])) best = v;
    }
    used[best] = 1;
    dict[d] = (unsigned char)best;
    covered += hist[best];
  }
  *escapes = nvals - covered;
  uint64_t nblocks = nvals / K3IO_SPLIT_BLOCK;
  uint64_t content = K3IO_SPLIT_HEADER + 4 * nblocks + nblocks * K3S_BLOCK_FIXED(w) + *escapes;
  return (content + 4095) / 4096 * 4096;
}

int64_t k3io_split_encode(const void *src, uint64_t len, void *dst, uint64_t cap, int32_t width) {
  if (len == 0 || len % (2 * K3IO_SPLIT_BLOCK) != 0 || width < 0 || width > 7) return -EINVAL;
  const unsigned char *s = (const unsigned char *)src;
  uint64_t nvals = len / 2, nblocks = nvals / K3IO_SPLIT_BLOCK;
  uint64_t hist[256] = {0};
  for (uint64_t i = 0; i < nvals; i++) hist[s[2 * i + 1]]++;
  unsigned char dict[128];
  uint64_t escapes = 0, stored = 0;
  int w = width;
  if (w == 0) {
    uint64_t best = len;
    for (int c = 1; c <= 7; c++) {
      unsigned char d[128];
      uint64_t e, n = k3s_plan(hist, nvals, c, d, &e);
      if (n < best) best = n, w = c;
    }
    if (w == 0) return 0; /* raw is no larger */
  }
  stored = k3s_plan(hist, nvals, w, dict, &escapes);
  if (stored > cap) return -ENOSPC;
  unsigned char *o = (unsigned char *)dst;
  memset(o, 0, (size_t)stored - nblocks * K3S_BLOCK_FIXED(w) - escapes);
  k3s_wr32(o, K3IO_SPLIT_MAGIC);
  k3s_wr32(o + 4, (uint32_t)w);
  k3s_wr32(o + 8, (uint32_t)nvals);
  /* The blocks end where the stored bytes do: the padding sits between header and blocks,
   * so the last blocks keep their slack for the in-place rule. */
  uint64_t first = stored - nblocks * K3S_BLOCK_FIXED(w) - escapes;
  k3s_wr32(o + 12, (uint32_t)first);
  int ndict = (1 << w) - 1;
  memcpy(o + 16, dict, (size_t)ndict);
  unsigned char code[256];
  memset(code, (unsigned char)ndict, sizeof code); /* the escape code: all ones */
  for (int d = ndict - 1; d >= 0; d--) code[dict[d]] = (unsigned char)d;
  unsigned char *p = o + first;
  /* The in-place rule: when the piece is read to the end of its decoded slot, block b's
   * decoded bytes end at or before where block b + 1's stored bytes begin. */
  uint64_t start = len - stored, in_place = 1;
  for (uint64_t b = 0; b < nblocks; b++) {
    const unsigned char *v = s + 2 * b * K3IO_SPLIT_BLOCK;
    unsigned char *codes = p, *lo = p + (uint64_t)K3IO_SPLIT_BLOCK * (uint64_t)w / 8, *esc = lo + K3IO_SPLIT_BLOCK;
    k3s_wr32(o + K3IO_SPLIT_HEADER + 4 * b, (uint32_t)(p - o));
    memset(codes, 0, (size_t)K3IO_SPLIT_BLOCK * (size_t)w / 8);
    for (uint64_t g = 0; g < K3IO_SPLIT_BLOCK / 8; g++) {
      uint64_t bits = 0;
      for (int j = 0; j < 8; j++) {
        uint64_t i = g * 8 + (uint64_t)j;
        unsigned char c = code[v[2 * i + 1]];
        bits |= (uint64_t)c << (j * w);
        lo[i] = v[2 * i];
        if (c == ndict) *esc++ = v[2 * i + 1];
      }
      for (int k = 0; k < w; k++) codes[g * (uint64_t)w + (uint64_t)k] = (unsigned char)(bits >> (8 * k));
    }
    p = esc;
    if (b + 1 < nblocks && start + (uint64_t)(p - o) < 2 * (b + 1) * K3IO_SPLIT_BLOCK) in_place = 0;
  }
  if (width == 0 && !in_place) return 0;
  return (int64_t)stored;
}

#if !defined(K3_SCALAR) && defined(__AVX512VBMI__) && defined(__AVX512VBMI2__) && defined(__AVX512BW__)
#define K3S_VBMI 1
#include <immintrin.h>
/* The decode's per-width permutes, made once per piece: byte b of qword k of `spread` picks
 * code byte w * k + b (the 8 codes of group k start there); byte j of each qword of `shifts`
 * is the bit offset j * w of code j. */
typedef struct {
  __m512i spread, shifts;
} k3s_consts;
static k3s_consts k3s_make(int w) {
  unsigned char sp[64], sh[64];
  for (int b = 0; b < 64; b++) {
    sp[b] = (unsigned char)(w * (b / 8) + b % 8);
    sh[b] = (unsigned char)(w * (b % 8));
  }
  k3s_consts c = {_mm512_loadu_si512((const void *)sp), _mm512_loadu_si512((const void *)sh)};
  return c;
}
/* Low byte i then high byte i (index 64 + i of the two-source permute), words 0..31 then
 * 32..63. */
static const unsigned char K3S_INTERLEAVE[128] = {
#define K3S_IL2(i) (i), 64 + (i), (i) + 1, 65 + (i)
#define K3S_IL8(i) K3S_IL2(i), K3S_IL2((i) + 2), K3S_IL2((i) + 4), K3S_IL2((i) + 6)
#define K3S_IL32(i) K3S_IL8(i), K3S_IL8((i) + 8), K3S_IL8((i) + 16), K3S_IL8((i) + 24)
    K3S_IL32(0), K3S_IL32(32)
#undef K3S_IL32
#undef K3S_IL8
#undef K3S_IL2
};
#else
typedef int k3s_consts; /* no per-width constants */
static k3s_consts k3s_make(int w) { return w; }
#endif
#if !defined(K3S_VBMI) && !defined(K3_SCALAR) && defined(__BMI2__) && defined(__SSSE3__)
#define K3S_PDEP 1
#include <immintrin.h>
#endif

/* Decodes one block of K3IO_SPLIT_BLOCK words at p (codes, low bytes, then escapes up to at
 * most end) into out; *next gets the end of its escapes. -1 when the escapes run past end.
 * Groups of 8 words without an escape take the fast path (the codes spread to one byte each,
 * looked up 16 at a time with a byte shuffle where the dictionary fits 16 entries); a group
 * with one goes word by word. Every path gives the same bytes (integer work only). */
static int k3s_block(const unsigned char *p, const unsigned char *end, int w, const unsigned char *dict,
                     k3s_consts kc, uint16_t *out, int stream_ok, const unsigned char **next) {
  const unsigned char *lo = p + K3IO_SPLIT_BLOCK * w / 8, *esc = lo + K3IO_SPLIT_BLOCK;
  const unsigned mask = (1u << w) - 1;
#if defined(K3S_VBMI)
  /* 64 words a step: one byte permute gives each qword its 8 codes' w bytes, one multishift
   * puts code j of a qword in byte j (bits above w masked off), one 128-entry byte permute
   * looks the high bytes up, the escapes are expanded in from the list under the mask of
   * all-ones codes, and two two-source byte permutes interleave high and low bytes. */
  const __m512i vmask = _mm512_set1_epi8((char)mask);
  const __m512i tlo = _mm512_loadu_si512((const void *)dict), thi = _mm512_loadu_si512((const void *)(dict + 64));
  const __m512i spread = kc.spread, shifts = kc.shifts;
  const int stream = stream_ok && ((uintptr_t)out & 63) == 0;
  const uint64_t fixed = K3S_BLOCK_FIXED(w);
  const char *ahead = (const char *)p + 2 * fixed;
  const __m512i il0 = _mm512_loadu_si512((const void *)K3S_INTERLEAVE), il1 = _mm512_loadu_si512((const void *)(K3S_INTERLEAVE + 64));
  for (int g = 0; g < K3IO_SPLIT_BLOCK / 8; g += 8) {
    /* The stored bytes come from memory (the ring): ask for the block after next while this
     * one decodes, two lines a step (one Zen 5 core, 16 MB pieces cold: 7.7 -> 13 GB/s). */
    _mm_prefetch(ahead + g * (int)fixed / 256, _MM_HINT_T0);
    _mm_prefetch(ahead + g * (int)fixed / 256 + 64, _MM_HINT_T0);
    __m512i raw = _mm512_loadu_si512((const void *)(p + g * w)); /* 8w <= 56 bytes used */
    __m512i c = _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(spread, raw)), vmask);
    __mmask64 escs = _mm512_cmpeq_epi8_mask(c, vmask);
    __m512i h = _mm512_permutex2var_epi8(tlo, c, thi);
    if (escs) {
      uint64_t nesc = (uint64_t)__builtin_popcountll(escs);
      if ((uint64_t)(end - esc) < nesc) return -1;
      h = _mm512_mask_expandloadu_epi8(h, escs, esc);
      esc += nesc;
    }
    __m512i l = _mm512_loadu_si512((const void *)(lo + g * 8));
    __m512i o0 = _mm512_permutex2var_epi8(l, il0, h), o1 = _mm512_permutex2var_epi8(l, il1, h);
    if (stream) { /* the slot is 64-byte aligned: bypass the cache, no read for ownership */
      _mm512_stream_si512((void *)(out + g * 8), o0);
      _mm512_stream_si512((void *)(out + g * 8 + 32), o1);
    } else {
      _mm512_storeu_si512((void *)(out + g * 8), o0);
      _mm512_storeu_si512((void *)(out + g * 8 + 32), o1);
    }
  }
#elif defined(K3S_PDEP)
  (void)kc;
  (void)stream_ok;
  const uint64_t spread = 0x0101010101010101ULL * mask;
  const __m128i vdict = _mm_loadu_si128((const __m128i *)dict), vmask = _mm_set1_epi8((char)mask);
  for (int g = 0; g < K3IO_SPLIT_BLOCK / 8; g += 2) {
    uint64_t b0, b1;
    memcpy(&b0, p + g * w, 8);
    memcpy(&b1, p + (g + 1) * w, 8);
    __m128i c = _mm_set_epi64x((long long)_pdep_u64(b1, spread), (long long)_pdep_u64(b0, spread));
    unsigned escs = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(c, vmask));
    __m128i l = _mm_loadu_si128((const __m128i *)(lo + g * 8)), h;
    if (w <= 4) {
      h = _mm_shuffle_epi8(vdict, c);
    } else {
      unsigned char cb[16], hb[16];
      _mm_storeu_si128((__m128i *)cb, c);
      for (int j = 0; j < 16; j++) hb[j] = dict[cb[j]];
      h = _mm_loadu_si128((const __m128i *)hb);
    }
    /* The escaped words, in order, take their high bytes from the escape list (branch-free
     * where a masked expanding load exists: about half the groups of a narrow code hold one). */
#if defined(__AVX512VBMI2__) && defined(__AVX512VL__)
    {
      unsigned nesc = (unsigned)__builtin_popcount(escs);
      if ((uint64_t)(end - esc) < nesc) return -1;
      h = _mm_mask_expandloadu_epi8(h, (__mmask16)escs, esc);
      esc += nesc;
    }
#else
    if (escs != 0) {
      unsigned nesc = (unsigned)__builtin_popcount(escs);
      if ((uint64_t)(end - esc) < nesc) return -1;
      unsigned char hb[16];
      _mm_storeu_si128((__m128i *)hb, h);
      for (; escs != 0; escs &= escs - 1) hb[__builtin_ctz(escs)] = *esc++;
      h = _mm_loadu_si128((const __m128i *)hb);
    }
#endif
    _mm_storeu_si128((__m128i *)(out + g * 8), _mm_unpacklo_epi8(l, h));
    _mm_storeu_si128((__m128i *)(out + g * 8 + 8), _mm_unpackhi_epi8(l, h));
  }
#else
  (void)kc;
  (void)stream_ok;
  for (int g = 0; g < K3IO_SPLIT_BLOCK / 8; g++) {
    uint64_t bits;
    memcpy(&bits, p + g * w, 8);
    unsigned any = 0;
    unsigned c[8];
    for (int j = 0; j < 8; j++) {
      c[j] = (unsigned)(bits >> (j * w)) & mask;
      any |= c[j] == mask;
    }
    for (int j = 0; j < 8; j++) {
      unsigned h = dict[c[j]];
      if (any && c[j] == mask) {
        if (esc >= end) return -1;
        h = *esc++;
      }
      out[g * 8 + j] = (uint16_t)(h << 8 | lo[g * 8 + j]);
    }
  }
#endif
  *next = esc;
  return 0;
}

/* A coded piece's header, read and range-checked: the code width, the block count, the
 * dictionary (zero padded to 128 entries), where the first block starts and the index. */
typedef struct {
  int w;
  uint64_t nblocks, first;
  unsigned char dict[128];
  const unsigned char *index;
} k3s_header;

/* Reads the header of slen stored bytes coding len bytes; -1 when a field is out of range or
 * (with zeros) a byte that must be zero is not. */
static int k3s_header_read(const unsigned char *s, uint64_t slen, uint64_t len, int zeros, k3s_header *h) {
  if (slen < K3IO_SPLIT_HEADER || len % (2 * K3IO_SPLIT_BLOCK) != 0) return -1;
  uint32_t w = k3s_rd32(s + 4), nvals = k3s_rd32(s + 8), first = k3s_rd32(s + 12);
  uint64_t nblocks = len / 2 / K3IO_SPLIT_BLOCK;
  if (k3s_rd32(s) != K3IO_SPLIT_MAGIC || w < 1 || w > 7 || (uint64_t)nvals * 2 != len ||
      first < K3IO_SPLIT_HEADER + 4 * nblocks || first > slen) {
    return -1;
  }
  /* Everything between the dictionary and the index, and between the index and the first
   * block, is zero: a flipped byte anywhere in a coded piece either changes what it decodes
   * to or is refused. */
  for (const unsigned char *z = s + 16 + (1u << w) - 1; zeros && z < s + K3IO_SPLIT_HEADER; z++) {
    if (*z != 0) return -1;
  }
  for (const unsigned char *z = s + K3IO_SPLIT_HEADER + 4 * nblocks; zeros && z < s + first; z++) {
    if (*z != 0) return -1;
  }
  h->w = (int)w;
  h->nblocks = nblocks;
  h->first = first;
  memset(h->dict, 0, sizeof h->dict);
  memcpy(h->dict, s + 16, (1u << w) - 1);
  h->index = s + K3IO_SPLIT_HEADER;
  return 0;
}

int64_t k3io_split_decode(const void *stored, uint64_t slen, void *dst, uint64_t len) {
  const unsigned char *s = (const unsigned char *)stored;
  unsigned char *d = (unsigned char *)dst;
  k3s_header hd;
  if (k3s_header_read(s, slen, len, 1, &hd) != 0) return -EBADMSG;
  int w = hd.w;
  uint64_t nblocks = hd.nblocks;
  /* In place when the stored bytes sit inside the slot (at its end, as the reads put them). */
  int in_place = s >= d && s < d + len;
  const unsigned char *p = s + hd.first, *end = s + slen;
  uint16_t out[K3IO_SPLIT_BLOCK];
  k3s_consts kc = k3s_make(w);
  /* The index is summed before the blocks decoded in place overwrite it, and the sum is
   * matched against where the blocks turn out to start (any one changed entry changes it). */
  uint64_t index_sum = 0, walk_sum = 0;
  for (uint64_t b = 0; b < nblocks; b++) index_sum += k3s_rd32(hd.index + 4 * b) * (2 * b + 1);
  for (uint64_t b = 0; b < nblocks; b++) {
    const unsigned char *next = p;
    if ((uint64_t)(end - p) < K3S_BLOCK_FIXED(w)) return -EBADMSG;
    walk_sum += (uint64_t)(p - s) * (2 * b + 1);
    unsigned char *o = d + 2 * b * K3IO_SPLIT_BLOCK;
    /* Straight into place when that cannot overwrite the block's own stored bytes; else
     * through `out`, copied once the block is decoded. */
    int direct = !in_place || o + 2 * K3IO_SPLIT_BLOCK <= p;
    int bad = k3s_block(p, end, w, hd.dict, kc, direct ? (uint16_t *)(void *)o : out, 1, &next);
    if (bad) return -EBADMSG;
    /* Copying out must not overwrite the next block's stored bytes (the encoder's rule). */
    if (in_place && b + 1 < nblocks && o + 2 * K3IO_SPLIT_BLOCK > next) return -EBADMSG;
    if (!direct) memcpy(o, out, sizeof out);
    p = next;
  }
  if (walk_sum != index_sum) return -EBADMSG;
#if defined(K3S_VBMI)
  _mm_sfence(); /* the streamed stores are visible before the piece is handed out */
#endif
  if (p != end) return -EBADMSG;
  return (int64_t)len;
}

int64_t k3io_split_check(const void *stored, uint64_t slen, uint64_t len) {
  const unsigned char *s = (const unsigned char *)stored;
  k3s_header hd;
  if (k3s_header_read(s, slen, len, 1, &hd) != 0) return -EBADMSG;
  uint64_t at = hd.first, fixed = K3S_BLOCK_FIXED(hd.w);
  for (uint64_t b = 0; b < hd.nblocks; b++) {
    uint64_t i = k3s_rd32(hd.index + 4 * b), next = b + 1 < hd.nblocks ? k3s_rd32(hd.index + 4 * (b + 1)) : slen;
    if (i != at || next < i + fixed || next > i + fixed + K3IO_SPLIT_BLOCK || next > slen) return -EBADMSG;
    at = next;
  }
  return at == slen ? (int64_t)len : -EBADMSG;
}

int64_t k3io_split_range(const void *stored, uint64_t slen, uint64_t len, uint64_t w0, uint64_t n, uint16_t *out) {
  const unsigned char *s = (const unsigned char *)stored;
  k3s_header hd;
  /* The zero bytes were checked when the piece landed (k3io_split_check); a product asks
   * for many windows of one piece, so each asks only what it reads. */
  if (k3s_header_read(s, slen, len, 0, &hd) != 0 || w0 + n > len / 2 || w0 + n < w0) {
    memset(out, 0, (size_t)n * 2);
    return -EBADMSG;
  }
  k3s_consts kc = k3s_make(hd.w);
  uint16_t tmp[K3IO_SPLIT_BLOCK];
  uint64_t fixed = K3S_BLOCK_FIXED(hd.w);
  int bad = 0;
  for (uint64_t i = w0; i < w0 + n;) {
    uint64_t b = i / K3IO_SPLIT_BLOCK, b0 = b * K3IO_SPLIT_BLOCK;
    uint64_t from = k3s_rd32(hd.index + 4 * b), to = b + 1 < hd.nblocks ? k3s_rd32(hd.index + 4 * (b + 1)) : slen;
    uint64_t take = b0 + K3IO_SPLIT_BLOCK - i < w0 + n - i ? b0 + K3IO_SPLIT_BLOCK - i : w0 + n - i;
    const unsigned char *next = NULL;
    /* A whole block goes straight to out; a part goes through tmp. */
    uint16_t *dst = take == K3IO_SPLIT_BLOCK ? out + (i - w0) : tmp;
    if (from < hd.first || to > slen || to < from + fixed ||
        k3s_block(s + from, s + to, hd.w, hd.dict, kc, dst, 0, &next) != 0 || next != s + to) {
      bad = 1;
      break;
    }
    if (dst == tmp) memcpy(out + (i - w0), tmp + (i - b0), (size_t)take * 2);
    i += take;
  }
  if (bad) {
    memset(out, 0, (size_t)n * 2);
    return -EBADMSG;
  }
  return 0;
}

int64_t k3io_pread_piece(int32_t fd, void *buf, uint64_t len, uint64_t offset, uint64_t stored, int32_t flags,
                         uint64_t *out) {
  if (stored > len || stored == 0) return -EINVAL;
  /* Coded and kept so: the stored bytes are the piece's whole place; else read to the end of
   * the len-byte slot and decoded in place. */
  unsigned char *at = (unsigned char *)buf + (flags & K3IO_KEEP_CODED ? 0 : len - stored);
  int64_t n = k3io_pread(fd, at, stored, offset);
  if (n < 0) return n;
  if ((uint64_t)n < stored) return stored == len ? n : 0; /* end of file */
  out[1] = 0;
  if (stored < len) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    int64_t r = flags & K3IO_KEEP_CODED ? k3io_split_check(at, stored, len) : k3io_split_decode(at, stored, buf, len);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    out[1] = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
    if (r < 0) return r;
  }
  if (flags & K3IO_HASH) out[0] = k3io_hash(buf, len);
  return (int64_t)len;
}
