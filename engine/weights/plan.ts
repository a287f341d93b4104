/**
 * Memory budgets: the presets, and the memory plan that turns a budget into pinned trunk
 * layers, a read-ahead ring and expert-cache slots. More memory buys speed, never a
 * different token: every budget runs the same kernels in the same order.
 *
 * The plan (all bytes, printed before anything big is allocated):
 *
 *   total = trunk + experts + embed/head + finals + state + scratch
 *   trunk   = pinned layers + ring          (with --trunk; without it every layer is resident)
 *             pinned: layers chosen largest first while pinned + ring need <= trunk budget,
 *             where the ring needs the largest pair of consecutive streamed layers (two
 *             layers: the one computing and the one being read), and at least the largest
 *             streamed layer; the ring gets whatever budget the pinned layers leave.
 *   experts = slots x slot bytes            (slot = one expert rounded up to 4096, + 4096 for
 *             O_DIRECT alignment); slots = floor(cache budget / slot), at least top-k + 1,
 *             at most every expert; no --cache-gb: every expert resident
 *   embed/head = both matrices resident, or (ultra) one row buffer + two lm_head chunks
 *   state   = KDA state (fixed) + KV per position x positions (MLA latent cache, fp32)
 *   drafts  = sequences x a speculation record (model/state.ts speculationBytes: the KDA
 *             states before a drafted pass and each row's inputs), when sequences may draft
 *   scratch = the forward pass's buffers for a prefill chunk (model/scratch.ts, sized by the caller)
 *   state cache (serve, batch) = kept conversation states (generate/state_cache.ts): --state-cache-gb,
 *             or by default what the plan leaves of MemAvailable after everything above
 *             (trunk, expert cache, state, scratch) and the fixed overhead, less the same
 *             10% headroom --preset auto keeps, at most STATE_CACHE_DEFAULT_CAP (the cap
 *             itself when availability is unknown); see stateCacheDefault
 *
 * The run is refused (exit 1) when total + FIXED_OVERHEAD exceeds MemAvailable.
 *
 * With measured rates (`PlanInput.rates`) the plan predicts decode tokens/s
 * (weights/throughput.ts) and prints it; `--preset auto` then spends what is left after the
 * fixed parts on the trunk pins and expert cache (and streams the embedding and head or
 * not) by the best prediction instead of trunk first, and `fitSequences` with `auto` takes
 * the number of sequences with the best prediction instead of the most that fit.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { EXIT, K3Error, usageError } from "../errors.ts";
import { bytesText } from "../native/available.ts";
import { layerTensors } from "../model/tensors.ts";
import { passRows, scratchBytes } from "../model/scratch.ts";
import { SPEC_RECORD_ROWS, speculationBytes, stateBytes } from "../model/state.ts";
import { DEFAULT_DRAFTING, type PassRates, type PassShape, type Prediction, predictPass } from "./throughput.ts";

/** A named memory budget, in GB (1e9 bytes). */
export interface Preset {
  /** Name (--preset NAME). */
  name: string;
  /** GB of trunk to pin (NaN: auto). */
  trunkGB: number;
  /** GB of expert cache (NaN: auto). */
  cacheGB: number;
  /** Stream embedding rows and lm_head chunks instead of keeping them resident. */
  streamEmbed: boolean;
  /** What it does. */
  about: string;
}

/** The presets (trunk / expert cache GB, the README's table), plus `auto`, sized from MemAvailable. */
export const PRESETS: Preset[] = [
  {
    name: "ultra",
    trunkGB: 2.5,
    cacheGB: 0.31,
    streamEmbed: true,
    about: "smallest: also streams embedding rows and lm_head chunks",
  },
  {
    name: "laptop",
    trunkGB: 3,
    cacheGB: 1,
    streamEmbed: false,
    about: "trunk streamed, embedding and lm_head resident",
  },
  { name: "desktop", trunkGB: 16, cacheGB: 10, streamEmbed: false, about: "a tenth of the trunk pinned" },
  { name: "workstation", trunkGB: 60, cacheGB: 30, streamEmbed: false, about: "half the trunk pinned" },
  { name: "server", trunkGB: 110, cacheGB: 13, streamEmbed: false, about: "trunk resident" },
  {
    name: "max",
    trunkGB: 110,
    cacheGB: 109,
    streamEmbed: false,
    about: "trunk resident, large expert cache",
  },
  {
    name: "auto",
    trunkGB: NaN,
    cacheGB: NaN,
    streamEmbed: false,
    about: "sized from MemAvailable at start-up",
  },
];

/** What the memory flags asked for (undefined: everything resident, no trunk file). */
export interface MemoryOptions {
  /** Directory of a packed trunk (`k3 pack`); without it the trunk is read from the checkpoint. */
  trunkDir?: string;
  /** Bytes of trunk layers to pin; the rest is streamed through a ring. */
  trunkGB?: number;
  /** Bytes of expert cache. */
  cacheGB?: number;
  /** Stream embedding rows and lm_head chunks. */
  streamEmbed?: boolean;
  /** The preset last named, if any. */
  preset?: string;
}

/**
 * Bytes the process needs beyond the plan: the Deno runtime, JIT and code, the kernel
 * library, compute workers, small JS objects. Measured by bench/ladder.ts as peak RSS
 * minus the plan on a real-width slice: 56-79 MB on every rung whose plan is fully touched
 * (Deno 2.9, 2 compute threads). Budgeted at about twice that in the MemAvailable check.
 */
export const FIXED_OVERHEAD_BYTES = 160e6;

const ALIGN = 4096;
const alignUp = (n: number) => Math.ceil(n / ALIGN) * ALIGN;
/** lm_head chunk streamed at a time in ultra (two are allocated: one read while one computes). */
export const HEAD_CHUNK_BYTES = 32 * 1024 * 1024;

/** True when any memory flag asks for something other than everything resident. */
export function wantsStreaming(mem?: MemoryOptions): boolean {
  return !!mem &&
    (mem.trunkDir !== undefined || mem.cacheGB !== undefined || mem.trunkGB !== undefined ||
      !!mem.streamEmbed || mem.preset !== undefined);
}

/** The sizes a plan is made from (from a packed trunk's manifest or the checkpoint). */
export interface PlanInput {
  /** The model config. */
  cfg: K3Config;
  /** Bytes of each layer's dense tensors in bound form (a packed trunk: region sizes). */
  layerBytes: number[];
  /** Bytes streaming each layer reads and holds in the ring, where fewer than `layerBytes` (a
   * split-coded trunk: trunk_ring.ts streamedLayout); the prediction reads these. The
   * pins and the ring are still sized by `layerBytes` (room to spare on a coded trunk). */
  layerStreamBytes?: number[];
  /** Of each layer's bytes, those its products decode from the coded form when streamed. */
  layerCodedBytes?: number[];
  /** Bytes of the embedding. */
  embedBytes: number;
  /** Bytes of the lm_head. */
  headBytes: number;
  /** Bytes of the final vectors. */
  finalsBytes: number;
  /** Bytes of one routed expert. */
  expertBytes: number;
  /** Positions the state holds. */
  capacity: number;
  /** Requested prefill chunk. */
  chunk: number;
  /** Sequences in flight at once, each with its own state (default 1). */
  sequences?: number;
  /** Bytes of one sequence's state (state.ts's stateBytes). */
  stateBytes: { fixed: number; perPosition: number };
  /** Bytes of the forward pass's scratch for `passRows(chunk, sequences)` rows (scratch.ts). */
  scratchBytes: number;
  /** The memory flags. */
  mem: MemoryOptions;
  /** A packed trunk is given (--trunk). */
  packed: boolean;
  /** Available memory in bytes (undefined: do not check): native/available.ts's probe. */
  available?: number;
  /** Where `available` comes from, for the refusal ("MemAvailable" unless given). */
  availableSource?: string;
  /** A conversation state cache to plan: its GB, or undefined gb for the default. Absent:
   * no state cache (the plan has no such line). */
  stateCache?: { gb?: number };
  /** Sequences may draft (speculative decoding): the plan holds a speculation record for
   * each. */
  drafts?: boolean;
  /** Measured rates: the plan predicts tokens/s with them, and `--preset auto` spends memory
   * by the prediction (absent: no prediction, trunk first). */
  rates?: PassRates;
  /** The share of a pinned MoE layer's missed experts the engine's read-ahead guesses right
   * (throughput.ts PassShape.guessRight; absent: none read ahead). */
  guessRight?: number;
}

/** The largest default state cache: enough for a few long conversations on the full model
 * (~55 KB per position: 8 GB holds ~145,000 positions). */
export const STATE_CACHE_DEFAULT_CAP = 8e9;

/**
 * The default state cache budget: what the plan leaves of `available` after `planned`
 * bytes (trunk, expert cache, state, scratch) and the fixed overhead, less 10% headroom
 * (as --preset auto keeps), capped at {@link STATE_CACHE_DEFAULT_CAP}; the cap when the
 * available memory is unknown. Entries take RAM only as conversations are kept, so the
 * budget is a ceiling, not an allocation.
 */
export function stateCacheDefault(available: number | undefined, planned: number): number {
  if (available === undefined) return STATE_CACHE_DEFAULT_CAP;
  const left = Math.max(0, 0.9 * (available - planned - FIXED_OVERHEAD_BYTES));
  return Math.floor(Math.min(STATE_CACHE_DEFAULT_CAP, left));
}

/** The memory plan. Every size in bytes. */
export interface MemoryPlan {
  /** Everything in RAM, or a trunk streamed from disk. */
  mode: "resident" | "streamed";
  /** The preset named, if any. */
  preset: string | null;
  /** Trunk layers: pinned, and the read-ahead ring. */
  trunk: {
    packed: boolean;
    layers: number;
    totalBytes: number;
    pinned: number[];
    pinnedBytes: number;
    ringBytes: number;
    /** Layers the ring can hold at once (min..max over the streamed layers). */
    ringDepth: [number, number];
    bytes: number;
    budgetBytes: number | null;
  };
  /** The routed-expert cache. */
  experts: {
    resident: boolean;
    slots: number;
    slotBytes: number;
    expertBytes: number;
    total: number;
    topK: number;
    bytes: number;
  };
  /** Embedding and lm_head: streamed or resident, and their bytes. */
  embedHead: { streamed: boolean; bytes: number };
  /** Bytes of the final vectors. */
  finalsBytes: number;
  /** Sequence state: fixed bytes, MLA cache per position, positions, sequences. */
  state: { fixedBytes: number; kvPerPosition: number; positions: number; sequences: number; bytes: number };
  /** Bytes of scratch buffers. */
  scratchBytes: number;
  /** Speculation records: one per sequence when sequences may draft (null: they do not). */
  speculation: { rows: number; perSequence: number; sequences: number; bytes: number } | null;
  /** Predicted decode tokens/s with every sequence decoding (null: no rates given). */
  prediction: (Prediction & { sequences: number; diskBytesPerSecond: number }) | null;
  /** The conversation state cache's RAM budget (null: no cache planned). */
  stateCache: { bytes: number; perPosition: number; fixedBytes: number; source: "flag" | "default" } | null;
  /** The prefill chunk. A pass whose experts exceed the cache runs them in waves. */
  chunk: number;
  /** Rows one forward pass holds: a prefill chunk plus one decode token of each other sequence. */
  passRows: number;
  /** Bytes of the whole plan. */
  totalBytes: number;
  /** Bytes beyond the plan (runtime, code). */
  overheadBytes: number;
  /** Available memory checked against (null: not checked). */
  availableBytes: number | null;
  /** Where availableBytes comes from ("MemAvailable", a cgroup limit, the override). */
  availableSource: string;
  /** Notes printed with the plan. */
  notes: string[];
}

/** Bytes of a routed expert (MXFP4 packed + scales of w1, w3, w2). */
export function expertBytesOf(cfg: K3Config): number {
  const { latent, intermediate: I } = cfg.moe;
  return 2 * (I * latent / 2 + I * latent / 32) + (latent * I / 2 + latent * I / 32);
}

/** One expert-cache slot: room for an O_DIRECT read that starts up to 4095 bytes early. */
export function expertSlotBytes(expertBytes: number): number {
  return alignUp(expertBytes) + ALIGN;
}

/**
 * Bound bytes of layer L as a packed region, assuming BF16 matrices and F32 vectors (the
 * released dtypes): for plans of models we do not have on disk (`k3 presets`).
 */
export function estimatedLayerBytes(cfg: K3Config, L: number): number {
  let at = 0;
  for (const s of layerTensors(cfg, L)) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    at = Math.ceil(at / 64) * 64 + n * (s.keep === "matrix" ? 2 : 4);
  }
  return alignUp(at);
}

/** The released Kimi K3 shape (for `k3 presets`). */
export function releasedK3(): K3Config {
  const layerKinds = Array.from(
    { length: 93 },
    (_, L) => (L % 4 === 3 || L === 92 ? "mla" : "kda") as "mla" | "kda",
  );
  return {
    hiddenSize: 7168,
    numLayers: 93,
    vocabSize: 163840,
    rmsNormEps: 1e-5,
    layerKinds,
    kda: { numHeads: 96, headDim: 128, convKernel: 4, gateLowerBound: -5 },
    mla: { numHeads: 96, qLoraRank: 1536, kvLoraRank: 512, nopeDim: 128, ropeDim: 64, vDim: 128 },
    moe: {
      numExperts: 896,
      topK: 16,
      numShared: 2,
      latent: 3584,
      intermediate: 3072,
      routedScaling: 1,
    },
    firstKDense: 1,
    denseIntermediate: 33792,
    attnResBlock: 12,
    situBeta: 4,
    situLinearBeta: 25,
    bosId: 163584,
    eosId: 163586,
    quantGroup: 32,
  };
}

/** Plan inputs for a model known only by its config (BF16 matrices). */
export function estimatedInput(
  cfg: K3Config,
  mem: MemoryOptions,
  capacity: number,
  chunk = 16,
): PlanInput {
  const VD = cfg.vocabSize * cfg.hiddenSize;
  return {
    cfg,
    mem,
    capacity,
    chunk,
    packed: true,
    layerBytes: Array.from({ length: cfg.numLayers }, (_, L) => estimatedLayerBytes(cfg, L)),
    embedBytes: alignUp(VD * 2),
    headBytes: alignUp(VD * 2),
    finalsBytes: alignUp(3 * cfg.hiddenSize * 4),
    expertBytes: expertBytesOf(cfg),
    stateBytes: stateBytes(cfg),
    scratchBytes: scratchBytes(cfg, passRows(chunk, 1), capacity),
  };
}

/** The ring's need for a set of streamed layers (in layer order, cyclic). */
function ringNeed(sizes: number[]): number {
  if (sizes.length === 0) return 0;
  if (sizes.length === 1) return sizes[0];
  let need = 0;
  for (let i = 0; i < sizes.length; i++) {
    need = Math.max(need, sizes[i] + sizes[(i + 1) % sizes.length]);
  }
  return need;
}

/** How many consecutive streamed layers fit in a ring of `ring` bytes (min, max). */
function ringDepth(sizes: number[], ring: number): [number, number] {
  if (sizes.length === 0) return [0, 0];
  let lo = Infinity, hi = 0;
  for (let i = 0; i < sizes.length; i++) {
    let n = 0, used = 0;
    while (n < sizes.length && used + sizes[(i + n) % sizes.length] <= ring) {
      used += sizes[(i + n++) % sizes.length];
    }
    lo = Math.min(lo, n);
    hi = Math.max(hi, n);
  }
  return [lo, hi];
}

const GB = 1e9;

/** Which layers to pin for a trunk budget, and the ring. Throws when the budget is too small. */
export function pinLayers(sizes: number[], budget: number): { pinned: number[]; ring: number } {
  const total = sizes.reduce((a, b) => a + b, 0);
  if (total <= budget) return { pinned: sizes.map((_, i) => i), ring: 0 };
  const pinned = new Set<number>();
  let pinnedBytes = 0;
  const order = sizes.map((s, i) => ({ s, i })).sort((a, b) => b.s - a.s || a.i - b.i);
  for (const { s, i } of order) {
    const rest = sizes.filter((_, j) => j !== i && !pinned.has(j));
    if (pinnedBytes + s + ringNeed(rest) <= budget) {
      pinned.add(i);
      pinnedBytes += s;
    }
  }
  const streamed = sizes.filter((_, j) => !pinned.has(j));
  const largest = Math.max(...streamed);
  const ring = Math.floor(Math.min(budget - pinnedBytes, streamed.reduce((a, b) => a + b, 0)) / ALIGN) * ALIGN;
  if (ring < largest) {
    throw new K3Error(
      `memory plan: --trunk-gb ${(budget / GB).toFixed(3)} cannot hold the largest trunk layer (${
        (largest / GB).toFixed(3)
      } GB); give the trunk at least that`,
    );
  }
  return { pinned: [...pinned].sort((a, b) => a - b), ring };
}

/**
 * The trunk budgets worth weighing, one per count n of layers pinned (largest first): the n
 * largest layers plus a ring for the rest (two consecutive streamed layers), ascending; the
 * last pins every layer.
 */
export function pinBudgets(sizes: number[]): number[] {
  return memo(sizes, "budgets", () => pinBudgetsOf(sizes));
}

/** Results computed from a layer-size list, kept while the list lives: the plan weighs the
 * same pin budgets for every sequence count and both embedding choices. */
const memos = new WeakMap<number[], Map<string, unknown>>();
function memo<T>(sizes: number[], key: string, make: () => T): T {
  let m = memos.get(sizes);
  if (!m) memos.set(sizes, m = new Map());
  if (!m.has(key)) m.set(key, make());
  return m.get(key) as T;
}

function pinBudgetsOf(sizes: number[]): number[] {
  const order = sizes.map((s, i) => ({ s, i })).sort((a, b) => b.s - a.s || a.i - b.i);
  const out: number[] = [];
  for (let n = 0; n <= sizes.length; n++) {
    const top = new Set(order.slice(0, n).map((o) => o.i));
    const pinned = order.slice(0, n).reduce((a, o) => a + o.s, 0);
    out.push(pinned + ringNeed(sizes.filter((_, j) => !top.has(j))));
  }
  return out;
}

/** Makes the plan; throws K3Error (exit 1) when it cannot be met. Pure: everything it weighs is in `input`. */
export function makePlan(input: PlanInput): MemoryPlan {
  const { cfg, mem } = input;
  const notes: string[] = [];
  const streaming = wantsStreaming(mem);
  const st = input.stateBytes;
  const topK = cfg.moe.topK;
  const moeLayers = Math.max(0, cfg.numLayers - cfg.firstKDense);
  const totalExperts = moeLayers * cfg.moe.numExperts;
  const slotBytes = expertSlotBytes(input.expertBytes);
  const trunkTotal = input.layerBytes.reduce((a, b) => a + b, 0);
  const headRow = input.headBytes / cfg.vocabSize;
  const embedHeadOf = (streamed: boolean) =>
    streamed
      ? alignUp(input.embedBytes / cfg.vocabSize) + 2 * ALIGN +
        2 *
          (alignUp(
            Math.min(
              input.headBytes,
              Math.max(1, Math.floor(HEAD_CHUNK_BYTES / headRow)) * headRow,
            ),
          ) + ALIGN)
      : input.embedBytes + input.headBytes;
  let streamEmbed = !!mem.streamEmbed;
  const sequences = Math.max(1, input.sequences ?? 1);
  const rows = passRows(input.chunk, sequences);
  const specRows = Math.min(rows, SPEC_RECORD_ROWS);
  const specEach = input.drafts ? speculationBytes(cfg, specRows) : 0;
  const stateTotal = sequences * (st.fixed + st.perPosition * input.capacity);
  const specTotal = sequences * specEach;
  const shape: PassShape = {
    trunkBytes: trunkTotal,
    headBytes: input.headBytes,
    moeLayers,
    experts: cfg.moe.numExperts,
    topK,
    expertBytes: input.expertBytes,
    layers: input.layerBytes,
    streamLayers: input.layerStreamBytes,
    codedLayers: input.layerCodedBytes,
    guessRight: input.guessRight,
  };
  /** The prediction for `sequences` with these layers pinned, this ring and cache slots. */
  const predictWith = (pinnedLayers: number[], ringBytes: number, slots: number, headStreamed: boolean) =>
    predictPass(shape, {
      sequences,
      streamedBytes: (input.layerStreamBytes ?? input.layerBytes).reduce(
        (a, b, L) => a + (pinnedLayers.includes(L) ? 0 : b),
        0,
      ),
      streamedLayers: input.layerBytes.map((_, L) => L).filter((L) => !pinnedLayers.includes(L)),
      ringBytes,
      headStreamed,
      slots,
      ...(input.drafts ? DEFAULT_DRAFTING : {}),
    }, input.rates!);

  let byRate = false;
  let trunkBudget = mem.trunkGB === undefined ? undefined : mem.trunkGB * GB;
  let cacheBudget = mem.cacheGB === undefined ? undefined : mem.cacheGB * GB;
  if (
    streaming && mem.preset === "auto" && (trunkBudget === undefined || cacheBudget === undefined)
  ) {
    const avail = input.available;
    if (avail === undefined) {
      throw new K3Error(
        "memory plan: --preset auto needs to know the available memory (MemAvailable), and this system does not say",
      );
    }
    const minCache = (topK + 1) * slotBytes;
    const largest = Math.max(...input.layerBytes);
    // 90% of what is left after the fixed parts; stream the embedding and head if needed.
    const usableWith = (se: boolean) =>
      0.9 *
      (avail -
        (embedHeadOf(se) + input.finalsBytes + stateTotal + specTotal +
          input.scratchBytes + FIXED_OVERHEAD_BYTES));
    const trunkMin = input.packed ? Math.min(trunkTotal, 2 * largest) : trunkTotal;
    if (!streamEmbed && usableWith(false) < trunkMin + minCache) streamEmbed = true;
    const usable = usableWith(streamEmbed);
    const floor = (input.packed ? largest : trunkTotal) + minCache;
    if (usable < floor) {
      const need = floor / 0.9 + (avail - usable / 0.9);
      throw new K3Error(
        `memory plan: --preset auto: ${(avail / GB).toFixed(2)} GB available, this model needs at least ${
          (need / GB).toFixed(2)
        } GB` +
          (input.packed ? "" : " without a packed trunk; --trunk needs far less"),
      );
    }
    if (input.rates && input.packed && trunkBudget === undefined && cacheBudget === undefined) {
      // Weigh every pin count (and streaming the embedding and head or not) by predicted
      // tokens/s; the cache gets what the pins leave. Ties go to more pins.
      let best = -1;
      for (const se of mem.streamEmbed ? [true] : [false, true]) {
        const room = usableWith(se);
        for (const t of [...pinBudgets(input.layerBytes)].reverse()) {
          if (t + minCache > room) continue;
          const cache = Math.max(minCache, Math.min(totalExperts * slotBytes, room - t));
          const { pinned, ring } = memo(input.layerBytes, `pin ${t}`, () => pinLayers(input.layerBytes, t));
          const tps = predictWith(pinned, ring, Math.min(totalExperts, Math.floor(cache / slotBytes)), se)
            .tokensPerSecond;
          if (tps > best * (1 + 1e-9)) {
            best = tps;
            [trunkBudget, cacheBudget, streamEmbed] = [t, cache, se];
          }
        }
      }
      byRate = best > 0;
    }
    // Without rates: pinned trunk beats expert cache: the trunk first, the rest to experts.
    trunkBudget ??= input.packed
      ? Math.max(Math.min(trunkTotal, usable - minCache), Math.min(trunkMin, usable - minCache))
      : trunkTotal;
    cacheBudget ??= Math.max(minCache, Math.min(totalExperts * slotBytes, usable - trunkBudget));
    notes.push(
      `auto: ${(avail / GB).toFixed(2)} GB available -> trunk ${(trunkBudget / GB).toFixed(3)} GB, expert cache ${
        (cacheBudget / GB).toFixed(3)
      } GB${streamEmbed && !mem.streamEmbed ? ", embedding and head streamed" : ""}${
        byRate ? " (the split with the best predicted tokens/s)" : ""
      }`,
    );
  }
  const embedHeadBytes = embedHeadOf(streamEmbed);

  // Trunk.
  let pinned: number[], ring = 0;
  if (!streaming || !input.packed) {
    pinned = input.layerBytes.map((_, i) => i);
    if (streaming && trunkBudget !== undefined) {
      notes.push(
        "without --trunk every trunk layer is resident (--trunk-gb applies to a packed trunk)",
      );
    }
  } else if (trunkBudget === undefined) {
    pinned = input.layerBytes.map((_, i) => i);
  } else {
    ({ pinned, ring } = pinLayers(input.layerBytes, trunkBudget));
  }
  const pinnedBytes = pinned.reduce((a, L) => a + input.layerBytes[L], 0);
  const streamedSizes = input.layerBytes.filter((_, L) => !pinned.includes(L));

  // Experts.
  let slots: number;
  let expertsResident = false;
  if (!streaming) {
    slots = totalExperts;
    expertsResident = true;
  } else if (cacheBudget === undefined) {
    slots = totalExperts;
    notes.push("no --cache-gb: every expert gets a slot (read once, never evicted)");
  } else {
    slots = Math.min(totalExperts, Math.floor(cacheBudget / slotBytes));
    if (slots < Math.min(topK + 1, totalExperts)) {
      throw new K3Error(
        `memory plan: --cache-gb ${(cacheBudget / GB).toFixed(4)} holds ${slots} experts of ${
          (slotBytes / 1e6).toFixed(2)
        } MB; the expert cache needs at least top-k + 1 = ${topK + 1} slots (${
          ((topK + 1) * slotBytes / GB).toFixed(4)
        } GB)`,
      );
    }
  }
  const expertBytes = expertsResident ? totalExperts * input.expertBytes : slots * slotBytes;
  const chunk = input.chunk;
  const scratch = input.scratchBytes;
  const trunkBytes = pinnedBytes + ring;
  const rest = trunkBytes + expertBytes + embedHeadBytes + input.finalsBytes + stateTotal + specTotal + scratch;
  let stateCache: MemoryPlan["stateCache"] = null;
  if (input.stateCache) {
    const gb = input.stateCache.gb;
    stateCache = {
      bytes: gb !== undefined ? Math.round(gb * GB) : stateCacheDefault(input.available, rest),
      perPosition: st.perPosition,
      fixedBytes: st.fixed,
      source: gb !== undefined ? "flag" : "default",
    };
  }
  const total = rest + (stateCache?.bytes ?? 0);
  const plan: MemoryPlan = {
    mode: streaming ? "streamed" : "resident",
    preset: mem.preset ?? null,
    trunk: {
      packed: input.packed && streaming,
      layers: cfg.numLayers,
      totalBytes: trunkTotal,
      pinned,
      pinnedBytes,
      ringBytes: ring,
      ringDepth: ringDepth(streamedSizes, ring),
      bytes: trunkBytes,
      budgetBytes: trunkBudget ?? null,
    },
    experts: {
      resident: expertsResident,
      slots,
      slotBytes,
      expertBytes: input.expertBytes,
      total: totalExperts,
      topK,
      bytes: expertBytes,
    },
    embedHead: { streamed: streamEmbed, bytes: embedHeadBytes },
    finalsBytes: input.finalsBytes,
    state: {
      fixedBytes: st.fixed,
      kvPerPosition: st.perPosition,
      positions: input.capacity,
      sequences,
      bytes: stateTotal,
    },
    scratchBytes: scratch,
    speculation: input.drafts ? { rows: specRows, perSequence: specEach, sequences, bytes: specTotal } : null,
    prediction: input.rates
      ? {
        ...(streaming
          ? predictWith(pinned, ring, expertsResident ? totalExperts : slots, streamEmbed)
          : predictPass(shape, { sequences, streamedBytes: 0, slots: totalExperts, resident: true }, input.rates)),
        sequences,
        diskBytesPerSecond: input.rates.disk,
      }
      : null,
    stateCache,
    chunk,
    passRows: rows,
    totalBytes: total,
    overheadBytes: FIXED_OVERHEAD_BYTES,
    availableBytes: input.available ?? null,
    availableSource: input.availableSource ?? "MemAvailable",
    notes,
  };
  return plan;
}

/**
 * The plan for `want` sequences; with `auto`, for the number up to `want` whose plan
 * predicts the most tokens/s (plans without a prediction: the most that fit; ties: more
 * sequences). When `want` (explicit) does not fit but fewer would, that is a usage error
 * naming the largest that fits; when not even one fits, the plan's own refusal stands.
 */
export function fitSequences(planFor: (n: number) => MemoryPlan, want: number, auto: boolean): MemoryPlan {
  let firstError: unknown;
  let best: MemoryPlan | undefined;
  const rate = (p: MemoryPlan) => p.prediction?.tokensPerSecond ?? 0;
  for (let n = want; n >= 1; n--) {
    try {
      const plan = planFor(n);
      if (n === want && !auto) return plan;
      if (auto) {
        if (!best || rate(plan) > rate(best) * (1 + 1e-9)) best = plan;
        if (!plan.prediction) return best;
        continue;
      }
      throw usageError(
        `--parallel ${want} does not fit the memory plan (${
          (firstError as Error).message
        }); the largest that fits is ${n}`,
      );
    } catch (e) {
      if (e instanceof K3Error && e.exitCode === EXIT.usage && n < want) throw e;
      firstError ??= e;
    }
  }
  if (best) return best;
  throw firstError;
}

/** Throws K3Error (exit 1) when the plan does not fit in what is available. */
export function checkFits(plan: MemoryPlan): void {
  if (plan.availableBytes === null) return;
  const need = plan.totalBytes + plan.overheadBytes;
  if (need > plan.availableBytes) {
    throw new K3Error(
      `memory plan needs ${bytesText(need)} (${bytesText(plan.totalBytes)} + ${
        bytesText(plan.overheadBytes)
      } runtime) but only ${
        bytesText(plan.availableBytes)
      } is available (${plan.availableSource}); choose a smaller --preset, --trunk-gb or --cache-gb${
        plan.trunk.packed ? "" : ", or stream the trunk with --trunk"
      }`,
    );
  }
}

/** The plan as lines for stderr. */
export function formatPlan(p: MemoryPlan): string[] {
  const t = p.trunk, e = p.experts;
  const lines = [
    `memory plan (${p.mode}${p.preset ? `, preset ${p.preset}` : ""}; GB = 1e9 bytes):`,
  ];
  const row = (name: string, bytes: number, what: string) =>
    lines.push(`  ${name.padEnd(11)}${bytesText(bytes).padStart(10)}  ${what}`);
  row(
    "trunk",
    t.bytes,
    t.ringBytes === 0
      ? `all ${t.layers} layers resident${t.packed ? " (pinned from the packed trunk)" : ""}`
      : `${t.pinned.length} of ${t.layers} layers pinned (${bytesText(t.pinnedBytes)}) + ring ${
        bytesText(t.ringBytes)
      } (${
        t.ringDepth[0] === t.ringDepth[1] ? t.ringDepth[0] : `${t.ringDepth[0]}-${t.ringDepth[1]}`
      } layers ahead) of ${bytesText(t.totalBytes)}`,
  );
  row(
    "experts",
    e.bytes,
    e.resident
      ? `all ${e.total} routed experts resident`
      : `${e.slots} of ${e.total} slots x ${bytesText(e.slotBytes)} (top-k ${e.topK}, at least ${e.topK + 1})`,
  );
  row(
    "embed+head",
    p.embedHead.bytes,
    p.embedHead.streamed ? "streamed: one embedding row + two lm_head chunks" : "embedding and lm_head resident",
  );
  row("finals", p.finalsBytes, "final norm and AttnRes vectors");
  row(
    "state",
    p.state.bytes,
    `${p.state.sequences > 1 ? `${p.state.sequences} sequences x (` : ""}KDA ${bytesText(p.state.fixedBytes)} + KV ${
      bytesText(p.state.kvPerPosition)
    }/position x ${p.state.positions} positions${p.state.sequences > 1 ? ")" : ""}`,
  );
  row(
    "scratch",
    p.scratchBytes,
    `forward buffers for ${p.passRows} rows a pass (a ${p.chunk}-token chunk${
      p.passRows > p.chunk ? ` + ${p.passRows - p.chunk} decode tokens` : ""
    })`,
  );
  if (p.speculation) {
    const d = p.speculation;
    row(
      "drafts",
      d.bytes,
      `${d.sequences > 1 ? `${d.sequences} sequences x ` : ""}${
        bytesText(d.perSequence)
      } speculation record (KDA states before a drafted pass + ${d.rows} rows' inputs; --draft off: none)`,
    );
  }
  if (p.stateCache) {
    const c = p.stateCache;
    row(
      "state cache",
      c.bytes,
      c.bytes === 0
        ? "off (--state-cache-gb 0)"
        : `kept conversation states: KDA ${bytesText(c.fixedBytes)} + KV ${bytesText(c.perPosition)}/position each (${
          c.source === "flag"
            ? "--state-cache-gb"
            : `default: what the plan leaves less 10%, at most ${bytesText(STATE_CACHE_DEFAULT_CAP)}`
        })`,
    );
  }
  row(
    "total",
    p.totalBytes,
    `+ ${bytesText(p.overheadBytes)} fixed runtime overhead${
      p.availableBytes !== null ? `; ${bytesText(p.availableBytes)} available` : ""
    }`,
  );
  if (p.prediction) lines.push(`  ${predictionText(p.prediction)}`);
  for (const n of p.notes) lines.push(`  note: ${n}`);
  return lines;
}

/** The plan's prediction as one line. */
export function predictionText(p: NonNullable<MemoryPlan["prediction"]>): string {
  const gb = (n: number) => (n / GB).toFixed(2);
  const tps = p.tokensPerSecond >= 100 ? p.tokensPerSecond.toFixed(0) : p.tokensPerSecond.toPrecision(3);
  const over = p.passSeconds - Math.max(p.ioSeconds, p.computeSeconds);
  const serial = over >= 0.0005 ? ` + ${over.toFixed(3)} s the reads and the compute cannot overlap` : "";
  return `predicted: ${tps} tokens/s with ${p.sequences} ${
    p.sequences === 1 ? "sequence" : "sequences"
  } decoding (a pass: ${p.passSeconds.toFixed(3)} s = max(read ${gb(p.readBytes)} GB${
    Number.isFinite(p.diskBytesPerSecond) ? ` at ${gb(p.diskBytesPerSecond)} GB/s` : ""
  } = ${p.ioSeconds.toFixed(3)} s, compute ${p.computeSeconds.toFixed(3)} s)${serial})`;
}
