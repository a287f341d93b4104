/*
 * k3 ops: ISA report, conversions, norms and activations, the KDA step, MLA
 * attention, the MoE router, Attention Residuals and the elementwise ops (k3.h says what
 * each computes), written once against the lane types of simd.h.
 */
#include "k3.h"
#include "simd.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
/* ---------------------------------------------------------------- exp, tanh, sigmoid
 *
 * k3's own transcendentals, not libm's: each C library has its own expf and tanhf (glibc,
 * musl and macOS differ, and glibc has replaced its float functions between versions), so
 * with libm's a token would depend on the machine's C library; and they run one element
 * at a time (tanhf + expf: about 23 ns an element here). These are the same IEEE operations
 * on every build, so every ISA and C library gives the same bits, and loops over them
 * vectorise (K3_SIMD_LOOP: lanes of doubles, no call). They work in double and round once
 * to float at the end: within an ulp of the true value for float inputs, where the float64
 * reference is the judge (tests/unit/kernels_test.ts sweeps 1e-38 to 1e4, the edges, NaN).
 *
 * exp_parts: x = k ln2 + r with |r| <= ln2/2 (k by the round-to-nearest of a shifted add,
 * ln2 in two parts so r is exact to ~2^-60), q = expm1(r) by its Taylor series to r^11
 * (remainder below 2^-42 of r), and 2^k from k's bits. x is held to [-708, 709] so 2^k is
 * a normal double (exp(-708) is 3e-308: zero to a float). NaN passes through as NaN. */
typedef struct {
  double scale, q; /* exp(x) = scale * (1 + q) */
} exp_parts_t;

K3_INLINE exp_parts_t exp_parts(double x) {
  const double shift = 0x1.8p52, log2e = 0x1.71547652b82fep0;
  const double ln2hi = 0x1.62e42fefa3800p-1, ln2lo = 0x1.ef35793c76730p-45;
  x = x < -708.0 ? -708.0 : x; /* two selects, not a nest: both vectorise as blends */
  x = x > 709.0 ? 709.0 : x;
  double kd = x * log2e + shift;
  uint64_t kbits;
  memcpy(&kbits, &kd, sizeof kbits);
  kd = kd - shift;
  double r = (x - kd * ln2hi) - kd * ln2lo;
  double p = 1.0 / 39916800.0;
  p = 1.0 / 3628800.0 + r * p;
  p = 1.0 / 362880.0 + r * p;
  p = 1.0 / 40320.0 + r * p;
  p = 1.0 / 5040.0 + r * p;
  p = 1.0 / 720.0 + r * p;
  p = 1.0 / 120.0 + r * p;
  p = 1.0 / 24.0 + r * p;
  p = 1.0 / 6.0 + r * p;
  p = 0.5 + r * p;
  p = 1.0 + r * p;
  /* kd + shift holds k in its low mantissa bits: (those + 1023) << 52 are 2^k's bits. */
  uint64_t sbits = (kbits + 1023) << 52;
  exp_parts_t e;
  memcpy(&e.scale, &sbits, sizeof sbits);
  e.q = r * p;
  return e;
}

/* exp(x) and exp(x) - 1 (the latter accurate near 0, where tanh and sigmoid need it). */
K3_INLINE double k3exp(double x) {
  exp_parts_t e = exp_parts(x);
  return e.scale + e.scale * e.q;
}
K3_INLINE double k3expm1(double x) {
  exp_parts_t e = exp_parts(x);
  return (e.scale - 1.0) + e.scale * e.q;
}
/* tanh(y) = expm1(2y) / (expm1(2y) + 2); sigmoid(x) = 1 / (2 + expm1(-x)). */
K3_INLINE double k3tanh(double y) {
  double e = k3expm1(2.0 * y);
  return e / (e + 2.0);
}
K3_INLINE double k3sigmoid(double x) { return 1.0 / (2.0 + k3expm1(-x)); }
K3_INLINE float sigm(float x) { return (float)k3sigmoid(x); }
/* ---------------------------------------------------------------- conversions */

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
  K3_SIMD_LOOP
  for (int i = 0; i < n; i++) {
    float gi = g[i], ui = u[i];
    double a = (b1 * k3tanh(gi / (double)b1)) * k3sigmoid(gi);
    double v = b2 * k3tanh(ui / (double)b2);
    out[i] = (float)(a * v);
  }
}

void k3_short_conv(float *state, const float *w, const float *x, float *y, int32_t channels) {
  K3_SIMD_LOOP
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
    float a = (float)k3exp(a_log[h]);
    K3_SIMD_LOOP
    for (int i = 0; i < d; i++) {
      size_t j = (size_t)h * d + i;
      alpha[j] = (float)k3exp(lb * sigm(a * (f[j] + dt_bias[j])));
    }
  }
}

/* ---------------------------------------------------------------- KDA step */

enum { KDA_COLS = 256 }; /* columns are independent, so they are processed in chunks */

void k3_kda_step(float *S, const float *q, const float *k, const float *v, const float *beta,
                 const float *alpha, float *o, int32_t d, int32_t h0, int32_t h1) {
  k3_kda_steps(S, q, k, v, beta, alpha, o, d, h1, 1, h0, h1); /* one row: no row stride is used */
}

void k3_kda_steps(float *S, const float *q, const float *k, const float *v, const float *beta,
                  const float *alpha, float *o, int32_t d, int32_t nheads, int32_t nrows, int32_t h0, int32_t h1) {
  float sd = sqrtf((float)d);
  size_t rs = (size_t)nheads * d; /* a row's stride in q, k, v, alpha and o */
  /* Head by head, a chunk of the head's state columns through every row in order: the
   * chunk stays in the cache while the rows pass, and each row's bits are one step's. */
  for (int h = h0; h < h1; h++)
    for (int j0 = 0; j0 < d; j0 += KDA_COLS)
      for (int t = 0; t < nrows; t++) {
        float *Sh = S + (size_t)h * d * d;
        size_t at = t * rs + (size_t)h * d;
        const float *qh = q + at, *kh = k + at, *vh = v + at, *ah = alpha + at;
        float b = beta[(size_t)t * nheads + h];
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
        float *oc = o + at + j0;
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

/* ---------------------------------------------------------------- MLA attention */

void k3_mla_attend(const float *q, const float *knope, const float *krope, const float *v,
                   float *out, float *scores, int32_t npos, int32_t nheads, int32_t kvheads,
                   int32_t dn, int32_t dr, int32_t dv, float scale, int32_t h0, int32_t h1) {
  k3_mla_attend_rows(q, knope, krope, v, out, scores, npos, 1, nheads, kvheads, dn, dr, dv, scale, h0, h1);
}

/* Tiles of k3_mla_attend_rows. Scores: MLA_QT query heads of one row x MLA_PT positions, each
 * key block and each query block loaded once per tile (the heads share the keys when
 * kvheads = 1). Output: MLA_OT heads of one row x MLA_CT column blocks of 16 held in registers
 * across a block of positions, each value block loaded once for all of them. AVX-512 has 32
 * registers for 4 x 4 tiles; a v16 is two of AVX2's 16 registers, so 2 x 2 and 4 x 1 there
 * (and on NEON). At most 4 each (K3_UNROLL4 keeps the tiles in registers); MLA_QT * MLA_PT
 * a multiple of 4 (v16_reduce4). */
#if K3_ISA_AVX512
enum { MLA_QT = 4, MLA_PT = 4, MLA_OT = 4, MLA_CT = 4 };
#else
enum { MLA_QT = 2, MLA_PT = 2, MLA_OT = 4, MLA_CT = 1 };
#endif
/* Positions per block: their cache rows (2.3 KB each at the released widths) stay in L2 while
 * every row and head of the tile passes over them. */
enum { MLA_BLOCK = 64 };

/* Contract 1's dot of each of MLA_QT queries with each of MLA_PT keys over n elements, into
 * out[a][e], every one its own chain in dot_f32's order: the tile only decides which chains
 * run side by side. */
K3_INLINE void dot_tile(const float *const *q, const float *const *k, int n, float out[MLA_QT][MLA_PT]) {
  v16 acc[MLA_QT][MLA_PT];
  K3_UNROLL4
  for (int a = 0; a < MLA_QT; a++) {
    K3_UNROLL4
    for (int e = 0; e < MLA_PT; e++) acc[a][e] = v16_zero();
  }
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 kv[MLA_PT];
    K3_UNROLL4
    for (int e = 0; e < MLA_PT; e++) kv[e] = v16_hold(v16_load(k[e] + i));
    K3_UNROLL4
    for (int a = 0; a < MLA_QT; a++) {
      v16 qv = v16_hold(v16_load(q[a] + i));
      K3_UNROLL4
      for (int e = 0; e < MLA_PT; e++) acc[a][e] = v16_add(acc[a][e], v16_mul(qv, kv[e]));
    }
  }
  if (i < n) {
    v16 kv[MLA_PT];
    K3_UNROLL4
    for (int e = 0; e < MLA_PT; e++) kv[e] = pad_f32(k[e] + i, n - i);
    K3_UNROLL4
    for (int a = 0; a < MLA_QT; a++) {
      v16 qv = pad_f32(q[a] + i, n - i);
      K3_UNROLL4
      for (int e = 0; e < MLA_PT; e++) acc[a][e] = v16_add(acc[a][e], v16_mul(qv, kv[e]));
    }
  }
  /* MLA_QT * MLA_PT is a multiple of 4: the accumulators in fours, in out's order */
  K3_UNROLL4
  for (int t = 0; t < MLA_QT * MLA_PT; t += 4) v16_reduce4(&acc[0][0] + t, &out[0][0] + t);
}

/* o[a][c] = o[a][c] + p[a][s] * v_s[c] for s in [s0, s1) ascending (contract 3), for MLA_OT
 * outputs and the MLA_CT column blocks of 16 at col[t]; v_s = v + s * stride. */
K3_INLINE void axpy_tile(float *const *o, const float *const *p, const float *v, size_t stride, const int *col,
                         int s0, int s1) {
  v16 acc[MLA_OT][MLA_CT];
  K3_UNROLL4
  for (int a = 0; a < MLA_OT; a++) {
    K3_UNROLL4
    for (int t = 0; t < MLA_CT; t++) acc[a][t] = v16_load(o[a] + col[t]);
  }
  for (int s = s0; s < s1; s++) {
    const float *vs = v + (size_t)s * stride;
    v16 vt[MLA_CT];
    K3_UNROLL4
    for (int t = 0; t < MLA_CT; t++) vt[t] = v16_hold(v16_load(vs + col[t]));
    K3_UNROLL4
    for (int a = 0; a < MLA_OT; a++) {
      v16 pa = v16_hold(v16_set1(p[a][s]));
      K3_UNROLL4
      for (int t = 0; t < MLA_CT; t++) acc[a][t] = v16_add(acc[a][t], v16_mul(pa, vt[t]));
    }
  }
  K3_UNROLL4
  for (int a = 0; a < MLA_OT; a++) {
    K3_UNROLL4
    for (int t = 0; t < MLA_CT; t++) v16_store(o[a] + col[t], acc[a][t]);
  }
}

/* The heads [h, h + n) of a tile, n <= max, padded to max by repeating the last: a repeated
 * head is computed twice into the same place, with the same bits. With kvheads > 1 the heads
 * do not share keys, so a tile holds one head. */
static int tile_heads(int h, int h1, int kvheads, int max, int *heads) {
  int n = kvheads == 1 ? (h1 - h < max ? h1 - h : max) : 1;
  for (int a = 0; a < max; a++) heads[a] = h + (a < n ? a : n - 1);
  return n;
}

void k3_mla_attend_rows(const float *q, const float *knope, const float *krope, const float *v,
                        float *out, float *scores, int32_t npos, int32_t nrows, int32_t nheads,
                        int32_t kvheads, int32_t dn, int32_t dr, int32_t dv, float scale, int32_t h0,
                        int32_t h1) {
  int dq = dn + dr, last = npos + nrows - 1; /* row j sees positions [0, npos + j) */
  size_t per_row = (size_t)nheads * (size_t)last;
  /* Blocks of positions outer, so the cache is read once for the whole tile; every score
   * and every output element still sees positions in ascending order, each row exactly as
   * it would alone. */
  for (int b0 = 0; b0 < last; b0 += MLA_BLOCK) {
    int b1 = last - b0 < MLA_BLOCK ? last : b0 + MLA_BLOCK;
    for (int j = 0; j < nrows; j++) {
      int s1 = b1 < npos + j ? b1 : npos + j;
      for (int h = h0; h < h1;) {
        int heads[MLA_QT];
        int nh = tile_heads(h, h1, kvheads, MLA_QT, heads), kh = kvheads == 1 ? 0 : h;
        const float *qn[MLA_QT], *qr[MLA_QT];
        for (int a = 0; a < MLA_QT; a++) {
          qn[a] = q + ((size_t)j * nheads + heads[a]) * dq;
          qr[a] = qn[a] + dn;
        }
        for (int s = b0; s < s1; s += MLA_PT) {
          const float *kn[MLA_PT], *kr[MLA_PT];
          int pos[MLA_PT];
          for (int e = 0; e < MLA_PT; e++) {
            pos[e] = s + e < s1 ? s + e : s1 - 1; /* positions past s1: the last repeated */
            kn[e] = knope + ((size_t)pos[e] * kvheads + kh) * dn;
            kr[e] = krope + (size_t)pos[e] * dr;
          }
          float a_n[MLA_QT][MLA_PT], a_r[MLA_QT][MLA_PT];
          dot_tile(qn, kn, dn, a_n);
          dot_tile(qr, kr, dr, a_r);
          for (int a = 0; a < MLA_QT; a++) {
            float *sc = scores + j * per_row + (size_t)heads[a] * last;
            for (int e = 0; e < MLA_PT; e++) sc[pos[e]] = (a_n[a][e] + a_r[a][e]) * scale;
          }
        }
        h += nh;
      }
    }
  }
  for (int j = 0; j < nrows; j++) {
    int n = npos + j;
    for (int h = h0; h < h1; h++) {
      float *sc = scores + j * per_row + (size_t)h * last;
      float m = -INFINITY;
      for (int s = 0; s < n; s++)
        if (sc[s] > m) m = sc[s];
      K3_SIMD_LOOP
      for (int s = 0; s < n; s++) sc[s] = (float)k3exp(sc[s] - m);
      float z = 0.0f;
      for (int s = 0; s < n; s++) z = z + sc[s];
      div_gain(sc, NULL, sc, z, n);
      memset(out + ((size_t)j * nheads + h) * dv, 0, (size_t)dv * sizeof(float));
    }
  }
  int full = dv / 16 * 16; /* columns in whole blocks of 16; the rest element by element */
  for (int b0 = 0; b0 < last; b0 += MLA_BLOCK) {
    int b1 = last - b0 < MLA_BLOCK ? last : b0 + MLA_BLOCK;
    for (int j = 0; j < nrows; j++) {
      int s1 = b1 < npos + j ? b1 : npos + j;
      if (s1 <= b0) continue;
      for (int h = h0; h < h1;) {
        int heads[MLA_OT];
        int nh = tile_heads(h, h1, kvheads, MLA_OT, heads), kh = kvheads == 1 ? 0 : h;
        const float *p[MLA_OT];
        float *o[MLA_OT];
        for (int a = 0; a < MLA_OT; a++) {
          p[a] = scores + j * per_row + (size_t)heads[a] * last;
          o[a] = out + ((size_t)j * nheads + heads[a]) * dv;
        }
        const float *vh = v + (size_t)kh * dv;
        size_t stride = (size_t)kvheads * dv;
        for (int c0 = 0; c0 < full; c0 += 16 * MLA_CT) {
          int col[MLA_CT];
          for (int t = 0; t < MLA_CT; t++) /* blocks past the last: the last repeated */
            col[t] = c0 + 16 * t < full ? c0 + 16 * t : full - 16;
          axpy_tile(o, p, vh, stride, col, b0, s1);
        }
        for (int a = 0; a < nh; a++)
          for (int c = full; c < dv; c++)
            for (int s = b0; s < s1; s++) o[a][c] = o[a][c] + p[a][s] * vh[(size_t)s * stride + c];
        h += nh;
      }
    }
  }
}

/* A weight block of one head's key rows, i, columns [j, j + 16). */
K3_INLINE v16 absorb_w(const void *wk, int32_t wtype, int32_t dc, int i, int j) {
  return wtype == K3_BF16 ? v16_load_bf16((const uint16_t *)wk + (size_t)i * dc + j)
                          : v16_load((const float *)wk + (size_t)i * dc + j);
}

/* Four query rows of one head over the key columns [j, j + 16): each weight block is
 * widened once and applied to every row (contract 3: y = y + w * q, i ascending, from +0). */
K3_INLINE void absorb_block4(const void *wk, int32_t wtype, const float *const *qn, float *const *y, int32_t dn,
                             int32_t dc, int j) {
  v16 a0 = v16_zero(), a1 = v16_zero(), a2 = v16_zero(), a3 = v16_zero();
  for (int i = 0; i < dn; i++) {
    v16 w = absorb_w(wk, wtype, dc, i, j);
    a0 = v16_add(a0, v16_mul(w, v16_set1(qn[0][i])));
    a1 = v16_add(a1, v16_mul(w, v16_set1(qn[1][i])));
    a2 = v16_add(a2, v16_mul(w, v16_set1(qn[2][i])));
    a3 = v16_add(a3, v16_mul(w, v16_set1(qn[3][i])));
  }
  v16_store(y[0] + j, a0), v16_store(y[1] + j, a1), v16_store(y[2] + j, a2), v16_store(y[3] + j, a3);
}

/* One query row, the same sums. */
K3_INLINE void absorb_block1(const void *wk, int32_t wtype, const float *qn, float *y, int32_t dn, int32_t dc,
                             int j) {
  v16 a = v16_zero();
  for (int i = 0; i < dn; i++) a = v16_add(a, v16_mul(absorb_w(wk, wtype, dc, i, j), v16_set1(qn[i])));
  v16_store(y + j, a);
}

void k3_mla_absorb(const void *kvb, int32_t wtype, const float *q, float *qlat, int32_t nrows, int32_t nheads,
                   int32_t dn, int32_t dr, int32_t dv, int32_t dc, int32_t h0, int32_t h1) {
  size_t esize = wtype == K3_BF16 ? 2 : 4;
  for (int h = h0; h < h1; h++) {
    const char *wk = (const char *)kvb + (size_t)h * (dn + dv) * dc * esize;
    for (int r0 = 0; r0 < nrows; r0 += 4) {
      int nr = nrows - r0 < 4 ? nrows - r0 : 4;
      const float *qn[4];
      float *y[4];
      for (int r = 0; r < nr; r++) {
        qn[r] = q + ((size_t)(r0 + r) * nheads + h) * (dn + dr);
        y[r] = qlat + ((size_t)(r0 + r) * nheads + h) * (dc + dr);
      }
      int j = 0;
      for (; j + 16 <= dc; j += 16) {
        if (nr == 4) absorb_block4(wk, wtype, qn, y, dn, dc, j);
        else
          for (int r = 0; r < nr; r++) absorb_block1(wk, wtype, qn[r], y[r], dn, dc, j);
      }
      /* The last columns one at a time, in the same order. */
      for (; j < dc; j++)
        for (int r = 0; r < nr; r++) {
          float s = 0.0f;
          for (int i = 0; i < dn; i++) {
            float w = wtype == K3_BF16 ? bf16_f32(((const uint16_t *)wk)[(size_t)i * dc + j])
                                       : ((const float *)wk)[(size_t)i * dc + j];
            s = s + w * qn[r][i];
          }
          y[r][j] = s;
        }
      for (int r = 0; r < nr; r++) memcpy(y[r] + dc, qn[r] + dn, (size_t)dr * sizeof(float));
    }
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

enum { ROUTER_KEYS = 1024 }; /* experts whose keys the router keeps (the model has 896) */

/* An expert's ranking key: sigmoid(logit) + bias, NaN ranking last. */
static float router_key(const float *logits, const float *bias, int e) {
  float ke = sigm(logits[e]) + (bias ? bias[e] : 0.0f);
  return ke != ke ? -INFINITY : ke;
}

int32_t k3_router_topk(const float *logits, const float *bias, int32_t nexperts, int32_t k,
                       float scale, int32_t *ids, float *weights) {
  if (k > nexperts) k = nexperts;
  if (k < 0) k = 0;
  int prev = -1;
  float kprev = 0.0f;
  /* Each expert's ranking key, computed once (the first ROUTER_KEYS; any beyond are
   * recomputed, the same bits). */
  float keys[ROUTER_KEYS];
#define K3_KEY(e) ((e) < ROUTER_KEYS ? keys[e] : router_key(logits, bias, e))
  for (int e = 0; e < nexperts && e < ROUTER_KEYS; e++) keys[e] = router_key(logits, bias, e);
  /* Pick j is the best expert ranking strictly after pick j-1: O(k n). */
  for (int j = 0; j < k; j++) {
    int best = -1;
    float kbest = 0.0f;
    for (int e = 0; e < nexperts; e++) {
      float ke = K3_KEY(e);
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
#undef K3_KEY
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
  for (int i = 0; i < nsrc; i++) z = z + (float)k3exp(K3_SCORE(i) - m);
  memset(out, 0, (size_t)n * sizeof(float));
  for (int i = 0; i < nsrc; i++) axpy_lanes(out, (float)k3exp(K3_SCORE(i) - m) / z, src + (size_t)i * n, n);
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
  K3_SIMD_LOOP
  for (int i = 0; i < n; i++) y[i] = y[i] * sigm(g[i]);
}

void k3_sigmoid(const float *x, float *y, int32_t n) {
  K3_SIMD_LOOP
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
