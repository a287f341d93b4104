/*
 * k3 products: the dense matmul (f32 and bf16 weights), the MXFP4 matmul, their checked
 * variants and the matrix check (contracts 1, 2 and 5 of simd.h and k3.h), written once
 * against the lane types of simd.h.
 */
#include "k3.h"
#include "k3io.h"
#include "simd.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- matrix check */

/* The matrix check (contract 5 in k3.h) over simd.h's c4 lanes. Words are read little-endian
 * (the hosts k3 builds for). */
static const uint64_t CHECK_KEY[19] = {
  0x80f4b3b5159811b6ULL, 0x1bb0bda46df1d396ULL, 0x83252a420a07d664ULL, 0x34d51b3f6e0605b4ULL,
  0x81d3742b513a982bULL, 0x6a50511684021245ULL, 0xae798d79fdc8873fULL, 0xe5139adb093fd6bbULL,
  0x011bb39417eeda40ULL, 0x62d48ab014a71b4bULL, 0x982946c2071f16b5ULL, 0x65c09985e0a56948ULL,
  0x61585b85fc3a5b4dULL, 0xf8df20075f5e38bbULL, 0x029ed767ae583be9ULL, 0x807317f97bda379eULL,
  0xfde5cf117371eff2ULL, 0xaf644af9edae2549ULL, 0xeea9b82e7c1d3126ULL,
};
#define CHECK_UNIT 32 /* bytes: 16 bf16 weights, one block of contract 1 */

/* The key of unit u of a row. */
K3_INLINE const uint64_t *check_key(size_t u) { return CHECK_KEY + (u & 15); }

/* The final unit of a row of `n` < CHECK_UNIT bytes, zero padded. */
K3_INLINE c4 c4_pad(c4 a, const void *p, size_t n, size_t u) {
  unsigned char b[CHECK_UNIT] = {0};
  memcpy(b, p, n);
  return c4_unit(a, b, check_key(u));
}

K3_INLINE uint64_t rotl64(uint64_t v, int s) { return (v << s) | (v >> (64 - s)); }

/* The word of row r from its four lanes. */
static uint64_t check_row_word(c4 acc, int32_t r) {
  uint64_t a[4];
  c4_store(a, acc);
  uint64_t h = a[0] ^ rotl64(a[1], 16) ^ rotl64(a[2], 32) ^ rotl64(a[3], 48);
  h += (uint64_t)(uint32_t)r * 0x9E3779B97F4A7C15ULL;
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  return h ^ (h >> 33);
}

/* Sum of the row words of rows [r0, r1), each `rowbytes` bytes, back to back from `w` (row r0). */
static uint64_t check_rows(const void *w, size_t rowbytes, int32_t r0, int32_t r1) {
  uint64_t sum = 0;
  for (int32_t r = r0; r < r1; r++) {
    const unsigned char *p = (const unsigned char *)w + (size_t)(r - r0) * rowbytes;
    c4 acc = c4_zero();
    size_t o = 0, u = 0;
    for (; o + CHECK_UNIT <= rowbytes; o += CHECK_UNIT, u++) acc = c4_unit(acc, p + o, check_key(u));
    if (o < rowbytes) acc = c4_pad(acc, p + o, rowbytes - o, u);
    sum += check_row_word(acc, r);
  }
  return sum;
}

void k3_matrix_check(const void *w, int32_t rowbytes, int32_t r0, int32_t r1, uint64_t *sum) {
  *sum += check_rows(w, (size_t)rowbytes, r0, r1);
}

/* ---------------------------------------------------------------- dense matmul */

/* Dense tiles: MM_R rows x up to MM_T tokens of accumulators held in registers, so each
 * weight block is loaded (and widened) once for all the tile's tokens. With several tokens
 * the columns are walked in chunks of MM_KC, x is first copied chunk-major into a per-thread
 * buffer (the rows of x are cols * 4 bytes apart, often a multiple of 4 KB, and would all
 * fall in the same L1 sets), and the accumulators are parked in memory between chunks.
 * None of this changes any row's order (contract 1: blocks ascending, one lane chain per
 * i % 16); with bf16 weights the packed x is stored in BF16_LANES order, so a lane may hold
 * another element class than its index, and v16_reduce_bf16 puts the classes back before
 * the tree. */
#if defined(MM_R) /* a build may force the tile height (isa_check runs both heights) */
#elif K3_ISA_AVX512
#define MM_R 4 /* 16 zmm accumulators */
#else
#define MM_R 1 /* AVX2: 8 ymm accumulators; 4 tokens share one widened weight block */
#endif
#define MM_T 4
enum { MM_R1 = 4 }; /* rows per pass for a single token (memory-bound: 4 streams) */
/* Several tokens (measured with bench/gemm_peak.ts, AVX-512 and AVX2, 4,096 x 7,168 bf16):
 * the weights stream from memory once per MM_TSUPER tokens, and at 16 that stream (about
 * 12 GB/s at the product's rate) was what held the product to half the peak; 64 cuts it
 * to a quarter. x of a chunk for all of them then sits in L2, so each tile of tokens' x
 * runs against all MM_RB rows of a block while it is in L1. The accumulators (64 KB) and
 * the staged weights (16 KB) are on the stack. */
enum { MM_KC = 256 };     /* columns per chunk with several tokens */
enum { MM_TSUPER = 64 };  /* tokens whose x is packed and accumulators parked together */
enum { MM_RB = 16 };      /* rows per block */
/* More tokens than this: each chunk of a row block's weights is decoded once into an f32
 * buffer (mm_stage) that the tiles of all the tokens read, instead of every tile decoding it
 * again (measured: no gain at 8 or 16 tokens, where a tile or four share the decode). */
enum { MM_STAGE_MIN = 16 };

K3_INLINE v16 load_w(const void *w, int wtype, int lanes, size_t i) {
  if (wtype == K3_BF16) return lanes ? v16_load_bf16_lanes((const uint16_t *)w + i) : v16_load_bf16((const uint16_t *)w + i);
  return v16_load((const float *)w + i);
}
K3_INLINE v16 pad_w(const void *w, int wtype, int lanes, size_t i, int n) {
  if (wtype == K3_BF16 && lanes) {
    uint16_t b[16] = {0};
    memcpy(b, (const uint16_t *)w + i, (size_t)n * sizeof(uint16_t));
    return v16_load_bf16_lanes(b);
  }
  return wtype == K3_BF16 ? pad_bf16((const uint16_t *)w + i, n) : pad_f32((const float *)w + i, n);
}
/* Accumulates the check units (contract 5) of elements [i, i + n) of a row: i a multiple of
 * 16, n = 16 except in the row's final block. */
K3_INLINE c4 check_block(c4 acc, const void *row, int wtype, size_t i, int n) {
  size_t es = wtype == K3_BF16 ? 2 : 4, bytes = (size_t)n * es, o = 0, u = i * es / CHECK_UNIT;
  const unsigned char *p = (const unsigned char *)row + i * es;
  for (; o + CHECK_UNIT <= bytes; o += CHECK_UNIT, u++) acc = c4_unit(acc, p + o, check_key(u));
  if (o < bytes) acc = c4_pad(acc, p + o, bytes - o, u);
  return acc;
}
K3_INLINE const void *row_ptr(const void *w, int wtype, int r, int cols) {
  size_t off = (size_t)r * (size_t)cols;
  return wtype == K3_BF16 ? (const void *)((const uint16_t *)w + off)
                          : (const void *)((const float *)w + off);
}

/* Columns [i0, i1) of an nr x nt tile (nr, nt, lanes compile-time after inlining).
 * acc[k][t] is row k, token t. xt[t] + i addresses column i of token t; packed x (lanes or
 * not) is zero padded to whole blocks, so only the weights of the final block need padding.
 * Unpacked x (one token) is padded here. With `check` (one token, whole rows) the rows'
 * check lanes ck[k] also take in every weight block as it is loaded. */
K3_INLINE void mm_tile(const void *const *wr, int wtype, int lanes, int packed, const float *const *xt, int nr,
                       int nt, int i0, int i1, int cols, v16 (*acc)[MM_TSUPER], int check, c4 *ck) {
  v16 a[MM_R1][MM_T];
  c4 c[MM_R1];
  K3_UNROLL4
  for (int k = 0; k < nr; k++) {
    K3_UNROLL4
    for (int t = 0; t < nt; t++) a[k][t] = acc[k][t];
    if (check) c[k] = ck[k];
  }
  int i = i0;
  for (; i + 16 <= i1; i += 16) {
    K3_UNROLL4
    for (int k = 0; k < nr; k++) {
      v16 wv = load_w(wr[k], wtype, lanes, (size_t)i);
      if (check) c[k] = check_block(c[k], wr[k], wtype, (size_t)i, 16);
      K3_UNROLL4
      for (int t = 0; t < nt; t++) a[k][t] = v16_add(a[k][t], v16_mul(wv, v16_load(xt[t] + i)));
    }
  }
  if (i < i1) { /* the final partial block (i1 == cols) */
    K3_UNROLL4
    for (int k = 0; k < nr; k++) {
      v16 wv = pad_w(wr[k], wtype, lanes, (size_t)i, cols - i);
      if (check) c[k] = check_block(c[k], wr[k], wtype, (size_t)i, cols - i);
      K3_UNROLL4
      for (int t = 0; t < nt; t++)
        a[k][t] = v16_add(a[k][t], v16_mul(wv, packed ? v16_load(xt[t] + i) : pad_f32(xt[t] + i, cols - i)));
    }
  }
  K3_UNROLL4
  for (int k = 0; k < nr; k++) {
    K3_UNROLL4
    for (int t = 0; t < nt; t++) acc[k][t] = a[k][t];
    if (check) ck[k] = c[k];
  }
}

/* Dispatch to a tile specialised for its shape: one token (MM_R1 rows or 1, x unpacked,
 * checking the rows when ck is not NULL) or several (MM_R rows or 1, nt 1..MM_T, x packed). */
K3_INLINE void mm_tile_n(const void *const *wr, int wtype, int lanes, const float *const *xt, int nr, int nt,
                         int i0, int i1, int cols, v16 (*acc)[MM_TSUPER], int packed, c4 *ck) {
#define K3_TILE(R, T) mm_tile(wr, wtype, lanes, 1, xt, R, T, i0, i1, cols, acc, 0, NULL)
#define K3_TILES(R) \
  switch (nt) {     \
  case 1:           \
    K3_TILE(R, 1);  \
    break;          \
  case 2:           \
    K3_TILE(R, 2);  \
    break;          \
  case 3:           \
    K3_TILE(R, 3);  \
    break;          \
  default:          \
    K3_TILE(R, 4);  \
  }
  if (!packed && ck) {
    if (nr == MM_R1)
      mm_tile(wr, wtype, 0, 0, xt, MM_R1, 1, i0, i1, cols, acc, 1, ck);
    else
      mm_tile(wr, wtype, 0, 0, xt, 1, 1, i0, i1, cols, acc, 1, ck);
  } else if (!packed) {
    if (nr == MM_R1)
      mm_tile(wr, wtype, 0, 0, xt, MM_R1, 1, i0, i1, cols, acc, 0, NULL);
    else
      mm_tile(wr, wtype, 0, 0, xt, 1, 1, i0, i1, cols, acc, 0, NULL);
  } else if (nr == MM_R) {
    K3_TILES(MM_R)
  } else {
    K3_TILES(1)
  }
#undef K3_TILES
#undef K3_TILE
}

/* Scratch for the packed x of one call, per thread (the pool's workers call concurrently).
 * Reused across calls: fresh pages cost a fault each, so it only grows. */
#if defined(_MSC_VER)
#define K3_TLS __declspec(thread)
#else
#define K3_TLS __thread
#endif
/* A per-thread buffer of at least `bytes`, grown (never shrunk) in place of *buf. */
static void *tls_grow(void **buf, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    k3_free(*buf);
    *buf = k3_alloc((uint64_t)bytes);
    *cap = *buf ? bytes : 0;
  }
  return *buf;
}
static K3_TLS void *xpack_buf;
static K3_TLS size_t xpack_cap;
static float *xpack_get(size_t n) { return (float *)tls_grow(&xpack_buf, &xpack_cap, n * sizeof(float)); }

/* x of tn tokens, chunk-major: chunk c of token t at (c * tn + t) * MM_KC, each block of 16
 * in lane order when `lanes`, the final partial block zero padded. */
static void xpack_fill(float *xp, const float *x, int tn, int cols, int lanes) {
  int nchunk = (cols + MM_KC - 1) / MM_KC;
  for (int c = 0; c < nchunk; c++)
    for (int t = 0; t < tn; t++) {
      const float *src = x + (size_t)t * cols + (size_t)c * MM_KC;
      float *dst = xp + ((size_t)c * tn + t) * MM_KC;
      int n = cols - c * MM_KC < MM_KC ? cols - c * MM_KC : MM_KC, b = 0;
      /* whole blocks by quads (BF16_LANES moves whole quads of elements) */
      for (; b + 16 <= n; b += 16)
        for (int q = 0; q < 4; q++) memcpy(dst + b + 4 * q, src + b + (lanes ? BF16_LANES[4 * q] : 4 * q), 4 * sizeof(float));
      if (b < n) {
        float blk[16] = {0};
        memcpy(blk, src + b, (size_t)(n - b) * sizeof(float));
        for (int j = 0; j < 16; j++) dst[b + j] = lanes ? blk[BF16_LANES[j]] : blk[j];
      }
    }
}

/* Split-coded weights (K3_BF16_SPLIT): the product asks for rows a window at a time, and
 * the window is decoded from the coded pieces into a per-thread buffer (k3io_split_range),
 * where the tiles then read it from cache. Each row is the same words as decoded in place,
 * and a row's result does not depend on which window brought it, so the bits are those of
 * the plain product. */
enum { SPLIT_WINDOW = 32768 }; /* words a window aims at (64 KB, well inside L2) */
static K3_TLS void *split_buf;
static K3_TLS size_t split_cap;
static uint16_t *split_buf_get(size_t n) { return (uint16_t *)tls_grow(&split_buf, &split_cap, n * sizeof(uint16_t)); }

/* Words [t0, t0 + n) of the matrix m into out (zeros where a piece does not decode). */
static void split_words(const k3_split_matrix *m, uint64_t t0, uint64_t n, uint16_t *out) {
  uint64_t at = m->word0 + t0, start = 0;
  for (uint64_t i = 0; i < m->npieces && n > 0; i++) {
    uint64_t words = m->piece[i].len / 2;
    if (at < start + words) {
      uint64_t a = at - start, take = words - a < n ? words - a : n;
      const unsigned char *base = (const unsigned char *)(uintptr_t)m->piece[i].base;
      uint64_t stored = m->piece[i].stored;
      if (stored == 0)
        memcpy(out, base + 2 * a, (size_t)take * 2);
      else
        k3io_split_range(base, stored, m->piece[i].len, a, take, out);
      out += take;
      at += take;
      n -= take;
    }
    start += words;
  }
  if (n > 0) memset(out, 0, (size_t)n * 2); /* past the last piece: a malformed descriptor */
}

/* The window of rows [r, r + n) is decoded: rows [wr, wr + wn) of [.., r1) are in buf. */
typedef struct {
  const k3_split_matrix *m;
  int cols, r1, per, wr, wn;
  uint16_t *buf;
  uint64_t *sum; /* several tokens: each row is checked once, in the first window that holds it */
  int checked;   /* rows below this one are in *sum */
} split_window;

/* Row r of a window holding rows [r, r + n) (decoding the next window when it does not). */
static const uint16_t *split_rows(split_window *s, int r, int n) {
  if (r < s->wr || r + n > s->wr + s->wn) {
    s->wr = r;
    s->wn = s->r1 - r < s->per ? s->r1 - r : s->per;
    split_words(s->m, (uint64_t)r * (uint64_t)s->cols, (uint64_t)s->wn * (uint64_t)s->cols, s->buf);
    if (s->sum && r + s->wn > s->checked) {
      int from = r > s->checked ? r : s->checked;
      *s->sum += check_rows(s->buf + (size_t)(from - r) * (size_t)s->cols, (size_t)s->cols * 2, from, r + s->wn);
      s->checked = r + s->wn;
    }
  }
  return s->buf + (size_t)(r - s->wr) * (size_t)s->cols;
}

/* Columns [i0, i1) of one weight row into dst as f32 (dst[j]: column i0 + j), each block the
 * v16 a tile would load from the row (in `lanes` order, the final partial block zero
 * padded), so that the tiles of all tokens read it decoded from L1. */
K3_INLINE void mm_stage(float *dst, const void *row, int wtype, int lanes, int i0, int i1, int cols) {
  int i = i0;
  for (; i + 16 <= i1; i += 16) v16_store(dst + (i - i0), load_w(row, wtype, lanes, (size_t)i));
  if (i < i1) v16_store(dst + (i - i0), pad_w(row, wtype, lanes, (size_t)i, cols - i));
}
/* i1 rounded up to whole blocks: staged weights and packed x are both zero padded. */
K3_INLINE int i1_blocks(int i1) { return (i1 + 15) / 16 * 16; }

/* One instance per weight type so wtype is a constant inside the loops.
 * One token: passes of MM_R1 rows over whole rows (weight streaming at memory speed).
 * Several: blocks of MM_RB rows; for each chunk of columns the block's weights are staged
 * (more than MM_STAGE_MIN tokens), then each tile of tokens runs against every row of the
 * block (walking whole rows per row would stream all of x from L2 for every row). */
K3_INLINE void matmul_t(const void *w, int wtype, const float *x, float *y, int ntok, int rows,
                        int cols, int r0, int r1, uint64_t *sum, int split) {
  v16 acc[MM_RB][MM_TSUPER];
  v16 wstage_v[MM_RB * MM_KC / 16]; /* several tokens: a block's weights of one chunk, as f32 */
  float *wstage = (float *)wstage_v;
  c4 ck[MM_R1];
  int nchunk = (cols + MM_KC - 1) / MM_KC;
  size_t esize = wtype == K3_BF16 ? 2 : 4;
  split_window sw = {(const k3_split_matrix *)w, cols, r1, 0, 0, 0, NULL, NULL, r0};
  if (split) {
    /* whole blocks of the rows a pass takes (MM_R1 for one token, MM_RB for several), so the
     * windows follow them */
    int block = ntok == 1 ? MM_R1 : MM_RB;
    sw.per = SPLIT_WINDOW / cols / block * block > block ? SPLIT_WINDOW / cols / block * block : block;
    sw.buf = split_buf_get((size_t)sw.per * (size_t)cols);
    sw.sum = sum && ntok > 1 ? sum : NULL;
    if (!sw.buf) { /* no memory for the window: no result (a checked product then fails) */
      for (int t = 0; t < ntok; t++)
        for (int r = r0; r < r1; r++) y[(size_t)t * rows + r] = 0.0f;
      return;
    }
  }
  for (int ts = 0; ts < ntok;) {
    int tn = ntok - ts < MM_TSUPER ? ntok - ts : MM_TSUPER;
    float *xp = tn > 1 ? xpack_get((size_t)nchunk * tn * MM_KC) : NULL;
    if (!xp) { /* one token (or no scratch: one token at a time) */
      const float *xt[1] = {x + (size_t)ts * cols};
      for (int r = r0; r < r1;) {
        int nr = r1 - r >= MM_R1 ? MM_R1 : 1;
        const void *wr[MM_R1];
        const uint16_t *sb = split ? split_rows(&sw, r, nr) : NULL;
        for (int k = 0; k < nr; k++) {
          wr[k] = split ? (const void *)(sb + (size_t)k * (size_t)cols) : row_ptr(w, wtype, r + k, cols);
          acc[k][0] = v16_zero();
          ck[k] = c4_zero();
        }
        /* one token: the rows are checked as they stream by */
        mm_tile_n(wr, wtype, 0, xt, nr, 1, 0, cols, cols, acc, 0, sum && ntok == 1 ? ck : NULL);
        for (int k = 0; k < nr; k++) {
          y[(size_t)ts * rows + r + k] = v16_reduce(acc[k][0]);
          if (sum && ntok == 1) *sum += check_row_word(ck[k], r + k);
        }
        r += nr;
      }
      ts += 1;
      continue;
    }
    int lanes = wtype == K3_BF16, staged = tn > MM_STAGE_MIN;
    xpack_fill(xp, x + (size_t)ts * cols, tn, cols, lanes);
    for (int rb = r0; rb < r1; rb += MM_RB) {
      int rbn = r1 - rb < MM_RB ? r1 - rb : MM_RB;
      const uint16_t *sb = split ? split_rows(&sw, rb, rbn) : NULL;
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++) acc[k][t] = v16_zero();
      for (int c = 0; c < nchunk; c++) {
        int i0 = c * MM_KC, i1 = cols - i0 < MM_KC ? cols : i0 + MM_KC;
        const void *wk[MM_RB]; /* the block's rows */
        for (int k = 0; k < rbn; k++) {
          wk[k] = split ? (const void *)(sb + (size_t)k * (size_t)cols) : row_ptr(w, wtype, rb + k, cols);
          /* the row's next chunk, a whole block-pass ahead of its use */
          for (size_t b = 0; c + 1 < nchunk && b < (size_t)MM_KC * esize; b += 64)
            K3_PREFETCH((const char *)wk[k] + (size_t)i1 * esize + b);
          if (staged) mm_stage(wstage + (size_t)k * MM_KC, wk[k], wtype, lanes, i0, i1, cols);
        }
        /* each tile of tokens' x (offset so that xt[t] + i addresses column i of this chunk)
         * against all the block's rows, while it is in L1 */
        for (int t0 = 0; t0 < tn; t0 += MM_T) {
          int nt = tn - t0 < MM_T ? tn - t0 : MM_T;
          const float *xt[MM_T];
          for (int t = 0; t < nt; t++) xt[t] = xp + ((size_t)c * tn + t0 + t) * MM_KC - i0;
          for (int r = rb; r < rb + rbn;) {
            int nr = rb + rbn - r >= MM_R ? MM_R : 1;
            const void *wr[MM_R1];
            v16(*at)[MM_TSUPER] = (v16(*)[MM_TSUPER]) & acc[r - rb][t0];
            if (staged) { /* wr[k] + i addresses column i of this chunk */
              for (int k = 0; k < nr; k++) wr[k] = wstage + (size_t)(r + k - rb) * MM_KC - i0;
              mm_tile_n(wr, K3_F32, 0, xt, nr, nt, i0, i1_blocks(i1), cols, at, 1, NULL);
            } else {
              for (int k = 0; k < nr; k++) wr[k] = wk[r + k - rb];
              mm_tile_n(wr, wtype, lanes, xt, nr, nt, i0, i1, cols, at, 1, NULL);
            }
            r += nr;
          }
        }
      }
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++)
          y[(size_t)(ts + t) * rows + rb + k] = lanes ? v16_reduce_bf16(acc[k][t]) : v16_reduce(acc[k][t]);
    }
    ts += tn;
  }
  /* several tokens: the tiles hold each weight block for a moment only; one pass after */
  if (sum && ntok > 1 && !split) *sum += check_rows(row_ptr(w, wtype, r0, cols), (size_t)cols * esize, r0, r1);
}

static void matmul_f32(const void *w, const float *x, float *y, int ntok, int rows, int cols, int r0, int r1,
                       uint64_t *sum) {
  matmul_t(w, K3_F32, x, y, ntok, rows, cols, r0, r1, sum, 0);
}
/* bf16 weights plain or split-coded: `split` is a flag here (one copy of the tiles, not two:
 * it only picks where each row block's weights come from). */
static void matmul_bf16(const void *w, const float *x, float *y, int ntok, int rows, int cols, int r0, int r1,
                        uint64_t *sum, int split) {
  matmul_t(w, K3_BF16, x, y, ntok, rows, cols, r0, r1, sum, split);
}

void k3_matmul_checked(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
                       int32_t cols, int32_t r0, int32_t r1, uint64_t *sum) {
  if (wtype == K3_BF16 || wtype == K3_BF16_SPLIT)
    matmul_bf16(w, x, y, ntok, rows, cols, r0, r1, sum, wtype == K3_BF16_SPLIT);
  else if (wtype == K3_F32)
    matmul_f32(w, x, y, ntok, rows, cols, r0, r1, sum);
}

void k3_matmul(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
               int32_t cols, int32_t r0, int32_t r1) {
  k3_matmul_checked(w, wtype, x, y, ntok, rows, cols, r0, r1, NULL);
}

/* ---------------------------------------------------------------- calibrated peak */

/* The dense tiles' inner step without the weights' memory: PEAK_N independent v16 chains
 * acc[k] = acc[k] + w * x[k] (a rounded multiply then a rounded add, no FMA, as in mm_tile),
 * w in a register, x[k] loaded from a 1 KB buffer in L1 (as the tiles load x). Its FLOP/s is
 * the most this build's instruction mix can do on this core, so a product's FLOP/s over it
 * says how far the product is from the machine (bench/prefill.ts's gemm_of_peak). PEAK_N:
 * as many chains as the registers hold beside w and a product (AVX2: 16 ymm). An empty asm
 * that may change x once per step keeps the multiplies inside the loop. */
#if K3_ISA_AVX512
#define PEAK_N 16
#elif K3_ISA_AVX2
#define PEAK_N 6
#else
#define PEAK_N 4
#endif
#if defined(__clang__)
#define K3_UNROLL16 _Pragma("unroll 16")
#elif defined(__GNUC__)
#define K3_UNROLL16 _Pragma("GCC unroll 16")
#else
#define K3_UNROLL16
#endif
#if defined(__GNUC__)
#define K3_CLOBBER(a) __asm__ volatile("" : "+m"(a)) /* a: an array, now "changed" */
#else
#define K3_CLOBBER(a) ((void)(a)) /* other compilers may hoist the multiplies: the peak reads high */
#endif

uint64_t k3_peak_loop(int32_t iters, float *sink) {
  float x[PEAK_N * 16], s = 0.0f;
  v16 a[PEAK_N], w = v16_set1(1.0009765625f);
  for (int i = 0; i < PEAK_N * 16; i++) x[i] = 0.5f + 0.001f * (float)i;
  K3_UNROLL16
  for (int k = 0; k < PEAK_N; k++) a[k] = v16_zero();
  for (int32_t i = 0; i < iters; i++) {
    K3_CLOBBER(x);
    K3_UNROLL16
    for (int k = 0; k < PEAK_N; k++) a[k] = v16_add(a[k], v16_mul(w, v16_load(x + 16 * k)));
  }
  K3_UNROLL16 /* every loop over a[] unrolled, so that it is never an array in memory */
  for (int k = 0; k < PEAK_N; k++) s = s + v16_reduce(a[k]);
  *sink = s;
  return (uint64_t)(iters > 0 ? iters : 0) * PEAK_N * 16 * 2;
}

/* ---------------------------------------------------------------- MXFP4 matmul */

/* 2^(s-128), the scale of the doubled E2M1 values, by scale byte s, exactly (s = 1 and s = 0
 * are the subnormals 2^-127 and 2^-128; s = 255 is never used: its group is skipped). A table
 * so that SIMD paths broadcast the scale straight from memory. */
#define MXS(s) {(s) >= 2 ? (uint32_t)((s)-1) << 23 : 0x00200000u << (s)}
#define MXS4(s) MXS(s), MXS((s) + 1), MXS((s) + 2), MXS((s) + 3)
#define MXS16(s) MXS4(s), MXS4((s) + 4), MXS4((s) + 8), MXS4((s) + 12)
#define MXS64(s) MXS16(s), MXS16((s) + 16), MXS16((s) + 32), MXS16((s) + 48)
static const union {
  uint32_t u;
  float f;
} MX_SCALE[256] = {MXS64(0), MXS64(64), MXS64(128), MXS64(192)};
#undef MXS64
#undef MXS16
#undef MXS4
#undef MXS

/* x of one token in the decode's lane order: xp[32g + 8j + p] = x[32g + MX_ELEM(j, MX_XL(p))]
 * (simd.h's MX_XL: physical lane p holds contract lane MX_XL(p), the identity except on
 * AVX-512). */
static const uint8_t MX_PERM[32] = {
#define K3_MXP(j) MX_ELEM(j, MX_XL(0)), MX_ELEM(j, MX_XL(1)), MX_ELEM(j, MX_XL(2)), MX_ELEM(j, MX_XL(3)), \
    MX_ELEM(j, MX_XL(4)), MX_ELEM(j, MX_XL(5)), MX_ELEM(j, MX_XL(6)), MX_ELEM(j, MX_XL(7))
    K3_MXP(0), K3_MXP(1), K3_MXP(2), K3_MXP(3)
#undef K3_MXP
};
K3_INLINE void mx_xperm(float *xp, const float *x, int ng) {
  for (int g = 0; g < ng; g++)
    for (int i = 0; i < 32; i++) xp[32 * g + i] = x[32 * g + MX_PERM[i]];
}

/* One token, nr (1..MX_R1) rows: x (permuted, in L1) is shared by the rows, each row's group
 * is decoded in registers. p[k], s[k]: packed bytes and scales of row k. */
/* Rows per pass: 1, so the weights stream in order. (4 rows in lockstep ran as fast from L2
 * but slower from DRAM: 1.0-1.1x the previous kernel against 1.3-1.5x for one row.) */
#ifndef MX_R1
#define MX_R1 1
#endif
K3_INLINE void mx_rows1(mxc c, const uint8_t *const *p, const uint8_t *const *s, int nr, const float *xp,
                        int ng, float *out, int check, c4 *ck) {
  m8 acc[MX_R1];
  c4 cc[MX_R1];
  K3_UNROLL4
  for (int k = 0; k < nr; k++) {
    acc[k] = m8_zero();
    if (check) cc[k] = c4_zero();
  }
  for (size_t g = 0; g < (size_t)ng; g++) { /* size_t: no sign extension per group */
    K3_UNROLL4
    for (int k = 0; k < nr; k++) {
      uint8_t sc = s[k][g];
      if (sc != 255) {
        mxw w;
        mx_decode(c, p[k] + 16 * g, &w);
        acc[k] = mx_group(acc[k], &w, xp + 32 * g, m8_bcast(&MX_SCALE[sc].f));
      }
      /* the packed row's check takes each 32-byte unit (two groups) as it goes by,
       * skipped groups included */
      if (check && (g & 1)) cc[k] = c4_unit(cc[k], p[k] + 16 * (g - 1), check_key(g / 2));
    }
  }
  K3_UNROLL4
  for (int k = 0; k < nr; k++) {
    out[k] = m8_reduce(acc[k]);
    if (check && (ng & 1)) cc[k] = c4_pad(cc[k], p[k] + 16 * (ng - 1), 16, (size_t)ng / 2);
    if (check) ck[k] = cc[k];
  }
}

#if defined(K3_MX_PAIR)
/* x of one token for mx_pairs: xp[64G + 16i + P] = element MXP_ELEM(i, P) of pair G (simd.h),
 * zero past the last group. */
static const uint8_t MXP_PERM[64] = {
#define K3_MXP4(i, P) MXP_ELEM(i, P), MXP_ELEM(i, (P) + 1), MXP_ELEM(i, (P) + 2), MXP_ELEM(i, (P) + 3)
#define K3_MXP16(i) K3_MXP4(i, 0), K3_MXP4(i, 4), K3_MXP4(i, 8), K3_MXP4(i, 12)
    K3_MXP16(0), K3_MXP16(1), K3_MXP16(2), K3_MXP16(3)
#undef K3_MXP16
#undef K3_MXP4
};
K3_INLINE void mxp_xperm(float *xp, const float *x, int ng) {
  int G = 0;
  for (; 2 * G + 2 <= ng; G++)
    for (int i = 0; i < 64; i++) xp[64 * G + i] = x[64 * G + MXP_PERM[i]];
  if (ng & 1) /* the last group alone: its pair's second half is never added */
    for (int i = 0; i < 64; i++) xp[64 * G + i] = MXP_PERM[i] < 32 ? x[64 * G + MXP_PERM[i]] : 0.0f;
}
/* mx_rows1 for one row, two groups per step (simd.h, "pair step"); the same bits. */
K3_INLINE void mx_pairs(mxpc c, const uint8_t *p, const uint8_t *s, const float *xp, int ng, float *out, int check,
                        c4 *ck) {
  __m512 acc = _mm512_setzero_ps();
  c4 cc = c4_zero();
  size_t np = (size_t)ng / 2;
  for (size_t G = 0; G < np; G++) {
    uint8_t sa = s[2 * G], sb = s[2 * G + 1];
    __m512 w[4];
    mxp_decode(c, mxp_load2(p + 32 * G), w);
    __m512 part = mxp_part(w, xp + 64 * G, mxp_scales(&MX_SCALE[sa].f, &MX_SCALE[sb].f));
    if (sa != 255 && sb != 255) {
      acc = mxp_add_hi(mxp_add_lo(acc, part), part);
    } else { /* a skipped group contributes nothing */
      if (sa != 255) acc = mxp_add_lo(acc, part);
      if (sb != 255) acc = mxp_add_hi(acc, part);
    }
    if (check) cc = c4_unit(cc, p + 32 * G, check_key(G));
  }
  if (ng & 1) {
    size_t g = (size_t)ng - 1;
    if (s[g] != 255) {
      __m512 w[4];
      mxp_decode(c, mxp_load1(p + 16 * g), w);
      acc = mxp_add_lo(acc, mxp_part(w, xp + 32 * g, _mm512_set1_ps(MX_SCALE[s[g]].f)));
    }
    if (check) cc = c4_pad(cc, p + 16 * g, 16, g / 2);
  }
  *out = m8_reduce(mxp_lanes(acc));
  if (check) *ck = cc;
}
#endif

/* Several tokens: one row's groups [g0, g1), each decoded once in registers for the nt
 * tokens of a tile, two tokens per mx2 (simd.h) and an odd one left over in an m8. x of a
 * chunk (mx_xpack): tokens t, t + 1 of a pair at xt + t * kc, group g's 64 floats
 * interleaved at 64 * (g - g0); a last token alone at xt + t * kc, its 32 at 32 * (g - g0).
 * The sizes were measured (bench/gemm_peak.ts and a C harness, 3,072 x 3,584 at 8 to 256
 * rows, interleaved): on AVX-512, 16 tokens a tile (8 zmm accumulators) and 32 rows a block,
 * so that a chunk of x (16 KB) serves 32 rows from L1; 32 or 64 tokens of x a chunk (32-64
 * KB) fell out of L1 and lost a fifth to a half; two rows a tile (x loaded once for both)
 * was slower. A build may force them (-D) to compare; MX_TT even, MX_TSUPER a multiple. */
#if !defined(MX_TT)
#if defined(K3_MX_PAIR)
#define MX_TT 16 /* tokens per tile: 8 zmm of accumulators */
#else
#define MX_TT 8 /* 8 m8 (ymm on AVX2) of accumulators */
#endif
#endif
#ifndef MX_KG
#define MX_KG 8 /* groups per column chunk */
#endif
#ifndef MX_RB
#define MX_RB 32 /* rows per block, whose accumulators are parked between chunks */
#endif
#ifndef MX_TSUPER
#define MX_TSUPER 16 /* tokens per packed x */
#endif
#if MX_TT % 2 || MX_TT > 16 || MX_TSUPER % MX_TT
#error "MX_TT: even, at most 16; MX_TSUPER: a multiple of it"
#endif
K3_INLINE void mx_tile(mx2c c, const uint8_t *p, const uint8_t *s, int g0, int g1, const float *xt, int nt,
                       m8 *acc) {
  enum { kc = 32 * MX_KG };
  int np = nt / 2, odd = nt & 1;
  mx2 a[MX_TT / 2];
  m8 a1 = odd ? acc[nt - 1] : m8_zero();
  K3_UNROLL8
  for (int q = 0; q < np; q++) a[q] = mx2_load(acc + 2 * q);
  mxw2 w, wn;
  mx2_decode(c, p + 16 * (size_t)g0, &w);
  for (size_t g = (size_t)g0; g < (size_t)g1; g++) {
    /* the next group decoded first, so its lookups run while this one's products wait (at
     * the chunk's last group, this one again: the row may end here) */
    mx2_decode(c, p + 16 * (g + 1 < (size_t)g1 ? g + 1 : g), &wn);
    uint8_t sc = s[g];
    if (sc != 255) {
      mx2 sv = mx2_bcast(&MX_SCALE[sc].f);
      const float *xg = xt + 64 * (g - g0);
      K3_UNROLL8
      for (int q = 0; q < np; q++) a[q] = mx2_group(a[q], &w, xg + 2 * q * kc, sv);
      if (odd) {
        mxw w1;
        mx2_one(&w, &w1);
        a1 = mx_group(a1, &w1, xt + (nt - 1) * kc + 32 * (g - g0), mx2_lo(sv));
      }
    }
    w = wn;
  }
  K3_UNROLL8
  for (int q = 0; q < np; q++) mx2_store(acc + 2 * q, a[q]);
  if (odd) acc[nt - 1] = a1;
}
/* mx_tile specialised for its width (nt 1..MX_TT, a constant inside). */
K3_INLINE void mx_tile_n(mx2c c, const uint8_t *p, const uint8_t *s, int g0, int g1, const float *xt, int nt,
                         m8 *acc) {
  switch (nt) {
#define K3_MXT(T)                         \
  case T:                                 \
    mx_tile(c, p, s, g0, g1, xt, T, acc); \
    break;
    K3_MXT(1) K3_MXT(2) K3_MXT(3) K3_MXT(4) K3_MXT(5) K3_MXT(6) K3_MXT(7)
#if MX_TT > 8
    K3_MXT(8) K3_MXT(9) K3_MXT(10) K3_MXT(11) K3_MXT(12) K3_MXT(13) K3_MXT(14) K3_MXT(15)
#endif
  default:
    mx_tile(c, p, s, g0, g1, xt, MX_TT, acc);
#undef K3_MXT
  }
}

/* x of tn tokens (one super-tile) for mx_tile, chunk-major: chunk c of token t at
 * (c * tn + t) * kc, pairs interleaved per group, a last odd token alone (mx_xperm). */
static void mx_xpack(float *xp, const float *x, int tn, int cols) {
  enum { kc = 32 * MX_KG };
  int ng = cols / 32, nchunk = (ng + MX_KG - 1) / MX_KG;
  for (int c = 0; c < nchunk; c++) {
    int gn = ng - c * MX_KG < MX_KG ? ng - c * MX_KG : MX_KG;
    for (int t = 0; t < tn; t += 2) {
      const float *src = x + (size_t)t * cols + (size_t)c * kc;
      float *dst = xp + ((size_t)c * tn + t) * kc;
      if (t + 1 == tn) {
        mx_xperm(dst, src, gn);
        continue;
      }
      for (int gi = 0; gi < gn; gi++)
        for (int h = 0; h < 2; h++)
          for (int i = 0; i < 32; i++)
            dst[64 * gi + 16 * (i / 8) + 8 * h + i % 8] = src[(size_t)h * cols + 32 * gi + MX_PERM[i]];
    }
  }
}

/* Several tokens, or no scratch: the packed and scale rows' checks in one pass after. */
static void mx_check_after(const uint8_t *packed, const uint8_t *scales, int32_t cols, int32_t r0, int32_t r1,
                           uint64_t *sums) {
  if (!sums) return;
  size_t pstride = (size_t)cols / 2, sstride = (size_t)cols / 32;
  sums[0] += check_rows(packed + (size_t)r0 * pstride, pstride, r0, r1);
  sums[1] += check_rows(scales + (size_t)r0 * sstride, sstride, r0, r1);
}

void k3_matmul_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, float *y,
                     int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1) {
  k3_matmul_mxfp4_checked(packed, scales, x, y, ntok, rows, cols, r0, r1, NULL);
}

void k3_matmul_mxfp4_checked(const uint8_t *packed, const uint8_t *scales, const float *x, float *y,
                             int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1, uint64_t *sums) {
  int ng = cols / 32, kc = 32 * MX_KG, nchunk = (ng + MX_KG - 1) / MX_KG;
  mxc mc = mx_consts();
  size_t pstride = (size_t)cols / 2, sstride = (size_t)ng;
  float *xp = xpack_get((size_t)(ntok < MX_TSUPER ? ntok : MX_TSUPER) * nchunk * kc);
  if (!xp) { /* no scratch: the same per-row operations, one group of x permuted at a time */
    float xg[32];
    for (int t = 0; t < ntok; t++)
      for (int r = r0; r < r1; r++) {
        const uint8_t *pr = packed + (size_t)r * pstride, *sr = scales + (size_t)r * sstride;
        m8 acc = m8_zero();
        for (int g = 0; g < ng; g++) {
          if (sr[g] == 255) continue;
          mxw w;
          mx_xperm(xg, x + (size_t)t * cols + 32 * g, 1);
          mx_decode(mc, pr + 16 * g, &w);
          acc = mx_group(acc, &w, xg, m8_bcast(&MX_SCALE[sr[g]].f));
        }
        y[(size_t)t * rows + r] = m8_reduce(acc);
      }
    mx_check_after(packed, scales, cols, r0, r1, sums);
    return;
  }
  if (ntok == 1) { /* passes of MX_R1 whole rows (weights streaming, x in L1) */
#if defined(K3_MX_PAIR)
    mxpc pc = mxp_consts();
    mxp_xperm(xp, x, ng);
    for (int r = r0; r < r1; r++) {
      const uint8_t *pr = packed + (size_t)r * pstride, *sr = scales + (size_t)r * sstride;
      c4 ck;
      if (sums) {
        mx_pairs(pc, pr, sr, xp, ng, y + r, 1, &ck);
        sums[0] += check_row_word(ck, r);
        sums[1] += check_rows(sr, sstride, r, r + 1); /* ng bytes, just read */
      } else {
        mx_pairs(pc, pr, sr, xp, ng, y + r, 0, NULL);
      }
    }
    return;
#endif
    mx_xperm(xp, x, ng);
    for (int r = r0; r < r1;) {
      int nr = r1 - r >= MX_R1 ? MX_R1 : 1;
      const uint8_t *pr[MX_R1], *sr[MX_R1];
      for (int k = 0; k < nr; k++) {
        pr[k] = packed + (size_t)(r + k) * pstride;
        sr[k] = scales + (size_t)(r + k) * sstride;
      }
      c4 ck[MX_R1];
      if (sums && nr == MX_R1)
        mx_rows1(mc, pr, sr, MX_R1, xp, ng, y + r, 1, ck);
      else if (sums)
        mx_rows1(mc, pr, sr, 1, xp, ng, y + r, 1, ck);
      else if (nr == MX_R1)
        mx_rows1(mc, pr, sr, MX_R1, xp, ng, y + r, 0, NULL);
      else
        mx_rows1(mc, pr, sr, 1, xp, ng, y + r, 0, NULL);
      for (int k = 0; sums && k < nr; k++) {
        sums[0] += check_row_word(ck[k], r + k);
        sums[1] += check_rows(sr[k], sstride, r + k, r + k + 1); /* ng bytes, just read */
      }
      r += nr;
    }
    return;
  }
  /* Several tokens: x of up to MX_TSUPER tokens permuted chunk-major (mx_xpack); for each
   * block of rows and each chunk, every row's groups are decoded once per tile of MX_TT
   * tokens. */
  mx2c pc2 = mx2_consts();
  m8 acc[MX_RB][MX_TSUPER];
  for (int ts = 0; ts < ntok; ts += MX_TSUPER) {
    int tn = ntok - ts < MX_TSUPER ? ntok - ts : MX_TSUPER;
    mx_xpack(xp, x + (size_t)ts * cols, tn, cols);
    for (int rb = r0; rb < r1; rb += MX_RB) {
      int rbn = r1 - rb < MX_RB ? r1 - rb : MX_RB;
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++) acc[k][t] = m8_zero();
      for (int c = 0; c < nchunk; c++) {
        int g0 = c * MX_KG, g1 = ng - g0 < MX_KG ? ng : g0 + MX_KG;
        for (int k = 0; k < rbn; k++) {
          const uint8_t *pr = packed + (size_t)(rb + k) * pstride, *sr = scales + (size_t)(rb + k) * sstride;
          if (c + 1 < nchunk) { /* the row's next chunk, a whole block-pass ahead of its use */
            K3_PREFETCH(pr + 16 * g1);
            K3_PREFETCH(pr + 16 * g1 + 64);
            K3_PREFETCH(sr + g1);
          }
          for (int t0 = 0; t0 < tn; t0 += MX_TT) {
            int nt = tn - t0 < MX_TT ? tn - t0 : MX_TT;
            mx_tile_n(pc2, pr, sr, g0, g1, xp + ((size_t)c * tn + t0) * kc, nt, &acc[k][t0]);
          }
        }
      }
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++) y[(size_t)(ts + t) * rows + rb + k] = m8_reduce(acc[k][t]);
    }
  }
  mx_check_after(packed, scales, cols, r0, r1, sums);
}
