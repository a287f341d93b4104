/**
 * What a memory plan is made from: the memory flags (`MemoryOptions`), the sizes of the
 * model's parts (`PlanInput`, from a packed trunk's manifest, the checkpoint, or a shape
 * alone: `estimatedInput` in plan.ts), and the bytes every plan adds beyond itself.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import type { ChunkRequest } from "./plan_segment.ts";
import type { PassRates } from "./throughput.ts";

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

/** The alignment of O_DIRECT reads, of expert slots and of streamed buffers. */
export const ALIGN = 4096;
/** `n` rounded up to {@link ALIGN}. */
export const alignUp = (n: number): number => Math.ceil(n / ALIGN) * ALIGN;
/** A GB as the plan counts it (the flags are in GB = 1e9 bytes). */
export const GB = 1e9;

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
   * split-coded trunk: trunk_geometry.ts streamedLayout); the prediction reads these. The
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
  /** Requested prefill segment: tokens a pass, or `auto` (plan_segment.ts). */
  chunk: ChunkRequest;
  /** Prompt tokens `auto` sizes the segment for (default: `capacity`). */
  prefillTokens?: number;
  /** Sequences in flight at once, each with its own state (default 1). */
  sequences?: number;
  /** Bytes of one sequence's state (state.ts's stateBytes). */
  stateBytes: { fixed: number; perPosition: number };
  /** Bytes of the forward pass's scratch for passes of `rows` rows with `sequences`
   * sequences (scratch.ts scratchBytes of planScratchRows). */
  scratchFor: (rows: number, sequences: number) => number;
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
