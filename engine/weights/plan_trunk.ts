/**
 * The plan's trunk term: which layers are pinned and how big the read-ahead ring is.
 *
 *   trunk = pinned layers + ring   (with --trunk; without it every layer is resident)
 *
 * Layers are chosen largest first while pinned + ring need <= the trunk budget, where the
 * ring needs the largest pair of consecutive streamed layers (two layers: the one computing
 * and the one being read), and at least the largest streamed layer; the ring gets whatever
 * budget the pinned layers leave.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { layerTensors } from "../model/tensors.ts";
import { ALIGN, alignUp, GB, type PlanInput } from "./plan_input.ts";

/** The trunk's part of the plan. Every size in bytes. */
export interface TrunkPlan {
  /** The trunk is streamed from a packed trunk (--trunk). */
  packed: boolean;
  /** Layers of the model. */
  layers: number;
  /** Bytes of every layer. */
  totalBytes: number;
  /** The layers kept in memory for good, ascending. */
  pinned: number[];
  /** Bytes of the pinned layers. */
  pinnedBytes: number;
  /** Bytes of the read-ahead ring (0: nothing streamed). */
  ringBytes: number;
  /** Layers the ring can hold at once (min..max over the streamed layers). */
  ringDepth: [number, number];
  /** Bytes of the term: pinned + ring. */
  bytes: number;
  /** The trunk budget it was planned for (null: none). */
  budgetBytes: number | null;
}

/** Bytes of every trunk layer together. */
export function trunkBytes(layerBytes: readonly number[]): number {
  return layerBytes.reduce((a, b) => a + b, 0);
}

/**
 * The trunk term for a trunk budget (undefined: every layer pinned). Without streaming or
 * without a packed trunk every layer is resident (a note says so when a budget was given).
 */
export function planTrunk(
  input: PlanInput,
  streaming: boolean,
  budget: number | undefined,
  notes: string[],
): TrunkPlan {
  let pinned: number[], ring = 0;
  if (!streaming || !input.packed) {
    pinned = input.layerBytes.map((_, i) => i);
    if (streaming && budget !== undefined) {
      notes.push(
        "without --trunk every trunk layer is resident (--trunk-gb applies to a packed trunk)",
      );
    }
  } else if (budget === undefined) {
    pinned = input.layerBytes.map((_, i) => i);
  } else {
    ({ pinned, ring } = pinLayers(input.layerBytes, budget));
  }
  const pinnedBytes = pinned.reduce((a, L) => a + input.layerBytes[L], 0);
  const streamedSizes = input.layerBytes.filter((_, L) => !pinned.includes(L));
  return {
    packed: input.packed && streaming,
    layers: input.cfg.numLayers,
    totalBytes: trunkBytes(input.layerBytes),
    pinned,
    pinnedBytes,
    ringBytes: ring,
    ringDepth: ringDepth(streamedSizes, ring),
    bytes: pinnedBytes + ring,
    budgetBytes: budget ?? null,
  };
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

/** `pinLayers(sizes, budget)`, computed once per size list and budget (the plan weighs the
 * same budgets for every sequence count and both embedding choices). */
export function pinLayersOnce(sizes: number[], budget: number): { pinned: number[]; ring: number } {
  return memo(sizes, `pin ${budget}`, () => pinLayers(sizes, budget));
}
