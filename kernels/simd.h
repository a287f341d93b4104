/*
 * k3 kernels: the lane types every kernel is written against, one definition per ISA
 * (AVX-512, AVX2, NEON, scalar), and the accumulation order they all follow. The products
 * (products.c) and the ops (ops.c) include this header and contain no ISA-specific code;
 * k3.h says what each exported function computes.
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
 *    is the one an AVX2 decode produces without moving data across lanes (see mx8_decode;
 *    AVX-512 decodes by table lookups and holds the lanes permuted, MX_XL, see there, and
 *    its one-token path takes two groups per zmm, MXP_ELEM, still one group after the other);
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
 * Transcendentals (exp, tanh, sigmoid) are k3's own (ops.c), in double, from IEEE adds,
 * multiplies and divides alone: no libm, so the same bits on every ISA and C library;
 * sqrtf and division are IEEE correctly rounded everywhere. Normalisations divide by
 * the root (x / r), they never multiply by a reciprocal.
 *
 * How the ISAs share one algorithm: the kernels below are written once against a 16-lane
 * vector type v16 (one zmm on AVX-512, two ymm on AVX2, four q registers on NEON, a float[16]
 * in the scalar build) or, for MXFP4, an 8-lane m8, whose operations are all lane-wise. The only cross-lane operation,
 * the final tree, is defined in scalar code on the stored lanes (x86 runs the same adds on
 * register halves, v16_reduce). So the SIMD paths cannot reorder anything; they only change
 * how lanes are computed.
 *
 * Batching: k3_matmul computes register tiles of rows x tokens (each weight block loaded and
 * widened once for up to 4 tokens, or, with more than 16 tokens, widened once per chunk of
 * columns into an f32 buffer all the tokens' tiles read) over column chunks of x;
 * k3_matmul_mxfp4 decodes each group of a row once, in registers, for a tile of tokens
 * (16 on AVX-512, two tokens' lanes to a zmm, mx2; 8 elsewhere) whose permuted x stays in L1
 * (column chunks of 256). A tile only decides which lanes are computed together: the
 * per-row order above does not depend on the tile, ntok or the row range. MLA
 * attention (ops.c) computes tiles of query heads x positions for its scores and of heads
 * x column blocks for its output the same way.
 *
 * Edge conventions: k3_argmax returns -1 when n <= 0 or every value is NaN; in
 * k3_router_topk a NaN selection score ranks as -inf; k3_rmsnorm accepts w == NULL.
 * NaN payloads are not part of the contract (which NaN propagates may differ by ISA).
 */
#ifndef K3_SIMD_H
#define K3_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define K3_INLINE static inline __attribute__((always_inline))
#else
#define K3_INLINE static inline
#endif
/* A loop whose iterations are independent (elementwise work over k3's own transcendentals,
 * ops.c): vectorised across elements even at -O2 (-fopenmp-simd; other compilers may
 * ignore it). Each element's operations stay the same IEEE operations in the same order,
 * so vectorising never changes a bit. */
#if defined(__GNUC__) || defined(__clang__)
#define K3_SIMD_LOOP _Pragma("omp simd")
#else
#define K3_SIMD_LOOP
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

/* v16_hold(load(p)): an operand a register tile loads once and multiplies into several
 * accumulators stays in its register. Without it GCC folds the load into every multiply
 * that uses it, and the tile is bound by loads, not arithmetic (the MLA tiles ran at half
 * their speed). An empty asm: no instruction, no value changed. */
#if K3_ISA_AVX512 && defined(__GNUC__)
K3_INLINE v16 v16_hold(v16 a) {
  __asm__("" : "+v"(a));
  return a;
}
#elif K3_ISA_AVX2 && defined(__GNUC__)
K3_INLINE v16 v16_hold(v16 a) {
  __asm__("" : "+x"(a.a), "+x"(a.b));
  return a;
}
#else
K3_INLINE v16 v16_hold(v16 a) { return a; }
#endif

/* ---------------------------------------------------------------- shared building blocks */

/* The fixed tree of contract 1. The scalar code is the definition; on x86 the same adds run
 * lane-wise on the register halves (a many-row product reduces every output it makes, and
 * the round trip through memory cost a tenth of its time): h = lanes 0..7 + lanes 8..15,
 * q = h[0..3] + h[4..7], then q4_reduce, each add the scalar one, so the bits are equal. */
#if K3_ISA_AVX512 || K3_ISA_AVX2
/* p[l] = q[l] + q[l + 2] (l < 2), then p[0] + p[1]. */
K3_INLINE float q4_reduce(__m128 q) {
  __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}
K3_INLINE float h8_reduce(__m256 h) { return q4_reduce(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))); }
#endif
K3_INLINE float v16_reduce(v16 acc) {
#if K3_ISA_AVX512
  return h8_reduce(_mm256_add_ps(_mm512_castps512_ps256(acc),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
#elif K3_ISA_AVX2
  return h8_reduce(_mm256_add_ps(acc.a, acc.b));
#else
  float a[16];
  v16_store(a, acc);
  for (int l = 0; l < 8; l++) a[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
  a[0] = a[0] + a[2];
  a[1] = a[1] + a[3];
  return a[0] + a[1];
#endif
}

/* out[i] = v16_reduce(acc[i]) for four accumulators, the same adds on four at once: each
 * step of the tree adds the halves of two accumulators held side by side in one register
 * (a tile of dots reduces every output it makes; one by one the shuffles cost a third of
 * the MLA scores' time). */
K3_INLINE void v16_reduce4(const v16 *acc, float *out) {
#if K3_ISA_AVX512
  /* h = lanes 0..7 + 8..15: [h0 | h1] and [h2 | h3], eight lanes each */
  __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], 0x44), _mm512_shuffle_f32x4(acc[0], acc[1], 0xEE));
  __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], 0x44), _mm512_shuffle_f32x4(acc[2], acc[3], 0xEE));
  /* q = h[0..3] + h[4..7]: [q0 | q1 | q2 | q3], four lanes each */
  __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, 0x88), _mm512_shuffle_f32x4(h01, h23, 0xDD));
  /* p[l] = q[l] + q[l + 2], then p[0] + p[1], in lane 0 of each 128-bit lane */
  __m512 p = _mm512_add_ps(q, _mm512_shuffle_ps(q, q, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 d = _mm512_add_ps(p, _mm512_movehdup_ps(p));
  __m512i lane0 = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0, d)));
#elif K3_ISA_AVX2
  for (int i = 0; i < 4; i += 2) {
    __m256 ha = _mm256_add_ps(acc[i].a, acc[i].b), hb = _mm256_add_ps(acc[i + 1].a, acc[i + 1].b);
    __m256 q = _mm256_add_ps(_mm256_permute2f128_ps(ha, hb, 0x20), _mm256_permute2f128_ps(ha, hb, 0x31));
    __m256 p = _mm256_add_ps(q, _mm256_shuffle_ps(q, q, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 d = _mm256_add_ps(p, _mm256_movehdup_ps(p));
    out[i] = _mm256_cvtss_f32(d);
    out[i + 1] = _mm_cvtss_f32(_mm256_extractf128_ps(d, 1));
  }
#else
  for (int i = 0; i < 4; i++) out[i] = v16_reduce(acc[i]);
#endif
}

#if !defined(K3_BF16_LANES)
static const int BF16_LANES[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
K3_INLINE v16 v16_load_bf16_lanes(const uint16_t *p) { return v16_load_bf16(p); }
#endif

/* The same tree for accumulators whose lane j holds element class BF16_LANES[j]. Only AVX2
 * has a lane order (see v16_load_bf16_lanes): acc.a holds classes 0..3, 8..11 and acc.b
 * 4..7, 12..15, so h[0..3] = classes 0..3 + 8..11 and h[4..7] = 4..7 + 12..15 are each
 * half's two 128-bit lanes summed. Elsewhere the order is the identity. */
K3_INLINE float v16_reduce_bf16(v16 acc) {
#if defined(K3_BF16_LANES)
  __m128 ha = _mm_add_ps(_mm256_castps256_ps128(acc.a), _mm256_extractf128_ps(acc.a, 1));
  __m128 hb = _mm_add_ps(_mm256_castps256_ps128(acc.b), _mm256_extractf128_ps(acc.b, 1));
  return q4_reduce(_mm_add_ps(ha, hb));
#else
  return v16_reduce(acc);
#endif
}

/* The final n < 16 elements as a zero-padded block of 16 (on x86 by a masked load: the
 * lanes past n are +0 and their memory is not touched, as with the copy). */
K3_INLINE v16 pad_f32(const float *p, int n) {
#if K3_ISA_AVX512
  return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif K3_ISA_AVX2
  __m256i nn = _mm256_set1_epi32(n);
  __m256i lo = _mm256_cmpgt_epi32(nn, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i hi = _mm256_cmpgt_epi32(nn, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
  return v16_mk(_mm256_maskload_ps(p, lo), _mm256_maskload_ps(p + 8, hi));
#else
  float b[16] = {0};
  memcpy(b, p, (size_t)n * sizeof(float));
  return v16_load(b);
#endif
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


/* ---------------------------------------------------------------- c4: the matrix check's lanes */

/* c4 is four 64-bit lanes (one ymm on AVX2 and AVX-512, two q registers on NEON,
 * uint64_t[4] in the scalar build) and c4_unit accumulates one 32-byte unit of the matrix
 * check (contract 5 in k3.h; products.c holds the check itself). Integer arithmetic mod
 * 2^64 only, so every path gives the same bits. */
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

/* ---------------------------------------------------------------- m8: MXFP4 lanes */

/* m8: the 8 lanes of an MXFP4 row accumulator (contract 2): one ymm on AVX2 and AVX-512, two
 * q registers on NEON, a float[8] in the scalar build. mx_decode turns one group (16 packed
 * bytes) into an mxw, its 32 doubled E2M1 values as four m8 (mx8_decode), v[j] lane l
 * holding element MX_ELEM(j, l) of the group; on AVX-512 lane p holds contract lane MX_XL(p)
 * instead (the identity elsewhere). mx_group applies one decoded group to one row's lanes;
 * only where a lane is held differs, not one rounding. */
#define MX_ELEM(j, l) (16 * ((j) >> 1) + 4 * ((l) & 3) + 2 * ((j) & 1) + ((l) >> 2))

/* The bf16 bit pattern of twice the E2M1 value, by nibble, as its high and low byte (doubled
 * E2M1 values are exact bf16 numbers; nibble 8, the E2M1 -0, gives +0). */
static const uint8_t E2M1X2_BF16_HI[16] = {0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41,
                                           0x00, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1};
static const uint8_t E2M1X2_BF16_LO[16] = {0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                           0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40};

#if !defined(K3_SCALAR) && defined(__AVX2__)
typedef __m256 m8;
K3_INLINE m8 m8_zero(void) { return _mm256_setzero_ps(); }
K3_INLINE m8 m8_load(const float *p) { return _mm256_loadu_ps(p); }
K3_INLINE void m8_store(float *p, m8 a) { _mm256_storeu_ps(p, a); }
K3_INLINE m8 m8_add(m8 a, m8 b) { return _mm256_add_ps(a, b); }
K3_INLINE m8 m8_mul(m8 a, m8 b) { return _mm256_mul_ps(a, b); }
K3_INLINE m8 m8_bcast(const float *p) { return _mm256_broadcast_ss(p); }
#if K3_ISA_AVX512 && defined(__AVX512VL__) /* (without VL, the AVX2 decode below) */
/* AVX-512 (F, VL; no VBMI needed): each m8 of a group straight to f32 by one 16-entry table
 * lookup (vpermt2ps over the 16 doubled E2M1 values in two ymm, indexed by the low 4 bits
 * of each dword, the bits above ignored). The indices need no byte shuffle: one 8-byte
 * broadcast of the packed bytes holds 16 elements, and a 64-bit shift by 4e brings element
 * e to the low dword's bits 0..3 and element e + 8 to the high dword's. v[j] of the contract
 * holds pairs (e, e + 8), so the lanes are held in the physical order MX_XL: lane p holds
 * contract lane MX_XL(p) (0, 2, 1, 3, 4, 6, 5, 7), which x follows and m8_reduce undoes.
 * Per group: two broadcasts from memory, four shifts, four lookups (the AVX2 decode below
 * takes eleven instructions, eight of them shuffles or shifts). */
#define MX_XL(p) (((p) & 4) | (((p) & 1) << 1) | (((p) >> 1) & 1))
static const float E2M1X2_F32[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
typedef struct {
  __m256i s0, s1; /* shifts for j even and j odd (element offset 2 = 8 bits more) */
  __m256 lo, hi;  /* the table, nibbles 0..7 and 8..15 */
} mxc;
K3_INLINE mxc mx_consts(void) {
  mxc c;
  /* qword q holds physical lanes 2q, 2q + 1 = contract lanes (0,2), (1,3), (4,6), (5,7):
   * elements (0,8), (4,12), (1,9), (5,13) for j = 0 */
  c.s0 = _mm256_setr_epi64x(0, 16, 4, 20);
  c.s1 = _mm256_setr_epi64x(8, 24, 12, 28);
  c.lo = _mm256_loadu_ps(E2M1X2_F32);
  c.hi = _mm256_loadu_ps(E2M1X2_F32 + 8);
  return c;
}
K3_INLINE void mx8_decode(mxc c, const uint8_t *p, m8 *v) {
  uint64_t q0, q1;
  memcpy(&q0, p, 8);
  memcpy(&q1, p + 8, 8);
  __m256i b0 = _mm256_set1_epi64x((long long)q0), b1 = _mm256_set1_epi64x((long long)q1);
  v[0] = _mm256_permutex2var_ps(c.lo, _mm256_srlv_epi64(b0, c.s0), c.hi);
  v[1] = _mm256_permutex2var_ps(c.lo, _mm256_srlv_epi64(b0, c.s1), c.hi);
  v[2] = _mm256_permutex2var_ps(c.lo, _mm256_srlv_epi64(b1, c.s0), c.hi);
  v[3] = _mm256_permutex2var_ps(c.lo, _mm256_srlv_epi64(b1, c.s1), c.hi);
}

/* The one-token product's pair step (products.c mx_pairs): two groups at once, in zmm, where
 * a 512-bit operation costs what a 256-bit one does (AMD since Zen 5; on Zen 4 it measured
 * no faster than the ymm decode above, and gives the same bits). A decoded pair is four zmm
 * w[i]; position P holds element MXP_ELEM(i, P) of the pair's 64. Group g is in the 128-bit
 * lanes 0 and 2 (positions 0..3, 8..11), group g + 1 in lanes 1 and 3, each half in the
 * physical lane order MX_XL of the ymm decode: the lookups are the same 64-bit shift of the
 * packed bytes and 16-entry table (one vpermps now), from one 32-byte broadcast d and its
 * copy e with the two qwords of each 128-bit lane swapped. A 128-bit lane whose qword of d
 * holds elements 16..31 takes the j = 2, 3 products of contract 2 in w[0], w[1] and the
 * j = 0, 1 ones in w[2], w[3], so it sums (p[2] + p[3]) + (p[0] + p[1]): float addition
 * commutes exactly, the same bits. The accumulator is a zmm whose group-g half holds the
 * 8 lanes; a pair's part is added to it as is (group g), then with lanes 1, 3 moved onto
 * 0, 2 (group g + 1): the contract's order, one group after the other. */
#define K3_MX_PAIR 1
#define MXP_ELEM(i, P)                                                                              \
  (32 * (((P) >> 2) & 1) + 16 * ((((P) >> 1) & 1) ^ ((i) >> 1)) + 4 * (((P) >> 1) & 1) + ((P) >> 3) + \
   2 * ((i) & 1) + 8 * ((P) & 1))
typedef struct {
  __m512i s0, s1; /* shifts for w[0], w[2] and for w[1], w[3] (two elements further) */
  __m512 t;       /* the 16 doubled E2M1 values */
} mxpc;
K3_INLINE mxpc mxp_consts(void) {
  mxpc c;
  c.s0 = _mm512_setr_epi64(0, 16, 0, 16, 4, 20, 4, 20);
  c.s1 = _mm512_setr_epi64(8, 24, 8, 24, 12, 28, 12, 28);
  c.t = _mm512_loadu_ps(E2M1X2_F32);
  return c;
}
/* d: the packed bytes of the pair (32), or of one group (16, both halves decode it). */
K3_INLINE void mxp_decode(mxpc c, __m512i d, __m512 *w) {
  __m512i e = _mm512_shuffle_epi32(d, _MM_PERM_BADC);
  w[0] = _mm512_permutexvar_ps(_mm512_srlv_epi64(d, c.s0), c.t);
  w[1] = _mm512_permutexvar_ps(_mm512_srlv_epi64(d, c.s1), c.t);
  w[2] = _mm512_permutexvar_ps(_mm512_srlv_epi64(e, c.s0), c.t);
  w[3] = _mm512_permutexvar_ps(_mm512_srlv_epi64(e, c.s1), c.t);
}
K3_INLINE __m512i mxp_load2(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
K3_INLINE __m512i mxp_load1(const uint8_t *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }
/* Both groups' products, summed per lane and scaled (sc: scale g in lanes 0, 2, g + 1 in 1, 3). */
K3_INLINE __m512 mxp_part(const __m512 *w, const float *xg, __m512 sc) {
  __m512 a = _mm512_add_ps(_mm512_mul_ps(w[0], _mm512_loadu_ps(xg)), _mm512_mul_ps(w[1], _mm512_loadu_ps(xg + 16)));
  __m512 b = _mm512_add_ps(_mm512_mul_ps(w[2], _mm512_loadu_ps(xg + 32)), _mm512_mul_ps(w[3], _mm512_loadu_ps(xg + 48)));
  return _mm512_mul_ps(_mm512_add_ps(a, b), sc);
}
K3_INLINE __m512 mxp_scales(const float *a, const float *b) {
  return _mm512_mask_broadcastss_ps(_mm512_set1_ps(*a), 0xF0F0, _mm_load_ss(b));
}
K3_INLINE __m512 mxp_add_lo(__m512 acc, __m512 part) { return _mm512_add_ps(acc, part); }
K3_INLINE __m512 mxp_add_hi(__m512 acc, __m512 part) {
  return _mm512_add_ps(acc, _mm512_shuffle_f32x4(part, part, _MM_SHUFFLE(3, 3, 1, 1)));
}
/* The 8 lanes of a pair accumulator as an m8 (m8_reduce's input). */
K3_INLINE m8 mxp_lanes(__m512 acc) {
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0), acc));
}
#else
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

#endif
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

#if !defined(MX_XL)
#define MX_XL(p) (p) /* lanes held in contract order */
#endif
/* A decoded group: the four m8 of mx8_decode. */
typedef struct {
  m8 v[4];
} mxw;
K3_INLINE void mx_decode(mxc c, const uint8_t *p, mxw *w) { mx8_decode(c, p, w->v); }
/* One group's contribution to one row's lanes (contract 2): xg + j * xs holds the 8 x of
 * v[j] in the lanes' order (MX_XL), sc = its scale. */
K3_INLINE m8 mx_group_at(m8 acc, const mxw *w, const float *xg, int xs, m8 sc) {
  m8 a = m8_add(m8_mul(w->v[0], m8_load(xg)), m8_mul(w->v[1], m8_load(xg + xs)));
  m8 b = m8_add(m8_mul(w->v[2], m8_load(xg + 2 * xs)), m8_mul(w->v[3], m8_load(xg + 3 * xs)));
  return m8_add(acc, m8_mul(m8_add(a, b), sc));
}
/* The same with one token's x of the group in one run of 32 (xg[8j + p]). */
K3_INLINE m8 mx_group(m8 acc, const mxw *w, const float *xg, m8 sc) { return mx_group_at(acc, w, xg, 8, sc); }

/* mx2: one row's lanes for two tokens at once (the many-token product), token t's 8 lanes
 * (as an m8 holds them) then token t + 1's. Their x is interleaved per group: xg[16j + 8h + p]
 * is token t + h's x of lane p of v[j]. On AVX-512 an mx2 is one zmm and a group is decoded
 * once into both 256-bit halves of four zmm (mxw2), so one instruction does the work of two
 * m8 ones; elsewhere it is two m8 and the decode is mx_decode's. Every operation is
 * lane-wise and the same per lane as mx_group's, so a lane gets the bits of the m8 path:
 * the pair only decides which lanes are computed together. */
#if defined(K3_MX_PAIR)
typedef __m512 mx2;
typedef struct {
  __m512 v[4];
} mxw2;
typedef struct {
  __m512i s0, s1; /* mx8_decode's shifts (mxc), in both halves */
  __m512 t;       /* the 16 doubled E2M1 values */
} mx2c;
K3_INLINE mx2c mx2_consts(void) {
  mx2c c;
  c.s0 = _mm512_setr_epi64(0, 16, 4, 20, 0, 16, 4, 20);
  c.s1 = _mm512_setr_epi64(8, 24, 12, 28, 8, 24, 12, 28);
  c.t = _mm512_loadu_ps(E2M1X2_F32);
  return c;
}
/* mx8_decode in zmm: the same shifts of the same 8-byte broadcasts, one 16-entry lookup
 * (vpermps reads the low 4 bits of each index, as vpermt2ps over the two ymm halves of the
 * table does), so each half is mx8_decode's m8. */
K3_INLINE void mx2_decode(mx2c c, const uint8_t *p, mxw2 *w) {
  uint64_t q0, q1;
  memcpy(&q0, p, 8);
  memcpy(&q1, p + 8, 8);
  __m512i b0 = _mm512_set1_epi64((long long)q0), b1 = _mm512_set1_epi64((long long)q1);
  w->v[0] = _mm512_permutexvar_ps(_mm512_srlv_epi64(b0, c.s0), c.t);
  w->v[1] = _mm512_permutexvar_ps(_mm512_srlv_epi64(b0, c.s1), c.t);
  w->v[2] = _mm512_permutexvar_ps(_mm512_srlv_epi64(b1, c.s0), c.t);
  w->v[3] = _mm512_permutexvar_ps(_mm512_srlv_epi64(b1, c.s1), c.t);
}
/* The group as one token's mxw (the low halves). */
K3_INLINE void mx2_one(const mxw2 *w, mxw *o) { /* (written out: a loop here was a copy through memory) */
  o->v[0] = _mm512_castps512_ps256(w->v[0]);
  o->v[1] = _mm512_castps512_ps256(w->v[1]);
  o->v[2] = _mm512_castps512_ps256(w->v[2]);
  o->v[3] = _mm512_castps512_ps256(w->v[3]);
}
K3_INLINE mx2 mx2_bcast(const float *p) { return _mm512_set1_ps(*p); }
/* a: the two tokens' accumulators, adjacent in memory (a[0] token t, a[1] token t + 1). */
K3_INLINE mx2 mx2_load(const m8 *a) { return _mm512_loadu_ps((const float *)a); }
K3_INLINE void mx2_store(m8 *a, mx2 v) { _mm512_storeu_ps((float *)a, v); }
K3_INLINE m8 mx2_lo(mx2 v) { return _mm512_castps512_ps256(v); }
K3_INLINE mx2 mx2_group(mx2 acc, const mxw2 *w, const float *xg, mx2 sc) {
  __m512 a = _mm512_add_ps(_mm512_mul_ps(w->v[0], _mm512_loadu_ps(xg)), _mm512_mul_ps(w->v[1], _mm512_loadu_ps(xg + 16)));
  __m512 b = _mm512_add_ps(_mm512_mul_ps(w->v[2], _mm512_loadu_ps(xg + 32)), _mm512_mul_ps(w->v[3], _mm512_loadu_ps(xg + 48)));
  return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_add_ps(a, b), sc));
}
#else
typedef struct {
  m8 t0, t1;
} mx2;
typedef mxw mxw2;
typedef mxc mx2c;
K3_INLINE mx2c mx2_consts(void) { return mx_consts(); }
K3_INLINE void mx2_decode(mx2c c, const uint8_t *p, mxw2 *w) { mx_decode(c, p, w); }
K3_INLINE void mx2_one(const mxw2 *w, mxw *o) { *o = *w; }
K3_INLINE mx2 mx2_bcast(const float *p) {
  mx2 r;
  r.t0 = r.t1 = m8_bcast(p);
  return r;
}
K3_INLINE mx2 mx2_load(const m8 *a) {
  mx2 r;
  r.t0 = a[0];
  r.t1 = a[1];
  return r;
}
K3_INLINE void mx2_store(m8 *a, mx2 v) {
  a[0] = v.t0;
  a[1] = v.t1;
}
K3_INLINE m8 mx2_lo(mx2 v) { return v.t0; }
K3_INLINE mx2 mx2_group(mx2 acc, const mxw2 *w, const float *xg, mx2 sc) {
  acc.t0 = mx_group_at(acc.t0, w, xg, 16, sc.t0);
  acc.t1 = mx_group_at(acc.t1, w, xg + 8, 16, sc.t1);
  return acc;
}
#endif

/* The 8-lane tree of contract 2, in scalar code shared by all ISAs. */
K3_INLINE float m8_reduce(m8 acc) {
  float a[8], h[8];
  m8_store(h, acc);
  for (int p = 0; p < 8; p++) a[MX_XL(p)] = h[p]; /* back to contract lanes */
  for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
  a[0] = a[0] + a[2];
  a[1] = a[1] + a[3];
  return a[0] + a[1];
}

#endif /* K3_SIMD_H */
