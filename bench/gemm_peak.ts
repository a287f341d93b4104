/**
 * The many-row bf16 product against this machine's own peak for its instruction mix: the
 * kernels' calibrated loop (`k3_peak_loop`: the dense tile's multiply-then-add chains, no
 * FMA, operands in registers and L1) gives the build's peak FLOP/s; a bf16 matrix bigger
 * than the caches (4,096 x 7,168, 58.7 MB) times 16, 64 and 256 rows gives the product's.
 * `gemm_of_peak` is the 256-row product over the peak (issue 33's target: >= 0.5).
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

/** The peak and the many-row bf16 product, in interleaved rounds, best of each. */
export function measureGemmOfPeak(k: Kernels, opts: GemmOptions = {}): GemmOfPeak {
  const rounds = opts.rounds ?? 3, tokens = opts.tokens ?? [16, 64, 256];
  const rows = opts.rows ?? 4096, cols = opts.cols ?? 7168;
  const P = Deno.UnsafePointer.of;
  const w = bf16Words(rows * cols), most = Math.max(...tokens);
  const x = Float32Array.from({ length: most * cols }, (_, i) => Math.sin(i) * 0.5);
  const y = new Float32Array(most * rows), sink = new Float32Array(1);
  let peak = 0;
  const best: Record<number, number> = {};
  for (let r = 0; r < rounds; r++) {
    peak = Math.max(peak, peakOnce(k, sink, 0.2));
    for (const n of tokens) {
      const t = cpuUsage();
      k.k3_matmul(P(w), WTYPE.bf16, P(x), P(y), n, rows, cols, 0, rows);
      const gflops = 2 * rows * cols * n / cpuSince(t) / 1e9;
      best[n] = Math.max(best[n] ?? 0, gflops);
    }
  }
  return {
    isa: isaName(k),
    peak_gflops: peak / 1e9,
    gemm_gflops: best,
    gemm_of_peak: best[tokens[tokens.length - 1]] / (peak / 1e9),
    matrix: `${rows}x${cols}`,
  };
}

if (import.meta.main) { // deno run -A bench/gemm_peak.ts [rounds]: one line of JSON
  const { kernels } = await import("../engine/native/ffi.ts");
  console.log(JSON.stringify(measureGemmOfPeak(kernels(), { rounds: Number(Deno.args[0] ?? 3) })));
}
