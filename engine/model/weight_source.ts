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
  /** Claims routed experts of layer L among `ids`: every one in memory or being read, and as
   * many others as there is room for, each read issued at once. Returns the claimed ones
   * (a source without a size limit claims all), each an expert or a promise that settles when
   * it is in memory; each held until doneWithExperts(L, [id]) or doneWithExperts(L). */
  experts(L: number, ids: number[]): Map<number, Expert | Promise<Expert>>;
  /** Called when the pass is done with the experts of layer L (or just `ids` of them). */
  doneWithExperts?(L: number, ids?: number[]): void;
  /** Settles when a read in flight settles, so room for more experts may have freed up;
   * undefined when no read is in flight. Absent: `experts` always claims all. */
  whenExpertRoom?(): Promise<void> | undefined;
  /** Reads experts `ids` of layer L ahead of need (a guess of its routing) into the room that
   * is free now, holding none of them: a later `experts` call finds them as hits. */
  prefetchExperts?(L: number, ids: number[]): void;
  /** Layer L's dense weights when they are in memory for good (pinned or resident) and were
   * handed out before, else undefined: lets the pass look ahead without waiting or moving a
   * streamer's ring. */
  heldLayer?(L: number): LayerWeights | undefined;
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
  /** Expert reads issued ahead of need, on a guess of the next layer's routing. */
  expertPrefetched: number;
  /** Of those, the ones a later lookup took (right guesses). */
  expertPrefetchHits: number;
  /** Seconds the forward pass spent waiting for reads. */
  ioWaitSeconds: number;
  /** Trunk layers pinned in RAM. */
  pinnedLayers: number;
  /** Bytes the trunk layers counted in `trunkBytes` take on disk (fewer when split-coded). */
  trunkStoredBytes: number;
  /** CPU seconds the I/O threads spent decoding coded trunk pieces (apart from the wall clock:
   * the decode runs beside the forward pass). */
  trunkDecodeSeconds: number;
  /** Of `trunkStoredBytes`, those left coded in the ring for the products to decode. */
  trunkCodedBytes: number;
}

/** IoStats with every counter at zero (a fresh source's, or a resident one's for good). */
export function noIoStats(): IoStats {
  return {
    trunkBytes: 0,
    trunkEarlyBytes: 0,
    expertBytes: 0,
    expertHits: 0,
    expertMisses: 0,
    expertPrefetched: 0,
    expertPrefetchHits: 0,
    ioWaitSeconds: 0,
    pinnedLayers: 0,
    trunkStoredBytes: 0,
    trunkDecodeSeconds: 0,
    trunkCodedBytes: 0,
  };
}
