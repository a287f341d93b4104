/**
 * Prefill: the old chunked path (`--chunk 16`: a read of the model every 16 tokens)
 * against layer-major segments (`--chunk auto`: the whole prompt in one pass when the
 * memory holds it), in the same run, at the floor budget and with the trunk pinned.
 *
 * Always on the tiny model (tests/fixtures/tiny, packed to a temporary trunk); on the
 * real-width slices (bench/slice.ts: 32 experts, and 896 experts top-16) only when their
 * cache exists under K3_BENCH_CACHE (this script never writes a slice: they are 6.5-36 GB).
 *
 *   deno run -A bench/prefill.ts [--lengths 256,1024,4096] [--budgets floor,pinned]
 *       [--skip-old-above 1024] [--threads N] [--json]
 *
 * Per run: the prompt's prefill seconds, the bytes read during it, the segment the plan
 * chose, and the bound: max(bytes read / the measured disk rate, the products' time at the
 * measured rates by the plan's equation: weights/plan_segment.ts predictPrefill). With
 * `--json`: `rows` (every run), `prefill_bytes_over_model` (bytes read by the new path's
 * largest prompt at the floor over the model's trunk + routed experts; 1.0 = every byte
 * once), `prefill_wall_over_bound` (the same run's seconds over its bound),
 * `gemm_of_peak` (the 256-row bf16 product over the kernels' calibrated peak, one thread,
 * bench/gemm_peak.ts; its rates under `gemm`),
 * `prefill_speedup_4096_floor` (old over new prefill seconds, 4,096 ids at the floor;
 * the old path projected from its measured passes when skipped) and `projection`: the
 * released model's time to first token for 4,096 ids at 8, 32, 64 and 128 GB on a 7 GB/s
 * disk with 16 cores, by the plan (`--preset auto`, the segment by `--chunk auto`).
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { measureGemmOfPeak } from "./gemm_peak.ts";
import { BENCH_CACHE, ROUTER_SLICE, type SliceRecipe } from "./slice.ts";
import { openModel } from "../engine/open.ts";
import { kernels } from "../engine/native/ffi.ts";
import { measureRates } from "../engine/weights/rate_probe.ts";
import { DATA_FILE, readManifest } from "../engine/weights/manifest.ts";
import { loadConfig } from "../engine/model/config.ts";
import { releasedK3 } from "../engine/model/shapes.ts";
import { expertBytesOf, expertSlotBytes, routedExperts } from "../engine/weights/plan_experts.ts";
import { estimatedInput, makePlan } from "../engine/weights/plan.ts";
import { type ChunkRequest, predictPrefill } from "../engine/weights/plan_segment.ts";
import { DEFAULT_COMPUTE, type PassRates } from "../engine/weights/throughput.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";
import { packTrunk } from "../pack/pack.ts";

const USAGE =
  "usage: deno run -A bench/prefill.ts [--lengths 256,1024,4096] [--budgets floor,pinned] [--skip-old-above N] [--threads N] [--json]";
const { values } = benchArgs(USAGE, {
  lengths: { type: "string", default: "256,1024,4096" },
  budgets: { type: "string", default: "floor,pinned" },
  "skip-old-above": { type: "string", default: "4096" },
  threads: { type: "string" },
  json: { type: "boolean" },
});
const lengths = values.lengths.split(",").map(Number);
const budgets = values.budgets.split(",") as ("floor" | "pinned")[];
const skipOldAbove = Number(values["skip-old-above"]);
const threads = values.threads ? Number(values.threads) : navigator.hardwareConcurrency;
const log = (s: string) => console.error(`prefill: ${s}`);

/** The slice of 32 experts bench/limits.ts uses. */
const LIMITS_SLICE: SliceRecipe = { layers: 3, experts: 32, topK: 16, vocab: 32768, fullAttn: [3] };
const TINY = new URL("../tests/fixtures/tiny", import.meta.url).pathname;

/** One measured prefill. */
interface Row {
  model: string;
  ids: number;
  budget: string;
  path: "old" | "new";
  segment: number;
  segments: number;
  read_bytes: number;
  read_over_model: number;
  prefill_seconds: number;
  bound_seconds: number;
  wall_over_bound: number;
  attention_share: number;
  /** Projected from `passes_measured` passes (the old path skipped above --skip-old-above). */
  projected: boolean;
}

/** The models to run: the tiny one, and each slice whose cache is there. */
async function models(): Promise<{ name: string; dir: string; trunk: string; temp?: string }[]> {
  const out: { name: string; dir: string; trunk: string; temp?: string }[] = [];
  const temp = await Deno.makeTempDir({ prefix: "k3-prefill-" });
  await packTrunk(TINY, `${temp}/trunk`, { log: null });
  out.push({ name: "tiny", dir: TINY, trunk: `${temp}/trunk`, temp });
  for (const [name, r] of [["slice-32e", LIMITS_SLICE], ["slice-896e", ROUTER_SLICE]] as const) {
    const dir = `${BENCH_CACHE}/slice-${r.layers}l-${r.experts}e`;
    try {
      await Deno.stat(`${dir}/slice.json`);
      await readManifest(`${dir}-trunk`);
      out.push({ name, dir, trunk: `${dir}-trunk` });
    } catch {
      log(`${name}: no cached slice at ${dir} (and its -trunk); skipped (make it with bench/slice.ts)`);
    }
  }
  return out;
}

const ids = (n: number) => Array.from({ length: n }, (_, i) => ((i * 7) % 700) + 1);

/** The floor budget of a packed trunk: a ring of its largest layer, top-k + 1 expert slots. */
async function floorOf(dir: string, trunk: string): Promise<MemoryOptions> {
  const cfg = await loadConfig(dir);
  const sizes = (await readManifest(trunk)).layer.map((r) => r.size);
  return {
    trunkDir: trunk,
    trunkGB: Math.max(...sizes) / 1e9,
    cacheGB: (cfg.moe.topK + 1) * expertSlotBytes(expertBytesOf(cfg)) / 1e9,
  };
}

/** One prefill of `n` ids with `chunk` (old: 16; new: auto); `maxPasses` stops early and
 * projects the rest from the passes measured. */
async function measure(
  m: { name: string; dir: string; trunk: string },
  n: number,
  budget: "floor" | "pinned",
  chunk: ChunkRequest,
  rates: PassRates,
  maxPasses = Infinity,
): Promise<Row> {
  const memory = budget === "floor" ? await floorOf(m.dir, m.trunk) : { trunkDir: m.trunk };
  const opened = await openModel(m.dir, { capacity: n + 1, chunk, prefillTokens: n, memory, threads, rates });
  try {
    const { model, plan } = opened;
    const io = () => model.weights.ioStats!();
    const io0 = io(), att0 = model.ledger.attention;
    const prompt = ids(n);
    let passes = 0, seconds = 0;
    const limit = Math.min(maxPasses, plan.prefill.segments);
    // Passes by hand (the scheduler's prefill loop, stopped after `limit` when projecting).
    const state = model.newState();
    const t0 = performance.now();
    try {
      for (let i = 0; i < n && passes < limit; i += plan.chunk, passes++) {
        const last = i + plan.chunk >= n;
        await model.pass([{ state, ids: prompt.slice(i, i + plan.chunk), logits: last ? "last" : "none" }]);
      }
    } finally {
      state.free();
    }
    seconds = (performance.now() - t0) / 1000;
    const read = io().trunkBytes + io().expertBytes - io0.trunkBytes - io0.expertBytes;
    const scale = plan.prefill.segments / passes;
    const cfg = opened.cfg;
    const modelBytes = plan.trunk.totalBytes + routedExperts(cfg) * expertBytesOf(cfg);
    const predicted = predictPrefill(
      {
        streamedBytes: 0,
        trunkBytes: plan.trunk.totalBytes,
        moeLayers: cfg.numLayers - cfg.firstKDense,
        experts: cfg.moe.numExperts,
        topK: cfg.moe.topK,
        expertBytes: expertBytesOf(cfg),
        expertsResident: true,
      },
      n,
      plan.chunk,
      rates,
    );
    const bound = Math.max((read * scale) / rates.disk, predicted.computeSeconds ?? 0);
    return {
      model: m.name,
      ids: n,
      budget,
      path: chunk === "auto" ? "new" : "old",
      segment: plan.chunk,
      segments: plan.prefill.segments,
      read_bytes: read * scale,
      read_over_model: (read * scale) / modelBytes,
      prefill_seconds: seconds * scale,
      bound_seconds: bound,
      wall_over_bound: (seconds * scale) / bound,
      attention_share: (model.ledger.attention - att0) / Math.max(seconds, 1e-9),
      projected: scale > 1,
    };
  } finally {
    await opened.close();
  }
}

/** The released model's time to first token for 4,096 ids at `gb` GB: 7 GB/s, 16 cores. */
function projection(gb: number, chunk: ChunkRequest) {
  const cfg = releasedK3();
  // The 2-core rates DEFAULT_COMPUTE holds, times 8 for 16 cores (products scale with cores).
  const rates: PassRates = {
    disk: 7e9,
    ...DEFAULT_COMPUTE,
    dense: 8 * DEFAULT_COMPUTE.dense,
    expert: 8 * DEFAULT_COMPUTE.expert,
  };
  const plan = makePlan({
    ...estimatedInput(cfg, { trunkDir: "t", preset: "auto" }, 4097, chunk),
    prefillTokens: 4096,
    available: gb * 1e9,
    rates,
  });
  return {
    gb,
    segment: plan.chunk,
    segments: plan.prefill.segments,
    read_tb: plan.prefill.readBytes / 1e12,
    minutes: (plan.prefill.seconds ?? NaN) / 60,
  };
}

const k = kernels();
const rows: Row[] = [];
const ms = await models();
try {
  for (const m of ms) {
    const rates = await measureRates(k, `${m.trunk}/${DATA_FILE}`, threads);
    log(`${m.name}: disk ${(rates.disk / 1e9).toFixed(2)} GB/s, bf16 ${(rates.dense / 1e9).toFixed(1)} GB/s a row`);
    for (const n of lengths) {
      for (const budget of budgets) {
        for (const chunk of [16, "auto"] as ChunkRequest[]) {
          // The old path above --skip-old-above: two passes measured, the rest projected.
          const max = chunk === 16 && n > skipOldAbove ? 2 : Infinity;
          const r = await measure(m, n, budget, chunk, rates, max);
          log(`${m.name} ${n} ids ${budget} ${r.path}: ${r.prefill_seconds.toFixed(2)} s, ${r.segments} segments`);
          rows.push(r);
        }
      }
    }
  }
} finally {
  for (const m of ms) if (m.temp) await Deno.remove(m.temp, { recursive: true });
}

const gemm = measureGemmOfPeak(k);
log(`gemm (${gemm.isa}): ${gemm.gemm_gflops[256].toFixed(1)} GFLOP/s at 256 rows, peak ${gemm.peak_gflops.toFixed(1)}`);

const largest = (pred: (r: Row) => boolean) =>
  rows.filter(pred).sort((a, b) => b.ids - a.ids || (a.model === "tiny" ? 1 : -1))[0];
const newFloor = largest((r) => r.path === "new" && r.budget === "floor");
const at4096 = (path: string) =>
  rows.filter((r) => r.ids === 4096 && r.budget === "floor" && r.path === path).sort((a, b) =>
    a.model === "tiny" ? 1 : b.model === "tiny" ? -1 : 0
  )[0];
const old4096 = at4096("old"), new4096 = at4096("new");
const projections = [8, 32, 64, 128].map((gb) => ({ new: projection(gb, "auto"), old: projection(gb, 16) }));
const summary = {
  rows,
  prefill_bytes_over_model: newFloor ? newFloor.read_over_model : null,
  prefill_wall_over_bound: newFloor ? newFloor.wall_over_bound : null,
  measured_on: newFloor ? `${newFloor.model}, ${newFloor.ids} ids, floor` : null,
  gemm_of_peak: gemm.gemm_of_peak,
  gemm,
  prefill_speedup_4096_floor: old4096 && new4096 ? old4096.prefill_seconds / new4096.prefill_seconds : null,
  speedup_measured_on: new4096?.model ?? null,
  projection: {
    model: "released K3, 4,096 ids, --preset auto, 7 GB/s disk, 16 cores (2-core product rates x 8)",
    budgets: projections,
  },
};

if (values.json) console.log(JSON.stringify(summary, null, 2));
else {
  console.log(
    "| model | ids | budget | path | segment | segments | read MB | read/model | prefill s | bound s | wall/bound | attention |",
  );
  console.log("| --- | --: | --- | --- | --: | --: | --: | --: | --: | --: | --: | --: |");
  for (const r of rows) {
    console.log(
      `| ${r.model} | ${r.ids} | ${r.budget} | ${r.path} | ${r.segment} | ${r.segments} | ${
        (r.read_bytes / 1e6).toFixed(1)
      } | ${r.read_over_model.toFixed(2)} | ${r.prefill_seconds.toFixed(2)}${r.projected ? "*" : ""} | ${
        r.bound_seconds.toFixed(3)
      } | ${r.wall_over_bound.toFixed(1)} | ${(100 * r.attention_share).toFixed(0)}% |`,
    );
  }
  console.log("(* projected from its first passes)");
  console.log("\nreleased K3, 4,096 ids, time to first token (7 GB/s disk, 16 cores):");
  console.log("| memory | segment (auto) | read (auto) | TTFT auto | TTFT --chunk 16 |");
  console.log("| --: | --: | --: | --: | --: |");
  for (const p of projections) {
    console.log(
      `| ${p.new.gb} GB | ${p.new.segment} x ${p.new.segments} | ${p.new.read_tb.toFixed(2)} TB | ${
        p.new.minutes.toFixed(1)
      } min | ${p.old.minutes.toFixed(0)} min |`,
    );
  }
}
