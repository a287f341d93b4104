/**
 * Prefill: the old chunked path (`--chunk 16`: a read of the model every 16 tokens)
 * against layer-major segments (`--chunk auto`: the whole prompt in one pass when the
 * memory holds it), in the same run, at the floor budget (a ring of the largest trunk layer,
 * top-k + 1 expert slots) and pinned (`--preset auto`: the trunk pinned, the expert cache
 * sized from the memory left, or from `--pinned-gb`: several runs side by side must not
 * each plan for all of it).
 *
 * On the tiny model (tests/fixtures/tiny, packed to a temporary trunk) and the real-width
 * slices (bench/slice.ts: 32 experts, 6.5 GB; and 896 experts top-16, 36.8 GB), or those
 * `--models` names. A slice missing from the cache folder (K3_BENCH_CACHE, outside the
 * repository) is written and packed first, with its progress on stderr (a few minutes at
 * this disk's rate), and reused by later runs.
 *
 *   deno run -A bench/prefill.ts [--models tiny,slice-32e,slice-896e] [--lengths 256,1024,4096]
 *       [--budgets floor,pinned] [--paths old,new] [--pinned-gb GB] [--skip-old-above 1024] [--threads N] [--json]
 *
 * Per run: the prompt's prefill seconds (wall, and `busy`: the CPU seconds of its busiest
 * thread, what the wall would be with the cores to itself: the machine is shared), the
 * bytes read during it, the segment the plan chose, where the seconds went (the model's
 * ledger: reads waited for, bf16 products, expert products, MLA and KDA attention, head,
 * other), and the bound: max(bytes read / the disk rate measured before the runs, the
 * products' FLOPs at this machine's rates for their rows, on `--threads` threads at once as
 * the pass splits them (productSeconds, RateMode; the rates measured right before and right
 * after the run, their two bounds averaged: computeBound), plus MLA attention's FLOPs at the bf16
 * product's rate: mlaAtProductRate; `wall_over_products_bound` leaves attention out;
 * `wall_over_ideal_bound` takes one thread's rates alone times the threads). With `--json`: `rows`
 * (every run) and, for the widest model
 * run (per model under `by_model`): `prefill_bytes_over_model` (bytes read by the new
 * path's largest prompt at the floor over the model's trunk + routed experts; 1.0 = every
 * byte once), `prefill_wall_over_bound` (the same run's wall seconds over its bound) and
 * `prefill_busy_over_bound` (its busy seconds over it), `prefill_wall_over_ideal_bound`,
 * `prefill_speedup_4096_floor` (old
 * over new prefill seconds, 4,096 ids at the floor, the old path projected from its first
 * passes above --skip-old-above) and the same in busy seconds; `gemm_of_peak` (the 256-row
 * bf16 product over the kernels' calibrated peak, one thread, bench/gemm_peak.ts; its rates
 * under `gemm`), `mxfp4_of_peak` (the experts' MXFP4 product at 256 rows over the same peak;
 * its rates by rows under `gemm.mxfp4_gflops`) and `projection`: the released model's time to first token for 4,096 ids
 * at 8, 32, 64 and 128 GB on a 7 GB/s disk with 16 cores, by the plan (`--preset auto`,
 * the segment by `--chunk auto`).
 *
 * @module
 */

import { cpuUsage } from "node:process";
import { benchArgs } from "./args.ts";
import { measureAttend } from "./attend_peak.ts";
import { measureGemmOfPeak } from "./gemm_peak.ts";
import { ensureSlice, ensureTrunk, LIMITS_SLICE, ROUTER_SLICE } from "./slice.ts";
import { openModel } from "../engine/open.ts";
import type { Ledger } from "../engine/model/ledger.ts";
import { kernels, WTYPE } from "../engine/native/ffi.ts";
import { WorkerPool } from "../engine/native/pool.ts";
import { layerTensors } from "../engine/model/tensors.ts";
import { DEFAULT_TILE_ROWS, expertTileRows } from "../engine/model/scratch.ts";
import { measureRates } from "../engine/weights/rate_probe.ts";
import { DATA_FILE, readManifest } from "../engine/weights/manifest.ts";
import { type K3Config, loadConfig } from "../engine/model/config.ts";
import { releasedK3 } from "../engine/model/shapes.ts";
import { expertBytesOf, expertSlotBytes, routedExperts } from "../engine/weights/plan_experts.ts";
import { estimatedInput, makePlan } from "../engine/weights/plan.ts";
import type { ChunkRequest } from "../engine/weights/plan_segment.ts";
import { DEFAULT_COMPUTE, distinctExperts, type PassRates } from "../engine/weights/throughput.ts";
import type { MemoryOptions } from "../engine/weights/plan_input.ts";
import { packTrunk } from "../pack/pack.ts";

const USAGE =
  "usage: deno run -A bench/prefill.ts [--models tiny,slice-32e,slice-896e] [--lengths 256,1024,4096] [--budgets floor,pinned] [--paths old,new] [--pinned-gb GB] [--skip-old-above N] [--threads N] [--json]";
const { values } = benchArgs(USAGE, {
  models: { type: "string", default: "tiny,slice-32e,slice-896e" },
  lengths: { type: "string", default: "256,1024,4096" },
  budgets: { type: "string", default: "floor,pinned" },
  paths: { type: "string", default: "old,new" },
  "pinned-gb": { type: "string" },
  "skip-old-above": { type: "string", default: "4096" },
  threads: { type: "string" },
  json: { type: "boolean" },
});
/** `--flag`'s comma-separated values, each one `ok` accepts; otherwise one line and exit 2. */
function listOf<T>(flag: string, text: string, ok: (v: string) => boolean): T[] {
  const items = text.split(",");
  const bad = items.find((v) => !ok(v));
  if (bad !== undefined) {
    console.error(`prefill: --${flag}: "${bad}" is not one of its values\n${USAGE}`);
    Deno.exit(2);
  }
  return items as T[];
}
const lengths = listOf<string>("lengths", values.lengths, (v) => /^[1-9]\d*$/.test(v)).map(Number);
const budgets = listOf<"floor" | "pinned">("budgets", values.budgets, (v) => v === "floor" || v === "pinned");
const skipOldAbove = Number(values["skip-old-above"]);
/** The memory the pinned runs plan against (`--pinned-gb`; default: what is available). */
const pinnedAvailable = values["pinned-gb"]
  ? { bytes: Number(values["pinned-gb"]) * 1e9, source: "--pinned-gb" }
  : undefined;
/** The old path (`--chunk 16`) and the new (`--chunk auto`), as `--paths` names them. */
const chunks = listOf<string>("paths", values.paths, (v) => v === "old" || v === "new")
  .map((p): ChunkRequest => p === "old" ? 16 : "auto");
const threads = values.threads ? Number(values.threads) : navigator.hardwareConcurrency;
const log = (s: string) => console.error(`prefill: ${s}`);

/** Passes of the old path measured above --skip-old-above (the rest projected from them). */
const PROJECTED_PASSES = 4;

/** The real-width slices by name (bench/slice.ts). */
const SLICES = { "slice-32e": LIMITS_SLICE, "slice-896e": ROUTER_SLICE } as const;
const modelNames = listOf<string>("models", values.models, (v) => v === "tiny" || v in SLICES);
const TINY = new URL("../tests/fixtures/tiny", import.meta.url).pathname;

/** One measured prefill. */
interface Row {
  model: string;
  ids: number;
  budget: string;
  path: "old" | "new";
  segment: number;
  segments: number;
  /** The plan's pinned trunk and expert cache. */
  trunk_pinned_gb: number;
  expert_cache_gb: number;
  read_bytes: number;
  read_over_model: number;
  prefill_seconds: number;
  /** CPU seconds of the prefill's busiest thread: its wall seconds with the cores to itself
   * (the machine is shared: `prefill_seconds` includes the neighbours' share). */
  busy_seconds: number;
  /** The bytes read at the disk rate measured before the runs. */
  io_seconds: number;
  /** The products' FLOPs at this machine's rates for their rows, on `threads` threads
   * (productSeconds), the rates measured right before the prefill and right after it (the
   * mean of the two: computeBound). */
  compute_seconds: number;
  /** The compute bound (products and MLA attention) from the rates before and after. */
  compute_before_after_seconds: number[];
  /** MLA attention's FLOPs at the many-row bf16 product's rate (mlaAtProductRate): the
   * issue's "compute time at the measured product rate" counts all the compute. */
  attention_compute_seconds: number;
  /** compute_seconds by kind (productParts), beside the pass's ledger in `parts`. */
  compute_parts: { dense: number; experts: number };
  /** max(io_seconds, compute_seconds + attention_compute_seconds). */
  bound_seconds: number;
  wall_over_bound: number;
  busy_over_bound: number;
  /** The bound with one core's product rates times the cores (ComputeBound.ideal). */
  ideal_bound_seconds: number;
  wall_over_ideal_bound: number;
  /** The wall over max(io_seconds, compute_seconds): the stricter bound, attention left out. */
  wall_over_products_bound: number;
  attention_share: number;
  /** Where the prefill's seconds went (the model's ledger; `other`: norms, AttnRes, residual
   * sums and the JavaScript between kernels). */
  parts: Parts;
  /** This process's CPU seconds over the prefill's wall seconds times the threads: the share
   * of the cores it got (on a shared machine, under 1 when the neighbours took some). */
  cpu_share: number;
  /** The kernel's share of it (page faults, reclaim, I/O). */
  system_share: number;
  /** What vmCounters changed by during the prefill. */
  vm: Record<string, number>;
  /** Projected from its first PROJECTED_PASSES passes (the old path above --skip-old-above). */
  projected: boolean;
}

/** Seconds of a prefill by kind of work. */
interface Parts {
  read_wait: number;
  dense: number;
  experts: number;
  mla_attention: number;
  kda_attention: number;
  head: number;
  other: number;
}

/** The ledger's seconds between two readings, by kind, `other` being the rest of `wall`. */
function partsOf(a: Ledger, b: Ledger, wall: number): Parts {
  const d = (key: keyof Ledger) => b[key] - a[key];
  const p = {
    read_wait: d("trunkReadWait") + d("expertReadWait"),
    dense: d("denseMatmul"),
    experts: d("expertCompute"),
    mla_attention: d("mlaAttention"),
    kda_attention: d("attention") - d("mlaAttention"),
    head: d("head"),
  };
  return { ...p, other: wall - Object.values(p).reduce((x, y) => x + y, 0) };
}

/** The models `--models` names, in its order: the tiny one packed to a temporary folder,
 * each slice from the cache (written and packed first when missing or stale). */
async function models(): Promise<{ name: string; dir: string; trunk: string; temp?: string }[]> {
  const out: { name: string; dir: string; trunk: string; temp?: string }[] = [];
  for (const name of modelNames) {
    if (name === "tiny") {
      const temp = await Deno.makeTempDir({ prefix: "k3-prefill-" });
      await packTrunk(TINY, `${temp}/trunk`, { log: null });
      out.push({ name, dir: TINY, trunk: `${temp}/trunk`, temp });
    } else {
      const sliceLog = (s: string) => log(`${name}: ${s}`);
      const dir = await ensureSlice(SLICES[name as keyof typeof SLICES], undefined, sliceLog);
      out.push({ name, dir, trunk: await ensureTrunk(dir, undefined, sliceLog) });
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

/**
 * CPU seconds of each of this process's threads (/proc/self/task: the compute pool's
 * workers are threads of it), by thread id; empty where /proc is not there.
 */
function threadCpuSeconds(): Map<string, number> {
  const out = new Map<string, number>();
  try {
    for (const t of Deno.readDirSync("/proc/self/task")) {
      try {
        const stat = Deno.readTextFileSync(`/proc/self/task/${t.name}/stat`);
        // After the command's closing parenthesis: field 3 on; utime and stime are 14 and 15.
        const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        out.set(t.name, (Number(f[11]) + Number(f[12])) / CLOCK_TICKS);
      } catch { /* the thread ended */ }
    }
  } catch { /* no /proc */ }
  return out;
}

/** The kernel's memory counters a run can stall on (/proc/vmstat: huge page faults served and
 * fallen back, compaction stalls, direct reclaim), to explain a run slower than its
 * neighbours; empty where /proc is not there. */
function vmCounters(): Record<string, number> {
  const keep = ["thp_fault_alloc", "thp_fault_fallback", "compact_stall", "allocstall_movable", "allocstall_normal"];
  try {
    const lines = Deno.readTextFileSync("/proc/vmstat").split("\n").map((l) => l.split(" "));
    return Object.fromEntries(lines.filter(([k]) => keep.includes(k)).map(([k, v]) => [k, Number(v)]));
  } catch {
    return {};
  }
}

/** Linux's USER_HZ: the unit of /proc's CPU times. */
const CLOCK_TICKS = 100;

/** The rates measured so far, by kind, rows and threads at once, FLOP/s a thread
 * (computeBound measures them afresh around each run; the projection takes the last). */
const rateCache = new Map<string, number>();

/** How a product's rate is measured: `one`, one thread alone in its CPU seconds (a core's
 * rate, what the projection multiplies by its cores); `all`, the compute pool's threads at
 * once, each its share of the rows as the pass splits them, in wall seconds (what this
 * machine's cores deliver together: on its two vCPUs two MXFP4 products at once run at
 * 1.4-1.75x one's rate, bf16 ones at 1.9-2x). */
type RateMode = "one" | "all";

/** The compute pool the `all` rates are measured on (started before the runs). */
let ratePool: WorkerPool | undefined;

/**
 * FLOP/s a thread of the `kind` product over `rows` rows (RateMode), best of three: bf16
 * over a 4,096 x 7,168 matrix (58.7 MB, a trunk matrix's width), MXFP4 over eight of an
 * expert's gate matrices back to back (past the caches, as a pass meets each expert fresh
 * from memory).
 */
function productRate(cfg: K3Config, kind: "bf16" | "mxfp4", rows: number, mode: RateMode = "all"): number {
  const P = Deno.UnsafePointer.of;
  const cols = kind === "bf16" ? cfg.hiddenSize : cfg.moe.latent;
  const out = kind === "bf16" ? 4096 : 8 * cfg.moe.intermediate;
  const key = `${kind}:${rows}:${cols}:${out}:${mode}`;
  const known = rateCache.get(key);
  if (known) return known;
  const x = Float32Array.from({ length: rows * cols }, (_, i) => Math.sin(i) * 0.5);
  const y = new Float32Array(rows * out);
  // bf16 words of magnitude below 1; MXFP4 nibbles any, group scales near 2^-7.
  const w = new Uint16Array(out * cols).map((_, i) => 0x3c00 | (i * 2654435761 >>> 20) & 0x3ff);
  const packed = new Uint8Array(out * cols / 2).map((_, i) => i * 2654435761 >>> 24);
  const scales = new Uint8Array(out * cols / 32).fill(120);
  const flops = 2 * out * cols * rows;
  let best = 0;
  for (let round = 0; round < 3; round++) {
    if (mode === "all" && ratePool) {
      // As the pass runs it: the pool splits each matrix's rows across its threads.
      const t0 = performance.now();
      if (kind === "bf16") ratePool.matmul({ ptr: P(w)!, wtype: WTYPE.bf16, rows: out, cols }, P(x)!, P(y)!, rows);
      else {
        const one = cfg.moe.intermediate;
        for (let e = 0; e < 8; e++) {
          const m = {
            packed: P(packed.subarray(e * one * cols / 2))!,
            scales: P(scales.subarray(e * one * cols / 32))!,
          };
          ratePool.mxfp4({ ...m, rows: one, cols }, P(x)!, P(y.subarray(e * one))!, rows);
        }
      }
      const seconds = (performance.now() - t0) / 1000;
      best = Math.max(best, flops / Math.max(seconds, 1e-6) / ratePool.threads);
      continue;
    }
    const t = cpuUsage();
    if (kind === "bf16") k.k3_matmul(P(w), WTYPE.bf16, P(x), P(y), rows, out, cols, 0, out);
    else k.k3_matmul_mxfp4(P(packed), P(scales), P(x), P(y), rows, out, cols, 0, out);
    const u = cpuUsage(t);
    best = Math.max(best, flops / Math.max((u.user + u.system) / 1e6, 1e-6));
  }
  rateCache.set(key, best);
  return best;
}

/** Multiply-adds of every trunk matrix (bf16) of `cfg`, times 2: a row's FLOPs in them. */
function trunkFlopsPerRow(cfg: K3Config): number {
  let params = 0;
  for (let L = 0; L < cfg.numLayers; L++) {
    for (const t of layerTensors(cfg, L)) if (t.keep === "matrix") params += t.shape[0] * t.shape[1];
  }
  return 2 * params;
}

/** Rows each routed expert's product runs over in a segment of `rows`: the rows times top-k
 * over the distinct experts they choose (a flat router), in the expert tiles the model's
 * tiles of `tileRows` give (expertTileRows). */
function rowsPerExpert(cfg: K3Config, rows: number, tileRows: number): number {
  const { numExperts: E, topK } = cfg.moe;
  const tile = expertTileRows(cfg, Math.min(rows, tileRows));
  return Math.max(1, Math.min(tile, Math.round((rows * topK) / distinctExperts(E, topK, rows))));
}

/**
 * The seconds of a prefill's products at this machine's rates, on `cores` threads with
 * the cores to themselves: every trunk matrix over all `n` rows (bf16, in tiles of
 * min(segment, tileRows) rows) and each row's top-k experts in each MoE layer (MXFP4, each
 * expert over rowsPerExpert rows). Attention, norms and the lm_head are not in it
 * (mlaAtProductRate adds attention's FLOPs to the bound).
 */
function productSeconds(cfg: K3Config, c: Prefill): number {
  const { dense, experts } = productParts(cfg, c);
  return dense + experts;
}

/** A prefill the bound is taken for: `n` ids in segments of `segment`, tiles of
 * `tileRows`, on `cores` threads at rates of `mode`. */
interface Prefill {
  n: number;
  segment: number;
  tileRows: number;
  cores: number;
  mode: RateMode;
}

/** productSeconds by kind: the trunk's bf16 products and the experts' MXFP4 ones (the
 * ledger's `dense` and `experts` in the pass, as the kernels alone would take them). */
function productParts(cfg: K3Config, { n, segment, tileRows, cores, mode }: Prefill) {
  const { topK, latent, intermediate } = cfg.moe;
  const moeLayers = cfg.numLayers - cfg.firstKDense;
  const rows = Math.min(segment, n);
  const dense = (trunkFlopsPerRow(cfg) * n) / productRate(cfg, "bf16", Math.min(rows, tileRows), mode);
  const expertFlops = 2 * 3 * latent * intermediate * n * topK * moeLayers;
  const experts = expertFlops / productRate(cfg, "mxfp4", rowsPerExpert(cfg, rows, tileRows), mode);
  return { dense: dense / cores, experts: experts / cores };
}

/** MLA attention's FLOPs for a prompt of `n` ids (row p attends over p + 1 positions in each
 * MLA layer: scores over the latent and rope parts, then the latent sum), at the rate of the
 * bf16 product over the segment's row tiles, on `cores` threads: attention counted as
 * compute at the measured product rate, as the bound's definition asks. */
function mlaAtProductRate(cfg: K3Config, { n, segment, tileRows, cores, mode }: Prefill): number {
  const { numHeads: H, kvLoraRank: dc, ropeDim: dr } = cfg.mla;
  const mlaLayers = cfg.layerKinds.filter((kind) => kind === "mla").length;
  const flops = 2 * H * (dc + dr + dc) * (n * (n + 1) / 2) * mlaLayers;
  return flops / productRate(cfg, "bf16", Math.min(segment, n, tileRows), mode) / cores;
}

/** FLOP/s of one thread's MLA attention over the latent cache (one query row over 2,048
 * positions, every head, bench/attend_peak.ts), in CPU seconds, best of three; measured once. */
function attendRate(cfg: K3Config): number {
  const key = `attend:${cfg.mla.numHeads}:${cfg.mla.kvLoraRank}:${cfg.mla.ropeDim}`;
  const rate = rateCache.get(key) ??
    1e9 * measureAttend(k, { rounds: 3, tiles: [{ p0: 2047, rows: 1 }], mla: cfg.mla }).tiles[0].gflops;
  rateCache.set(key, rate);
  return rate;
}

/** Seconds of MLA attention over the cache for a prompt of `n` ids on `cores` threads:
 * row p attends over p + 1 positions in each MLA layer (the prefill's one quadratic part). */
function attendSeconds(cfg: K3Config, n: number, cores: number): number {
  const { numHeads: H, kvLoraRank: dc, ropeDim: dr } = cfg.mla;
  const mlaLayers = cfg.layerKinds.filter((kind) => kind === "mla").length;
  return (2 * H * (dc + dr + dc) * (n * (n + 1) / 2) * mlaLayers) / attendRate(cfg) / cores;
}

/** A pass's compute bound at the rates measured now (fresh, not the cache's). */
interface ComputeBound {
  /** productSeconds and its parts, at the rates of all threads at once. */
  products: number;
  parts: { dense: number; experts: number };
  /** mlaAtProductRate at those rates. */
  attention: number;
  /** The same compute with one core's rates times the cores (RateMode "one"): what the
   * cores would give if they did not slow each other. */
  ideal: number;
}

/** The compute bound of `pass` with every rate measured afresh. */
function computeBound(cfg: K3Config, pass: Prefill): ComputeBound {
  rateCache.clear();
  const one = { ...pass, mode: "one" as const };
  const parts = productParts(cfg, pass);
  return {
    products: parts.dense + parts.experts,
    parts,
    attention: mlaAtProductRate(cfg, pass),
    ideal: productSeconds(cfg, one) + mlaAtProductRate(cfg, one),
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
  // Pinned: `--preset auto` (the trunk pinned, the expert cache sized from what is left).
  const memory = budget === "floor" ? await floorOf(m.dir, m.trunk) : { trunkDir: m.trunk, preset: "auto" };
  const opened = await openModel(m.dir, {
    capacity: n + 1,
    chunk,
    prefillTokens: n,
    memory,
    threads,
    rates,
    memoryAvailable: budget === "pinned" ? pinnedAvailable : undefined,
  });
  try {
    const { model, plan } = opened;
    const io = () => model.weights.ioStats!();
    const cfg = opened.cfg;
    const pass: Prefill = { n, segment: plan.chunk, tileRows: model.tileRows, cores: threads, mode: "all" };
    // The product rates right before the prefill and again right after it: the machine is
    // shared and its speed drifts over a run of many rows, so the bound takes the rates of
    // the row's own minutes (the mean of its two computes), not of the run's start.
    const before = computeBound(cfg, pass);
    const io0 = io(), ledger0 = { ...model.ledger }, cpu0 = cpuUsage(), threads0 = threadCpuSeconds();
    const vm0 = vmCounters();
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
    const cpu = cpuUsage(cpu0);
    const vm1 = vmCounters();
    const threads1 = threadCpuSeconds();
    // The busiest thread's CPU seconds (the main one: its share of the products and all
    // the serial work): the prefill's wall time on cores of its own.
    const busy = Math.max(...[...threads1].map(([tid, s]) => s - (threads0.get(tid) ?? 0)));
    const parts = partsOf(ledger0, model.ledger, seconds);
    const read = io().trunkBytes + io().expertBytes - io0.trunkBytes - io0.expertBytes;
    const scale = plan.prefill.segments / passes;
    const modelBytes = plan.trunk.totalBytes + routedExperts(cfg) * expertBytesOf(cfg);
    const ioSeconds = (read * scale) / rates.disk;
    const after = computeBound(cfg, pass);
    const mean = (f: (b: ComputeBound) => number) => (f(before) + f(after)) / 2;
    const computeSeconds = mean((b) => b.products);
    const attentionCompute = mean((b) => b.attention);
    const bound = Math.max(ioSeconds, computeSeconds + attentionCompute);
    const ideal = Math.max(ioSeconds, mean((b) => b.ideal));
    return {
      model: m.name,
      ids: n,
      budget,
      path: chunk === "auto" ? "new" : "old",
      segment: plan.chunk,
      segments: plan.prefill.segments,
      trunk_pinned_gb: plan.trunk.pinnedBytes / 1e9,
      expert_cache_gb: plan.experts.bytes / 1e9,
      read_bytes: read * scale,
      read_over_model: (read * scale) / modelBytes,
      prefill_seconds: seconds * scale,
      busy_seconds: busy * scale,
      io_seconds: ioSeconds,
      compute_seconds: computeSeconds,
      attention_compute_seconds: attentionCompute,
      compute_parts: { dense: mean((b) => b.parts.dense), experts: mean((b) => b.parts.experts) },
      compute_before_after_seconds: [before, after].map((b) => b.products + b.attention),
      bound_seconds: bound,
      wall_over_bound: (seconds * scale) / bound,
      busy_over_bound: (busy * scale) / bound,
      ideal_bound_seconds: ideal,
      wall_over_ideal_bound: (seconds * scale) / ideal,
      wall_over_products_bound: (seconds * scale) / Math.max(ioSeconds, computeSeconds),
      attention_share: (parts.mla_attention + parts.kda_attention) / Math.max(seconds, 1e-9),
      parts: Object.fromEntries(Object.entries(parts).map(([k, v]) => [k, v * scale])) as unknown as Parts,
      cpu_share: (cpu.user + cpu.system) / 1e6 / (seconds * threads),
      system_share: cpu.system / 1e6 / (seconds * threads),
      vm: Object.fromEntries(Object.entries(vm1).map(([k, v]) => [k, v - (vm0[k] ?? 0)])),
      projected: scale > 1,
    };
  } finally {
    await opened.close();
  }
}

/** Cores of the projection's machine (the 16-core desktop) and its disk's rate. */
const PROJECTED_CORES = 16;
const PROJECTED_DISK = 7e9;

/**
 * The released model's time to first token for 4,096 ids at `gb` GB on a 7 GB/s disk with
 * 16 cores: the plan's segments and reads (`--preset auto`, the segment by `chunk`), and
 * the time two ways. `plan_minutes`: the plan's own prediction (weights/plan_segment.ts
 * predictPrefill) from DEFAULT_COMPUTE's 2-core rates times 8, its row costs linear in the
 * rows from one row's product. `minutes`: max(the reads at 7 GB/s, the products' FLOPs at
 * the many-row rates this machine's cores measure (productSeconds; the tile the plan's
 * segment gives) plus MLA attention at attendRate, on 16 cores).
 */
function projection(gb: number, chunk: ChunkRequest) {
  const cfg = releasedK3();
  // The 2-core rates DEFAULT_COMPUTE holds, times 8 for 16 cores (products scale with cores).
  const rates: PassRates = {
    disk: PROJECTED_DISK,
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
  const products = productSeconds(cfg, {
    n: 4096,
    segment: plan.chunk,
    tileRows: DEFAULT_TILE_ROWS,
    cores: PROJECTED_CORES,
    mode: "one",
  });
  const attention = attendSeconds(cfg, 4096, PROJECTED_CORES);
  const reads = plan.prefill.readBytes / PROJECTED_DISK;
  return {
    gb,
    segment: plan.chunk,
    segments: plan.prefill.segments,
    read_tb: plan.prefill.readBytes / 1e12,
    read_minutes: reads / 60,
    products_minutes: products / 60,
    mla_attention_minutes: attention / 60,
    minutes: Math.max(reads, products + attention) / 60,
    plan_minutes: (plan.prefill.seconds ?? NaN) / 60,
  };
}

const k = kernels();
const rows: Row[] = [];
const ms = await models();
if (threads > 1) ratePool = await WorkerPool.start(k, threads);
try {
  for (const m of ms) {
    const rates = await measureRates(k, `${m.trunk}/${DATA_FILE}`, threads);
    log(`${m.name}: disk ${(rates.disk / 1e9).toFixed(2)} GB/s, bf16 ${(rates.dense / 1e9).toFixed(1)} GB/s a row`);
    for (const n of lengths) {
      for (const budget of budgets) {
        for (const chunk of chunks) {
          // The old path above --skip-old-above: its first passes measured, the rest projected.
          const max = chunk === 16 && n > skipOldAbove ? PROJECTED_PASSES : Infinity;
          const r = await measure(m, n, budget, chunk, rates, max);
          const parts = Object.entries(r.parts).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(", ");
          log(
            `${m.name} ${n} ids ${budget} ${r.path}: ${r.prefill_seconds.toFixed(2)} s${
              r.projected ? " (projected)" : ""
            }, busy ${r.busy_seconds.toFixed(2)} s, ${r.segments} x ${r.segment}, read ${
              (r.read_bytes / 1e9).toFixed(1)
            } GB (${r.read_over_model.toFixed(2)}x), bound ${r.bound_seconds.toFixed(2)} s (io ${
              r.io_seconds.toFixed(2)
            }, products ${r.compute_seconds.toFixed(2)}: dense ${r.compute_parts.dense.toFixed(1)}, experts ${
              r.compute_parts.experts.toFixed(1)
            }; MLA ${r.attention_compute_seconds.toFixed(1)}), cpu ${
              r.cpu_share.toFixed(2)
            } of ${threads} cores (system ${r.system_share.toFixed(2)}); ${parts}; vm ${JSON.stringify(r.vm)}`,
          );
          rows.push(r);
        }
      }
    }
  }
} finally {
  ratePool?.close();
  for (const m of ms) if (m.temp) await Deno.remove(m.temp, { recursive: true });
}

const gemm = measureGemmOfPeak(k);
log(
  `gemm (${gemm.isa}): ${gemm.gemm_gflops[256].toFixed(1)} GFLOP/s at 256 rows, MXFP4 ${
    gemm.mxfp4_gflops[256].toFixed(1)
  }, peak ${gemm.peak_gflops.toFixed(1)}`,
);

/** A model's headline figures: its largest new-path prompt at the floor, and the speed-up
 * at 4,096 ids at the floor (old over new, wall and busy seconds). */
function headline(model: string) {
  const mine = rows.filter((r) => r.model === model && r.budget === "floor");
  const newFloor = mine.filter((r) => r.path === "new").sort((a, b) => b.ids - a.ids)[0];
  const at4096 = (path: string) => mine.find((r) => r.ids === 4096 && r.path === path);
  const old4096 = at4096("old"), new4096 = at4096("new");
  return {
    measured_on: newFloor ? `${model}, ${newFloor.ids} ids, floor` : null,
    prefill_bytes_over_model: newFloor?.read_over_model ?? null,
    prefill_wall_over_bound: newFloor?.wall_over_bound ?? null,
    prefill_busy_over_bound: newFloor?.busy_over_bound ?? null,
    prefill_wall_over_ideal_bound: newFloor?.wall_over_ideal_bound ?? null,
    prefill_wall_over_products_bound: newFloor?.wall_over_products_bound ?? null,
    prefill_speedup_4096_floor: old4096 && new4096 ? old4096.prefill_seconds / new4096.prefill_seconds : null,
    prefill_busy_speedup_4096_floor: old4096 && new4096 ? old4096.busy_seconds / new4096.busy_seconds : null,
    old_4096_projected: old4096?.projected ?? null,
  };
}

// The headline is the widest model's (the last of tiny, slice-32e, slice-896e that ran).
const order = ["tiny", ...Object.keys(SLICES)];
const widest = ms.map((m) => m.name).sort((a, b) => order.indexOf(b) - order.indexOf(a))[0];
const projections = [8, 32, 64, 128].map((gb) => ({ new: projection(gb, "auto"), old: projection(gb, 16) }));
const summary = {
  rows,
  ...headline(widest),
  by_model: Object.fromEntries(ms.map((m) => [m.name, headline(m.name)])),
  threads,
  gemm_of_peak: gemm.gemm_of_peak,
  mxfp4_of_peak: gemm.mxfp4_of_peak,
  gemm,
  projection: {
    model:
      "released K3, 4,096 ids, --preset auto, 7 GB/s disk, 16 cores: minutes from this machine's many-row product and MLA attention rates per core, plan_minutes from the plan's (2-core DEFAULT_COMPUTE x 8)",
    budgets: projections,
  },
};

if (values.json) console.log(JSON.stringify(summary));
else {
  console.log(
    "| model | ids | budget | path | segments | read GB | read/model | prefill s | busy s | bound s (io, products) | wall/bound | busy/bound | wall/ideal | MLA attention |",
  );
  console.log("| --- | --: | --- | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |");
  for (const r of rows) {
    console.log(
      `| ${r.model} | ${r.ids} | ${r.budget} | ${r.path} | ${r.segments} x ${r.segment} | ${
        (r.read_bytes / 1e9).toFixed(1)
      } | ${r.read_over_model.toFixed(2)} | ${r.prefill_seconds.toFixed(1)}${r.projected ? "*" : ""} | ${
        r.busy_seconds.toFixed(1)
      } | ${r.bound_seconds.toFixed(1)} (${r.io_seconds.toFixed(1)}, ${r.compute_seconds.toFixed(1)}) | ${
        r.wall_over_bound.toFixed(2)
      } | ${r.busy_over_bound.toFixed(2)} | ${r.wall_over_ideal_bound.toFixed(2)} | ${
        (100 * r.parts.mla_attention / r.prefill_seconds).toFixed(0)
      }% |`,
    );
  }
  console.log(
    `(* projected from its first ${PROJECTED_PASSES} passes: the old path above --skip-old-above ${skipOldAbove} ids; busy: the busiest thread's CPU seconds)`,
  );
  console.log("\nreleased K3, 4,096 ids, time to first token (7 GB/s disk, 16 cores):");
  console.log(
    "| memory | segment (auto) | read (auto) | auto: reads, products + MLA attention | TTFT auto | TTFT --chunk 16 | the plan's prediction (auto, 16) |",
  );
  console.log("| --: | --: | --: | --: | --: | --: | --: |");
  const min = (x: number) => `${x.toFixed(1)} min`;
  for (const p of projections) {
    console.log(
      `| ${p.new.gb} GB | ${p.new.segment} x ${p.new.segments} | ${p.new.read_tb.toFixed(2)} TB | ${
        min(p.new.read_minutes)
      }, ${min(p.new.products_minutes)} + ${min(p.new.mla_attention_minutes)} | ${min(p.new.minutes)} | ${
        min(p.old.minutes)
      } | ${p.new.plan_minutes.toFixed(0)}, ${p.old.plan_minutes.toFixed(0)} min |`,
    );
  }
}
