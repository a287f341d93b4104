/**
 * The forward pass's port to its weights (`WeightSource`): every weight resident
 * (../weights/resident.ts), or streamed and cached (../weights/streamed.ts,
 * ../weights/expert_cache.ts); and what a source that reads from disk reports (`IoStats`).
 *
 * @module
 */

import type { Compute } from "../native/pool.ts";
import type { Expert, F32 } from "../native/tensors.ts";
import type { LayerWeights } from "./layer_weights.ts";

/** Where the forward pass gets its weights. Implementations may read from disk. */
export interface WeightSource {
  /** Layer L's dense weights, bound once into their record (resolves when they are in memory). */
  layer(L: number): Promise<LayerWeights> | LayerWeights;
  /** Called when the pass is done with layer L's attention tensors (`self_attn.*`): a
   * streamer may read the next layers into their space while the MLP computes. */
  doneWithAttention?(L: number): void;
  /** Called when the pass is done with layer L, so a streamer can reuse its slot. */
  doneWithLayer?(L: number): void;
  /** Routed experts `ids` of layer L, one per id in order, each a promise that settles
   * when that expert is in memory (a streaming source issues every read at once). Held
   * until doneWithExperts(L). */
  experts(L: number, ids: number[]): (Expert | Promise<Expert>)[];
  /** Called when the pass is done with the experts of layer L (the last `experts` call). */
  doneWithExperts?(L: number, ids?: number[]): void;
  /** How many experts one `experts` call may ask for at most (the cache's slots); a pass
   * that needs more runs them in waves. Undefined: no limit. */
  readonly expertSlots?: number;
  /** Writes the embedding row of `id` as f32 to `dst`. */
  embed(id: number, dst: NonNullable<Deno.PointerValue>): Promise<void> | void;
  /** Writes the lm_head logits of T tokens, y[t*vocab + r], using `compute` for the
   * products (a streaming source may run the head chunk by chunk). */
  head(
    x: NonNullable<Deno.PointerValue>,
    y: NonNullable<Deno.PointerValue>,
    ntok: number,
    compute: Compute,
  ): Promise<void> | void;
  /** Bytes read and cache behaviour so far (sources that read from disk report these). */
  ioStats?(): IoStats;
  /** model.norm, output_attn_res_norm, output_attn_res_proj. */
  finalNorm: F32;
  /** output_attn_res_norm. */
  outputResNorm: F32;
  /** output_attn_res_proj. */
  outputResProj: F32;
}

/** What a weight source has read so far. */
export interface IoStats {
  /** Trunk bytes read. */
  trunkBytes: number;
  /** Trunk bytes read into ring space a layer still in use had released after its attention. */
  trunkEarlyBytes: number;
  /** Routed expert bytes read. */
  expertBytes: number;
  /** Expert lookups served from the cache. */
  expertHits: number;
  /** Expert lookups that had to be read. */
  expertMisses: number;
  /** Seconds the forward pass spent waiting for reads. */
  ioWaitSeconds: number;
  /** Trunk layers pinned in RAM. */
  pinnedLayers: number;
  /** Bytes the trunk layers counted in `trunkBytes` take on disk (fewer when split-coded). */
  trunkStoredBytes: number;
  /** CPU seconds the I/O threads spent decoding coded trunk pieces (apart from the wall clock:
   * the decode runs beside the forward pass). */
  trunkDecodeSeconds: number;
}

/** IoStats with every counter at zero (a fresh source's, or a resident one's for good). */
export function noIoStats(): IoStats {
  return {
    trunkBytes: 0,
    trunkEarlyBytes: 0,
    expertBytes: 0,
    expertHits: 0,
    expertMisses: 0,
    ioWaitSeconds: 0,
    pinnedLayers: 0,
    trunkStoredBytes: 0,
    trunkDecodeSeconds: 0,
  };
}
