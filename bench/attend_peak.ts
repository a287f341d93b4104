/**
 * MLA attention over the latent cache (`k3_mla_attend_rows`) at the released widths against
 * the kernels' calibrated peak (`k3_peak_loop`, bench/gemm_peak.ts), one thread: absorbed MLA,
 * every head's query a latent part (512) and a rope part (64) over one shared cache row per
 * position, the output a 512-float latent per head, 96 heads. The tiles of query rows are the
 * ones the prefill of a 4,096-id prompt passes (engine/model/model.ts): at the first position
 * the wide buffers' 39 rows, past 1,024 positions the 3 rows whose scores fit a 4,096-position
 * context, at the end 1 row. FLOPs per (row, position): 2 x heads x (512 + 64 + 512).
 *
 * With `--baseline LIB` another build of the kernels (an older libk3, say) is timed in the
 * same rounds, interleaved, and the table gives the speedup: the machine is shared, so two
 * bests taken minutes apart would mostly measure the neighbours. Times are this process's
 * CPU seconds, best of the rounds.
 *
 *   deno run -A bench/attend_peak.ts [--rounds 5] [--baseline LIB] [--json]
 *
 * @module
 */

import { cpuUsage } from "node:process";
import { isaName, type Kernels, kernels, openKernels } from "../engine/native/ffi.ts";
import type { K3Config } from "../engine/model/config.ts";
import { releasedK3 } from "../engine/model/shapes.ts";
import { benchArgs } from "./args.ts";
import { cpuSince, peakOnce } from "./gemm_peak.ts";

/** One tile of query rows the bench times: rows at position p0 attend over p0 + 1 .. p0 + rows. */
export interface AttendTile {
  /** the position of the tile's first row */
  p0: number;
  /** query rows in the tile */
  rows: number;
}

/** The tiles a 4,096-id prompt's prefill passes at its start, past 1,024 and at its end. */
export const PREFILL_TILES: AttendTile[] = [{ p0: 0, rows: 39 }, { p0: 1024, rows: 3 }, { p0: 4096, rows: 1 }];

/** One tile's measurement. */
export interface AttendRate extends AttendTile {
  /** GFLOP/s of this library */
  gflops: number;
  /** gflops over the calibrated peak */
  of_peak: number;
  /** GFLOP/s of the baseline library (with --baseline) */
  baseline_gflops?: number;
  /** gflops over baseline_gflops */
  speedup?: number;
}

/** What {@link measureAttend} measured. */
export interface AttendOfPeak {
  /** the library's SIMD path (avx512, avx2, ...) */
  isa: string;
  /** the calibrated loop's best FLOP/s, in GFLOP/s */
  peak_gflops: number;
  /** heads, latent width, rope width */
  shape: string;
  /** per tile */
  tiles: AttendRate[];
}

/** Pseudo-random floats in [-scale, scale). */
function floats(n: number, seed: number, scale: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 1e4 + i * 12.9898) * scale);
}

/** Times each tile on `k` (and `baseline`, interleaved) in `rounds` rounds, best of each, at
 * the released model's MLA widths or `mla`'s. */
export function measureAttend(
  k: Kernels,
  opts: { rounds?: number; baseline?: Kernels; tiles?: AttendTile[]; mla?: K3Config["mla"] } = {},
): AttendOfPeak {
  const rounds = opts.rounds ?? 5, tiles = opts.tiles ?? PREFILL_TILES;
  const { numHeads: H, kvLoraRank: dc, ropeDim: dr, nopeDim } = opts.mla ?? releasedK3().mla;
  const P = Deno.UnsafePointer.of, scale = 1 / Math.sqrt(nopeDim + dr);
  const positions = Math.max(...tiles.map((t) => t.p0 + t.rows));
  const latent = floats(positions * dc, 1, 0.1), krope = floats(positions * dr, 2, 0.5);
  const run = (lib: Kernels, t: AttendTile, q: Float32Array, out: Float32Array, scores: Float32Array) => {
    const start = cpuUsage();
    lib.k3_mla_attend_rows(
      P(q),
      P(latent),
      P(krope),
      P(latent),
      P(out),
      P(scores),
      t.p0 + 1,
      t.rows,
      H,
      1,
      dc,
      dr,
      dc,
      scale,
      0,
      H,
    );
    return cpuSince(start);
  };
  // buffers allocated and touched once, before the rounds: a first call's page faults are
  // not attention
  const bufs = tiles.map((t) => ({
    q: floats(t.rows * H * (dc + dr), 3, 0.5),
    out: new Float32Array(t.rows * H * dc),
    scores: new Float32Array(t.rows * H * (t.p0 + t.rows)),
  }));
  const libs = opts.baseline ? [k, opts.baseline] : [k];
  tiles.forEach((t, i) => libs.forEach((lib) => run(lib, t, bufs[i].q, bufs[i].out, bufs[i].scores)));
  const sink = new Float32Array(1);
  let peak = 0;
  const best = tiles.map(() => libs.map(() => Infinity));
  for (let r = 0; r < rounds; r++) {
    peak = Math.max(peak, peakOnce(k, sink, 0.2));
    tiles.forEach((t, i) => {
      libs.forEach((lib, l) => best[i][l] = Math.min(best[i][l], run(lib, t, bufs[i].q, bufs[i].out, bufs[i].scores)));
    });
  }
  return {
    isa: isaName(k),
    peak_gflops: peak / 1e9,
    shape: `heads ${H}, latent ${dc}, rope ${dr}`,
    tiles: tiles.map((t, i) => {
      // row j attends over p0 + 1 + j positions
      const flops = 2 * H * (dc + dr + dc) * (t.rows * (t.p0 + 1) + (t.rows * (t.rows - 1)) / 2);
      const gflops = flops / best[i][0] / 1e9;
      const rate: AttendRate = { ...t, gflops, of_peak: gflops / (peak / 1e9) };
      if (opts.baseline) {
        rate.baseline_gflops = flops / best[i][1] / 1e9;
        rate.speedup = gflops / rate.baseline_gflops;
      }
      return rate;
    }),
  };
}

if (import.meta.main) {
  const USAGE = "usage: deno run -A bench/attend_peak.ts [--rounds 5] [--baseline LIB] [--json]";
  const { values } = benchArgs(USAGE, {
    rounds: { type: "string", default: "5" },
    baseline: { type: "string" },
    json: { type: "boolean" },
  });
  const rounds = Number(values.rounds);
  if (!Number.isInteger(rounds) || rounds < 1) {
    console.error(`--rounds: expected a positive integer, got ${JSON.stringify(values.rounds)}\n${USAGE}`);
    Deno.exit(2);
  }
  let baseline: Kernels | undefined;
  if (values.baseline) {
    try {
      baseline = openKernels(values.baseline).symbols;
    } catch (e) {
      console.error(`--baseline: cannot open ${values.baseline}: ${(e as Error).message.split("\n")[0]}\n${USAGE}`);
      Deno.exit(2);
    }
  }
  const m = measureAttend(kernels(), { rounds, baseline });
  if (values.json) {
    console.log(JSON.stringify(m));
  } else {
    console.log(`MLA attention, ${m.shape}, one thread, ${m.isa}, peak ${m.peak_gflops.toFixed(1)} GFLOP/s`);
    console.log("| first position | rows | GFLOP/s | of peak |" + (baseline ? " baseline GFLOP/s | speedup |" : ""));
    console.log("| -------------- | ---- | ------- | ------- |" + (baseline ? " ---------------- | ------- |" : ""));
    for (const t of m.tiles) {
      const base = baseline ? ` ${t.baseline_gflops!.toFixed(1)} | ${t.speedup!.toFixed(2)} |` : "";
      console.log(`| ${t.p0} | ${t.rows} | ${t.gflops.toFixed(1)} | ${t.of_peak.toFixed(2)} |${base}`);
    }
  }
}
