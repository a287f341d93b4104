/**
 * The WeightSource for a memory budget: trunk layers pinned and streamed through the ring
 * (trunk_ring.ts) from a packed trunk (trunk_file.ts) or, without one, all resident from
 * the checkpoint; routed experts through the expert cache (expert_cache.ts); the embedding
 * and lm_head resident, or (ultra) streamed in rows and chunks (head_stream.ts).
 *
 * Every path runs the same kernels on the same bytes in the same order as
 * ResidentWeights, and the lm_head on the same compute (the pool the model was given), so
 * the tokens and logits are identical at every budget.
 *
 * Checks, with a packed trunk: what is read once (pinned layers, the final vectors, the
 * embedding and lm_head when resident) is read as whole pieces, each checked against its
 * k3w64 in the manifest on the I/O thread that read it, and so are ultra's reads
 * (head_stream.ts). Streamed layers are checked tensor by tensor where they are used
 * (trunk_ring.ts). Routed experts are checked against the expert table when the trunk has
 * one (experts.json, `k3 pack --hash-experts`); the plan says so once when it has not.
 * Without a trunk nothing is verified per read: the checkpoint's shards carry no checksum.
 *
 * engine/open.ts makes the memory plan (plan.ts), prints it, refuses it when it does not
 * fit in MemAvailable, and only then opens these weights.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { ExpertCache } from "./expert_cache.ts";
import type { ExpertTable } from "./expert_table.ts";
import type { Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { Compute } from "../native/pool.ts";
import { type IoStats, noIoStats, type WeightSource } from "../model/weight_source.ts";
import type { LayerWeights } from "../model/layer_weights.ts";
import type { MemoryPlan } from "./plan.ts";
import type { TrunkDecode } from "./trunk_geometry.ts";
import { embedRow, loadGlobals } from "./resident.ts";
import type { Checkpoint } from "./safetensors.ts";
import { bindRegion, type TrunkFile } from "./trunk_file.ts";
import { StreamedTrunk } from "./trunk_ring.ts";
import { StreamedEmbedHead } from "./head_stream.ts";
import type { Expert, F32, Matrix } from "../native/tensors.ts";
import { globalTensors, layerTensors, PREFIX } from "../model/tensors.ts";
import { type BoundTensors, loadTensors } from "./bind.ts";

/** Trunk, experts, embedding and head for a memory budget. */
export class StreamedWeights implements WeightSource {
  finalNorm!: F32;
  /** output_attn_res_norm. */
  outputResNorm!: F32;
  /** output_attn_res_proj. */
  outputResProj!: F32;
  private readonly stats: IoStats = noIoStats();
  private trunk?: StreamedTrunk;
  private residentLayers: BoundTensors[] = [];
  private cache?: ExpertCache;
  /** Layers handed out without waiting (pinned or resident), bound once. */
  private readonly held = new Map<number, LayerWeights>();
  private embedM?: Matrix;
  private headM?: Matrix;
  private streamedEH?: StreamedEmbedHead;
  private readonly owned: NativeBuffer[] = [];
  private readonly ownedTensors: BoundTensors[] = [];

  private constructor(private readonly k: Kernels, private readonly cfg: K3Config) {}

  /** Opens everything the plan says, in the plan's sizes; `trunkDecode` says where the
   * coded pieces of streamed trunk layers are decoded (trunk_ring.ts). */
  static async open(
    k: Kernels,
    cfg: K3Config,
    ckpt: Checkpoint,
    plan: MemoryPlan,
    trunkFile: TrunkFile | undefined,
    table: { table: ExpertTable; path: string } | undefined,
    trunkDecode: TrunkDecode,
  ): Promise<StreamedWeights> {
    const w = new StreamedWeights(k, cfg);
    try {
      // Final vectors, embedding and head.
      if (trunkFile) {
        const m = trunkFile.manifest;
        const finals = await trunkFile.readVerified("finals", m.finals);
        w.owned.push(finals);
        const g = bindRegion(m.finals.tensors, finals);
        w.setFinals(g);
        if (plan.embedHead.streamed) {
          w.streamedEH = StreamedEmbedHead.fromTrunk(k, cfg, trunkFile, w.stats);
        } else {
          for (const [what, r] of [["embed", m.embed], ["head", m.head]] as const) {
            const buf = await trunkFile.readVerified(what, r);
            w.owned.push(buf);
            const mat = bindRegion(r.tensors, buf).matrix(r.tensors[0].name);
            if (what === "embed") w.embedM = mat;
            else w.headM = mat;
          }
        }
      } else if (plan.embedHead.streamed) {
        const g = await loadTensors(k, ckpt, globalTensors(cfg));
        w.ownedTensors.push(g);
        w.setFinals(g);
        w.streamedEH = StreamedEmbedHead.fromCheckpoint(k, cfg, ckpt, w.stats);
      } else {
        const g = await loadGlobals(k, cfg, ckpt);
        w.ownedTensors.push(g.tensors);
        w.setFinals(g.tensors, PREFIX);
        w.embedM = g.embed;
        w.headM = g.head;
      }
      // Trunk layers.
      if (trunkFile) {
        w.trunk = await StreamedTrunk.open(
          k,
          trunkFile,
          cfg.numLayers,
          plan.trunk.pinned,
          plan.trunk.ringBytes,
          w.stats,
          trunkDecode,
        );
      } else {
        for (let L = 0; L < cfg.numLayers; L++) {
          const t = await loadTensors(k, ckpt, layerTensors(cfg, L));
          w.residentLayers.push(t);
          w.ownedTensors.push(t);
        }
        w.stats.pinnedLayers = cfg.numLayers;
      }
      // Expert cache.
      w.cache = new ExpertCache(k, cfg, ckpt, plan.experts.slots, plan.experts.slotBytes, w.stats, table);
    } catch (e) {
      await w.close();
      throw e;
    }
    return w;
  }

  /** Binds the final vectors from `g`. */
  private setFinals(g: BoundTensors, prefix = ""): void {
    this.finalNorm = g.vector(prefix + "norm.weight");
    this.outputResNorm = g.vector(prefix + "output_attn_res_norm.weight");
    this.outputResProj = g.vector(prefix + "output_attn_res_proj.weight");
  }

  layer(L: number): LayerWeights | Promise<LayerWeights> {
    const held = this.held.get(L);
    if (held) return held;
    const bound = this.trunk ? this.trunk.layer(L) : this.residentLayers[L];
    if (bound instanceof Promise) return bound.then((b) => b.layerWeights(this.cfg, L));
    // Handed out at once: pinned or resident, in memory for good.
    const w = bound.layerWeights(this.cfg, L);
    this.held.set(L, w);
    return w;
  }

  heldLayer(L: number): LayerWeights | undefined {
    return this.held.get(L);
  }

  doneWithAttention(L: number): void {
    this.trunk?.attentionDone(L);
  }

  doneWithLayer(L: number): void {
    this.trunk?.done(L);
  }

  experts(L: number, ids: number[]): Map<number, Promise<Expert>> {
    return this.cache!.take(L, ids);
  }

  whenExpertRoom(): Promise<void> | undefined {
    return this.cache!.whenRoom();
  }

  prefetchExperts(L: number, ids: number[]): void {
    this.cache!.prefetch(L, ids);
  }

  doneWithExperts(L: number, ids?: number[]): void {
    this.cache!.release(L, ids);
  }

  embed(id: number, dst: NonNullable<Deno.PointerValue>): void | Promise<void> {
    if (this.streamedEH) return this.streamedEH.embedRow(id, dst);
    embedRow(this.k, this.embedM!, id, dst);
  }

  head(
    x: NonNullable<Deno.PointerValue>,
    y: NonNullable<Deno.PointerValue>,
    ntok: number,
    compute: Compute,
  ): void | Promise<void> {
    if (this.streamedEH) return this.streamedEH.matmul(x, y, ntok, compute);
    compute.matmul(this.headM!, x, y, ntok);
  }

  ioStats(): IoStats {
    return { ...this.stats };
  }

  /** Waits for every read in flight, then frees. */
  async close(): Promise<void> {
    await this.trunk?.close();
    await this.cache?.close();
    await this.streamedEH?.close();
    for (const b of this.owned) b.free();
    for (const t of this.ownedTensors) t.free();
    this.owned.length = 0;
    this.ownedTensors.length = 0;
  }
}
