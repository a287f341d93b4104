/**
 * The WeightSource for a memory budget: trunk layers pinned and streamed from a packed
 * trunk (trunk_file.ts, read through the ring of trunk_ring.ts) or, without one, all resident from the checkpoint; routed experts
 * through the expert cache (expert_cache.ts); the embedding and lm_head resident, or
 * (ultra) streamed: one embedding row read per token, the lm_head read in chunks, the
 * next chunk read while the current one is multiplied.
 *
 * Every path runs the same kernels on the same bytes in the same order as
 * ResidentWeights, so the tokens and logits are identical at every budget.
 *
 * Checks, with a packed trunk: what is read once (pinned layers, the final vectors, the
 * embedding and lm_head when resident) is read as whole pieces, each checked against its
 * k3w64 in the manifest on the I/O thread that read it, and so are ultra's reads (an
 * embedding row reads the one or two pieces holding it, the lm_head is read in chunks of
 * whole pieces). Streamed layers are checked tensor by tensor where they are used (trunk_ring.ts). Routed experts are checked against the expert table when the trunk has
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
import { ALIGN, alignUp, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { type IoStats, noIoStats, type WeightSource } from "../model/model.ts";
import {
  checkFits,
  formatPlan,
  HEAD_CHUNK_BYTES,
  makePlan,
  type MemoryOptions,
  type MemoryPlan,
  planAvailability,
  wantsStreaming,
} from "./plan.ts";
import { embedRow, loadGlobals, ResidentWeights } from "./resident.ts";
import type { Checkpoint } from "./safetensors.ts";
import { bindRegion, readRegionVerified, TrunkFile } from "./trunk_file.ts";
import { StreamedTrunk } from "./trunk_ring.ts";
import { type Region, type TrunkManifest, weightSample } from "./manifest.ts";
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

/** A matrix whose rows are read from a file on demand (ultra). */
interface StreamedMatrix {
  file: IoFile;
  /** Absolute offset of row 0. */
  offset: number;
  rows: number;
  cols: number;
  /** dtype of the bytes on disk: BF16, F16 or F32. */
  dtype: string;
}

/** A packed trunk region holding a streamed matrix at its offset 0, with its piece hashes. */
interface VerifiedRegion {
  /** The region (offset, size, piece hashes). */
  region: Region;
  /** Bytes per hashed piece. */
  piece: number;
  /** Trunk directory (for messages). */
  dir: string;
  /** The manifest (for messages). */
  manifest: TrunkManifest;
  /** Check the piece hashes (false only for bench/verify.ts). */
  verify: boolean;
}

const esize = (dtype: string) => (dtype === "F32" ? 4 : 2);

/**
 * Pieces of `piece` bytes per lm_head chunk read from a trunk (HEAD_CHUNK_BYTES of them;
 * K3_TEST_HEAD_CHUNK=BYTES, tests only, makes chunks small enough for a tiny model to have
 * many, with rows straddling them).
 */
function piecesPerChunk(piece: number): number {
  const test = Number(Deno.env.get("K3_TEST_HEAD_CHUNK") ?? NaN);
  return Math.max(1, Math.floor((test > 0 ? test : HEAD_CHUNK_BYTES) / piece));
}

/**
 * Embedding rows and lm_head chunks read from disk. From a packed trunk (`regions`), every
 * read is whole verified pieces: an embedding row reads the one or two pieces holding it,
 * and the lm_head is read in chunks of whole pieces; a row that straddles two chunks is
 * completed from the end of the previous chunk (its verified tail is copied in front of
 * the next chunk's pieces before they are read). From the checkpoint (no trunk) rows and
 * chunks are read as they are, unverified: the shards carry no checksum.
 */
class StreamedEmbedHead {
  private readonly row?: NativeBuffer;
  private readonly chunks: NativeBuffer[];
  private readonly conv?: NativeBuffer;
  private readonly chunkRows: number;
  /** Room in front of a piece-aligned chunk for the tail of a row begun in the previous one. */
  private readonly carryRoom: number;
  private pending?: Promise<unknown>;

  constructor(
    private readonly k: Kernels,
    private readonly embed: StreamedMatrix,
    private readonly head: StreamedMatrix,
    private readonly stats: IoStats,
    private readonly regions?: { embed: VerifiedRegion; head: VerifiedRegion },
  ) {
    const rowBytes = embed.cols * esize(embed.dtype);
    const headRow = head.cols * esize(head.dtype);
    if (regions) {
      const { piece } = regions.head;
      this.carryRoom = alignUp(headRow);
      const span = Math.min(piecesPerChunk(piece) * piece, regions.head.region.size);
      this.chunkRows = Math.min(head.rows, Math.ceil((span + this.carryRoom) / headRow));
      // An embedding row lies in at most two pieces; it is read into chunk buffer 0 (the
      // head is never being read then: its reads are awaited within matmul).
      const embedSpan = Math.min(2 * regions.embed.piece, regions.embed.region.size);
      const bytes = Math.max(this.carryRoom + span, embedSpan);
      this.chunks = [0, 1].map(() => NativeBuffer.alloc(k, bytes, "lm_head chunk"));
    } else {
      this.carryRoom = 0;
      this.row = NativeBuffer.alloc(k, alignUp(rowBytes) + 2 * ALIGN, "embedding row");
      this.chunkRows = Math.min(head.rows, Math.max(1, Math.floor(HEAD_CHUNK_BYTES / headRow)));
      this.chunks = [0, 1].map(() => NativeBuffer.alloc(k, alignUp(this.chunkRows * headRow) + ALIGN, "lm_head chunk"));
    }
    if (head.dtype === "F16") {
      this.conv = NativeBuffer.alloc(k, this.chunkRows * head.cols * 4, "lm_head chunk (f32)");
    }
  }

  /** Reads bytes [from, to) of a region (whole pieces) to `ptr`, each piece verified. */
  private readVerified(
    v: VerifiedRegion,
    m: StreamedMatrix,
    what: string,
    ptr: NonNullable<Deno.PointerValue>,
    from: number,
    to: number,
  ): Promise<void> {
    const first = from / v.piece, last = Math.ceil(to / v.piece) - 1;
    const sub: Region = {
      ...v.region,
      offset: v.region.offset + from,
      size: to - from,
      pieces: v.region.pieces.slice(first, last + 1),
    };
    return readRegionVerified(v.dir, m.file, v.manifest, `${what} (streamed)`, sub, ptr, v.verify, first);
  }

  async embedRow(id: number, dst: NonNullable<Deno.PointerValue>): Promise<void> {
    const e = this.embed;
    const rowBytes = e.cols * esize(e.dtype);
    const t0 = performance.now();
    let src: NonNullable<Deno.PointerValue>, bytes: Uint8Array;
    if (this.regions) {
      const v = this.regions.embed;
      const at = id * rowBytes;
      const from = Math.floor(at / v.piece) * v.piece;
      const to = Math.min(v.region.size, (Math.floor((at + rowBytes - 1) / v.piece) + 1) * v.piece);
      const p = this.readVerified(v, e, "embed", this.chunks[0].ptr, from, to);
      this.pending = p;
      await p;
      this.pending = undefined;
      this.stats.trunkBytes += to - from;
      src = this.chunks[0].at(at - from);
      bytes = this.chunks[0].u8.subarray(at - from, at - from + rowBytes);
    } else {
      const p = e.file.readSpan(this.row!.ptr, this.row!.bytes, e.offset + id * rowBytes, rowBytes);
      this.pending = p;
      const delta = await p;
      this.pending = undefined;
      this.stats.trunkBytes += rowBytes;
      src = this.row!.at(delta);
      bytes = this.row!.u8.subarray(delta, delta + rowBytes);
    }
    this.stats.ioWaitSeconds += (performance.now() - t0) / 1000;
    if (e.dtype === "BF16") this.k.k3_bf16_to_f32(src, dst, e.cols);
    else if (e.dtype === "F16") this.k.k3_f16_to_f32(src, dst, e.cols);
    else new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(dst, rowBytes)).set(bytes);
  }

  /**
   * The lm_head's chunks: rows [r0, r1) of chunk c, whose bytes start at `at` in its
   * buffer, and how to read it. From a trunk, chunk c is pieces [cP, (c+1)P) of the head
   * region, and its rows are those that end inside it (the first one begun in chunk c-1).
   */
  private headChunks(): {
    n: number;
    rows: (c: number) => [number, number];
    read: (c: number) => Promise<number>;
  } {
    const h = this.head, rowBytes = h.cols * esize(h.dtype);
    if (!this.regions) {
      const n = Math.ceil(h.rows / this.chunkRows);
      const rows = (c: number): [number, number] => [c * this.chunkRows, Math.min(h.rows, (c + 1) * this.chunkRows)];
      const read = (c: number) => {
        const [r0, r1] = rows(c);
        return h.file.readSpan(
          this.chunks[c % 2].ptr,
          this.chunks[c % 2].bytes,
          h.offset + r0 * rowBytes,
          (r1 - r0) * rowBytes,
        );
      };
      return { n, rows, read };
    }
    const v = this.regions.head, span = piecesPerChunk(v.piece) * v.piece;
    const content = h.rows * rowBytes;
    const n = Math.ceil(content / span);
    const start = (c: number) => c * span, end = (c: number) => Math.min(v.region.size, (c + 1) * span);
    // rows ending inside chunk c: from the row containing its first byte
    const rows = (c: number): [number, number] => [
      Math.floor(start(c) / rowBytes),
      c === n - 1 ? h.rows : Math.floor(end(c) / rowBytes),
    ];
    const read = async (c: number) => {
      const buf = this.chunks[c % 2], [r0] = rows(c);
      const carry = start(c) - r0 * rowBytes;
      if (carry > 0) {
        // The verified tail of chunk c-1 (its buffer is not reused before chunk c is read).
        const prev = this.chunks[(c - 1) % 2];
        buf.u8.set(
          prev.u8.subarray(this.carryRoom + span - carry, this.carryRoom + span),
          this.carryRoom - carry,
        );
      }
      await this.readVerified(v, h, "head", buf.at(this.carryRoom), start(c), end(c));
      return this.carryRoom - carry;
    };
    return { n, rows, read };
  }

  /** y[t][r] for every row r of the head, chunk by chunk, the next chunk read ahead. */
  async matmul(
    x: NonNullable<Deno.PointerValue>,
    y: NonNullable<Deno.PointerValue>,
    ntok: number,
  ): Promise<void> {
    const h = this.head;
    const rowBytes = h.cols * esize(h.dtype);
    const { n, rows, read } = this.headChunks();
    let next: Promise<number> | undefined = read(0);
    try {
      for (let c = 0; c < n; c++) {
        const t0 = performance.now();
        const delta = await next!;
        next = undefined;
        this.stats.ioWaitSeconds += (performance.now() - t0) / 1000;
        const [r0, r1] = rows(c);
        this.stats.trunkBytes += (r1 - r0) * rowBytes;
        // Chunk c+1's read copies the tail of chunk c first, then reads into the other buffer.
        if (c + 1 < n) next = read(c + 1);
        let base = this.chunks[c % 2].at(delta);
        let wtype = h.dtype === "BF16" ? 1 : 0;
        if (h.dtype === "F16") {
          this.k.k3_f16_to_f32(base, this.conv!.ptr, (r1 - r0) * h.cols);
          base = this.conv!.ptr;
          wtype = 0;
        }
        // A base pointer such that row r of the matrix is at base + r * row size: the
        // kernel touches only rows [r0, r1), which are in this chunk.
        const rowOut = h.cols * (wtype === 1 ? 2 : 4);
        const virt = Deno.UnsafePointer.create(
          BigInt(Deno.UnsafePointer.value(base)) - BigInt(r0 * rowOut),
        )!;
        this.k.k3_matmul(virt, wtype, x, y, ntok, h.rows, h.cols, r0, r1);
      }
    } finally {
      if (next) await next.catch(() => 0);
    }
  }

  async close(): Promise<void> {
    if (this.pending) await this.pending.catch(() => 0);
    this.row?.free();
    this.chunks.forEach((c) => c.free());
    this.conv?.free();
  }
}

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
  private embedM?: Matrix;
  private headM?: Matrix;
  private streamedEH?: StreamedEmbedHead;
  private readonly owned: NativeBuffer[] = [];
  private readonly ownedTensors: BoundTensors[] = [];
  private readonly files: IoFile[] = [];

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
      const D = cfg.hiddenSize;
      // Final vectors, embedding and head.
      if (trunkFile) {
        const m = trunkFile.manifest;
        const finals = await trunkFile.readVerified("finals", m.finals);
        w.owned.push(finals);
        const g = bindRegion(m.finals.tensors, finals);
        w.setFinals(g);
        if (plan.embedHead.streamed) {
          const entry = (r: typeof m.embed) => ({
            file: trunkFile.file,
            offset: r.offset + r.tensors[0].offset,
            rows: cfg.vocabSize,
            cols: D,
            dtype: r.tensors[0].dtype,
          });
          const verified = (r: Region): VerifiedRegion => ({
            region: r,
            piece: m.piece,
            dir: trunkFile.dir,
            manifest: m,
            verify: trunkFile.verify,
          });
          w.streamedEH = new StreamedEmbedHead(k, entry(m.embed), entry(m.head), w.stats, {
            embed: verified(m.embed),
            head: verified(m.head),
          });
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
        const src = (name: string) => {
          const t = ckpt.get(name);
          const f = IoFile.open(t.file, { direct: true });
          w.files.push(f);
          return { file: f, offset: t.offset, rows: cfg.vocabSize, cols: D, dtype: t.dtype };
        };
        w.streamedEH = new StreamedEmbedHead(
          k,
          src(PREFIX + "embed_tokens.weight"),
          src(HEAD_NAME),
          w.stats,
        );
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

  layer(L: number): BoundTensors | Promise<BoundTensors> {
    return this.trunk ? this.trunk.layer(L) : this.residentLayers[L];
  }

  doneWithAttention(L: number): void {
    this.trunk?.attentionDone(L);
  }

  doneWithLayer(L: number): void {
    this.trunk?.done(L);
  }

  experts(L: number, ids: number[]): Promise<Expert>[] {
    return this.cache!.fetch(L, ids);
  }

  get expertSlots(): number | undefined {
    return this.cache?.size;
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
  ): void | Promise<void> {
    if (this.streamedEH) return this.streamedEH.matmul(x, y, ntok);
    const h = this.headM!;
    this.k.k3_matmul(h.ptr, h.wtype, x, y, ntok, h.rows, h.cols, 0, h.rows);
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
    for (const f of this.files) f.close();
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
