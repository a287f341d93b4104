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
 * `openWeights` makes the memory plan (plan.ts), prints it, refuses it when it does not fit
 * in MemAvailable, and only then allocates.
 *
 * @module
 */

import { EXIT, K3Error, usageError } from "../errors.ts";
import { configFingerprint, type K3Config } from "../model/config.ts";
import { ExpertCache } from "./expert_cache.ts";
import { EXPERTS_FILE, type ExpertTable, readExpertTable, TABLE_ADVICE } from "./expert_table.ts";
import { expertBytes } from "./experts.ts";
import type { Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { Compute } from "../native/pool.ts";
import { type IoStats, noIoStats, type WeightSource } from "../model/model.ts";
import {
  checkFits,
  formatPlan,
  makePlan,
  type MemoryOptions,
  type MemoryPlan,
  planAvailability,
  wantsStreaming,
} from "./plan.ts";
import { embedRow, loadGlobals, ResidentWeights } from "./resident.ts";
import type { Checkpoint } from "./safetensors.ts";
import { bindRegion, TrunkFile } from "./trunk_file.ts";
import { StreamedTrunk } from "./trunk_ring.ts";
import { StreamedEmbedHead } from "./head_stream.ts";
import { weightSample } from "./manifest.ts";
import {
  boundBytes,
  type BoundTensors,
  type Expert,
  type F32,
  globalTensors,
  HEAD_NAME,
  layerTensors,
  loadTensors,
  type Matrix,
  PREFIX,
} from "../model/weights.ts";

/**
 * Trunk, experts, embedding and head for a memory budget: layers from the ring (or resident
 * from the checkpoint), experts from the cache, the embedding and lm_head resident or
 * streamed.
 */
export class StreamedWeights implements WeightSource {
  /** model.norm. */
  finalNorm!: F32;
  /** output_attn_res_norm. */
  outputResNorm!: F32;
  /** output_attn_res_proj. */
  outputResProj!: F32;
  private readonly stats: IoStats = noIoStats();
  private trunk?: StreamedTrunk;
  private residentLayers: BoundTensors[] = [];
  private cache?: ExpertCache;
  private embedM?: Matrix;
  private headM?: Matrix;
  private streamedEH?: StreamedEmbedHead;
  private readonly owned: NativeBuffer[] = [];
  private readonly ownedTensors: BoundTensors[] = [];

  private constructor(private readonly k: Kernels, private readonly cfg: K3Config) {}

  /** Opens everything the plan says, in the plan's sizes. */
  static async open(
    k: Kernels,
    cfg: K3Config,
    ckpt: Checkpoint,
    plan: MemoryPlan,
    trunkFile: TrunkFile | undefined,
    table?: { table: ExpertTable; path: string },
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

  /** Layer L's dense tensors: pinned or from the ring (waits for its read), or resident. */
  layer(L: number): BoundTensors | Promise<BoundTensors> {
    return this.trunk ? this.trunk.layer(L) : this.residentLayers[L];
  }

  /** The ring may read the next layers into layer L's attention bytes. */
  doneWithAttention(L: number): void {
    this.trunk?.attentionDone(L);
  }

  /** The ring may reuse layer L's space. */
  doneWithLayer(L: number): void {
    this.trunk?.done(L);
  }

  /** Experts `ids` of layer L from the cache (each read on a miss). */
  experts(L: number, ids: number[]): Promise<Expert>[] {
    return this.cache!.fetch(L, ids);
  }

  /** The cache's slots: the most experts one `experts` call may ask for. */
  get expertSlots(): number | undefined {
    return this.cache?.size;
  }

  /** The pass is done with layer L's experts (or just `ids` of them): the cache may evict them. */
  doneWithExperts(L: number, ids?: number[]): void {
    this.cache!.release(L, ids);
  }

  /** Writes token `id`'s embedding row as f32 to `dst` (read from disk when streamed). */
  embed(id: number, dst: NonNullable<Deno.PointerValue>): void | Promise<void> {
    if (this.streamedEH) return this.streamedEH.embedRow(id, dst);
    embedRow(this.k, this.embedM!, id, dst);
  }

  /** Writes the lm_head logits of `ntok` tokens to `y` (chunk by chunk when streamed), the
   * products on `compute`. */
  head(
    x: NonNullable<Deno.PointerValue>,
    y: NonNullable<Deno.PointerValue>,
    ntok: number,
    compute: Compute,
  ): void | Promise<void> {
    if (this.streamedEH) return this.streamedEH.matmul(x, y, ntok, compute);
    compute.matmul(this.headM!, x, y, ntok);
  }

  /** What this source has read so far. */
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

/** Sizes of the trunk pieces in the checkpoint (bound form), for the plan without --trunk. */
function checkpointSizes(cfg: K3Config, ckpt: Checkpoint) {
  const bound = (name: string, keep: "matrix" | "vector") => boundBytes(ckpt.get(name), keep);
  const layerBytes = Array.from(
    { length: cfg.numLayers },
    (_, L) =>
      layerTensors(cfg, L).reduce(
        (a, s) => a + bound(PREFIX + s.name, s.keep as "matrix" | "vector"),
        0,
      ),
  );
  return {
    layerBytes,
    embedBytes: bound(PREFIX + "embed_tokens.weight", "matrix"),
    headBytes: bound(HEAD_NAME, "matrix"),
    finalsBytes: globalTensors(cfg).reduce((a, s) => a + bound(PREFIX + s.name, "vector"), 0),
  };
}

/**
 * The plan for `want` sequences; with `auto`, for the most sequences up to `want` that fit.
 * When `want` (explicit) does not fit but fewer would, that is a usage error naming the
 * largest that fits; when not even one fits, the plan's own refusal stands.
 */
export function fitSequences(planFor: (n: number) => MemoryPlan, want: number, auto: boolean): MemoryPlan {
  let firstError: unknown;
  for (let n = want; n >= 1; n--) {
    try {
      const plan = planFor(n);
      if (n === want || auto) return plan;
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
  throw firstError;
}

/** What `openWeights` opened. */
export interface OpenedWeights {
  /** The weight source. */
  weights: WeightSource & { close?(): Promise<void>; free?(): void };
  /** Its memory plan. */
  plan: MemoryPlan;
  /** Rows a forward pass holds (the plan's passRows). */
  passRows: number;
  /** Closes the source and frees its memory. */
  close(): Promise<void>;
}

/**
 * Plans, prints (through `log`), checks and opens the weights for `mem`. `fullCfg` is the
 * model's whole config (its fingerprint identifies a packed trunk); `cfg` may be its first
 * layers only (--layers).
 */
export async function openWeights(
  k: Kernels,
  fullCfg: K3Config,
  cfg: K3Config,
  ckpt: Checkpoint,
  opts: {
    mem?: MemoryOptions;
    capacity: number;
    chunk: number;
    /** Sequences in flight at once (default 1). */
    sequences?: number;
    /** Take the largest number of sequences up to `sequences` that fits the plan. */
    autoSequences?: boolean;
    log?: (line: string) => void;
    onLayer?: (done: number, total: number) => void;
    /** Verify trunk pieces and expert reads (default true; false only for bench/verify.ts). */
    verify?: boolean;
  },
): Promise<OpenedWeights> {
  const mem = opts.mem ?? {};
  const streaming = wantsStreaming(mem);
  const verify = opts.verify ?? true;
  let trunkFile: TrunkFile | undefined;
  let table: { table: ExpertTable; path: string } | undefined;
  if (streaming && mem.trunkDir !== undefined) {
    const fingerprint = await configFingerprint(fullCfg), sample = await weightSample(k, fullCfg, ckpt);
    trunkFile = await TrunkFile.open(k, mem.trunkDir, cfg, fingerprint, sample, verify);
    const t = readExpertTable(mem.trunkDir, fullCfg, fingerprint, sample);
    if (t && verify) table = { table: t, path: `${mem.trunkDir}/${EXPERTS_FILE}` };
  }
  try {
    const sizes = trunkFile
      ? {
        layerBytes: trunkFile.manifest.layer.slice(0, cfg.numLayers).map((r) => r.size),
        embedBytes: trunkFile.manifest.embed.size,
        headBytes: trunkFile.manifest.head.size,
        finalsBytes: trunkFile.manifest.finals.size,
      }
      : checkpointSizes(cfg, ckpt);
    const planFor = (sequences: number) => {
      const plan = makePlan({
        cfg,
        ...sizes,
        expertBytes: expertBytes(cfg),
        capacity: opts.capacity,
        chunk: opts.chunk,
        sequences,
        mem,
        packed: trunkFile !== undefined,
        ...planAvailability(),
      });
      checkFits(plan);
      return plan;
    };
    const plan = fitSequences(planFor, opts.sequences ?? 1, opts.autoSequences ?? false);
    if (opts.log) {
      for (const line of formatPlan(plan)) opts.log(line);
      if (!table && fullCfg.numLayers > fullCfg.firstKDense) {
        opts.log(
          `  (routed experts are not verified per read: ${
            mem.trunkDir === undefined ? "no packed trunk" : `no ${EXPERTS_FILE} in ${mem.trunkDir}`
          }; add the table with ${TABLE_ADVICE})`,
        );
      }
    }
    if (!streaming) {
      const weights = await ResidentWeights.load(k, cfg, ckpt, { onLayer: opts.onLayer });
      return { weights, plan, passRows: plan.passRows, close: () => Promise.resolve(weights.free()) };
    }
    const weights = await StreamedWeights.open(k, cfg, ckpt, plan, trunkFile, table);
    const tf = trunkFile;
    trunkFile = undefined;
    return {
      weights,
      plan,
      passRows: plan.passRows,
      close: async () => {
        await weights.close();
        tf?.close();
      },
    };
  } finally {
    trunkFile?.close();
  }
}
