/*
 * Bit-identity check of the compiled SIMD path against the scalar path of the same k3.c,
 * in one static binary (used by `make check-arm` under qemu-aarch64 for NEON; it builds and
 * runs on any host). The file is compiled twice: once with K3_CHECK_SCALAR_TU, where it
 * includes k3.c with K3_SCALAR and every public name prefixed s_, and once as the driver.
 */
#ifdef K3_CHECK_SCALAR_TU
#define K3_SCALAR 1
#define k3_isa s_k3_isa
#define k3_alloc s_k3_alloc
#define k3_free s_k3_free
#define k3_bf16_to_f32 s_k3_bf16_to_f32
#define k3_f16_to_f32 s_k3_f16_to_f32
#define k3_matmul s_k3_matmul
#define k3_matmul_mxfp4 s_k3_matmul_mxfp4
#define k3_rmsnorm s_k3_rmsnorm
#define k3_situ_glu s_k3_situ_glu
#define k3_short_conv s_k3_short_conv
#define k3_l2norm s_k3_l2norm
#define k3_kda_decay s_k3_kda_decay
#define k3_kda_step s_k3_kda_step
#define k3_mla_attend s_k3_mla_attend
#define k3_router_topk s_k3_router_topk
#define k3_attnres s_k3_attnres
#define k3_add s_k3_add
#define k3_axpy s_k3_axpy
#define k3_sigmoid_mul s_k3_sigmoid_mul
#define k3_sigmoid s_k3_sigmoid
#define k3_argmax s_k3_argmax
#include "k3.c"

#else
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

/* Declarations of the s_ (scalar) copies: same prototypes as k3.h. */
const char *s_k3_isa(void);
void s_k3_bf16_to_f32(const uint16_t *src, float *dst, int32_t n);
void s_k3_f16_to_f32(const uint16_t *src, float *dst, int32_t n);
void s_k3_matmul(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
                 int32_t cols, int32_t r0, int32_t r1);
void s_k3_matmul_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, float *y,
                       int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1);
void s_k3_rmsnorm(const float *x, const float *w, float *y, int32_t n, int32_t ngroups, float eps);
void s_k3_situ_glu(const float *g, const float *u, float *out, int32_t n, float b1, float b2);
void s_k3_short_conv(float *state, const float *w, const float *x, float *y, int32_t channels);
void s_k3_l2norm(float *x, int32_t d, int32_t nheads, float eps);
void s_k3_kda_decay(const float *f, const float *a_log, const float *dt_bias, float *alpha,
                    int32_t nheads, int32_t d, float lb);
void s_k3_kda_step(float *S, const float *q, const float *k, const float *v, const float *beta,
                   const float *alpha, float *o, int32_t d, int32_t h0, int32_t h1);
void s_k3_mla_attend(const float *q, const float *knope, const float *krope, const float *v,
                     float *out, float *scores, int32_t npos, int32_t nheads, int32_t dn,
                     int32_t dr, int32_t dv, float scale, int32_t h0, int32_t h1);
int32_t s_k3_router_topk(const float *logits, const float *bias, int32_t nexperts, int32_t k,
                         float scale, int32_t *ids, float *weights);
void s_k3_attnres(const float *src, int32_t nsrc, int32_t n, const float *norm_w,
                  const float *proj_w, float eps, float *out);
void s_k3_add(float *y, const float *x, int32_t n);
void s_k3_axpy(float *y, float a, const float *x, int32_t n);
void s_k3_sigmoid_mul(float *y, const float *g, int32_t n);
void s_k3_sigmoid(const float *x, float *y, int32_t n);
int32_t s_k3_argmax(const float *x, int32_t n);

static uint32_t seed = 12345;
static uint32_t rnd(void) {
  seed ^= seed << 13;
  seed ^= seed >> 17;
  seed ^= seed << 5;
  return seed;
}
static float frand(float s) { return ((float)(rnd() >> 8) / 16777216.0f * 2.0f - 1.0f) * s; }
static float *fvec(size_t n, float s) {
  float *a = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) a[i] = frand(s);
  return a;
}
static float *fdup(const float *a, size_t n) {
  float *b = malloc((n ? n : 1) * sizeof(float));
  memcpy(b, a, n * sizeof(float));
  return b;
}

static int failures = 0, checks = 0;
static void same(const void *a, const void *b, size_t bytes, const char *what, int p1, int p2) {
  checks++;
  if (memcmp(a, b, bytes)) {
    failures++;
    printf("MISMATCH %s (%d, %d)\n", what, p1, p2);
  }
}

int main(void) {
  static const int cols_list[] = {1, 15, 16, 17, 33, 1000, 7168};
  printf("arm_check: %s vs %s\n", k3_isa(), s_k3_isa());
  for (unsigned ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
    int cols = cols_list[ci], rows = 9, ntok = 5;
    float *wf = fvec((size_t)rows * cols, 1), *x = fvec((size_t)ntok * cols, 1);
    uint16_t *wb = malloc((size_t)rows * cols * 2);
    for (int i = 0; i < rows * cols; i++) { /* any bf16 but inf/NaN (NaN payloads are not part of the contract) */
      do wb[i] = (uint16_t)rnd(); while ((wb[i] & 0x7F80) == 0x7F80);
    }
    float *y1 = calloc((size_t)ntok * rows, 4), *y2 = calloc((size_t)ntok * rows, 4);
    for (int nt = 1; nt <= ntok; nt += 4) {
      k3_matmul(wf, K3_F32, x, y1, nt, rows, cols, 1, rows);
      s_k3_matmul(wf, K3_F32, x, y2, nt, rows, cols, 1, rows);
      same(y1, y2, (size_t)nt * rows * 4, "matmul f32", cols, nt);
      k3_matmul(wb, K3_BF16, x, y1, nt, rows, cols, 0, rows);
      s_k3_matmul(wb, K3_BF16, x, y2, nt, rows, cols, 0, rows);
      same(y1, y2, (size_t)nt * rows * 4, "matmul bf16", cols, nt);
    }
    /* rmsnorm, l2norm, elementwise */
    {
      float *a = fvec((size_t)3 * cols, 3), *b = fdup(a, (size_t)3 * cols);
      float *ra = malloc((size_t)3 * cols * 4), *rb = malloc((size_t)3 * cols * 4);
      k3_rmsnorm(a, wf, ra, cols, 3, 1e-5f);
      s_k3_rmsnorm(a, wf, rb, cols, 3, 1e-5f);
      same(ra, rb, (size_t)3 * cols * 4, "rmsnorm", cols, 0);
      k3_l2norm(a, cols, 3, 1e-6f);
      s_k3_l2norm(b, cols, 3, 1e-6f);
      same(a, b, (size_t)3 * cols * 4, "l2norm", cols, 0);
      float *g = fvec(cols, 8);
      k3_situ_glu(g, ra, a, cols, 4, 25);
      s_k3_situ_glu(g, ra, b, cols, 4, 25);
      same(a, b, (size_t)cols * 4, "situ_glu", cols, 0);
      k3_axpy(a, 0.3f, g, cols);
      s_k3_axpy(b, 0.3f, g, cols);
      k3_add(a, g, cols);
      s_k3_add(b, g, cols);
      k3_sigmoid_mul(a, g, cols);
      s_k3_sigmoid_mul(b, g, cols);
      same(a, b, (size_t)cols * 4, "axpy/add/sigmoid_mul", cols, 0);
      k3_bf16_to_f32(wb, a, cols);
      s_k3_bf16_to_f32(wb, b, cols);
      same(a, b, (size_t)cols * 4, "bf16_to_f32", cols, 0);
      k3_f16_to_f32(wb, a, cols);
      s_k3_f16_to_f32(wb, b, cols);
      same(a, b, (size_t)cols * 4, "f16_to_f32", cols, 0);
      int i1 = k3_argmax(g, cols), i2 = s_k3_argmax(g, cols);
      same(&i1, &i2, 4, "argmax", cols, 0);
      /* attnres with 4 sources of width cols */
      float *src = fvec((size_t)4 * cols, 2), *nw = fvec(cols, 1), *pw = fvec(cols, 0.1f);
      k3_attnres(src, 4, cols, nw, pw, 1e-5f, a);
      s_k3_attnres(src, 4, cols, nw, pw, 1e-5f, b);
      same(a, b, (size_t)cols * 4, "attnres", cols, 0);
      free(a), free(b), free(ra), free(rb), free(g), free(src), free(nw), free(pw);
    }
    free(wf), free(x), free(wb), free(y1), free(y2);
  }
  /* MXFP4 */
  static const int mx_cols[] = {32, 96, 1024, 3584};
  for (unsigned ci = 0; ci < sizeof mx_cols / sizeof *mx_cols; ci++) {
    int cols = mx_cols[ci], rows = 7, ntok = 5;
    uint8_t *p = malloc((size_t)rows * cols / 2), *s = malloc((size_t)rows * cols / 32);
    for (int i = 0; i < rows * cols / 2; i++) p[i] = (uint8_t)rnd();
    for (int i = 0; i < rows * cols / 32; i++) {
      uint32_t r = rnd() % 100;
      s[i] = r < 5 ? 255 : r < 8 ? 0 : (uint8_t)(120 + r % 14);
    }
    float *x = fvec((size_t)ntok * cols, 1), *y1 = calloc((size_t)ntok * rows, 4),
          *y2 = calloc((size_t)ntok * rows, 4);
    for (int nt = 1; nt <= ntok; nt += 4) {
      k3_matmul_mxfp4(p, s, x, y1, nt, rows, cols, 0, rows);
      s_k3_matmul_mxfp4(p, s, x, y2, nt, rows, cols, 0, rows);
      same(y1, y2, (size_t)nt * rows * 4, "mxfp4", cols, nt);
    }
    free(p), free(s), free(x), free(y1), free(y2);
  }
  /* KDA */
  static const int kd[] = {16, 17, 128, 300};
  for (unsigned di = 0; di < sizeof kd / sizeof *kd; di++) {
    int d = kd[di], nh = 3;
    float *S1 = fvec((size_t)nh * d * d, 0.5f), *S2 = fdup(S1, (size_t)nh * d * d);
    float *q = fvec((size_t)nh * d, 0.1f), *k = fvec((size_t)nh * d, 0.1f), *v = fvec((size_t)nh * d, 1);
    float *beta = fvec(nh, 0.5f), *al = fvec((size_t)nh * d, 0.5f);
    for (int i = 0; i < nh * d; i++) al[i] = 0.5f + al[i] * 0.9f;
    float *o1 = calloc((size_t)nh * d, 4), *o2 = calloc((size_t)nh * d, 4);
    k3_kda_step(S1, q, k, v, beta, al, o1, d, 0, nh);
    s_k3_kda_step(S2, q, k, v, beta, al, o2, d, 0, nh);
    same(S1, S2, (size_t)nh * d * d * 4, "kda S", d, 0);
    same(o1, o2, (size_t)nh * d * 4, "kda o", d, 0);
    k3_kda_decay(q, beta, v, o1, nh, d, -5);
    s_k3_kda_decay(q, beta, v, o2, nh, d, -5);
    same(o1, o2, (size_t)nh * d * 4, "kda_decay", d, 0);
    float *st1 = fvec((size_t)nh * d * 3, 1), *st2 = fdup(st1, (size_t)nh * d * 3), *cw = fvec((size_t)nh * d * 4, 1);
    k3_short_conv(st1, cw, q, o1, nh * d);
    s_k3_short_conv(st2, cw, q, o2, nh * d);
    same(o1, o2, (size_t)nh * d * 4, "short_conv", d, 0);
    free(S1), free(S2), free(q), free(k), free(v), free(beta), free(al), free(o1), free(o2);
    free(st1), free(st2), free(cw);
  }
  /* MLA */
  static const int mla[][4] = {{1, 128, 64, 128}, {9, 128, 64, 128}, {5, 17, 5, 15}};
  for (unsigned mi = 0; mi < 3; mi++) {
    int npos = mla[mi][0], dn = mla[mi][1], dr = mla[mi][2], dv = mla[mi][3], nh = 3;
    float *q = fvec((size_t)nh * (dn + dr), 1), *kn = fvec((size_t)npos * nh * dn, 1);
    float *kr = fvec((size_t)npos * dr, 1), *v = fvec((size_t)npos * nh * dv, 1);
    float *o1 = calloc((size_t)nh * dv, 4), *o2 = calloc((size_t)nh * dv, 4);
    float *s1 = calloc((size_t)nh * npos, 4), *s2 = calloc((size_t)nh * npos, 4);
    k3_mla_attend(q, kn, kr, v, o1, s1, npos, nh, dn, dr, dv, 0.07f, 0, nh);
    s_k3_mla_attend(q, kn, kr, v, o2, s2, npos, nh, dn, dr, dv, 0.07f, 0, nh);
    same(o1, o2, (size_t)nh * dv * 4, "mla out", npos, dn);
    same(s1, s2, (size_t)nh * npos * 4, "mla scores", npos, dn);
    free(q), free(kn), free(kr), free(v), free(o1), free(o2), free(s1), free(s2);
  }
  /* router */
  {
    float *lg = fvec(896, 4), *bias = fvec(896, 0.1f), w1[16], w2[16];
    int32_t id1[16], id2[16];
    int n1 = k3_router_topk(lg, bias, 896, 16, 2.5f, id1, w1);
    int n2 = s_k3_router_topk(lg, bias, 896, 16, 2.5f, id2, w2);
    same(&n1, &n2, 4, "router n", 0, 0);
    same(id1, id2, sizeof id1, "router ids", 0, 0);
    same(w1, w2, sizeof w1, "router weights", 0, 0);
    free(lg), free(bias);
  }
  printf("arm_check: %d checks, %d mismatches\n", checks, failures);
  return failures != 0;
}
#endif
