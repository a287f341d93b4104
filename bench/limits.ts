/**
 * This machine's limits, and k3's kernels against them, in one run:
 *
 * - DRAM read rate with 1 and 2 threads (k3_read_sum over a buffer far bigger than the
 *   last-level cache, faulted in first; two threads = two concurrent nonblocking calls on
 *   two halves);
 * - the disk's deep O_DIRECT sequential read rate the way the engine reads (16 MB pieces,
 *   8 in flight, bench/disk.ts) on a scratch file of its own, written, read, removed;
 * - the matrix kernels, one thread: bf16 matrix-vector at a real width (12288 x 7168,
 *   176 MB), MXFP4 matrix-vector of one routed expert matrix (3072 x 3584; 16 experts
 *   rotated so they come from DRAM), each as a ratio to the one-thread DRAM rate, and the
 *   per-token cost of 16 tokens in one call against one token (the prefill's gain); and what
 *   bounds them when they miss: the same kernels on a few rows that stay in L2 (no DRAM
 *   traffic: the compute-bound rate), best of many calls;
 * - the many-row bf16 product (16, 64 and 256 rows) and MXFP4 product (256 rows) against the
 *   kernels' calibrated peak for its instruction mix (`gemm_of_peak`, `mxfp4_of_peak`,
 *   bench/gemm_peak.ts).
 *
 *   deno task limits [--json] [--dir DIR] [--dram-gb N] [--disk-gb N] [--skip-disk]
 *
 * Prints a table (figure, value, limit, ratio); with --json, one JSON object last.
 * Timings are medians (best in brackets) of several runs; the machine is shared, so read
 * ratios measured side by side rather than absolute rates.
 *
 * Hooks: every figure comes from a section (`Section` of bench/figures.ts: async (ctx) =>
 * figures), run in order by `runLimits`; a later section sees the earlier figures in `ctx.figures` (its
 * limits). Decode figures on a real-width slice (resident_decode_of_dram,
 * floor_read_of_disk, the overlap ratios) belong in a section appended to `SECTIONS`.
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { measureDisk } from "./disk.ts";
import { measureGemmOfPeak } from "./gemm_peak.ts";
import { defaultLibraryPath, isaName, type Kernels, kernels, libraryPath } from "../engine/native/ffi.ts";
import { IoFile } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { nonblocking, symbols } from "../engine/native/symbols.ts";
import { parseConfig } from "../engine/model/config.ts";
import { expertBytes } from "../engine/weights/experts.ts";
import { ensureSlice, type SliceRecipe } from "./slice.ts";
import { DATA_FILE, readManifest } from "../engine/weights/manifest.ts";
import { storedSize } from "../engine/weights/trunk_geometry.ts";
import { codecVerdict, measureDecodeRate } from "../engine/weights/codec.ts";
import { measureDiskRate } from "../engine/weights/rate_probe.ts";
import { speculationSection } from "./speculation.ts";
import type { Context, Figure, LimitsOptions, Section } from "./figures.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

/** The decode slice: the released widths and router top-k, 32 experts per MoE layer (~6.5 GB). */
const LIMITS_SLICE: SliceRecipe = { layers: 3, experts: 32, topK: 16, vocab: 32768, fullAttn: [3] };

/** Median of a list. */
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Median and best (seconds) of `reps` timed runs of `fn` after one warm-up run. */
export async function timeRuns(reps: number, fn: () => unknown): Promise<{ median: number; best: number }> {
  await fn();
  const t: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await fn();
    t.push((performance.now() - t0) / 1000);
  }
  t.sort((a, b) => a - b);
  return { median: t[t.length >> 1], best: t[0] };
}

/** The read probe as a nonblocking call, so that two can run at once on two threads. */
function readProbe() {
  return Deno.dlopen(defaultLibraryPath(), nonblocking(symbols, "k3_read_sum"));
}

/** DRAM read rate (GB/s) with 1 and 2 threads over a buffer of `bytes` (faulted in first). */
export async function measureDram(k: Kernels, bytes: number, reps: number): Promise<{ one: number; two: number }> {
  const half = Math.floor(bytes / 2 / 4096) * 4096, n = 2 * half;
  const buf = NativeBuffer.alloc(k, n, "DRAM probe buffer");
  const probe = readProbe();
  try {
    buf.u8.fill(1); // fault every page in (a fresh page reads as the shared zero page)
    const lo = buf.ptr, hi = buf.at(half);
    const one = await timeRuns(reps, () => probe.symbols.k3_read_sum(lo, BigInt(n)));
    const two = await timeRuns(
      reps,
      () => Promise.all([probe.symbols.k3_read_sum(lo, BigInt(half)), probe.symbols.k3_read_sum(hi, BigInt(half))]),
    );
    return { one: n / one.median / 1e9, two: n / two.median / 1e9 };
  } finally {
    probe.close();
    buf.free();
  }
}

/** Writes a scratch file of `bytes` in `dir` (synced), reads it as the engine does, removes it. */
export async function measureDiskRead(
  k: Kernels,
  dir: string,
  bytes: number,
): Promise<{ gbps: number; direct: boolean }> {
  Deno.mkdirSync(dir, { recursive: true });
  const path = `${dir}/k3-limits-${Deno.pid}.tmp`;
  const piece = 16 << 20, total = Math.max(1, Math.floor(bytes / piece)) * piece;
  const src = NativeBuffer.alloc(k, piece, "disk scratch piece");
  try {
    for (let i = 0; i < piece; i++) src.u8[i] = (i * 2654435761) >>> 24; // not all zeros
    const f = IoFile.open(path, { write: true });
    try {
      for (let off = 0; off < total; off += piece) await f.pwrite(src.ptr, piece, off);
      await f.sync();
    } finally {
      f.close();
    }
    const r = await measureDisk(path, total, { piece, depth: 8, randReads: 0 });
    return { gbps: r.seqGBps, direct: r.direct };
  } finally {
    src.free();
    try {
      Deno.removeSync(path);
    } catch { /* already gone */ }
  }
}

/** xorshift bf16 weights of magnitude < 1 (no inf/NaN). */
function fillBf16(a: Uint16Array): void {
  let s = 0x9e3779b9;
  for (let i = 0; i < a.length; i++) {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
    a[i] = (s & 0x807f) | 0x3c00 | ((s >>> 16) & 0x0380);
  }
}
function fillBytes(a: Uint8Array, lo = 0, span = 256): void {
  let s = 0x12345678;
  for (let i = 0; i < a.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = lo + ((s >>> 24) % span);
  }
}

/** Per call, median seconds: bf16 [rows][cols] times ntok vectors, one thread. */
export async function timeBf16(k: Kernels, rows: number, cols: number, toks: number[], reps: number) {
  const w = NativeBuffer.alloc(k, rows * cols * 2, "bf16 matrix");
  const tmax = Math.max(...toks);
  const x = NativeBuffer.alloc(k, tmax * cols * 4, "x"), y = NativeBuffer.alloc(k, tmax * rows * 4, "y");
  try {
    fillBf16(new Uint16Array(w.u8.buffer, w.u8.byteOffset, rows * cols));
    x.f32().forEach((_, i, a) => (a[i] = Math.sin(i) * 0.5));
    const out = new Map<number, number>();
    for (const t of toks) {
      out.set(t, (await timeRuns(reps, () => k.k3_matmul(w.ptr, 1, x.ptr, y.ptr, t, rows, cols, 0, rows))).median);
    }
    return out;
  } finally {
    [w, x, y].forEach((b) => b.free());
  }
}

/** Per call, median seconds: one MXFP4 matrix [rows][cols] (16 rotated, so from DRAM). */
export async function timeMxfp4(k: Kernels, rows: number, cols: number, toks: number[], reps: number) {
  const NE = 16, pb = rows * cols / 2, sb = rows * cols / 32;
  const p = NativeBuffer.alloc(k, NE * pb, "MXFP4 packed"), s = NativeBuffer.alloc(k, NE * sb, "MXFP4 scales");
  const tmax = Math.max(...toks);
  const x = NativeBuffer.alloc(k, tmax * cols * 4, "x"), y = NativeBuffer.alloc(k, tmax * rows * 4, "y");
  try {
    fillBytes(p.u8);
    fillBytes(s.u8, 118, 12);
    x.f32().forEach((_, i, a) => (a[i] = Math.sin(i) * 0.5));
    const out = new Map<number, number>();
    for (const t of toks) {
      let e = 0;
      const one = () => {
        k.k3_matmul_mxfp4(p.at(e * pb), s.at(e * sb), x.ptr, y.ptr, t, rows, cols, 0, rows);
        e = (e + 1) % NE;
      };
      // median over NE calls per timed run (one pass over the 16 experts)
      const r = await timeRuns(reps, () => {
        for (let i = 0; i < NE; i++) one();
      });
      out.set(t, r.median / NE);
    }
    return out;
  } finally {
    [p, s, x, y].forEach((b) => b.free());
  }
}

/**
 * The one-token MXFP4 product against the one-thread DRAM read, side by side: each of `reps`
 * rounds reads `dramBytes` once with the probe and runs one pass over 16 matrices (from
 * DRAM); the medians of the rounds' rates and of their ratios. On a shared machine the probe
 * moves from round to round as much as the product does, so only a ratio taken within a
 * round means anything.
 */
export async function mxfp4AgainstDram(k: Kernels, rows: number, cols: number, dramBytes: number, reps: number) {
  const NE = 16, pb = rows * cols / 2, sb = rows * cols / 32, half = Math.floor(dramBytes / 4096) * 4096;
  const p = NativeBuffer.alloc(k, NE * pb, "MXFP4 packed"), s = NativeBuffer.alloc(k, NE * sb, "MXFP4 scales");
  const x = NativeBuffer.alloc(k, cols * 4, "x"), y = NativeBuffer.alloc(k, rows * 4, "y");
  const buf = NativeBuffer.alloc(k, half, "DRAM probe buffer");
  const probe = readProbe();
  try {
    fillBytes(p.u8);
    fillBytes(s.u8, 118, 12);
    x.f32().forEach((_, i, a) => (a[i] = Math.sin(i) * 0.5));
    buf.u8.fill(1);
    const pass = () => {
      for (let e = 0; e < NE; e++) k.k3_matmul_mxfp4(p.at(e * pb), s.at(e * sb), x.ptr, y.ptr, 1, rows, cols, 0, rows);
    };
    pass(); // warm: x's permuted copy, code paths
    const rates: number[] = [], ratios: number[] = [];
    for (let i = 0; i < reps; i++) {
      let t0 = performance.now();
      await probe.symbols.k3_read_sum(buf.ptr, BigInt(half));
      const dram = half / ((performance.now() - t0) / 1000) / 1e9;
      t0 = performance.now();
      pass();
      const rate = NE * (pb + sb) / ((performance.now() - t0) / 1000) / 1e9;
      rates.push(rate);
      ratios.push(rate / dram);
    }
    return { gbps: median(rates), ofDram: median(ratios) };
  } finally {
    probe.close();
    [p, s, x, y, buf].forEach((b) => b.free());
  }
}

/**
 * Compute-bound rates, best of many calls on weights that stay in cache (so they never come
 * from DRAM): MXFP4 at 1 token on 128 expert rows in L2, as GB/s of packed bytes; bf16 at 16
 * tokens on 512 rows in L3 (enough rows that packing x, once per call, is a few percent), as
 * seconds per call per row (scale by the rows of a real matrix).
 */
export async function timeCached(k: Kernels, reps: number) {
  const mr = 128, mc = 3584, br = 512, bc = 7168, bt = 16;
  const pb = mr * mc / 2, sb = mr * mc / 32;
  const p = NativeBuffer.alloc(k, pb, "MXFP4 packed"), s = NativeBuffer.alloc(k, sb, "MXFP4 scales");
  const w = NativeBuffer.alloc(k, br * bc * 2, "bf16 rows");
  const x = NativeBuffer.alloc(k, bt * bc * 4, "x"), y = NativeBuffer.alloc(k, bt * br * 4, "y");
  try {
    fillBytes(p.u8);
    fillBytes(s.u8, 118, 12);
    fillBf16(new Uint16Array(w.u8.buffer, w.u8.byteOffset, br * bc));
    x.f32().forEach((_, i, a) => (a[i] = Math.sin(i) * 0.5));
    const n = 20 * reps, calls = 8;
    // bf16: fewer, longer calls (each ~1 ms)
    const m = await timeRuns(n, () => {
      for (let i = 0; i < calls; i++) k.k3_matmul_mxfp4(p.ptr, s.ptr, x.ptr, y.ptr, 1, mr, mc, 0, mr);
    });
    const b = await timeRuns(4 * reps, () => k.k3_matmul(w.ptr, 1, x.ptr, y.ptr, bt, br, bc, 0, br));
    return { mxfp4Gbps: (pb + sb) * calls / m.best / 1e9, bf16PerRow: b.best / br, bf16Tokens: bt, bf16Cols: bc };
  } finally {
    [p, s, w, x, y].forEach((b) => b.free());
  }
}

/** DRAM read rates. */
export const dramSection: Section = async (ctx) => {
  ctx.log(`DRAM: reading ${(ctx.opts.dramBytes / 1e9).toFixed(1)} GB, 1 and 2 threads`);
  const d = await measureDram(ctx.k, ctx.opts.dramBytes, ctx.opts.reps);
  return [
    { key: "dram_read_gbps_1t", label: "DRAM read, 1 thread", value: d.one, unit: "GB/s" },
    {
      key: "dram_read_gbps_2t",
      label: "DRAM read, 2 threads",
      value: d.two,
      unit: "GB/s",
      of: "dram_read_gbps_1t",
      ratio: d.two / d.one,
    },
  ];
};

/** The disk's deep sequential O_DIRECT read rate. */
export const diskSection: Section = async (ctx) => {
  if (ctx.opts.skipDisk) return [];
  ctx.log(`disk: ${(ctx.opts.diskBytes / 1e9).toFixed(1)} GB scratch file in ${ctx.opts.dir}`);
  const r = await measureDiskRead(ctx.k, ctx.opts.dir, ctx.opts.diskBytes);
  return [{
    key: "disk_read_gbps",
    label: `disk read, 16 MB x 8 in flight${r.direct ? ", O_DIRECT" : ", buffered (O_DIRECT refused)"}`,
    value: r.gbps,
    unit: "GB/s",
  }];
};

/** The matrix kernels against the one-thread DRAM rate, and batching's per-token gain. */
export const kernelSection: Section = async (ctx) => {
  const { k } = ctx, reps = ctx.opts.reps, dram = ctx.get("dram_read_gbps_1t");
  const [br, bc] = [12288, 7168], [mr, mc] = [3072, 3584];
  ctx.log(`kernels (${isaName(k)}): bf16 ${br}x${bc}, mxfp4 ${mr}x${mc}, 1 and 16 tokens`);
  const b = await timeBf16(k, br, bc, [1, 16], reps);
  const m = await timeMxfp4(k, mr, mc, [1, 16], reps);
  const bBytes = br * bc * 2;
  const bGbps = bBytes / b.get(1)! / 1e9;
  const mx = await mxfp4AgainstDram(k, mr, mc, ctx.opts.dramBytes, 3 * reps);
  const c = await timeCached(k, reps);
  if (c.bf16Cols !== bc) throw new Error("limits: the cached bf16 rows must have the matrix's width");
  const bCachedTok = c.bf16PerRow * br / c.bf16Tokens; // scaled to the real matrix's rows
  return [
    {
      key: "bf16_matvec_gbps",
      label: `bf16 ${br}x${bc}, 1 token`,
      value: bGbps,
      unit: "GB/s",
      of: "dram_read_gbps_1t",
      ratio: bGbps / dram,
    },
    {
      key: "mxfp4_matvec_gbps",
      label: `mxfp4 ${mr}x${mc}, 1 token (ratio: per round)`,
      value: mx.gbps,
      unit: "GB/s",
      of: "dram_read_gbps_1t",
      ratio: mx.ofDram,
    },
    {
      key: "bf16_t16_per_token_ms",
      label: `bf16 ${br}x${bc}, 16 tokens, per token`,
      value: b.get(16)! / 16 * 1e3,
      unit: "ms",
      of: "bf16_t1_ms",
      ratio: b.get(16)! / 16 / b.get(1)!,
    },
    { key: "bf16_t1_ms", label: `bf16 ${br}x${bc}, 1 token`, value: b.get(1)! * 1e3, unit: "ms" },
    {
      key: "mxfp4_t16_per_token_ms",
      label: `mxfp4 ${mr}x${mc}, 16 tokens, per token`,
      value: m.get(16)! / 16 * 1e3,
      unit: "ms",
      of: "mxfp4_t1_ms",
      ratio: m.get(16)! / 16 / m.get(1)!,
    },
    { key: "mxfp4_t1_ms", label: `mxfp4 ${mr}x${mc}, 1 token`, value: m.get(1)! * 1e3, unit: "ms" },
    {
      key: "mxfp4_cached_gbps",
      label: `mxfp4 128x${mc} in L2 (compute), 1 token`,
      value: c.mxfp4Gbps,
      unit: "GB/s",
      of: "dram_read_gbps_1t",
      ratio: c.mxfp4Gbps / dram,
    },
    {
      key: "bf16_t16_cached_per_token_ms",
      label: `bf16 512x${bc} in L3 (compute), 16 tok, per tok`,
      value: bCachedTok * 1e3,
      unit: "ms",
      of: "bf16_t1_ms",
      ratio: bCachedTok / b.get(1)!,
    },
  ];
};

/** The many-row bf16 and MXFP4 products against the kernels' calibrated peak (bench/gemm_peak.ts). */
export const gemmSection: Section = (ctx) => {
  const g = measureGemmOfPeak(ctx.k, { rounds: ctx.opts.reps });
  ctx.log(
    `gemm (${g.isa}): bf16 ${g.matrix} at 16, 64, 256 rows, MXFP4 ${g.mxfp4_matrix} at 256, against the calibrated peak`,
  );
  return Promise.resolve([
    { key: "peak_gflops", label: "calibrated peak, mul + add, 1 thread", value: g.peak_gflops, unit: "GFLOP/s" },
    ...[16, 64].map((n) => ({
      key: `bf16_gemm_t${n}_gflops`,
      label: `bf16 ${g.matrix}, ${n} rows`,
      value: g.gemm_gflops[n],
      unit: "GFLOP/s",
      of: "peak_gflops",
      ratio: g.gemm_gflops[n] / g.peak_gflops,
    })),
    {
      key: "gemm_of_peak",
      label: `bf16 ${g.matrix}, 256 rows, over the peak`,
      value: g.gemm_of_peak,
      unit: "",
    },
    {
      key: "mxfp4_of_peak",
      label: `MXFP4 ${g.mxfp4_matrix}, 256 rows, over the peak`,
      value: g.mxfp4_of_peak,
      unit: "",
    },
  ]);
};

/** One `k3 run` on the decode slice; returns its report. `cgroup`: run it in that cgroup
 * (a directory with cgroup.procs, diskThrottle's). */
async function k3Run(args: string[], env: Record<string, string> = {}, cgroup?: string): Promise<Record<string, any>> {
  const out = await Deno.makeTempFile({ prefix: "k3-limits-", suffix: ".json" });
  try {
    const run = ["run", "-A", `${ROOT}/main.ts`, "run", ...args, "--out", out];
    const o = await new Deno.Command(cgroup ? "sh" : Deno.execPath(), {
      args: cgroup ? ["-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cgroup, Deno.execPath(), ...run] : run,
      env: { K3_LIB: defaultLibraryPath(), ...env },
      stdout: "null",
      stderr: "piped",
    }).output();
    if (o.code !== 0) {
      throw new Error(`k3 run ${args.join(" ")}: exit ${o.code}: ${new TextDecoder().decode(o.stderr).slice(-1500)}`);
    }
    return JSON.parse(await Deno.readTextFile(out));
  } finally {
    await Deno.remove(out).catch(() => {});
  }
}

/** wall / max(I/O busy, compute) of a run: 1 when reads hide entirely behind compute or the reverse. */
function overlap(
  r: Record<string, any>,
): { ratio: number; io: number; compute: number; wall: number; perToken: number } {
  const l = r.ledger;
  const compute = l.wall_seconds - l.trunk_read_wait_seconds - l.expert_read_wait_seconds;
  const io = r.read_busy_seconds;
  return {
    ratio: l.wall_seconds / Math.max(io, compute, 1e-9),
    io,
    compute,
    wall: l.wall_seconds,
    perToken: r.decode_seconds_per_token,
  };
}

/**
 * Decode on a real-width slice (bench/slice.ts: dense+KDA, MoE+KDA, MoE+MLA, 32 experts top-16,
 * vocab 32768, ~6.5 GB): resident (bytes a token moves / decode s/token against 2-thread DRAM;
 * the load against the disk), pinned trunk + a small expert cache, and the floor (reads against
 * the disk, and how well reads hide behind compute).
 */
export const decodeSection: Section = async (ctx) => {
  if (ctx.opts.skipDecode) return [];
  const model = await ensureSlice(LIMITS_SLICE, undefined, ctx.log);
  const trunk = `${model}-trunk`;
  ctx.log(`decode: packing ${trunk}`);
  // Re-packed only when it is not this slice's raw trunk already (others may be reading it).
  const packArgs = ["run", "-A", `${ROOT}/main.ts`, "pack", model, trunk, "--codec", "raw"];
  let pack = await new Deno.Command(Deno.execPath(), { args: packArgs, stdout: "null", stderr: "piped" }).output();
  if (pack.code !== 0) {
    pack = await new Deno.Command(Deno.execPath(), { args: [...packArgs, "--force"], stdout: "null", stderr: "piped" })
      .output();
  }
  if (pack.code !== 0) throw new Error(`k3 pack: ${new TextDecoder().decode(pack.stderr).slice(-1500)}`);
  const cfg = parseConfig(JSON.parse(await Deno.readTextFile(`${model}/config.json`)), "slice config");
  const ids = ["--ids", "11,222,3333,4444", "--gen", "6"];
  // The cold start's other limit: the first touch of fresh memory. On a virtual machine whose
  // hypervisor takes freed guest memory back (free page reporting), each first touch is a
  // fault on the host too, and no guest-side trick (huge pages, faulting ahead) is faster.
  const touchBytes = 2 ** 31;
  const fresh = NativeBuffer.alloc(ctx.k, touchBytes, "fresh-memory probe");
  const t0 = performance.now();
  fresh.prefault();
  const touchGbps = touchBytes / ((performance.now() - t0) / 1000) / 1e9;
  fresh.free();
  ctx.log("decode: resident");
  const res = await k3Run([model, ...ids]);
  // Bytes one decode token moves when everything is resident: every layer's dense weights,
  // one embedding row, the head, and top-k experts in each MoE layer.
  const manifest = JSON.parse(await Deno.readTextFile(`${trunk}/manifest.json`));
  const layerBytes = (manifest.layer as { size: number }[]).reduce((a, r) => a + r.size, 0);
  const moeLayers = cfg.numLayers - cfg.firstKDense;
  const tokenBytes = layerBytes + manifest.head.size + cfg.hiddenSize * 2 +
    moeLayers * cfg.moe.topK * expertBytes(cfg);
  const residentGbps = tokenBytes / res.decode_seconds_per_token / 1e9;
  const loadGbps = (layerBytes + manifest.head.size + manifest.embed.size +
    moeLayers * cfg.moe.numExperts * expertBytes(cfg)) / res.load_seconds / 1e9;
  // Trunk pinned, a small cache: as the engine runs by default (the next layer's experts read
  // ahead on a guess at the end of each layer, then the misses at its routing) and without the
  // guess (K3_EXPERT_READ_AHEAD=0), the two alternated round by round (which goes first
  // alternates too), medians and the median of the within-round ratios.
  const pinnedArgs = [model, ...ids, "--trunk", trunk, "--trunk-gb", "8", "--cache-gb", "0.31"];
  const variants = { plain: { K3_EXPERT_READ_AHEAD: "0" }, ahead: {} };
  const runs: Record<keyof typeof variants, ReturnType<typeof overlap>[]> = { plain: [], ahead: [] };
  const tokenRatios: number[] = [], overlapRatios: number[] = [], loads: number[] = [];
  for (let round = 0; round < ctx.opts.reps; round++) {
    const order = round % 2 === 0 ? ["plain", "ahead"] as const : ["ahead", "plain"] as const;
    const got: Partial<Record<keyof typeof variants, ReturnType<typeof overlap>>> = {};
    for (const v of order) {
      loads.push(Deno.loadavg()[0]);
      ctx.log(
        `decode: trunk pinned, cache 0.31 GB, ${v === "ahead" ? "with" : "without"} read-ahead, round ${
          round + 1
        }/${ctx.opts.reps}`,
      );
      got[v] = overlap(await k3Run(pinnedArgs, variants[v]));
      runs[v].push(got[v]!);
    }
    tokenRatios.push(got.ahead!.perToken / got.plain!.perToken);
    overlapRatios.push(got.ahead!.ratio / got.plain!.ratio);
    ctx.log(
      `decode: round ${round + 1}: s/token ${got.plain!.perToken.toFixed(3)} -> ${got.ahead!.perToken.toFixed(3)}, ` +
        `wall/max(io, compute) ${got.plain!.ratio.toFixed(2)} -> ${got.ahead!.ratio.toFixed(2)}, load ${
          Deno.loadavg()[0].toFixed(1)
        }`,
    );
  }
  const mid = (v: keyof typeof variants, f: (o: ReturnType<typeof overlap>) => number) => median(runs[v].map(f));
  const pinned = {
    ratio: mid("ahead", (o) => o.ratio),
    wall: mid("ahead", (o) => o.wall),
    io: mid("ahead", (o) => o.io),
    compute: mid("ahead", (o) => o.compute),
    perToken: mid("ahead", (o) => o.perToken),
  };
  ctx.log("decode: floor (trunk 2.5 GB, cache 0.31 GB)");
  const floorRun = await k3Run([model, ...ids, "--trunk", trunk, "--trunk-gb", "2.5", "--cache-gb", "0.31"]);
  const floor = overlap(floorRun);
  const floorGbps = floorRun.read_bytes / Math.max(floorRun.read_busy_seconds, 1e-9) / 1e9;
  const disk = ctx.figures.find((f) => f.key === "disk_read_gbps")?.value;
  const dram = ctx.figures.find((f) => f.key === "dram_read_gbps_2t")?.value;
  const figures: Figure[] = [
    {
      key: "resident_decode_gbps",
      label: `resident decode, ${(tokenBytes / 1e9).toFixed(2)} GB/token`,
      value: residentGbps,
      unit: "GB/s",
      ...(dram === undefined ? {} : { of: "dram_read_gbps_2t", ratio: residentGbps / dram }),
    },
    { key: "resident_decode_s_per_token", label: "resident decode", value: res.decode_seconds_per_token, unit: "s" },
    {
      key: "pinned_wall_over_max_io_compute",
      label: `pinned + 0.31 GB cache, read-ahead (the default): wall ${pinned.wall.toFixed(1)} s, I/O ${
        pinned.io.toFixed(1)
      }, compute ${pinned.compute.toFixed(1)}`,
      value: pinned.ratio,
      unit: "x",
    },
    {
      key: "pinned_no_read_ahead_wall_over_max_io_compute",
      label: `the same without read-ahead: wall ${mid("plain", (o) => o.wall).toFixed(1)} s, I/O ${
        mid("plain", (o) => o.io).toFixed(1)
      }, compute ${mid("plain", (o) => o.compute).toFixed(1)}`,
      value: mid("plain", (o) => o.ratio),
      unit: "x",
    },
    {
      key: "pinned_read_ahead_s_per_token",
      label: `pinned decode with read-ahead (without: ${mid("plain", (o) => o.perToken).toFixed(3)} s)`,
      value: pinned.perToken,
      unit: "s",
    },
    {
      key: "pinned_read_ahead_token_ratio",
      label: "s/token with read-ahead over without, within rounds",
      value: median(tokenRatios),
      unit: "x",
    },
    {
      key: "pinned_read_ahead_overlap_ratio",
      label: "wall/max(io, compute) with over without, within rounds",
      value: median(overlapRatios),
      unit: "x",
    },
    {
      key: "decode_load_average",
      label: "1-minute load average during the pinned runs",
      value: median(loads),
      unit: "",
    },
    {
      key: "floor_wall_over_max_io_compute",
      label: `floor: wall ${floor.wall.toFixed(1)} s, I/O ${floor.io.toFixed(1)}, compute ${floor.compute.toFixed(1)}`,
      value: floor.ratio,
      unit: "x",
    },
  ];
  if (disk !== undefined) {
    figures.push(
      {
        key: "floor_read_gbps",
        label: "floor reads, while in flight",
        value: floorGbps,
        unit: "GB/s",
        of: "disk_read_gbps",
        ratio: floorGbps / disk,
      },
      {
        key: "resident_load_gbps",
        label: "resident load (cold start)",
        value: loadGbps,
        unit: "GB/s",
        of: "disk_read_gbps",
        ratio: loadGbps / disk,
      },
      {
        key: "fresh_memory_touch_gbps",
        label: "first touch of 2 GiB of fresh memory (huge pages)",
        value: touchGbps,
        unit: "GB/s",
        of: "disk_read_gbps",
        ratio: touchGbps / disk,
      },
    );
  }
  return figures;
};

/** The disk rate the issue measured its floor token at (GB/s), which `--throttle-gbps`
 * defaults to. */
const ISSUE_DISK_GBPS = 3;

/**
 * A cgroup whose reads from the disk holding `path` are capped at `gbps` (cgroup v1 blkio
 * throttle, or v2 io.max), for a run at a slower disk's rate than this one's; undefined
 * where none can be made (not root, no such controller, a device it does not take).
 * `remove` takes it away again.
 */
async function diskThrottle(path: string, gbps: number): Promise<{ dir: string; remove(): Promise<void> } | undefined> {
  const dev = Deno.statSync(path).dev;
  const major = Number((BigInt(dev) >> 8n) & 0xfffn),
    minor = Number((BigInt(dev) & 0xffn) | ((BigInt(dev) >> 12n) & 0xfff00n));
  const rate = Math.round(gbps * 1e9);
  const tries: [string, string, string][] = [
    ["/sys/fs/cgroup/blkio/k3-limits", "blkio.throttle.read_bps_device", `${major}:${minor} ${rate}`],
    ["/sys/fs/cgroup/k3-limits", "io.max", `${major}:${minor} rbps=${rate}`],
  ];
  // Through sh: Deno grants writes under /sys only to --allow-all, and the bench may run.
  const sh = (script: string, ...args: string[]) =>
    new Deno.Command("sh", { args: ["-c", script, "sh", ...args], stdout: "null", stderr: "null" }).output()
      .then((o) => o.success);
  for (const [dir, file, rule] of tries) {
    if (await sh(`mkdir -p "$1" && printf '%s' "$3" > "$1/$2"`, dir, file, rule)) {
      return { dir, remove: () => sh(`rmdir "$1"`, dir).then(() => {}) };
    }
    await sh(`rmdir "$1"`, dir);
  }
  return undefined;
}

/**
 * The trunk codec on the decode slice: the split decode rate and the bf16 product's rates
 * (plain and from the coded form) on every thread against the disk's O_DIRECT read of the
 * raw trunk (alternated, `reps` each, median of the ratios), the slice's coded size, and
 * the floor token with the coded trunk against the raw one (alternated runs, median seconds
 * per token; the ratio is the median of the rounds' own): on this machine's disk, with the
 * coded pieces decoded by the product (the default) and on the I/O threads
 * (K3_TRUNK_DECODE=io), and with the disk capped at `throttleGbps` (the issue's 3 GB/s:
 * a floor token bound by its reads) where a cgroup can cap it.
 * The slice's bf16 weights are uniform in +-sqrt(3 / cols) (bench/slice.ts): their high bytes
 * take a handful of values, as real weights' do, but a different handful, so the size ratio
 * is the slice's, not the model's.
 */
export const codecSection: Section = async (ctx) => {
  if (ctx.opts.skipDecode) return [];
  const model = await ensureSlice(LIMITS_SLICE, undefined, ctx.log);
  const raw = `${model}-trunk`, split = ctx.opts.codedTrunk ?? `${model}-trunk-split`;
  for (const [dir, codec] of [[raw, "raw"], [split, "split"]]) {
    ctx.log(`codec: packing ${dir} (--codec ${codec}; left alone when it is there)`);
    const pack = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", `${ROOT}/main.ts`, "pack", model, dir, "--codec", codec],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (pack.code !== 0) throw new Error(`k3 pack: ${new TextDecoder().decode(pack.stderr).slice(-1500)}`);
  }
  const m = await readManifest(split);
  const size = m.layer.reduce((a, r) => a + r.size, 0), stored = m.layer.reduce((a, r) => a + storedSize(r), 0);
  const threads = navigator.hardwareConcurrency;
  const ratios: number[] = [], decs: number[] = [], disks: number[] = [], plains: number[] = [], splits: number[] = [];
  for (let i = 0; i < ctx.opts.reps; i++) {
    const r = await measureDecodeRate(ctx.k, libraryPath(), threads, 1);
    const disk = await measureDiskRate(ctx.k, `${raw}/${DATA_FILE}`, 1 << 30);
    decs.push(r.bytesPerSecond / 1e9);
    plains.push(r.plainProduct / 1e9);
    splits.push(r.splitProduct / 1e9);
    disks.push(disk / 1e9);
    ratios.push(r.bytesPerSecond / disk);
    ctx.log(
      `codec: decode ${(r.bytesPerSecond / 1e9).toFixed(2)} GB/s on ${threads} threads, bf16 product ${
        (r.plainProduct / 1e9).toFixed(2)
      } plain and ${(r.splitProduct / 1e9).toFixed(2)} coded, disk ${(disk / 1e9).toFixed(2)} GB/s`,
    );
  }
  const ids = ["--ids", "11,222,3333,4444", "--gen", "6"];
  const floor = ["--trunk-gb", "2.5", "--cache-gb", "0.31"];
  type Way = { name: string; dir: string; env?: Record<string, string> };
  const ways: Way[] = [
    { name: "raw", dir: raw },
    { name: "split", dir: split },
    { name: "split-io", dir: split, env: { K3_TRUNK_DECODE: "io" } },
  ];
  /** Floor seconds per token of each way, alternated over `rounds` rounds. */
  const floorRuns = async (which: Way[], rounds: number, cgroup?: string, tag = "") => {
    const per: Record<string, number[]> = {};
    let decodeSeconds = 0, leftCoded = 0, storedRead = 0, read = 0;
    for (let i = 0; i < rounds; i++) {
      for (const w of which) {
        ctx.log(`codec: floor${tag}, ${w.name} trunk (run ${i + 1} of ${rounds})`);
        const r = await k3Run([model, ...ids, "--trunk", w.dir, ...floor], w.env, cgroup);
        (per[w.name] ??= []).push(r.decode_seconds_per_token);
        if (w.name === "split") {
          decodeSeconds += r.trunk_decode_cpu_seconds;
          leftCoded += r.trunk_bytes_left_coded;
          storedRead += r.trunk_bytes_stored;
          read += r.trunk_bytes_read;
        }
      }
    }
    // The ratio is taken within each round (the raw run and the coded one just after it): on
    // a shared machine the load moves between rounds as much as the codec moves a token.
    const over = (name: string) => median(per[name].map((t, i) => t / per.raw[i]));
    return { per, over, decodeSeconds, leftCoded, storedRead, read };
  };
  const here = await floorRuns(ways, 2);
  const figures: Figure[] = [];
  const throttle = await diskThrottle(`${raw}/${DATA_FILE}`, ctx.opts.throttleGbps ?? ISSUE_DISK_GBPS);
  if (throttle) {
    try {
      const gbps = ctx.opts.throttleGbps ?? ISSUE_DISK_GBPS;
      const slow = await floorRuns(ways.slice(0, 2), 2, throttle.dir, ` at ${gbps} GB/s`);
      figures.push(
        {
          key: "floor_coded_s_per_token_capped",
          label: `floor token, coded trunk, the disk capped at ${gbps} GB/s (a cgroup)`,
          value: median(slow.per.split),
          unit: "s",
          of: "floor_raw_s_per_token_capped",
          ratio: slow.over("split"),
        },
        {
          key: "floor_raw_s_per_token_capped",
          label: `floor token, raw trunk, the disk capped at ${gbps} GB/s`,
          value: median(slow.per.raw),
          unit: "s",
        },
      );
    } finally {
      await throttle.remove();
    }
  } else {
    ctx.log(
      "codec: no cgroup to cap the disk's rate here (not root, or no blkio/io controller): the capped runs are left out",
    );
  }
  const v = codecVerdict({
    disk: median(disks) * 1e9,
    plain: median(plains) * 1e9,
    split: median(splits) * 1e9,
    ratio: stored / size,
  });
  return [
    {
      key: "codec_predicted_coded_over_raw",
      label: `auto's prediction for a streamed trunk byte: ${v.pays ? "split" : "raw"}`,
      value: v.predicted,
      unit: "x",
    },
    {
      key: "codec_slice_stored_ratio",
      label: `slice layers split-coded: ${(stored / 1e9).toFixed(2)} of ${(size / 1e9).toFixed(2)} GB`,
      value: stored / size,
      unit: "x",
    },
    {
      key: "codec_decode_gbps",
      label: `split decode, ${threads} threads (disk ${median(disks).toFixed(2)} GB/s beside it)`,
      value: median(decs),
      unit: "GB/s",
      of: "disk_read_gbps",
      ratio: median(ratios),
    },
    {
      key: "codec_product_gbps",
      label: `bf16 product from the coded form, ${threads} threads, decoded bytes (plain ${
        median(plains).toFixed(2)
      } GB/s)`,
      value: median(splits),
      unit: "GB/s",
      of: "codec_plain_product_gbps",
      ratio: median(splits) / median(plains),
    },
    {
      key: "floor_coded_s_per_token",
      label: `floor token, coded trunk decoded by the product (${
        (here.leftCoded / Math.max(here.storedRead, 1)).toFixed(3)
      } of the stored bytes left coded, ${here.decodeSeconds.toFixed(1)} CPU s on I/O threads; ${
        (here.storedRead / Math.max(here.read, 1)).toFixed(3)
      } of the trunk bytes read)`,
      value: median(here.per.split),
      unit: "s",
      of: "floor_raw_s_per_token",
      ratio: here.over("split"),
    },
    {
      key: "floor_coded_io_s_per_token",
      label: "floor token, coded trunk decoded on the I/O threads (K3_TRUNK_DECODE=io)",
      value: median(here.per["split-io"]),
      unit: "s",
      of: "floor_raw_s_per_token",
      ratio: here.over("split-io"),
    },
    { key: "floor_raw_s_per_token", label: "floor token, raw trunk", value: median(here.per.raw), unit: "s" },
    ...figures,
  ];
};

/** Budgets (GB available, K3_MEM_AVAILABLE_GB) the plan section runs a batch at. */
const PLAN_BUDGETS_GB = [5.5, 7.5];

/**
 * The plan's prediction against a run: `k3 batch --preset auto --parallel auto --draft off`
 * on the decode slice at two memory budgets, 8 prompts of one id each (so every pass holds
 * one row per sequence, as the prediction assumes) and 8 tokens each. The plan predicts
 * tokens/s from the disk rate it measures at start-up (weights/throughput.ts); the run's
 * tokens/s is tokens over the run's wall clock (a cold expert cache included). Reports
 * each budget's choice, prediction and measurement, and `plan_predicted_over_measured`,
 * the geometric mean of predicted over measured.
 */
export const planSection: Section = async (ctx) => {
  if (ctx.opts.skipDecode) return [];
  const model = await ensureSlice(LIMITS_SLICE, undefined, ctx.log);
  const trunk = `${model}-trunk`;
  const pack = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${ROOT}/main.ts`, "pack", model, trunk, "--codec", "raw"],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (pack.code !== 0) throw new Error(`k3 pack: ${new TextDecoder().decode(pack.stderr).slice(-1500)}`);
  const dir = await Deno.makeTempDir({ prefix: "k3-limits-plan-" });
  const figures: Figure[] = [];
  const ratios: number[] = [];
  try {
    const input = `${dir}/prompts.jsonl`;
    await Deno.writeTextFile(
      input,
      Array.from({ length: 8 }, (_, i) => JSON.stringify({ id: i, ids: [100 + 37 * i], gen: 8 })).join("\n") + "\n",
    );
    for (const gb of PLAN_BUDGETS_GB) {
      ctx.log(`plan: k3 batch at ${gb} GB available (--preset auto --parallel auto, 8 prompts x 8 tokens)`);
      const report = `${dir}/report-${gb}.json`;
      const o = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          `${ROOT}/main.ts`,
          "batch",
          model,
          "--trunk",
          trunk,
          "--preset",
          "auto",
          "--draft",
          "off",
          "--input",
          input,
          "--output",
          `${dir}/out-${gb}.jsonl`,
          "--report",
          report,
        ],
        env: { K3_LIB: defaultLibraryPath(), K3_MEM_AVAILABLE_GB: String(gb) },
        stdout: "null",
        stderr: "piped",
      }).output();
      if (o.code !== 0) {
        throw new Error(`k3 batch at ${gb} GB: exit ${o.code}: ${new TextDecoder().decode(o.stderr).slice(-1500)}`);
      }
      const r = JSON.parse(await Deno.readTextFile(report));
      const plan = r.memory, predicted = plan.prediction.tokens_per_second, measured = r.tokens_per_second;
      ratios.push(predicted / measured);
      const choice =
        `${plan.state.sequences} seq, ${plan.trunk.pinned.length}/${plan.trunk.layers} pinned, ${plan.experts.slots} slots`;
      ctx.log(`plan: ${gb} GB: ${choice}; predicted ${predicted.toFixed(3)} tokens/s, measured ${measured.toFixed(3)}`);
      // Where the run's seconds went, against the predicted pass (read and compute).
      const l = r.ledger, p = plan.prediction, f = (x: number) => x.toFixed(2);
      ctx.log(
        `plan: ${gb} GB: predicted pass ${f(p.pass_seconds)} s (read ${f(p.io_seconds)} s, compute ${
          f(p.compute_seconds)
        } s); the run ${f(l.wall_seconds)} s: trunk read wait ${f(l.trunk_read_wait_seconds)}, expert read wait ${
          f(l.expert_read_wait_seconds)
        }, dense ${f(l.dense_matmul_seconds)}, experts ${f(l.expert_compute_seconds)}, head ${
          f(l.head_seconds)
        }, attention ${f(l.attention_seconds)}, other ${f(l.other_seconds)}`,
      );
      figures.push(
        {
          key: `plan_measured_tps_${gb}gb`,
          label: `batch at ${gb} GB (${choice}), measured`,
          value: measured,
          unit: "tok/s",
        },
        {
          key: `plan_predicted_tps_${gb}gb`,
          label: `batch at ${gb} GB, predicted (disk ${(plan.prediction.disk_bytes_per_second / 1e9).toFixed(2)} GB/s)`,
          value: predicted,
          unit: "tok/s",
          of: `plan_measured_tps_${gb}gb`,
          ratio: predicted / measured,
        },
      );
    }
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  const geo = Math.exp(ratios.reduce((a, x) => a + Math.log(x), 0) / ratios.length);
  figures.push({
    key: "plan_predicted_over_measured",
    label: `plan: predicted over measured tokens/s (geometric mean of ${ratios.length})`,
    value: geo,
    unit: "x",
  });
  return figures;
};

/** Sections in run order (append decode sections here; they may use the figures above). */
export const SECTIONS: Section[] = [
  dramSection,
  diskSection,
  kernelSection,
  gemmSection,
  decodeSection,
  codecSection,
  speculationSection,
  planSection,
];

/** The issue's summary ratios, from the figures (absent when a section was skipped). */
export function summary(figures: Figure[]): Record<string, number> {
  const ratio = (key: string) => figures.find((f) => f.key === key)?.ratio;
  const out: Record<string, number> = {};
  const put = (name: string, v: number | undefined) => {
    if (v !== undefined && Number.isFinite(v)) out[name] = v;
  };
  put("bf16_matvec_of_dram", ratio("bf16_matvec_gbps"));
  put("mxfp4_matvec_of_dram", ratio("mxfp4_matvec_gbps"));
  put("bf16_t16_per_token_of_t1", ratio("bf16_t16_per_token_ms"));
  put("mxfp4_t16_per_token_of_t1", ratio("mxfp4_t16_per_token_ms"));
  put("resident_decode_of_dram", ratio("resident_decode_gbps"));
  put("floor_read_of_disk", ratio("floor_read_gbps"));
  put("resident_load_of_disk", ratio("resident_load_gbps"));
  put("fresh_memory_touch_of_disk", ratio("fresh_memory_touch_gbps"));
  put("floor_wall_over_max_io_compute", figures.find((f) => f.key === "floor_wall_over_max_io_compute")?.value);
  put("pinned_wall_over_max_io_compute", figures.find((f) => f.key === "pinned_wall_over_max_io_compute")?.value);
  put(
    "pinned_no_read_ahead_wall_over_max_io_compute",
    figures.find((f) => f.key === "pinned_no_read_ahead_wall_over_max_io_compute")?.value,
  );
  put("pinned_read_ahead_token_ratio", figures.find((f) => f.key === "pinned_read_ahead_token_ratio")?.value);
  put("codec_decode_over_disk", ratio("codec_decode_gbps"));
  put("floor_coded_over_raw", ratio("floor_coded_s_per_token"));
  put("floor_coded_io_over_raw", ratio("floor_coded_io_s_per_token"));
  put("floor_coded_over_raw_capped", ratio("floor_coded_s_per_token_capped"));
  put("codec_product_of_plain", ratio("codec_product_gbps"));
  put("codec_slice_stored_ratio", figures.find((f) => f.key === "codec_slice_stored_ratio")?.value);
  put("codec_predicted_coded_over_raw", figures.find((f) => f.key === "codec_predicted_coded_over_raw")?.value);
  // Speculation (bench/speculation.ts): greedy, the repetitive prompt, suffix drafts.
  const value = (key: string) => figures.find((f) => f.key === key)?.value;
  put("spec_accepted_per_pass", value("spec_suffix_accepted_per_pass_repetitive"));
  put("spec_speedup_repetitive", value("spec_suffix_speedup_repetitive"));
  put("spec_speedup_plain", value("spec_suffix_speedup_plain"));
  put("spec_floor_row_cost", value("spec_floor_row_cost"));
  return out;
}

/** Runs `sections` in order; returns every figure. */
export async function runLimits(k: Kernels, opts: LimitsOptions, sections = SECTIONS): Promise<Figure[]> {
  const figures: Figure[] = [];
  const ctx: Context = {
    k,
    opts,
    figures,
    get(key) {
      const f = figures.find((x) => x.key === key);
      if (!f) throw new Error(`limits: figure ${key} was not measured before it was needed`);
      return f.value;
    },
    log: (line) => console.error(`limits: ${line}`),
  };
  for (const s of sections) figures.push(...await s(ctx));
  return figures;
}

function table(figures: Figure[]): string {
  const lines = [`${"figure".padEnd(44)} ${"value".padStart(10)}       ratio to`];
  for (const f of figures) {
    const v = `${f.value.toFixed(f.unit === "ms" ? 3 : 2)} ${f.unit}`;
    const r = f.ratio === undefined ? "" : `${f.ratio.toFixed(3)} of ${f.of}`;
    lines.push(`${f.label.padEnd(44)} ${v.padStart(14)}   ${r}`);
  }
  return lines.join("\n");
}

if (import.meta.main) {
  const usage =
    "usage: deno task limits [--json] [--dir DIR] [--dram-gb N] [--disk-gb N] [--skip-disk] [--skip-decode] [--reps N] [--only dram,disk,kernels,gemm,decode,codec] [--coded-trunk T] [--throttle-gbps G]\n" +
    "  DIR: where the disk's scratch file goes (default /var/tmp/k3-bench; removed after)\n" +
    "  T: the decode slice's split-coded trunk, packed there when missing (default: beside its raw trunk)\n" +
    "  G: the disk rate the codec's capped floor runs are held to, in a cgroup (default 3 GB/s, the issue's disk)";
  const { values } = benchArgs(usage, {
    json: { type: "boolean" },
    dir: { type: "string" },
    "dram-gb": { type: "string" },
    "disk-gb": { type: "string" },
    "skip-disk": { type: "boolean" },
    "skip-decode": { type: "boolean" },
    reps: { type: "string" },
    only: { type: "string" },
    "coded-trunk": { type: "string" },
    "throttle-gbps": { type: "string" },
  });
  const num = (name: string, v: string | undefined, dflt: number) => {
    const n = v === undefined ? dflt : Number(v);
    if (!Number.isFinite(n) || n <= 0) {
      console.error(`k3: --${name} must be a positive number (got ${v})\n${usage}`);
      Deno.exit(2);
    }
    return n;
  };
  const opts: LimitsOptions = {
    dir: values.dir ?? "/var/tmp/k3-bench",
    dramBytes: num("dram-gb", values["dram-gb"], 1) * 1e9,
    diskBytes: num("disk-gb", values["disk-gb"], 2) * 1e9,
    skipDisk: values["skip-disk"] ?? false,
    skipDecode: values["skip-decode"] ?? false,
    reps: Math.round(num("reps", values.reps, 5)),
    codedTrunk: values["coded-trunk"],
    throttleGbps: num("throttle-gbps", values["throttle-gbps"], ISSUE_DISK_GBPS),
  };
  const named: Record<string, Section> = {
    dram: dramSection,
    disk: diskSection,
    kernels: kernelSection,
    gemm: gemmSection,
    decode: decodeSection,
    codec: codecSection,
    plan: planSection,
  };
  const only = values.only?.split(",").map((n) => {
    if (!named[n]) {
      console.error(
        `k3: --only: unknown section ${JSON.stringify(n)} (one of ${Object.keys(named).join(", ")})\n${usage}`,
      );
      Deno.exit(2);
    }
    return named[n];
  });
  const k = kernels();
  const figures = await runLimits(k, opts, only ?? SECTIONS);
  console.log(table(figures));
  if (values.json) {
    const obj: Record<string, unknown> = { isa: isaName(k), ...summary(figures) };
    for (const f of figures) obj[f.key] = f.value;
    console.log(JSON.stringify(obj));
  }
}
