/**
 * The embedding and lm_head streamed from disk (ultra): one embedding row read per token,
 * the lm_head read in chunks, the next chunk read while the current one is multiplied (on
 * the compute the forward pass gives, so every thread of the pool takes its rows).
 *
 * From a packed trunk every read is whole pieces, each checked against its k3w64 in the
 * manifest on the I/O thread that read it (trunk_file.ts): an embedding row reads the one
 * or two pieces holding it, the lm_head is read in chunks of whole pieces. From the
 * checkpoint (no trunk) rows and chunks are read as they are, unverified: the shards carry
 * no checksum.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { type Kernels, WTYPE } from "../native/ffi.ts";
import { ALIGN, alignUp, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { testHook } from "../native/test_hooks.ts";
import type { Compute } from "../native/pool.ts";
import type { IoStats } from "../model/weight_source.ts";
import type { Matrix } from "../native/tensors.ts";
import { HEAD_NAME, PREFIX } from "../model/tensors.ts";
import { HEAD_CHUNK_BYTES } from "./plan_embed_head.ts";
import type { Checkpoint } from "./safetensors.ts";
import { pieceRun, type Region } from "./trunk_geometry.ts";
import type { TrunkManifest } from "./manifest.ts";
import { readRegionVerified, type TrunkFile } from "./trunk_file.ts";

/** A matrix whose rows are read from a file on demand. */
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

/** The model dimensions the streamed embedding and lm_head have (vocab rows, hidden columns). */
type HeadShape = Pick<K3Config, "vocabSize" | "hiddenSize">;

const esize = (dtype: string) => (dtype === "F32" ? 4 : 2);

/**
 * Bytes per lm_head chunk: HEAD_CHUNK_BYTES (K3_TEST_HEAD_CHUNK=BYTES, tests only, makes
 * chunks small enough for a tiny model to have many, with rows straddling them).
 */
function headChunkBytes(): number {
  const test = Number(testHook("K3_TEST_HEAD_CHUNK") ?? NaN);
  return test > 0 ? test : HEAD_CHUNK_BYTES;
}

/** Pieces of `piece` bytes per lm_head chunk of `chunkBytes` read from a trunk (at least one). */
function piecesPerChunk(piece: number, chunkBytes: number): number {
  return Math.max(1, Math.floor(chunkBytes / piece));
}

/**
 * Embedding rows and lm_head chunks read from disk. From a packed trunk (`regions`), every
 * read is whole verified pieces: an embedding row reads the one or two pieces holding it,
 * and the lm_head is read in chunks of whole pieces; a row that straddles two chunks is
 * completed from the end of the previous chunk (its verified tail is copied in front of
 * the next chunk's pieces before they are read). From the checkpoint (no trunk) rows and
 * chunks are read as they are, unverified: the shards carry no checksum.
 */
export class StreamedEmbedHead {
  private readonly row?: NativeBuffer;
  private readonly chunks: NativeBuffer[];
  private readonly conv?: NativeBuffer;
  private readonly chunkRows: number;
  /** Room in front of a piece-aligned chunk for the tail of a row begun in the previous one. */
  private readonly carryRoom: number;
  private pending?: Promise<unknown>;
  /** The verified embedding bytes [from, to) now in chunk buffer 0 (a trunk only): rows of a
   * pass taken in id order read each piece once, not once a row. The lm_head's reads reuse
   * the buffer, so they forget it. */
  private embedSpan?: { from: number; to: number };

  private constructor(
    private readonly k: Kernels,
    private readonly embed: StreamedMatrix,
    private readonly head: StreamedMatrix,
    private readonly stats: IoStats,
    /** Bytes per lm_head chunk (whole pieces of them from a trunk). */
    private readonly chunkBytes: number,
    private readonly regions?: { embed: VerifiedRegion; head: VerifiedRegion },
    /** Files opened for this stream (closed with it). */
    private readonly files: IoFile[] = [],
  ) {
    const rowBytes = embed.cols * esize(embed.dtype);
    const headRow = head.cols * esize(head.dtype);
    if (regions) {
      const { piece } = regions.head;
      this.carryRoom = alignUp(headRow);
      const span = Math.min(piecesPerChunk(piece, chunkBytes) * piece, regions.head.region.size);
      this.chunkRows = Math.min(head.rows, Math.ceil((span + this.carryRoom) / headRow));
      // An embedding row lies in at most two pieces; it is read into chunk buffer 0 (the
      // head is never being read then: its reads are awaited within matmul).
      const embedSpan = Math.min(2 * regions.embed.piece, regions.embed.region.size);
      const bytes = Math.max(this.carryRoom + span, embedSpan);
      this.chunks = [0, 1].map(() => NativeBuffer.alloc(k, bytes, "lm_head chunk"));
    } else {
      this.carryRoom = 0;
      this.row = NativeBuffer.alloc(k, alignUp(rowBytes) + 2 * ALIGN, "embedding row");
      this.chunkRows = Math.min(head.rows, Math.max(1, Math.floor(chunkBytes / headRow)));
      this.chunks = [0, 1].map(() => NativeBuffer.alloc(k, alignUp(this.chunkRows * headRow) + ALIGN, "lm_head chunk"));
    }
    if (head.dtype === "F16") {
      this.conv = NativeBuffer.alloc(k, this.chunkRows * head.cols * 4, "lm_head chunk (f32)");
    }
  }

  /** The embedding and lm_head of a packed trunk, every read verified piece by piece
   * (unless the trunk was opened with verify false, only for bench/verify.ts), the lm_head
   * in chunks of `chunkBytes`. */
  static fromTrunk(
    k: Kernels,
    cfg: HeadShape,
    trunk: TrunkFile,
    stats: IoStats,
    chunkBytes = headChunkBytes(),
  ): StreamedEmbedHead {
    const m = trunk.manifest;
    const entry = (r: Region): StreamedMatrix => ({
      file: trunk.file,
      offset: r.offset + r.tensors[0].offset,
      rows: cfg.vocabSize,
      cols: cfg.hiddenSize,
      dtype: r.tensors[0].dtype,
    });
    const verified = (r: Region): VerifiedRegion => ({
      region: r,
      piece: m.piece,
      dir: trunk.dir,
      manifest: m,
      verify: trunk.verify,
    });
    return new StreamedEmbedHead(k, entry(m.embed), entry(m.head), stats, chunkBytes, {
      embed: verified(m.embed),
      head: verified(m.head),
    });
  }

  /** The embedding and lm_head of the checkpoint's shards (opened direct), read unverified,
   * the lm_head in chunks of `chunkBytes`. */
  static fromCheckpoint(
    k: Kernels,
    cfg: HeadShape,
    ckpt: Checkpoint,
    stats: IoStats,
    chunkBytes = headChunkBytes(),
  ): StreamedEmbedHead {
    const files: IoFile[] = [];
    const src = (name: string): StreamedMatrix => {
      const t = ckpt.get(name);
      const file = IoFile.open(t.file, { direct: true });
      files.push(file);
      return { file, offset: t.offset, rows: cfg.vocabSize, cols: cfg.hiddenSize, dtype: t.dtype };
    };
    try {
      const embed = src(PREFIX + "embed_tokens.weight"), head = src(HEAD_NAME);
      return new StreamedEmbedHead(k, embed, head, stats, chunkBytes, undefined, files);
    } catch (e) {
      for (const f of files) f.close();
      throw e;
    }
  }

  /** Reads bytes [from, to) of a region (whole pieces) to `ptr`, each piece verified. */
  private async readVerified(
    v: VerifiedRegion,
    m: StreamedMatrix,
    what: string,
    ptr: NonNullable<Deno.PointerValue>,
    from: number,
    to: number,
  ): Promise<void> {
    const first = from / v.piece, last = Math.ceil(to / v.piece) - 1;
    const sub: Region = pieceRun(v.region, v.piece, first, last);
    await readRegionVerified(v.dir, m.file, v.manifest, `${what} (streamed)`, sub, ptr, v.verify, first);
  }

  /** Writes row `id` of the embedding as f32 to `dst` (reading it first). */
  async embedRow(id: number, dst: NonNullable<Deno.PointerValue>): Promise<void> {
    const e = this.embed;
    const rowBytes = e.cols * esize(e.dtype);
    const t0 = performance.now();
    let src: NonNullable<Deno.PointerValue>, bytes: Uint8Array;
    if (this.regions) {
      const v = this.regions.embed;
      const at = id * rowBytes;
      const held = this.embedSpan;
      if (!held || at < held.from || at + rowBytes > held.to) {
        const from = Math.floor(at / v.piece) * v.piece;
        const to = Math.min(v.region.size, (Math.floor((at + rowBytes - 1) / v.piece) + 1) * v.piece);
        this.embedSpan = undefined;
        const p = this.readVerified(v, e, "embed", this.chunks[0].ptr, from, to);
        this.pending = p;
        await p;
        this.pending = undefined;
        this.embedSpan = { from, to };
        this.stats.trunkBytes += to - from;
      }
      const from = this.embedSpan!.from;
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
    const v = this.regions.head, span = piecesPerChunk(v.piece, this.chunkBytes) * v.piece;
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

  /**
   * y[t][r] for every row r of the head, chunk by chunk, the next chunk read ahead; each
   * chunk's rows multiplied on `compute` (the pool's threads split them as they split any
   * product, and a row has the same bits on every thread).
   */
  async matmul(
    x: NonNullable<Deno.PointerValue>,
    y: NonNullable<Deno.PointerValue>,
    ntok: number,
    compute: Compute,
  ): Promise<void> {
    this.embedSpan = undefined;
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
        let wtype = h.dtype === "BF16" ? WTYPE.bf16 : WTYPE.f32;
        if (h.dtype === "F16") {
          this.k.k3_f16_to_f32(base, this.conv!.ptr, (r1 - r0) * h.cols);
          base = this.conv!.ptr;
          wtype = WTYPE.f32;
        }
        // A base pointer such that row r of the matrix is at base + r * row size: the
        // product touches only rows [r0, r1), which are in this chunk.
        const rowOut = h.cols * (wtype === WTYPE.bf16 ? 2 : 4);
        const virt = Deno.UnsafePointer.create(
          BigInt(Deno.UnsafePointer.value(base)) - BigInt(r0 * rowOut),
        )!;
        const chunk: Matrix = { ptr: virt, wtype, rows: h.rows, cols: h.cols };
        compute.matmul(chunk, x, y, ntok, [r0, r1]);
      }
    } finally {
      if (next) await next.catch(() => 0);
    }
  }

  /** Waits for a read in flight, then frees the buffers and closes the files it opened. */
  async close(): Promise<void> {
    if (this.pending) await this.pending.catch(() => 0);
    this.row?.free();
    this.chunks.forEach((c) => c.free());
    this.conv?.free();
    for (const f of this.files) f.close();
  }
}
