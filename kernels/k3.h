/*
 * k3 kernels: every numeric op of Kimi K3, C99, stateless.
 *
 * The caller (TypeScript, through Deno.dlopen) owns every buffer. Sizes are int32_t so
 * that a JS number crosses the FFI on the fast path; allocation sizes are uint64_t
 * (passed as bigint).
 *
 * Determinism contract: the scalar path of simd.h defines the accumulation order of every
 * reduction. SIMD paths (AVX-512, AVX2, NEON) reproduce it bit for bit; the build uses
 * -ffp-contract=off so no multiply-add is fused behind our back. Every op that takes a
 * [r0, r1) row range or [h0, h1) head range gives, for each row or head, a result that
 * does not depend on the range, so splitting work across threads never changes a bit.
 */
#ifndef K3_H
#define K3_H
#include <stdint.h>

/* Weight element types for k3_matmul. */
#define K3_F32 0
#define K3_BF16 1
/* bf16 weights some of which are still split-coded (k3io.h) where the trunk ring read them:
 * w then points to a k3_split_matrix, and the product decodes each window of rows into a
 * per-thread buffer as it reaches it, so the weights cross memory once, coded. The words,
 * and so every result and check, are those of the decoded matrix. */
#define K3_BF16_SPLIT 2

/* Where a K3_BF16_SPLIT matrix's words are: npieces trunk pieces back to back, the matrix
 * starting at word `word0` of the first. Piece i holds len bytes; stored == 0: base holds
 * them decoded; else base holds their `stored` coded bytes, as k3io_pread_piece left them
 * with K3IO_KEEP_CODED. A piece that does not decode gives zero words (the matrix check then
 * fails). All fields are 64-bit. */
typedef struct {
  uint64_t npieces, word0;
  struct {
    uint64_t base, len, stored;
  } piece[];
} k3_split_matrix;

/* Name of the compiled SIMD path: "scalar", "avx2", "avx512" or "neon". */
const char *k3_isa(void);

/* x86 features of this CPU as bits: 1 avx2, 2 fma, 4 f16c, 8 avx512f, 16 avx512bw,
   32 avx512vl, 64 avx512dq (0 elsewhere). Any build can answer, so the loader asks the
   scalar build which SIMD build to load when /proc/cpuinfo is not readable (Deno grants it
   only with --allow-all). */
int32_t k3_cpu_features(void);

/* Aligned (4096 bytes, fit for O_DIRECT) uninitialised allocation; NULL on failure. */
void *k3_alloc(uint64_t bytes);
void k3_free(void *p);

/* Widen n elements to f32. */
void k3_bf16_to_f32(const uint16_t *src, float *dst, int32_t n);
void k3_f16_to_f32(const uint16_t *src, float *dst, int32_t n);

/* Dense matrix times several vectors. W is row-major [rows][cols] of type wtype.
 * For t < ntok and r0 <= r < r1: y[t*rows + r] = dot(W[r, :], x[t*cols : (t+1)*cols]).
 * The dot of one row is the same bits whatever ntok, r0, r1 are. */
void k3_matmul(const void *w, int32_t wtype, const float *x, float *y,
               int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1);

/* Matrix check (contract 5), k3's checksum of a weight matrix that the product itself
 * computes, so streamed weights are verified without a second pass over their bytes. Each
 * row of `rowbytes` bytes is cut into 32-byte units (the last zero padded) of four
 * little-endian 64-bit words d[0..3]; unit u uses key words K[(u mod 16) + i] (CHECK_KEY in
 * products.c: splitmix64 outputs 1..19 from seed 0x6B33636B). With lanes a[0..3] = 0, mod 2^64:
 *   x = d[i] ^ K[(u mod 16) + i];  a[i] += d[i] + lo32(x) * hi32(x)
 * then h = a[0] ^ rotl(a[1], 16) ^ rotl(a[2], 32) ^ rotl(a[3], 48), h += r * 0x9E3779B97F4A7C15
 * (r the row's index in the matrix), and the row word is murmur3's fmix64(h). The check of a
 * matrix is the sum of its row words mod 2^64, so any split of the rows adds up to it.
 * tests/oracle/k3check.py states it in Python.
 * k3_matrix_check: *sum += the words of rows [r0, r1), which w holds back to back from row r0
 * (so a row can be checked from a copy). */
void k3_matrix_check(const void *w, int32_t rowbytes, int32_t r0, int32_t r1, uint64_t *sum);

/* k3_matmul that also adds the check of rows [r0, r1) of W to *sum (sum NULL: k3_matmul).
 * One token: computed from the weight blocks as the product loads them; several: one pass
 * over the rows after the product. */
void k3_matmul_checked(const void *w, int32_t wtype, const float *x, float *y, int32_t ntok, int32_t rows,
                       int32_t cols, int32_t r0, int32_t r1, uint64_t *sum);

/* The same for an MXFP4 matrix: packed [rows][cols/2] (low nibble = even element),
 * scales [rows][cols/32] (value = E2M1[nibble] * 2^(scale-127); scale 255 = zero group).
 * cols must be a multiple of 32. */
void k3_matmul_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, float *y,
                     int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1);

/* k3_matmul_mxfp4 that also adds the checks (contract 5) of rows [r0, r1) of `packed` (rows
 * of cols/2 bytes) to sums[0] and of `scales` (rows of cols/32 bytes) to sums[1] (sums NULL:
 * k3_matmul_mxfp4). One token: the packed rows' checks come from the groups as the product
 * decodes them (skipped groups included); several: one pass after. */
void k3_matmul_mxfp4_checked(const uint8_t *packed, const uint8_t *scales, const float *x, float *y,
                             int32_t ntok, int32_t rows, int32_t cols, int32_t r0, int32_t r1, uint64_t *sums);

/* RMSNorm of ngroups consecutive groups of n: y = w * x / sqrt(mean(x^2) + eps).
 * w may be NULL (no gain). y may equal x. */
void k3_rmsnorm(const float *x, const float *w, float *y, int32_t n, int32_t ngroups, float eps);

/* SiTU-GLU: out[i] = b1*tanh(g/b1)*sigmoid(g) * b2*tanh(u/b2). out may equal g or u. */
void k3_situ_glu(const float *g, const float *u, float *out, int32_t n, float b1, float b2);

/* Causal depthwise conv (kernel 4) then SiLU, one token, all channels.
 * w [channels][4]: tap 3 multiplies the current input, taps 0..2 the previous inputs
 * oldest first. state [channels][3] holds the previous inputs oldest first and is shifted. */
void k3_short_conv(float *state, const float *w, const float *x, float *y, int32_t channels);

/* In place, per head of dim d: x = x / sqrt(sum(x^2) + eps). */
void k3_l2norm(float *x, int32_t d, int32_t nheads, float eps);

/* KDA decay: for head h, channel i: alpha = exp(lb * sigmoid(exp(a_log[h]) * (f + dt_bias))). */
void k3_kda_decay(const float *f, const float *a_log, const float *dt_bias, float *alpha,
                  int32_t nheads, int32_t d, float lb);

/* One KDA delta-rule step for heads [h0, h1). S [nheads][d keys][d values] fp32.
 * q, k [nheads][d] already L2-normalised; v [nheads][d]; beta [nheads] already sigmoided;
 * alpha [nheads][d]. Per head: S = Diag(alpha) S; u = S^T k; S += k (beta (v - u))^T;
 * o = S^T (q / sqrt(d)). */
void k3_kda_step(float *S, const float *q, const float *k, const float *v, const float *beta,
                 const float *alpha, float *o, int32_t d, int32_t h0, int32_t h1);

/* nrows such steps in order, the same bits as one call of k3_kda_step a row: q, k, v,
 * alpha and o [nrows][nheads][d], beta [nrows][nheads]. */
void k3_kda_steps(float *S, const float *q, const float *k, const float *v, const float *beta,
                  const float *alpha, float *o, int32_t d, int32_t nheads, int32_t nrows, int32_t h0, int32_t h1);

/* Gated MLA (NoPE) attention of one query over positions 0..npos-1, heads [h0, h1).
 * Keys and values have kvheads heads: nheads (one per query head) or 1 (shared by all query
 * heads, as in the latent form, where knope and v may be the same array).
 * q [nheads][dn + dr]; knope [npos][kvheads][dn]; krope [npos][dr] (shared by all heads);
 * v [npos][kvheads][dv]; out [nheads][dv]; scores: scratch of npos floats per head,
 * laid out [nheads][npos]. score = (q_nope.k_nope + q_rope.k_rope) * scale; softmax;
 * out = sum_s p_s v_s. Each cache row is read once for all heads. */
void k3_mla_attend(const float *q, const float *knope, const float *krope, const float *v,
                   float *out, float *scores, int32_t npos, int32_t nheads, int32_t kvheads,
                   int32_t dn, int32_t dr, int32_t dv, float scale, int32_t h0, int32_t h1);

/* k3_mla_attend for a tile of nrows consecutive query rows of one sequence, causal: row j
 * attends over positions 0..npos+j-1 (row 0 as k3_mla_attend with npos). q [nrows][nheads]
 * [dn + dr]; out [nrows][nheads][dv]; scores: scratch [nrows][nheads][npos + nrows - 1].
 * The cache is read once for the tile, not once per row; each row's scores, softmax and
 * output are computed in exactly k3_mla_attend's order (the same bits as row by row). */
void k3_mla_attend_rows(const float *q, const float *knope, const float *krope, const float *v,
                        float *out, float *scores, int32_t npos, int32_t nrows, int32_t nheads,
                        int32_t kvheads, int32_t dn, int32_t dr, int32_t dv, float scale, int32_t h0,
                        int32_t h1);

/* MLA latent form, query side, heads [h0, h1) of nrows query rows. kvb is kv_b_proj
 * [nheads*(dn+dv)][dc] of type wtype: per head, dn key rows then dv value rows. q
 * [nrows][nheads][dn + dr] as q_b_proj gives it. Writes qlat [nrows][nheads][dc + dr]: the
 * head's key rows applied transposed to its q_nope (qlat[h][j] = sum_i W_k[h][i][j]
 * q_nope[h][i], i ascending from +0), then q_rope copied. A row's bits do not depend on
 * nrows: the rows only share each weight block's load. */
void k3_mla_absorb(const void *kvb, int32_t wtype, const float *q, float *qlat, int32_t nrows, int32_t nheads,
                   int32_t dn, int32_t dr, int32_t dv, int32_t dc, int32_t h0, int32_t h1);

/* MLA latent form, output side, heads [h0, h1): out[h] = W_v[h] olat[h], olat [nheads][dc],
 * out [nheads][dv]; each row a dot product in the order of k3_matmul. */
void k3_mla_expand(const void *kvb, int32_t wtype, const float *olat, float *out, int32_t nheads,
                   int32_t dn, int32_t dv, int32_t dc, int32_t h0, int32_t h1);

/* Sigmoid router: s = sigmoid(logits); choose the k experts with the largest s + bias
 * (ties to the lowest index), ids in descending order of selection score; weights =
 * s_j / (sum of chosen s + 1e-20) * scale. Returns k. */
int32_t k3_router_topk(const float *logits, const float *bias, int32_t nexperts, int32_t k,
                       float scale, int32_t *ids, float *weights);

/* Attention Residuals over nsrc sources stored back to back, src [nsrc][n]:
 * score_i = dot(src_i / rms(src_i), norm_w * proj_w) (rms with eps, no gain);
 * p = softmax(score); out = sum_i p_i src_i (i ascending). */
void k3_attnres(const float *src, int32_t nsrc, int32_t n, const float *norm_w,
                const float *proj_w, float eps, float *out);

/* Elementwise helpers. */
void k3_add(float *y, const float *x, int32_t n);                 /* y += x */
void k3_axpy(float *y, float a, const float *x, int32_t n);       /* y += a*x */
void k3_sigmoid_mul(float *y, const float *g, int32_t n);         /* y *= sigmoid(g) */
void k3_sigmoid(const float *x, float *y, int32_t n);             /* y = sigmoid(x) */

/* Index of the largest value, ties to the lowest index; NaN never wins. */
int32_t k3_argmax(const float *x, int32_t n);

/* Calibrated peak (bench/prefill.ts's gemm_of_peak): `iters` steps of the dense product's
 * register tile (multiplies and adds, no FMA, no loads); the lanes' sum goes to *sink (so
 * nothing is dead code). Returns the floating-point operations done (each multiply and each
 * add counts one), to be divided by the call's wall time. */
uint64_t k3_peak_loop(int32_t iters, float *sink);

/* Memory read probe (bench/limits.ts measures DRAM with it): XOR of the bytes as 8-byte
 * words in memory order (a final partial word zero padded, read as the host's uint64_t). */
uint64_t k3_read_sum(const void *p, uint64_t bytes);

#endif
