/*
 * k3 kernels (see k3.h for what each function computes).
 *
 * ACCUMULATION ORDER (the determinism contract; every ISA path follows it exactly)
 *
 * Build with -ffp-contract=off: every a*b+c below is a rounded multiply, then a rounded add.
 *
 * 1. dot(a, b, n), used by k3_matmul (f32 and bf16 weights), rmsnorm, l2norm, attnres and the
 *    MLA scores. Sixteen lane sums acc[0..15] start at +0. Elements are taken in blocks of 16:
 *    element i goes to lane i % 16 as acc[l] = acc[l] + a[i] * b[i], blocks in ascending
 *    order. A final partial block is zero padded to 16 elements (the missing lanes add
 *    +0 * +0). The lanes are then reduced by one fixed pairwise tree:
 *        h[l] = acc[l] + acc[l+8]   (l < 8)
 *        q[l] = h[l]   + h[l+4]     (l < 4)
 *        p[l] = q[l]   + q[l+2]     (l < 2)
 *        dot  = p[0]   + p[1]
 *    bf16 weights are widened exactly (16-bit shift) before the multiply.
 *
 * 2. MXFP4 row dot (k3_matmul_mxfp4). Eight lane sums acc[0..7] start at +0. Per group g of
 *    32 elements with scale byte s, groups in ascending order: if s == 255 the group is
 *    skipped (it contributes nothing, not even 0 * inf); otherwise, with d[e] = 2 * E2M1 value
 *    of element e of the group (an exact float; nibble 8, the E2M1 -0, gives +0), x[e] the
 *    matching x, and the lane order E(j, l) = 16*(j>>1) + 4*(l&3) + 2*(j&1) + (l>>2)
 *    (j = 0..3, l = 0..7; MX_ELEM below), for each lane l:
 *        p[j]   = d[E(j,l)] * x[E(j,l)]
 *        part   = (p[0] + p[1]) + (p[2] + p[3])
 *        acc[l] = acc[l] + part * 2^(s-128)        (2^(s-128) built from its bits)
 *    then  h[l] = acc[l] + acc[l+4] (l < 4), q[l] = h[l] + h[l+2] (l < 2), dot = q[0] + q[1].
 *    Doubling is exact, so this is the E2M1 * 2^(s-127) product of the format. The lane order
 *    is the one an AVX2 decode produces without moving data across lanes (see mx8_decode);
 *    x is permuted into it once per call (it is shared by all rows), and each group's
 *    products are summed before its scale is applied (one multiply per group, not four).
 *
 * 3. Column sums (KDA u = S^T k and o = S^T q, MLA out = sum_s p_s v_s, AttnRes out) are
 *    lane-wise: each output element is its own sequential sum over rows in ascending order,
 *    starting at +0, y = y + c * row. SIMD over columns therefore cannot change a bit.
 *
 * 4. Scalar sequential sums in index order: softmax denominators, router weight sum.
 *
 * 5. The matrix check (k3.h) is integer arithmetic mod 2^64 per row, summed over rows: it
 *    has no order to keep, and k3_matmul_checked gives the k3_matrix_check bits on every path.
 *
 * Transcendentals (expf, tanhf) come from libm through one scalar code path shared by all
 * ISAs; sqrtf and division are IEEE correctly rounded everywhere. Normalisations divide by
 * the root (x / r), they never multiply by a reciprocal.
 *
 * How the ISAs share one algorithm: the kernels below are written once against a 16-lane
 * vector type v16 (one zmm on AVX-512, two ymm on AVX2, four q registers on NEON, a float[16]
 * in the scalar build) or, for MXFP4, an 8-lane m8, whose operations are all lane-wise. The only cross-lane operation,
 * the final tree, is done in scalar code on the stored lanes, shared by every ISA. So the
 * SIMD paths cannot reorder anything; they only change how lanes are computed.
 *
 * Batching: k3_matmul computes register tiles of rows x tokens (each weight block loaded and
 * widened once for up to 4 tokens) over column chunks whose x stays in L1;
 * k3_matmul_mxfp4 decodes each group of a row once, in registers, for up to 8 tokens whose
 * permuted x stays in L1 (column chunks of 256). A tile only decides which lanes are
 * computed together: the per-row order above does not depend on the tile, ntok or the row
 * range.
 *
 * Edge conventions: k3_argmax returns -1 when n <= 0 or every value is NaN; in
 * k3_router_topk a NaN selection score ranks as -inf; k3_rmsnorm accepts w == NULL.
 * NaN payloads are not part of the contract (which NaN propagates may differ by ISA).
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#endif
#include "k3.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(_WIN32)
#include <malloc.h> /* _aligned_malloc */
#endif

#if defined(__GNUC__)
#define K3_INLINE static inline __attribute__((always_inline))
#else
#define K3_INLINE static inline
#endif
/* Fully unroll a loop over the (at most 4) rows of a tile so its accumulators live in
 * registers instead of memory. */
#if defined(__clang__)
#define K3_UNROLL4 _Pragma("unroll 4")
#elif defined(__GNUC__)
#define K3_UNROLL4 _Pragma("GCC unroll 4")
#else
#define K3_UNROLL4
#endif
#if defined(__clang__)
#define K3_UNROLL8 _Pragma("unroll 8")
#elif defined(__GNUC__)
#define K3_UNROLL8 _Pragma("GCC unroll 8")
#else
#define K3_UNROLL8
#endif
#if defined(__GNUC__)
#define K3_PREFETCH(p) __builtin_prefetch(p)
#else
#define K3_PREFETCH(p) ((void)(p))
#endif

/* ---------------------------------------------------------------- ISA selection */

#if !defined(K3_SCALAR) && defined(__AVX512F__)
#define K3_ISA_AVX512 1
#define K3_ISA_NAME "avx512"
#include <immintrin.h>
#elif !defined(K3_SCALAR) && defined(__AVX2__)
#define K3_ISA_AVX2 1
#define K3_ISA_NAME "avx2"
#include <immintrin.h>
#elif !defined(K3_SCALAR) && defined(__ARM_NEON) && defined(__aarch64__)
#define K3_ISA_NEON 1
#define K3_ISA_NAME "neon"
#include <arm_neon.h>
#else
#define K3_ISA_SCALAR 1
#define K3_ISA_NAME "scalar"
#endif

const char *k3_isa(void) { return K3_ISA_NAME; }

int32_t k3_cpu_features(void) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  int32_t f = 0;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) f |= 1;
  if (__builtin_cpu_supports("fma")) f |= 2;
  if (__builtin_cpu_supports("f16c")) f |= 4;
  if (__builtin_cpu_supports("avx512f")) f |= 8;
  if (__builtin_cpu_supports("avx512bw")) f |= 16;
  if (__builtin_cpu_supports("avx512vl")) f |= 32;
  if (__builtin_cpu_supports("avx512dq")) f |= 64;
  return f;
#else
  return 0;
#endif
}

K3_INLINE float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

K3_INLINE float bf16_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }


/* ---------------------------------------------------------------- v16: 16 float lanes */

#if K3_ISA_AVX512
typedef __m512 v16;
K3_INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
K3_INLINE v16 v16_set1(float a) { return _mm512_set1_ps(a); }
K3_INLINE v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
K3_INLINE void v16_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
K3_INLINE v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
K3_INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
K3_INLINE v16 v16_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
K3_INLINE v16 v16_load_bf16(const uint16_t *p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

#elif K3_ISA_AVX2
typedef struct {
  __m256 a, b; /* lanes 0..7, 8..15 */
} v16;
K3_INLINE v16 v16_mk(__m256 a, __m256 b) {
  v16 r;
  r.a = a;
  r.b = b;
  return r;
}
K3_INLINE v16 v16_zero(void) { return v16_mk(_mm256_setzero_ps(), _mm256_setzero_ps()); }
K3_INLINE v16 v16_set1(float a) { return v16_mk(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
K3_INLINE v16 v16_load(const float *p) { return v16_mk(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
K3_INLINE void v16_store(float *p, v16 a) {
  _mm256_storeu_ps(p, a.a);
  _mm256_storeu_ps(p + 8, a.b);
}
K3_INLINE v16 v16_add(v16 x, v16 y) { return v16_mk(_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)); }
K3_INLINE v16 v16_mul(v16 x, v16 y) { return v16_mk(_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)); }
K3_INLINE v16 v16_div(v16 x, v16 y) { return v16_mk(_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)); }
K3_INLINE __m256 bf16x8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
K3_INLINE v16 v16_load_bf16(const uint16_t *p) {
  return v16_mk(bf16x8(_mm_loadu_si128((const __m128i *)p)),
                bf16x8(_mm_loadu_si128((const __m128i *)(p + 8))));
}
/* 16 bf16 values widened by interleaving with zero words, one unpack per 8 lanes instead of
 * a widen and a shift; the unpacks work within 128-bit halves, so the lanes come out in the
 * order BF16_LANES (lane j holds element BF16_LANES[j]). Used with x stored in that order. */
#define K3_BF16_LANES 1
static const int BF16_LANES[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
K3_INLINE v16 v16_load_bf16_lanes(const uint16_t *p) {
  __m256i w = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
  return v16_mk(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w)));
}

#elif K3_ISA_NEON
typedef struct {
  float32x4_t a, b, c, d; /* lanes 0..3, 4..7, 8..11, 12..15 */
} v16;
K3_INLINE v16 v16_mk(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  v16 r;
  r.a = a;
  r.b = b;
  r.c = c;
  r.d = d;
  return r;
}
K3_INLINE v16 v16_zero(void) {
  float32x4_t z = vdupq_n_f32(0.0f);
  return v16_mk(z, z, z, z);
}
K3_INLINE v16 v16_set1(float s) {
  float32x4_t z = vdupq_n_f32(s);
  return v16_mk(z, z, z, z);
}
K3_INLINE v16 v16_load(const float *p) {
  return v16_mk(vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12));
}
K3_INLINE void v16_store(float *p, v16 x) {
  vst1q_f32(p, x.a);
  vst1q_f32(p + 4, x.b);
  vst1q_f32(p + 8, x.c);
  vst1q_f32(p + 12, x.d);
}
K3_INLINE v16 v16_add(v16 x, v16 y) {
  return v16_mk(vaddq_f32(x.a, y.a), vaddq_f32(x.b, y.b), vaddq_f32(x.c, y.c), vaddq_f32(x.d, y.d));
}
K3_INLINE v16 v16_mul(v16 x, v16 y) {
  return v16_mk(vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b), vmulq_f32(x.c, y.c), vmulq_f32(x.d, y.d));
}
K3_INLINE v16 v16_div(v16 x, v16 y) {
  return v16_mk(vdivq_f32(x.a, y.a), vdivq_f32(x.b, y.b), vdivq_f32(x.c, y.c), vdivq_f32(x.d, y.d));
}
K3_INLINE float32x4_t bf16x4(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
K3_INLINE v16 v16_load_bf16(const uint16_t *p) {
  uint16x8_t lo = vld1q_u16(p), hi = vld1q_u16(p + 8);
  return v16_mk(bf16x4(vget_low_u16(lo)), bf16x4(vget_high_u16(lo)), bf16x4(vget_low_u16(hi)),
                bf16x4(vget_high_u16(hi)));
}

#else /* scalar: the reference definition of every lane operation */
typedef struct {
  float v[16];
} v16;
K3_INLINE v16 v16_zero(void) {
  v16 r;
  for (int l = 0; l < 16; l++) r.v[l] = 0.0f;
  return r;
}
K3_INLINE v16 v16_set1(float a) {
  v16 r;
  for (int l = 0; l < 16; l++) r.v[l] = a;
  return r;
}
K3_INLINE v16 v16_load(const float *p) {
  v16 r;
  memcpy(r.v, p, sizeof r.v);
  return r;
}
K3_INLINE void v16_store(float *p, v16 a) { memcpy(p, a.v, sizeof a.v); }
K3_INLINE v16 v16_add(v16 a, v16 b) {
  for (int l = 0; l < 16; l++) a.v[l] = a.v[l] + b.v[l];
  return a;
}
K3_INLINE v16 v16_mul(v16 a, v16 b) {
  for (int l = 0; l < 16; l++) a.v[l] = a.v[l] * b.v[l];
  return a;
}
K3_INLINE v16 v16_div(v16 a, v16 b) {
  for (int l = 0; l < 16; l++) a.v[l] = a.v[l] / b.v[l];
  return a;
}
K3_INLINE v16 v16_load_bf16(const uint16_t *p) {
  v16 r;
  for (int l = 0; l < 16; l++) r.v[l] = bf16_f32(p[l]);
  return r;
}
#endif

/* ---------------------------------------------------------------- shared building blocks */

/* The fixed tree of contract 1, in scalar code shared by all ISAs. */
K3_INLINE float v16_reduce(v16 acc) {
  float a[16];
  v16_store(a, acc);
  for (int l = 0; l < 8; l++) a[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
  a[0] = a[0] + a[2];
  a[1] = a[1] + a[3];
  return a[0] + a[1];
}

#if !defined(K3_BF16_LANES)
static const int BF16_LANES[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
K3_INLINE v16 v16_load_bf16_lanes(const uint16_t *p) { return v16_load_bf16(p); }
#endif

/* The same tree for accumulators whose lane j holds element class lanes[j]. */
K3_INLINE float v16_reduce_lanes(v16 acc, const int *lanes) {
  float a[16], e[16];
  v16_store(a, acc);
  for (int j = 0; j < 16; j++) e[lanes[j]] = a[j];
  return v16_reduce(v16_load(e));
}

/* Copy the final n < 16 elements into a zero-padded block of 16. */
K3_INLINE v16 pad_f32(const float *p, int n) {
  float b[16] = {0};
  memcpy(b, p, (size_t)n * sizeof(float));
  return v16_load(b);
}
K3_INLINE v16 pad_bf16(const uint16_t *p, int n) {
  float b[16] = {0};
  for (int i = 0; i < n; i++) b[i] = bf16_f32(p[i]);
  return v16_load(b);
}

/* Contract 1 for two f32 vectors. */
static float dot_f32(const float *a, const float *b, int n) {
  v16 acc = v16_zero();
  int i = 0;
  for (; i + 16 <= n; i += 16) acc = v16_add(acc, v16_mul(v16_load(a + i), v16_load(b + i)));
  if (i < n) acc = v16_add(acc, v16_mul(pad_f32(a + i, n - i), pad_f32(b + i, n - i)));
  return v16_reduce(acc);
}

/* Lane-wise y = y + a * x (contract 3); the scalar tail does the same per element. */
static void axpy_lanes(float *y, float a, const float *x, int n) {
  v16 av = v16_set1(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) v16_store(y + i, v16_add(v16_load(y + i), v16_mul(av, v16_load(x + i))));
  for (; i < n; i++) y[i] = y[i] + a * x[i];
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---------------------------------------------------------------- matrix check */

/* The matrix check (contract 5 in k3.h): c4 is four 64-bit lanes (one ymm on AVX2 and AVX-512,
 * two q registers on NEON, uint64_t[4] in the scalar build) and c4_unit accumulates one
 * 32-byte unit. Integer arithmetic mod 2^64 only, so every path gives the same bits. Words
 * are read little-endian (the hosts k3 builds for). */
static const uint64_t CHECK_KEY[19] = {
  0x80f4b3b5159811b6ULL, 0x1bb0bda46df1d396ULL, 0x83252a420a07d664ULL, 0x34d51b3f6e0605b4ULL,
  0x81d3742b513a982bULL, 0x6a50511684021245ULL, 0xae798d79fdc8873fULL, 0xe5139adb093fd6bbULL,
  0x011bb39417eeda40ULL, 0x62d48ab014a71b4bULL, 0x982946c2071f16b5ULL, 0x65c09985e0a56948ULL,
  0x61585b85fc3a5b4dULL, 0xf8df20075f5e38bbULL, 0x029ed767ae583be9ULL, 0x807317f97bda379eULL,
  0xfde5cf117371eff2ULL, 0xaf644af9edae2549ULL, 0xeea9b82e7c1d3126ULL,
};
#define CHECK_UNIT 32 /* bytes: 16 bf16 weights, one block of contract 1 */

#if K3_ISA_AVX512 || K3_ISA_AVX2
typedef __m256i c4;
K3_INLINE c4 c4_zero(void) { return _mm256_setzero_si256(); }
/* a[i] += d[i] + lo32(x[i]) * hi32(x[i]), x = d ^ key[i] */
K3_INLINE c4 c4_unit(c4 a, const void *p, const uint64_t *key) {
  __m256i d = _mm256_loadu_si256((const __m256i *)p);
  __m256i x = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)key));
  return _mm256_add_epi64(a, _mm256_add_epi64(d, _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32))));
}
K3_INLINE void c4_store(uint64_t *o, c4 a) { _mm256_storeu_si256((__m256i *)o, a); }
#elif K3_ISA_NEON
typedef struct {
  uint64x2_t a, b;
} c4;
K3_INLINE c4 c4_zero(void) {
  c4 r = {vdupq_n_u64(0), vdupq_n_u64(0)};
  return r;
}
K3_INLINE uint64x2_t c2_unit(uint64x2_t a, uint64x2_t d, const uint64_t *key) {
  uint64x2_t x = veorq_u64(d, vld1q_u64(key));
  return vaddq_u64(a, vaddq_u64(d, vmull_u32(vmovn_u64(x), vshrn_n_u64(x, 32))));
}
K3_INLINE c4 c4_unit(c4 a, const void *p, const uint64_t *key) {
  const uint8_t *b = (const uint8_t *)p;
  c4 r = {c2_unit(a.a, vreinterpretq_u64_u8(vld1q_u8(b)), key),
          c2_unit(a.b, vreinterpretq_u64_u8(vld1q_u8(b + 16)), key + 2)};
  return r;
}
K3_INLINE void c4_store(uint64_t *o, c4 a) {
  vst1q_u64(o, a.a);
  vst1q_u64(o + 2, a.b);
}
#else /* scalar: the reference definition */
typedef struct {
  uint64_t w[4];
} c4;
K3_INLINE c4 c4_zero(void) {
  c4 r = {{0, 0, 0, 0}};
  return r;
}
K3_INLINE c4 c4_unit(c4 a, const void *p, const uint64_t *key) {
  uint64_t d[4];
  memcpy(d, p, sizeof d);
  for (int i = 0; i < 4; i++) {
    uint64_t x = d[i] ^ key[i];
    a.w[i] += d[i] + (x & 0xFFFFFFFFu) * (x >> 32);
  }
  return a;
}
K3_INLINE void c4_store(uint64_t *o, c4 a) { memcpy(o, a.w, sizeof a.w); }
#endif

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

/* ---------------------------------------------------------------- memory, conversions */

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

void k3_bf16_to_f32(const uint16_t *src, float *dst, int32_t n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) v16_store(dst + i, v16_load_bf16(src + i));
  for (; i < n; i++) dst[i] = bf16_f32(src[i]);
}

/* IEEE binary16 -> binary32, exact (subnormals normalised, inf and NaN kept). */
static float f16_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
  if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    e = 113; /* 127 - 15 + 1, decremented while normalising */
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    return bits_f32(sign | (e << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

void k3_f16_to_f32(const uint16_t *src, float *dst, int32_t n) {
  for (int i = 0; i < n; i++) dst[i] = f16_f32(src[i]);
}

/* ---------------------------------------------------------------- dense matmul */

enum { TILE_TOK = 8 }; /* MXFP4: tokens sharing one decode of the weights */

/* Dense tiles: MM_R rows x up to MM_T tokens of accumulators held in registers, so each
 * weight block is loaded (and widened) once for all the tile's tokens. With several tokens
 * the columns are walked in chunks of MM_KC, x is first copied chunk-major into a per-thread
 * buffer (the rows of x are cols * 4 bytes apart, often a multiple of 4 KB, and would all
 * fall in the same L1 sets), and the accumulators are parked in memory between chunks.
 * None of this changes any row's order (contract 1: blocks ascending, one lane chain per
 * i % 16); with bf16 weights the packed x is stored in BF16_LANES order, so a lane may hold
 * another element class than its index, and v16_reduce_lanes puts the classes back before
 * the tree. */
#if defined(MM_R) /* a build may force the tile height (arm_check runs both heights) */
#elif K3_ISA_AVX512
#define MM_R 4 /* 16 zmm accumulators */
#else
#define MM_R 1 /* AVX2: 8 ymm accumulators; 4 tokens share one widened weight block */
#endif
#define MM_T 4
enum { MM_R1 = 4 };      /* rows per pass for a single token (memory-bound: 4 streams) */
enum { MM_KC = 256 };    /* columns per chunk with several tokens: 16 tokens x 1 KB of x */
enum { MM_TSUPER = 16 }; /* tokens whose accumulators are parked together */

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
static K3_TLS float *xpack_buf;
static K3_TLS size_t xpack_cap;
static float *xpack_get(size_t n) {
  if (n > xpack_cap) {
    k3_free(xpack_buf);
    xpack_buf = (float *)k3_alloc((uint64_t)n * sizeof(float));
    xpack_cap = xpack_buf ? n : 0;
  }
  return xpack_buf;
}

/* x of tn tokens, chunk-major: chunk c of token t at (c * tn + t) * MM_KC, each block of 16
 * in lane order when `lanes`, the final partial block zero padded. */
static void xpack_fill(float *xp, const float *x, int tn, int cols, int lanes) {
  int nchunk = (cols + MM_KC - 1) / MM_KC;
  for (int c = 0; c < nchunk; c++)
    for (int t = 0; t < tn; t++) {
      const float *src = x + (size_t)t * cols + (size_t)c * MM_KC;
      float *dst = xp + ((size_t)c * tn + t) * MM_KC;
      int n = cols - c * MM_KC < MM_KC ? cols - c * MM_KC : MM_KC;
      for (int b = 0; b < n; b += 16) {
        float blk[16] = {0};
        memcpy(blk, src + b, (size_t)(n - b < 16 ? n - b : 16) * sizeof(float));
        for (int j = 0; j < 16; j++) dst[b + j] = lanes ? blk[BF16_LANES[j]] : blk[j];
      }
    }
}

/* One instance per weight type so wtype is a constant inside the loops.
 * One token: passes of MM_R1 rows over whole rows (weight streaming at memory speed).
 * Several: blocks of MM_RB rows; for each chunk of columns, every row of the block runs its
 * tiles against that chunk of x for all tokens, which stays in L1 (walking whole rows per row
 * would stream all of x from L2 for every row). */
enum { MM_RB = 8 };
K3_INLINE void matmul_t(const void *w, int wtype, const float *x, float *y, int ntok, int rows,
                        int cols, int r0, int r1, uint64_t *sum) {
  v16 acc[MM_RB][MM_TSUPER];
  c4 ck[MM_R1];
  int nchunk = (cols + MM_KC - 1) / MM_KC;
  size_t esize = wtype == K3_BF16 ? 2 : 4;
  for (int ts = 0; ts < ntok;) {
    int tn = ntok - ts < MM_TSUPER ? ntok - ts : MM_TSUPER;
    float *xp = tn > 1 ? xpack_get((size_t)nchunk * tn * MM_KC) : NULL;
    if (!xp) { /* one token (or no scratch: one token at a time) */
      const float *xt[1] = {x + (size_t)ts * cols};
      for (int r = r0; r < r1;) {
        int nr = r1 - r >= MM_R1 ? MM_R1 : 1;
        const void *wr[MM_R1];
        for (int k = 0; k < nr; k++) {
          wr[k] = row_ptr(w, wtype, r + k, cols);
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
    int lanes = wtype == K3_BF16;
    xpack_fill(xp, x + (size_t)ts * cols, tn, cols, lanes);
    for (int rb = r0; rb < r1; rb += MM_RB) {
      int rbn = r1 - rb < MM_RB ? r1 - rb : MM_RB;
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++) acc[k][t] = v16_zero();
      for (int c = 0; c < nchunk; c++) {
        int i0 = c * MM_KC, i1 = cols - i0 < MM_KC ? cols : i0 + MM_KC;
        for (int r = rb; r < rb + rbn;) {
          int nr = rb + rbn - r >= MM_R ? MM_R : 1;
          const void *wr[MM_R1];
          for (int k = 0; k < nr; k++) {
            wr[k] = row_ptr(w, wtype, r + k, cols);
            /* the row's next chunk, a whole block-pass ahead of its use */
            for (size_t b = 0; c + 1 < nchunk && b < (size_t)MM_KC * esize; b += 64)
              K3_PREFETCH((const char *)wr[k] + (size_t)i1 * esize + b);
          }
          for (int t0 = 0; t0 < tn; t0 += MM_T) {
            int nt = tn - t0 < MM_T ? tn - t0 : MM_T;
            const float *xt[MM_T];
            /* offset so that xt[t] + i addresses column i of this chunk */
            for (int t = 0; t < nt; t++) xt[t] = xp + ((size_t)c * tn + t0 + t) * MM_KC - i0;
            v16(*at)[MM_TSUPER] = (v16(*)[MM_TSUPER]) & acc[r - rb][t0];
            mm_tile_n(wr, wtype, lanes, xt, nr, nt, i0, i1, cols, at, 1, NULL);
          }
          r += nr;
        }
      }
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++)
          y[(size_t)(ts + t) * rows + rb + k] = lanes ? v16_reduce_lanes(acc[k][t], BF16_LANES) : v16_reduce(acc[k][t]);
    }
    ts += tn;
  }
  /* several tokens: the tiles hold each weight block for a moment only; one pass after */
  if (sum && ntok > 1) *sum += check_rows(row_ptr(w, wtype, r0, cols), (size_t)cols * esize, r0, r1);
}

static void matmul_f32(const void *w, const float *x, float *y, int ntok, int rows, int cols, int r0, int r1,
                       uint64_t *sum) {
  matmul_t(w, K3_F32, x, y, ntok, rows, cols, r0, r1, sum);
}
static void matmul_bf16(const void *w, const float *x, float *y, int ntok, int rows, int cols, int r0, int r1,
                        uint64_t *sum) {
  matmul_t(w, K3_BF16, x, y, ntok, rows, cols, r0, r1, sum);
}

void k3_matmul_checked(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
                       int32_t cols, int32_t r0, int32_t r1, uint64_t *sum) {
  if (wtype == K3_BF16)
    matmul_bf16(w, x, y, ntok, rows, cols, r0, r1, sum);
  else if (wtype == K3_F32)
    matmul_f32(w, x, y, ntok, rows, cols, r0, r1, sum);
}

void k3_matmul(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
               int32_t cols, int32_t r0, int32_t r1) {
  k3_matmul_checked(w, wtype, x, y, ntok, rows, cols, r0, r1, NULL);
}

/* ---------------------------------------------------------------- MXFP4 matmul */

/* m8: the 8 lanes of an MXFP4 row accumulator (contract 2): one ymm on AVX2 (and on AVX-512,
 * where a zmm would need a second decode per group), two q registers on NEON, a float[8] in
 * the scalar build. mx8_decode turns one group (16 packed bytes) into its 32 doubled E2M1
 * values as four m8, v[j] lane l holding element MX_ELEM(j, l) of the group. */
#define MX_ELEM(j, l) (16 * ((j) >> 1) + 4 * ((l) & 3) + 2 * ((j) & 1) + ((l) >> 2))

/* The bf16 bit pattern of twice the E2M1 value, by nibble, as its high and low byte (doubled
 * E2M1 values are exact bf16 numbers; nibble 8, the E2M1 -0, gives +0). */
static const uint8_t E2M1X2_BF16_HI[16] = {0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41,
                                           0x00, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1};
static const uint8_t E2M1X2_BF16_LO[16] = {0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                           0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40};

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

#if !defined(K3_SCALAR) && defined(__AVX2__)
typedef __m256 m8;
K3_INLINE m8 m8_zero(void) { return _mm256_setzero_ps(); }
K3_INLINE m8 m8_load(const float *p) { return _mm256_loadu_ps(p); }
K3_INLINE void m8_store(float *p, m8 a) { _mm256_storeu_ps(p, a); }
K3_INLINE m8 m8_add(m8 a, m8 b) { return _mm256_add_ps(a, b); }
K3_INLINE m8 m8_mul(m8 a, m8 b) { return _mm256_mul_ps(a, b); }
K3_INLINE m8 m8_bcast(const float *p) { return _mm256_broadcast_ss(p); }
/* The decode's constants, made once per call so that they stay in registers. */
typedef struct {
  __m256i th, tl, nib, sh, top;
} mxc;
K3_INLINE mxc mx_consts(void) {
  mxc c;
  c.th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)E2M1X2_BF16_HI));
  c.tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)E2M1X2_BF16_LO));
  c.nib = _mm256_set1_epi8(15);
  c.sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  c.top = _mm256_set1_epi32((int)0xFFFF0000u);
  return c;
}
/* Both halves of a ymm get the 16 bytes; the low half keeps the low nibbles (even elements),
 * the high half the high ones (odd elements). Two byte lookups give the high and low bytes of
 * each value's bf16 pattern, two unpacks pair them into 16-bit words, and each word becomes
 * an f32 by a shift (even words) or a mask (odd words): no conversion, no cross-lane move. */
K3_INLINE void mx8_decode(mxc c, const uint8_t *p, m8 *v) {
  __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
  __m256i n = _mm256_and_si256(_mm256_srlv_epi32(b, c.sh), c.nib);
  __m256i h = _mm256_shuffle_epi8(c.th, n), l = _mm256_shuffle_epi8(c.tl, n);
  __m256i w0 = _mm256_unpacklo_epi8(l, h), w1 = _mm256_unpackhi_epi8(l, h);
  v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
  v[1] = _mm256_castsi256_ps(_mm256_and_si256(w0, c.top));
  v[2] = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
  v[3] = _mm256_castsi256_ps(_mm256_and_si256(w1, c.top));
}

#elif K3_ISA_NEON
typedef struct {
  float32x4_t a, b; /* lanes 0..3, 4..7 */
} m8;
K3_INLINE m8 m8_mk(float32x4_t a, float32x4_t b) {
  m8 r;
  r.a = a;
  r.b = b;
  return r;
}
K3_INLINE m8 m8_zero(void) { return m8_mk(vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)); }
K3_INLINE m8 m8_load(const float *p) { return m8_mk(vld1q_f32(p), vld1q_f32(p + 4)); }
K3_INLINE void m8_store(float *p, m8 x) {
  vst1q_f32(p, x.a);
  vst1q_f32(p + 4, x.b);
}
K3_INLINE m8 m8_add(m8 x, m8 y) { return m8_mk(vaddq_f32(x.a, y.a), vaddq_f32(x.b, y.b)); }
K3_INLINE m8 m8_mul(m8 x, m8 y) { return m8_mk(vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b)); }
K3_INLINE m8 m8_bcast(const float *p) { return m8_mk(vld1q_dup_f32(p), vld1q_dup_f32(p)); }
/* The AVX2 decode's lane order with q registers: a table lookup per nibble half and byte,
 * zips into 16-bit words, shift (even words) or mask (odd words) to f32. */
K3_INLINE float32x4_t mx_even(uint8x16_t w) { return vreinterpretq_f32_u32(vshlq_n_u32(vreinterpretq_u32_u8(w), 16)); }
K3_INLINE float32x4_t mx_odd(uint8x16_t w) {
  return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_u8(w), vdupq_n_u32(0xFFFF0000u)));
}
typedef int mxc; /* no constants to hoist */
K3_INLINE mxc mx_consts(void) { return 0; }
K3_INLINE void mx8_decode(mxc c, const uint8_t *p, m8 *v) {
  (void)c;
  uint8x16_t th = vld1q_u8(E2M1X2_BF16_HI), tl = vld1q_u8(E2M1X2_BF16_LO), b = vld1q_u8(p);
  uint8x16_t lo = vandq_u8(b, vdupq_n_u8(15)), hi = vshrq_n_u8(b, 4);
  uint8x16_t hl = vqtbl1q_u8(th, lo), ll = vqtbl1q_u8(tl, lo), hh = vqtbl1q_u8(th, hi), lh = vqtbl1q_u8(tl, hi);
  uint8x16_t la = vzip1q_u8(ll, hl), lb = vzip2q_u8(ll, hl), ha = vzip1q_u8(lh, hh), hb = vzip2q_u8(lh, hh);
  v[0] = m8_mk(mx_even(la), mx_even(ha));
  v[1] = m8_mk(mx_odd(la), mx_odd(ha));
  v[2] = m8_mk(mx_even(lb), mx_even(hb));
  v[3] = m8_mk(mx_odd(lb), mx_odd(hb));
}

#else /* scalar: the reference definition */
typedef struct {
  float v[8];
} m8;
K3_INLINE m8 m8_zero(void) {
  m8 r;
  for (int l = 0; l < 8; l++) r.v[l] = 0.0f;
  return r;
}
K3_INLINE m8 m8_load(const float *p) {
  m8 r;
  memcpy(r.v, p, sizeof r.v);
  return r;
}
K3_INLINE void m8_store(float *p, m8 a) { memcpy(p, a.v, sizeof a.v); }
K3_INLINE m8 m8_add(m8 a, m8 b) {
  for (int l = 0; l < 8; l++) a.v[l] = a.v[l] + b.v[l];
  return a;
}
K3_INLINE m8 m8_mul(m8 a, m8 b) {
  for (int l = 0; l < 8; l++) a.v[l] = a.v[l] * b.v[l];
  return a;
}
K3_INLINE m8 m8_bcast(const float *p) {
  m8 r;
  for (int l = 0; l < 8; l++) r.v[l] = *p;
  return r;
}
typedef int mxc; /* no constants to hoist */
K3_INLINE mxc mx_consts(void) { return 0; }
K3_INLINE void mx8_decode(mxc c, const uint8_t *p, m8 *v) {
  (void)c;
  for (int j = 0; j < 4; j++)
    for (int l = 0; l < 8; l++) {
      int e = MX_ELEM(j, l), nib = e & 1 ? p[e >> 1] >> 4 : p[e >> 1] & 15;
      v[j].v[l] = bits_f32((uint32_t)E2M1X2_BF16_HI[nib] << 24 | (uint32_t)E2M1X2_BF16_LO[nib] << 16);
    }
}
#endif

/* The 8-lane tree of contract 2, in scalar code shared by all ISAs. */
K3_INLINE float m8_reduce(m8 acc) {
  float a[8];
  m8_store(a, acc);
  for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
  a[0] = a[0] + a[2];
  a[1] = a[1] + a[3];
  return a[0] + a[1];
}

/* One group's contribution to one row's lanes (contract 2): w = the decoded group, xg = its
 * x in MX_ELEM order, sc = its scale. */
K3_INLINE m8 mx_group(m8 acc, const m8 *w, const float *xg, m8 sc) {
  m8 a = m8_add(m8_mul(w[0], m8_load(xg)), m8_mul(w[1], m8_load(xg + 8)));
  m8 b = m8_add(m8_mul(w[2], m8_load(xg + 16)), m8_mul(w[3], m8_load(xg + 24)));
  return m8_add(acc, m8_mul(m8_add(a, b), sc));
}

/* x of one token in contract 2's lane order: xp[32g + 8j + l] = x[32g + MX_ELEM(j, l)]. */
static const uint8_t MX_PERM[32] = {
#define K3_MXP(j) MX_ELEM(j, 0), MX_ELEM(j, 1), MX_ELEM(j, 2), MX_ELEM(j, 3), MX_ELEM(j, 4), MX_ELEM(j, 5), MX_ELEM(j, 6), MX_ELEM(j, 7)
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
  for (int g = 0; g < ng; g++) {
    K3_UNROLL4
    for (int k = 0; k < nr; k++) {
      uint8_t sc = s[k][g];
      if (sc != 255) {
        m8 w[4];
        mx8_decode(c, p[k] + 16 * g, w);
        acc[k] = mx_group(acc[k], w, xp + 32 * g, m8_bcast(&MX_SCALE[sc].f));
      }
      /* the packed row's check takes each 32-byte unit (two groups) as it goes by,
       * skipped groups included */
      if (check && (g & 1)) cc[k] = c4_unit(cc[k], p[k] + 16 * (g - 1), check_key((size_t)g / 2));
    }
  }
  K3_UNROLL4
  for (int k = 0; k < nr; k++) {
    out[k] = m8_reduce(acc[k]);
    if (check && (ng & 1)) cc[k] = c4_pad(cc[k], p[k] + 16 * (ng - 1), 16, (size_t)ng / 2);
    if (check) ck[k] = cc[k];
  }
}

/* Several tokens: one row's groups [g0, g1), each decoded once in registers for the nt
 * tokens of a tile; xt + t * kc + 32 * (g - g0) is token t's permuted x of group g. */
enum { MX_TT = 8 };      /* tokens per tile (their accumulators stay in registers) */
enum { MX_KG = 8 };      /* groups per column chunk: 16 tokens x 256 columns of x stay in L1 */
enum { MX_RB = 8 };      /* rows per block whose accumulators are parked between chunks */
enum { MX_TSUPER = 16 }; /* tokens per packed x */
K3_INLINE void mx_tile(mxc c, const uint8_t *p, const uint8_t *s, int g0, int g1, const float *xt, int nt,
                       m8 *acc) {
  enum { kc = 32 * MX_KG };
  m8 a[MX_TT];
  K3_UNROLL8
  for (int t = 0; t < nt; t++) a[t] = acc[t];
  for (int g = g0; g < g1; g++) {
    uint8_t sc = s[g];
    if (sc != 255) {
      m8 w[4], sv = m8_bcast(&MX_SCALE[sc].f);
      mx8_decode(c, p + 16 * g, w);
      const float *xg = xt + 32 * (g - g0);
      K3_UNROLL8
      for (int t = 0; t < nt; t++) a[t] = mx_group(a[t], w, xg + t * kc, sv);
    }
  }
  K3_UNROLL8
  for (int t = 0; t < nt; t++) acc[t] = a[t];
}
K3_INLINE void mx_tile_n(mxc c, const uint8_t *p, const uint8_t *s, int g0, int g1, const float *xt, int nt,
                         m8 *acc) {
  switch (nt) { /* a constant tile width per instance */
#define K3_MXT(T)                        \
  case T:                                \
    mx_tile(c, p, s, g0, g1, xt, T, acc); \
    break;
    K3_MXT(1) K3_MXT(2) K3_MXT(3) K3_MXT(4) K3_MXT(5) K3_MXT(6) K3_MXT(7) default : mx_tile(c, p, s, g0, g1, xt, MX_TT, acc);
#undef K3_MXT
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
          m8 w[4];
          mx_xperm(xg, x + (size_t)t * cols + 32 * g, 1);
          mx8_decode(mc, pr + 16 * g, w);
          acc = mx_group(acc, w, xg, m8_bcast(&MX_SCALE[sr[g]].f));
        }
        y[(size_t)t * rows + r] = m8_reduce(acc);
      }
    mx_check_after(packed, scales, cols, r0, r1, sums);
    return;
  }
  if (ntok == 1) { /* passes of MX_R1 whole rows (weights streaming, x in L1) */
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
  /* Several tokens: x of up to MX_TSUPER tokens permuted chunk-major (chunk c of token t at
   * (c * tn + t) * kc); for each block of rows and each chunk, every row's groups are decoded
   * once per tile of MX_TT tokens. */
  m8 acc[MX_RB][MX_TSUPER];
  for (int ts = 0; ts < ntok; ts += MX_TSUPER) {
    int tn = ntok - ts < MX_TSUPER ? ntok - ts : MX_TSUPER;
    for (int c = 0; c < nchunk; c++)
      for (int t = 0; t < tn; t++) {
        int gn = ng - c * MX_KG < MX_KG ? ng - c * MX_KG : MX_KG;
        mx_xperm(xp + ((size_t)c * tn + t) * kc, x + (size_t)(ts + t) * cols + (size_t)c * kc, gn);
      }
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
            mx_tile_n(mc, pr, sr, g0, g1, xp + ((size_t)c * tn + t0) * kc, nt, &acc[k][t0]);
          }
        }
      }
      for (int k = 0; k < rbn; k++)
        for (int t = 0; t < tn; t++) y[(size_t)(ts + t) * rows + rb + k] = m8_reduce(acc[k][t]);
    }
  }
  mx_check_after(packed, scales, cols, r0, r1, sums);
}

/* ---------------------------------------------------------------- norms and activations */

/* y = x / r * w lane-wise (w NULL: no gain). */
static void div_gain(const float *x, const float *w, float *y, float r, int n) {
  v16 rv = v16_set1(r);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 v = v16_div(v16_load(x + i), rv);
    if (w) v = v16_mul(v, v16_load(w + i));
    v16_store(y + i, v);
  }
  for (; i < n; i++) y[i] = w ? (x[i] / r) * w[i] : x[i] / r;
}

void k3_rmsnorm(const float *x, const float *w, float *y, int32_t n, int32_t ngroups, float eps) {
  for (int g = 0; g < ngroups; g++) {
    const float *xg = x + (size_t)g * n;
    float r = sqrtf(dot_f32(xg, xg, n) / (float)n + eps);
    div_gain(xg, w, y + (size_t)g * n, r, n);
  }
}

void k3_l2norm(float *x, int32_t d, int32_t nheads, float eps) {
  for (int h = 0; h < nheads; h++) {
    float *xh = x + (size_t)h * d;
    float r = sqrtf(dot_f32(xh, xh, d) + eps);
    div_gain(xh, NULL, xh, r, d);
  }
}

void k3_situ_glu(const float *g, const float *u, float *out, int32_t n, float b1, float b2) {
  for (int i = 0; i < n; i++) {
    float gi = g[i], ui = u[i];
    float a = (b1 * tanhf(gi / b1)) * sigm(gi);
    float v = b2 * tanhf(ui / b2);
    out[i] = a * v;
  }
}

void k3_short_conv(float *state, const float *w, const float *x, float *y, int32_t channels) {
  for (int c = 0; c < channels; c++) {
    float *s = state + 3 * (size_t)c;
    const float *wc = w + 4 * (size_t)c;
    float xc = x[c];
    float z = wc[0] * s[0];
    z = z + wc[1] * s[1];
    z = z + wc[2] * s[2];
    z = z + wc[3] * xc;
    s[0] = s[1];
    s[1] = s[2];
    s[2] = xc;
    y[c] = z * sigm(z);
  }
}

void k3_kda_decay(const float *f, const float *a_log, const float *dt_bias, float *alpha,
                  int32_t nheads, int32_t d, float lb) {
  for (int h = 0; h < nheads; h++) {
    float a = expf(a_log[h]);
    for (int i = 0; i < d; i++) {
      size_t j = (size_t)h * d + i;
      alpha[j] = expf(lb * sigm(a * (f[j] + dt_bias[j])));
    }
  }
}

/* ---------------------------------------------------------------- KDA step */

enum { KDA_COLS = 256 }; /* columns are independent, so they are processed in chunks */

void k3_kda_step(float *S, const float *q, const float *k, const float *v, const float *beta,
                 const float *alpha, float *o, int32_t d, int32_t h0, int32_t h1) {
  float sd = sqrtf((float)d);
  for (int h = h0; h < h1; h++) {
    float *Sh = S + (size_t)h * d * d;
    const float *qh = q + (size_t)h * d, *kh = k + (size_t)h * d, *vh = v + (size_t)h * d;
    const float *ah = alpha + (size_t)h * d;
    float *oh = o + (size_t)h * d;
    float b = beta[h];
    for (int j0 = 0; j0 < d; j0 += KDA_COLS) {
      int nc = d - j0 < KDA_COLS ? d - j0 : KDA_COLS;
      float u[KDA_COLS];
      /* Pass 1: S = Diag(alpha) S; u = S^T k (rows ascending). */
      memset(u, 0, sizeof u);
      for (int i = 0; i < d; i++) {
        float *row = Sh + (size_t)i * d + j0;
        float ai = ah[i], ki = kh[i];
        v16 av = v16_set1(ai), kv = v16_set1(ki);
        int j = 0;
        for (; j + 16 <= nc; j += 16) {
          v16 sv = v16_mul(v16_load(row + j), av);
          v16_store(row + j, sv);
          v16_store(u + j, v16_add(v16_load(u + j), v16_mul(kv, sv)));
        }
        for (; j < nc; j++) {
          row[j] = row[j] * ai;
          u[j] = u[j] + ki * row[j];
        }
      }
      /* delta = beta (v - u), kept in u. */
      for (int j = 0; j < nc; j++) u[j] = b * (vh[j0 + j] - u[j]);
      /* Pass 2: S += k delta^T; o = S^T (q / sqrt(d)) (rows ascending). */
      float *oc = oh + j0;
      memset(oc, 0, (size_t)nc * sizeof(float));
      for (int i = 0; i < d; i++) {
        float *row = Sh + (size_t)i * d + j0;
        float ki = kh[i], qi = qh[i] / sd;
        v16 kv = v16_set1(ki), qv = v16_set1(qi);
        int j = 0;
        for (; j + 16 <= nc; j += 16) {
          v16 sv = v16_add(v16_load(row + j), v16_mul(kv, v16_load(u + j)));
          v16_store(row + j, sv);
          v16_store(oc + j, v16_add(v16_load(oc + j), v16_mul(qv, sv)));
        }
        for (; j < nc; j++) {
          row[j] = row[j] + ki * u[j];
          oc[j] = oc[j] + qi * row[j];
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- MLA attention */

void k3_mla_attend(const float *q, const float *knope, const float *krope, const float *v,
                   float *out, float *scores, int32_t npos, int32_t nheads, int32_t kvheads,
                   int32_t dn, int32_t dr, int32_t dv, float scale, int32_t h0, int32_t h1) {
  (void)nheads;
  int dq = dn + dr;
  /* Positions outer, heads inner, so a cache row is read once for all heads; every score
   * and every output element still sees positions in ascending order. */
  for (int s = 0; s < npos; s++) {
    for (int h = h0; h < h1; h++) {
      int kh = kvheads == 1 ? 0 : h;
      const float *qh = q + (size_t)h * dq;
      float a = dot_f32(qh, knope + ((size_t)s * kvheads + kh) * dn, dn);
      float b = dot_f32(qh + dn, krope + (size_t)s * dr, dr);
      scores[(size_t)h * npos + s] = (a + b) * scale;
    }
  }
  for (int h = h0; h < h1; h++) {
    float *sc = scores + (size_t)h * npos;
    float m = -INFINITY;
    for (int s = 0; s < npos; s++)
      if (sc[s] > m) m = sc[s];
    float z = 0.0f;
    for (int s = 0; s < npos; s++) {
      sc[s] = expf(sc[s] - m);
      z = z + sc[s];
    }
    for (int s = 0; s < npos; s++) sc[s] = sc[s] / z;
    memset(out + (size_t)h * dv, 0, (size_t)dv * sizeof(float));
  }
  for (int s = 0; s < npos; s++) {
    for (int h = h0; h < h1; h++) {
      int kh = kvheads == 1 ? 0 : h;
      axpy_lanes(out + (size_t)h * dv, scores[(size_t)h * npos + s], v + ((size_t)s * kvheads + kh) * dv, dv);
    }
  }
}

void k3_mla_absorb(const void *kvb, int32_t wtype, const float *q, float *qlat, int32_t nheads,
                   int32_t dn, int32_t dr, int32_t dv, int32_t dc, int32_t h0, int32_t h1) {
  (void)nheads;
  for (int h = h0; h < h1; h++) {
    const float *qn = q + (size_t)h * (dn + dr);
    float *y = qlat + (size_t)h * (dc + dr);
    memset(y, 0, (size_t)dc * sizeof(float));
    /* Contract 3: each y[j] is a sequential sum over the key rows i. */
    for (int i = 0; i < dn; i++) {
      size_t row = ((size_t)h * (dn + dv) + (size_t)i) * (size_t)dc;
      if (wtype == K3_BF16) {
        const uint16_t *w = (const uint16_t *)kvb + row;
        for (int j = 0; j < dc; j++) y[j] = y[j] + bf16_f32(w[j]) * qn[i];
      } else {
        const float *w = (const float *)kvb + row;
        for (int j = 0; j < dc; j++) y[j] = y[j] + w[j] * qn[i];
      }
    }
    memcpy(y + dc, qn + dn, (size_t)dr * sizeof(float));
  }
}

void k3_mla_expand(const void *kvb, int32_t wtype, const float *olat, float *out, int32_t nheads,
                   int32_t dn, int32_t dv, int32_t dc, int32_t h0, int32_t h1) {
  (void)nheads;
  size_t esize = wtype == K3_BF16 ? 2 : 4;
  for (int h = h0; h < h1; h++) {
    const char *wv = (const char *)kvb + ((size_t)h * (dn + dv) + (size_t)dn) * (size_t)dc * esize;
    k3_matmul(wv, wtype, olat + (size_t)h * dc, out + (size_t)h * dv, 1, dv, dc, 0, dv);
  }
}

/* ---------------------------------------------------------------- router */

/* Selection order: larger score first, ties to the lower index; NaN ranks as -inf. */
K3_INLINE int ranks_before(float ka, int a, float kb, int b) { return ka > kb || (ka == kb && a < b); }

int32_t k3_router_topk(const float *logits, const float *bias, int32_t nexperts, int32_t k,
                       float scale, int32_t *ids, float *weights) {
  if (k > nexperts) k = nexperts;
  if (k < 0) k = 0;
  int prev = -1;
  float kprev = 0.0f;
  /* Pick j is the best expert ranking strictly after pick j-1: O(k n), no scratch. */
  for (int j = 0; j < k; j++) {
    int best = -1;
    float kbest = 0.0f;
    for (int e = 0; e < nexperts; e++) {
      float ke = sigm(logits[e]) + (bias ? bias[e] : 0.0f);
      if (ke != ke) ke = -INFINITY;
      if (prev >= 0 && !ranks_before(kprev, prev, ke, e)) continue;
      if (best < 0 || ranks_before(ke, e, kbest, best)) {
        best = e;
        kbest = ke;
      }
    }
    ids[j] = best;
    prev = best;
    kprev = kbest;
  }
  float sum = 0.0f;
  for (int j = 0; j < k; j++) sum = sum + sigm(logits[ids[j]]);
  for (int j = 0; j < k; j++) weights[j] = sigm(logits[ids[j]]) / (sum + 1e-20f) * scale;
  return k;
}

/* ---------------------------------------------------------------- Attention Residuals */

/* score = dot(src / rms(src), norm_w * proj_w), contract 1 with the element product
 * ((src_j / r) * (norm_w_j * proj_w_j)). */
static float attnres_score(const float *src, int n, const float *nw, const float *pw, float eps) {
  float r = sqrtf(dot_f32(src, src, n) / (float)n + eps);
  v16 rv = v16_set1(r), acc = v16_zero();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 a = v16_div(v16_load(src + i), rv), f = v16_mul(v16_load(nw + i), v16_load(pw + i));
    acc = v16_add(acc, v16_mul(a, f));
  }
  if (i < n) {
    int m = n - i;
    v16 a = v16_div(pad_f32(src + i, m), rv), f = v16_mul(pad_f32(nw + i, m), pad_f32(pw + i, m));
    acc = v16_add(acc, v16_mul(a, f));
  }
  return v16_reduce(acc);
}

enum { ATTNRES_CACHE = 256 }; /* scores beyond this many sources are recomputed (same bits) */

void k3_attnres(const float *src, int32_t nsrc, int32_t n, const float *norm_w,
                const float *proj_w, float eps, float *out) {
  float cache[ATTNRES_CACHE];
#define K3_SCORE(i) \
  ((i) < ATTNRES_CACHE ? cache[i] : attnres_score(src + (size_t)(i) * n, n, norm_w, proj_w, eps))
  float m = -INFINITY;
  for (int i = 0; i < nsrc; i++) {
    float s = attnres_score(src + (size_t)i * n, n, norm_w, proj_w, eps);
    if (i < ATTNRES_CACHE) cache[i] = s;
    if (s > m) m = s;
  }
  float z = 0.0f;
  for (int i = 0; i < nsrc; i++) z = z + expf(K3_SCORE(i) - m);
  memset(out, 0, (size_t)n * sizeof(float));
  for (int i = 0; i < nsrc; i++) axpy_lanes(out, expf(K3_SCORE(i) - m) / z, src + (size_t)i * n, n);
#undef K3_SCORE
}

/* ---------------------------------------------------------------- elementwise */

void k3_add(float *y, const float *x, int32_t n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) v16_store(y + i, v16_add(v16_load(y + i), v16_load(x + i)));
  for (; i < n; i++) y[i] = y[i] + x[i];
}

void k3_axpy(float *y, float a, const float *x, int32_t n) { axpy_lanes(y, a, x, n); }

void k3_sigmoid_mul(float *y, const float *g, int32_t n) {
  for (int i = 0; i < n; i++) y[i] = y[i] * sigm(g[i]);
}

void k3_sigmoid(const float *x, float *y, int32_t n) {
  for (int i = 0; i < n; i++) y[i] = sigm(x[i]);
}

int32_t k3_argmax(const float *x, int32_t n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = i;
  return best;
}

/* ---------------------------------------------------------------- memory read probe */

uint64_t k3_read_sum(const void *p, uint64_t bytes) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t a[8] = {0}, n = bytes / 8, i = 0;
  /* eight independent chains of 8-byte loads: far more than DRAM can deliver per core */
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) {
      uint64_t v;
      memcpy(&v, b + 8 * (i + j), 8);
      a[j] ^= v;
    }
  for (; i < n; i++) {
    uint64_t v;
    memcpy(&v, b + 8 * i, 8);
    a[0] ^= v;
  }
  if (bytes % 8) {
    uint64_t v = 0;
    memcpy(&v, b + 8 * n, (size_t)(bytes % 8)); /* little-endian hosts: the low bytes */
    a[0] ^= v;
  }
  return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}
