/**
 * The trunk (every layer's dense tensors) when it does not all stay in memory: a packed
 * trunk (manifest.ts) with some layers pinned and the rest streamed through a ring.
 *
 * Every read, pinned or streamed, checks each piece against its k3w64 in the manifest on
 * the I/O thread that read it (readPieces). Pinned layers are read once at start-up. The
 * ring is one arena used as a FIFO of variable-size layer regions: streamed layers are
 * read ahead in the order the forward pass uses them (wrapping to the next token's first
 * streamed layer), as many as fit, while the current layer computes. A layer's space is
 * reused only after `done(L)` (the forward pass's doneWithLayer), so the layer being
 * computed is never overwritten, and a layer is handed out only after its read fully
 * succeeded and every piece matched. A failed
 * check stops the run (exit 1) naming the layer.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { type Kernels, WTYPE } from "../native/ffi.ts";
import type { IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { IoStats } from "../model/model.ts";
import { BoundTensors, type F32, type Matrix } from "../model/weights.ts";
import {
  checkLayout,
  DATA_FILE,
  openTrunkData,
  readManifest,
  type Region,
  type TensorEntry,
  type TrunkManifest,
} from "./manifest.ts";

/** Bytes per pread when a piece is read and hashed (bench/verify.ts measures the choice). */
export const HASH_CHUNK = 0;

/** A piece of a region whose bytes did not match its checksum. */
export class PieceMismatch extends Error {
  /** Piece `index` of a region, starting at byte `at`, did not match. */
  constructor(readonly index: number, readonly at: number) {
    super(`piece ${index} (region bytes ${at}..) does not match its checksum`);
  }
}

/**
 * Reads a big region as `piece`-byte pieces, `depth` in flight at once (the device works on
 * several requests together; one huge pread is slower). With `hashes` (one k3w64 per
 * piece, from the manifest) every piece is hashed on the I/O thread that read it, `chunk`
 * bytes per pread (0: the whole piece in one pread), and a mismatch rejects with
 * PieceMismatch. Resolves to the bytes read.
 */
export async function readPieces(
  f: IoFile,
  ptr: NonNullable<Deno.PointerValue>,
  len: number,
  offset: number,
  piece = 16 << 20,
  depth = 8,
  hashes?: readonly string[],
  chunk = HASH_CHUNK,
): Promise<number> {
  let next = 0, total = 0;
  let failure: unknown;
  const worker = async () => {
    while (next < len && failure === undefined) {
      const at = next;
      next += piece;
      const want = Math.min(piece, len - at);
      const dst = at === 0 ? ptr : Deno.UnsafePointer.offset(ptr, at)!;
      try {
        if (hashes) {
          const r = await f.preadHashed(dst, want, offset + at, chunk);
          total += r.n;
          if (r.n < want) return; // end of file: the caller sees the short total
          if (r.hash !== hashes[at / piece]) throw new PieceMismatch(at / piece, at);
        } else {
          const n = await f.pread(dst, want, offset + at);
          total += n;
          if (n < want) return;
        }
      } catch (e) {
        failure = e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(depth, Math.ceil(len / piece)) }, worker));
  if (failure !== undefined) throw failure;
  return total;
}

/**
 * Reads region `r` of a trunk into `ptr`, every piece verified against the manifest.
 * Throws K3Error (exit 1) naming the trunk, `what` and the bad piece.
 */
export async function readRegionVerified(
  dir: string,
  f: IoFile,
  m: TrunkManifest,
  what: string,
  r: Region,
  ptr: NonNullable<Deno.PointerValue>,
): Promise<void> {
  let n: number;
  try {
    n = await readPieces(f, ptr, r.size, r.offset, m.piece, 8, r.pieces);
  } catch (e) {
    if (e instanceof PieceMismatch) {
      throw new K3Error(
        `${dir}: ${what}: checksum mismatch in piece ${e.index} (bytes ${
          r.offset + e.at
        }.. of ${DATA_FILE}): the trunk is corrupt; re-pack it (k3 pack --force)`,
      );
    }
    if (e instanceof K3Error) throw e;
    throw new K3Error(`${dir}: ${what}: read failed: ${(e as Error).message}`);
  }
  if (n !== r.size) {
    throw new K3Error(
      `${dir}: ${what}: short read (${n} of ${r.size} bytes): the trunk data is truncated; re-pack it`,
    );
  }
}

/** Bound tensors over a region's bytes at `base` (nothing owned: the region buffer is). */
export function bindRegion(tensors: TensorEntry[], base: NativeBuffer, at = 0): BoundTensors {
  const matrices = new Map<string, Matrix>();
  const vectors = new Map<string, F32>();
  for (const t of tensors) {
    const ptr = base.at(at + t.offset);
    if (t.keep === "matrix") {
      matrices.set(t.name, {
        ptr,
        wtype: t.dtype === "BF16" ? WTYPE.bf16 : WTYPE.f32,
        rows: t.shape[0],
        cols: t.shape.slice(1).reduce((a, b) => a * b, 1),
      });
    } else if (t.keep === "vector") {
      vectors.set(t.name, {
        ptr,
        f: new Float32Array(base.u8.buffer, base.u8.byteOffset + at + t.offset, t.bytes / 4),
      });
    }
  }
  return new BoundTensors(matrices, vectors, []);
}

/** A packed trunk opened for a model: manifest checked, data file open. */
export class TrunkFile {
  private constructor(
    readonly dir: string,
    readonly manifest: TrunkManifest,
    readonly file: IoFile,
    private readonly k: Kernels,
  ) {}

  /**
   * Opens and checks a trunk against the model: fingerprint (of the whole model's config),
   * data length, and the tensor table of every layer the run uses.
   */
  static async open(
    k: Kernels,
    dir: string,
    cfg: K3Config,
    fingerprint: string,
    sample?: string,
  ): Promise<TrunkFile> {
    const m = await readManifest(dir);
    if (m.fingerprint !== fingerprint) {
      throw new K3Error(
        `${dir}: this trunk was packed from a different model (fingerprint ${m.fingerprint}, the model has ${fingerprint}); re-pack it with k3 pack`,
      );
    }
    if (sample !== undefined && m.sample !== sample) {
      throw new K3Error(
        `${dir}: this trunk was packed from different weights (weight sample ${m.sample}, the model has ${sample}); re-pack it with k3 pack`,
      );
    }
    checkLayout(m, cfg, dir);
    const f = openTrunkData(dir, m);
    return new TrunkFile(dir, m, f, k);
  }

  /** Reads a whole region into a new buffer, every piece checked against its checksum. */
  async readVerified(what: string, r: Region): Promise<NativeBuffer> {
    const buf = NativeBuffer.alloc(this.k, r.size, `trunk ${what}`);
    try {
      await this.readInto(what, r, buf.ptr);
      return buf;
    } catch (e) {
      buf.free();
      throw e;
    }
  }

  /** Reads region `r` to `ptr`, every piece checked against its checksum. */
  readInto(what: string, r: Region, ptr: NonNullable<Deno.PointerValue>): Promise<void> {
    return readRegionVerified(this.dir, this.file, this.manifest, what, r, ptr);
  }

  /** Stops the read-ahead and frees the ring and the pinned layers. */
  close(): void {
    this.file.close();
  }
}

interface RingEntry {
  L: number;
  off: number;
  size: number;
  /** Settles when the read is done; never rejects (errors go to `error`). */
  settled: Promise<void>;
  bound?: BoundTensors;
  error?: Error;
}

/** Pinned layers plus a read-ahead ring over the rest. */
export class StreamedTrunk {
  private readonly pinnedLayers = new Map<number, { buf: NativeBuffer; bound: BoundTensors }>();
  private readonly streamed: number[];
  private readonly queue: RingEntry[] = [];
  private next = 0;
  private readonly ring?: NativeBuffer;

  private constructor(
    private readonly k: Kernels,
    private readonly trunk: TrunkFile,
    numLayers: number,
    pinned: number[],
    ringBytes: number,
    private readonly stats: IoStats,
  ) {
    this.streamed = Array.from({ length: numLayers }, (_, L) => L).filter((L) => !pinned.includes(L));
    if (this.streamed.length > 0) this.ring = NativeBuffer.alloc(k, ringBytes, "trunk ring");
  }

  /** Reads and verifies the pinned layers, allocates the ring and starts reading ahead. */
  static async open(
    k: Kernels,
    trunk: TrunkFile,
    numLayers: number,
    pinned: number[],
    ringBytes: number,
    stats: IoStats,
  ): Promise<StreamedTrunk> {
    const t = new StreamedTrunk(k, trunk, numLayers, pinned, ringBytes, stats);
    try {
      for (const L of pinned) {
        const r = trunk.manifest.layer[L];
        const buf = await trunk.readVerified(`layer ${L}`, r);
        t.pinnedLayers.set(L, { buf, bound: bindRegion(r.tensors, buf) });
        stats.pinnedLayers++;
      }
      t.fill();
    } catch (e) {
      await t.close();
      throw e;
    }
    return t;
  }

  /** Where a region of `size` bytes can go in the ring now, or -1. */
  private place(size: number): number {
    const cap = this.ring!.bytes;
    if (this.queue.length === 0) return size <= cap ? 0 : -1;
    const head = this.queue[0].off;
    const last = this.queue[this.queue.length - 1];
    const tail = last.off + last.size;
    if (last.off >= head) {
      if (tail + size <= cap) return tail;
      return size <= head ? 0 : -1;
    }
    return tail + size <= head ? tail : -1;
  }

  /** Starts reads of the next streamed layers while they fit. */
  private fill(): void {
    if (!this.ring) return;
    while (true) {
      const L = this.streamed[this.next];
      if (this.queue.some((e) => e.L === L)) return; // every streamed layer is already in the ring
      const r = this.trunk.manifest.layer[L];
      const off = this.place(r.size);
      if (off < 0) return;
      const entry: RingEntry = { L, off, size: r.size, settled: Promise.resolve() };
      entry.settled = this.read(entry, r);
      this.queue.push(entry);
      this.next = (this.next + 1) % this.streamed.length;
    }
  }

  /** Reads region `r` into ring entry `e`. */
  private async read(e: RingEntry, r: Region): Promise<void> {
    const ring = this.ring!;
    const dir = this.trunk.dir;
    try {
      await this.trunk.readInto(`layer ${e.L} (streamed)`, r, ring.at(e.off));
      e.bound = bindRegion(r.tensors, ring, e.off);
    } catch (err) {
      e.error = err instanceof K3Error
        ? err
        : new K3Error(`${dir}: layer ${e.L}: read failed: ${(err as Error).message}`);
    }
  }

  /** The bound tensors of layer L (waits for its read). */
  layer(L: number): BoundTensors | Promise<BoundTensors> {
    const p = this.pinnedLayers.get(L);
    if (p) return p.bound;
    return this.streamedLayer(L);
  }

  /** Layer `L` from the ring (read ahead, then bound). */
  private async streamedLayer(L: number): Promise<BoundTensors> {
    let e = this.queue.find((x) => x.L === L);
    if (!e) {
      // Not the layer the ring expected (a different pass order): drain and restart there.
      await Promise.all(this.queue.map((x) => x.settled));
      this.queue.length = 0;
      this.next = this.streamed.indexOf(L);
      if (this.next < 0) throw new Error(`internal: layer ${L} is neither pinned nor streamed`);
      this.fill();
      e = this.queue.find((x) => x.L === L)!;
    }
    const t0 = performance.now();
    await e.settled;
    this.stats.ioWaitSeconds += (performance.now() - t0) / 1000;
    if (e.error) throw e.error;
    // Counted when used, so a read-ahead the run never uses is not charged to a token.
    this.stats.trunkBytes += e.size;
    return e.bound!;
  }

  /** The pass is done with layer L: its ring space can be reused. */
  done(L: number): void {
    if (this.pinnedLayers.has(L)) return;
    const i = this.queue.findIndex((x) => x.L === L);
    if (i < 0) return;
    this.queue.splice(i, 1);
    this.fill();
  }

  /** Waits for reads in flight, then frees everything. */
  async close(): Promise<void> {
    await Promise.all(this.queue.map((x) => x.settled));
    this.queue.length = 0;
    for (const p of this.pinnedLayers.values()) p.buf.free();
    this.pinnedLayers.clear();
    this.ring?.free();
  }
}
