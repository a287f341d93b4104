/**
 * The many-row products against this machine's own peak for their instruction mix: the
 * kernels' calibrated loop (`k3_peak_loop`: the dense tile's multiply-then-add chains, no
 * FMA, operands in registers and L1) gives the build's peak FLOP/s; a bf16 matrix bigger
 * than the caches (4,096 x 7,168, 58.7 MB) times 16, 64 and 256 rows gives the bf16
 * product's, and an MXFP4 matrix of one expert's width (the released model's intermediate
 * x latent, 3,072 x 3,584, 5.5 MB) times 8, 16, 64 and 256 rows the experts' product's.
 * `gemm_of_peak` is the 256-row bf16 product over the peak (issue 33's target: >= 0.5),
 * `mxfp4_of_peak` the MXFP4 product at its most rows over the same peak.
 *
 * The machine is shared, so both are timed in this process's CPU seconds (time the scheduler
 * gave to the neighbours does not count; the calls run on this one thread), in interleaved
 * rounds, each keeping its best round: a ratio of two bests taken minutes apart would
 * mostly measure the neighbours. One thread, the loaded library's ISA.
 * bench/prefill.ts reports it in its --json; bench/limits.ts has it as its `gemm` section.
 *
 * @module
 */

import { cpuUsage } from "node:process";
import { isaName, type Kernels, WTYPE } from "../engine/native/ffi.ts";

/** What {@link measureGemmOfPeak} measured. */
export interface GemmOfPeak {
  /** the library's SIMD path (avx512, avx2, ...) */
  isa: string;
  /** the calibrated loop's best FLOP/s, in GFLOP/s */
  peak_gflops: number;
  /** the bf16 product's best GFLOP/s by rows (tokens) */
  gemm_gflops: Record<number, number>;
  /** the product at the most rows over the peak */
  gemm_of_peak: number;
  /** the matrix, rows x cols */
  matrix: string;
  /** the MXFP4 product's best GFLOP/s by rows (tokens) */
  mxfp4_gflops: Record<number, number>;
  /** the MXFP4 product at its most rows over the peak */
  mxfp4_of_peak: number;
  /** the MXFP4 matrix, rows x cols */
  mxfp4_matrix: string;
}

/** Options of {@link measureGemmOfPeak}. */
export interface GemmOptions {
  /** interleaved rounds (default 3) */
  rounds?: number;
  /** the rows the product is timed at (default 16, 64, 256; the last gives gemm_of_peak) */
  tokens?: number[];
  /** the weight matrix's rows (default 4,096; with cols, bigger than the last-level cache) */
  rows?: number;
  /** the weight matrix's columns (default 7,168, the model's width) */
  cols?: number;
  /** the rows the MXFP4 product is timed at (default 8, 16, 64, 256; the last gives mxfp4_of_peak) */
  mxfp4Tokens?: number[];
  /** the MXFP4 matrix's rows (default 3,072, an expert's intermediate width) */
  mxfp4Rows?: number;
  /** the MXFP4 matrix's columns (default 3,584, the experts' latent width) */
  mxfp4Cols?: number;
}

/** Pseudo-random bf16 words of magnitude below 1 (no NaN, no infinity). */
function bf16Words(n: number): Uint16Array {
  const a = new Uint16Array(n);
  let s = 0x9e3779b9;
  for (let i = 0; i < n; i++) {
    s = (s ^ (s << 13)) >>> 0;
    s = (s ^ (s >>> 17)) >>> 0;
    s = (s ^ (s << 5)) >>> 0;
    a[i] = (s & 0x807f) | 0x3c00 | ((s >>> 16) & 0x0380);
  }
  return a;
}

/** An MXFP4 matrix of rows x cols: pseudo-random nibbles, group scales near 2^-7 with one
 * group in 64 skipped (scale 255), as a packed model has a few. */
function mxfp4Matrix(rows: number, cols: number): { packed: Uint8Array; scales: Uint8Array } {
  const packed = new Uint8Array(rows * cols / 2).map((_, i) => (i * 2654435761) >>> 24);
  const scales = new Uint8Array(rows * cols / 32).map((_, i) => (i % 64 === 63 ? 255 : 118 + (i * 40503 >>> 8) % 5));
  return { packed, scales };
}

/** CPU seconds of this process (user + system) since `from` (a cpuUsage() reading). */
export function cpuSince(from: { user: number; system: number }): number {
  const u = cpuUsage(from);
  return (u.user + u.system) / 1e6;
}

/** The calibrated peak, FLOP/s, from one call of about `seconds`. */
export function peakOnce(k: Kernels, sink: Float32Array, seconds: number): number {
  let iters = 1 << 16;
  for (;;) { // grow the call until it lasts long enough to time
    const t = cpuUsage();
    const flops = Number(k.k3_peak_loop(iters, Deno.UnsafePointer.of(sink)));
    const s = cpuSince(t);
    if (s >= seconds || iters >= 1 << 30) return flops / s;
    iters = Math.min(1 << 30, iters * Math.max(2, Math.ceil(seconds / Math.max(s, 1e-4))));
  }
}

/** GFLOP/s of `product` (2 * multiplyAdds FLOPs a call), called until `seconds` of CPU time
 * have passed (a product of few rows lasts a few milliseconds: one call is too short to time). */
function rate(product: () => void, multiplyAdds: number, seconds: number): number {
  const t = cpuUsage();
  let calls = 0, s = 0;
  do {
    product();
    calls++;
    s = cpuSince(t);
  } while (s < seconds);
  return 2 * multiplyAdds * calls / s / 1e9;
}

/** The peak and the many-row bf16 and MXFP4 products, in interleaved rounds, best of each. */
export function measureGemmOfPeak(k: Kernels, opts: GemmOptions = {}): GemmOfPeak {
  const rounds = opts.rounds ?? 3, tokens = opts.tokens ?? [16, 64, 256];
  const rows = opts.rows ?? 4096, cols = opts.cols ?? 7168;
  const mxTokens = opts.mxfp4Tokens ?? [8, 16, 64, 256];
  const mxRows = opts.mxfp4Rows ?? 3072, mxCols = opts.mxfp4Cols ?? 3584;
  const P = Deno.UnsafePointer.of;
  const w = bf16Words(rows * cols), most = Math.max(...tokens, ...mxTokens);
  const mx = mxfp4Matrix(mxRows, mxCols);
  const x = Float32Array.from({ length: most * Math.max(cols, mxCols) }, (_, i) => Math.sin(i) * 0.5);
  const y = new Float32Array(most * Math.max(rows, mxRows)), sink = new Float32Array(1);
  let peak = 0;
  const best: Record<number, number> = {}, mxBest: Record<number, number> = {};
  for (let r = 0; r < rounds; r++) {
    peak = Math.max(peak, peakOnce(k, sink, 0.2));
    for (const n of tokens) {
      const gflops = rate(() => k.k3_matmul(P(w), WTYPE.bf16, P(x), P(y), n, rows, cols, 0, rows), rows * cols * n, 0);
      best[n] = Math.max(best[n] ?? 0, gflops);
    }
    for (const n of mxTokens) {
      const product = () => k.k3_matmul_mxfp4(P(mx.packed), P(mx.scales), P(x), P(y), n, mxRows, mxCols, 0, mxRows);
      mxBest[n] = Math.max(mxBest[n] ?? 0, rate(product, mxRows * mxCols * n, 0.05));
    }
  }
  return {
    isa: isaName(k),
    peak_gflops: peak / 1e9,
    gemm_gflops: best,
    gemm_of_peak: best[tokens[tokens.length - 1]] / (peak / 1e9),
    matrix: `${rows}x${cols}`,
    mxfp4_gflops: mxBest,
    mxfp4_of_peak: mxBest[mxTokens[mxTokens.length - 1]] / (peak / 1e9),
    mxfp4_matrix: `${mxRows}x${mxCols}`,
  };
}

if (import.meta.main) { // deno run -A bench/gemm_peak.ts [rounds [library]]: one line of JSON
  const { kernels } = await import("../engine/native/ffi.ts");
  console.log(JSON.stringify(measureGemmOfPeak(kernels(Deno.args[1]), { rounds: Number(Deno.args[0] ?? 3) })));
}
