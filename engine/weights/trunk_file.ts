/**
 * The packed trunk file (manifest.ts): opening it for a model (fingerprint, weight sample,
 * layout), reading its regions piece by piece, each piece checked against its k3w64 in the
 * manifest on the I/O thread that read it, and binding a region's bytes as tensors.
 *
 * Everything read once (pinned layers, the final vectors, a resident embedding and lm_head)
 * goes through `TrunkFile.readVerified`. The ring (trunk_ring.ts) reads its streamed layers
 * plainly, through the same file, and leaves their check to the tensors' own checks
 * (`bindRegion` with `checked`); ultra's embedding rows and lm_head chunks (head_stream.ts)
 * are read as whole verified pieces with `readRegionVerified`.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { type Kernels, WTYPE } from "../native/ffi.ts";
import { CodedPieceCorrupt, type IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { checkMismatch, type F32, type Matrix, tensorCheck } from "../native/tensors.ts";
import { BoundTensors } from "./bind.ts";
import { checkLayout, DATA_FILE, openTrunkData, readManifest, type TrunkManifest } from "./manifest.ts";
import { pieceRange, pieceSpans, type Region, type TensorEntry } from "./trunk_geometry.ts";

/** Bytes per pread when a piece is read and hashed (0: the whole piece in one pread, then its
 * hash; bench/verify.ts measures the choice). */
export const HASH_CHUNK = 0;

/**
 * Pieces in flight for a verified region read. The disk alone is as fast at 8 as deeper, but
 * each I/O thread also hashes its piece, and with 8 that time comes off the disk's queue:
 * 1.2 GB regions verified/plain 1.15-1.20 at 8, 0.98-1.05 at 32 (idle machine, side by side).
 */
export const VERIFIED_DEPTH = 32;

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
 * Reads region `r` of a trunk into `ptr`, every piece verified against the manifest
 * (`verify` false skips the hashing: only bench/verify.ts, to measure what it costs). `r`
 * may be a run of whole pieces of a larger region (trunk_geometry.ts pieceRun); `pieceBase` is
 * its first piece's index there, for the message. Coded pieces are decoded on the I/O
 * thread that read them, and the hash is of the decoded bytes (what the kernels use).
 * Resolves to the seconds spent decoding; throws K3Error (exit 1) naming the trunk, `what`
 * and the bad piece.
 */
export async function readRegionVerified(
  dir: string,
  f: IoFile,
  m: TrunkManifest,
  what: string,
  r: Region,
  ptr: NonNullable<Deno.PointerValue>,
  verify = true,
  pieceBase = 0,
): Promise<number> {
  const spans = pieceSpans(r, m.piece);
  let next = 0, total = 0, decodeSeconds = 0;
  let failure: unknown;
  const worker = async () => {
    while (next < spans.length && failure === undefined) {
      const i = next++, s = spans[i];
      try {
        const got = await readOnePiece(f, s.at === 0 ? ptr : Deno.UnsafePointer.offset(ptr, s.at)!, s, i, verify);
        total += got.n;
        decodeSeconds += got.decodeSeconds;
        if (got.n < s.len) return; // end of file: the caller sees the short total
        if (verify && got.hash !== r.pieces[i]) throw new PieceMismatch(i, s.at);
      } catch (e) {
        failure = e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(VERIFIED_DEPTH, spans.length) }, worker));
  if (failure !== undefined) throw regionReadError(dir, what, r, failure, pieceBase);
  if (total !== r.size) throw regionShortRead(dir, what, total, r.size);
  return decodeSeconds;
}

/** Reads piece `i` (span `s`) of a region to its place `dst`: a coded piece that does not
 * decode rejects as a PieceMismatch (corrupt like any other). */
async function readOnePiece(
  f: IoFile,
  dst: NonNullable<Deno.PointerValue>,
  s: { at: number; len: number; file: number; stored: number },
  i: number,
  hash: boolean,
  keepCoded = false,
): Promise<{ n: number; hash?: string; decodeSeconds: number }> {
  try {
    return await f.preadPiece(dst, s.len, s.file, s.stored, hash, keepCoded);
  } catch (e) {
    if (e instanceof CodedPieceCorrupt) throw new PieceMismatch(i, s.at);
    throw e;
  }
}

/**
 * The K3Error (exit 1) for a failed read of region `r`: a piece mismatch names the piece
 * (`pieceBase` + its index in `r`, when `r` is a run of pieces of a larger region).
 */
function regionReadError(dir: string, what: string, r: Region, e: unknown, pieceBase = 0): K3Error {
  if (e instanceof PieceMismatch) {
    return new K3Error(
      `${dir}: ${what}: checksum mismatch in piece ${pieceBase + e.index} (bytes ${
        r.offset + e.at
      }.. of ${DATA_FILE}): the trunk is corrupt; re-pack it (k3 pack --force)`,
    );
  }
  if (e instanceof K3Error) return e;
  return new K3Error(`${dir}: ${what}: read failed: ${(e as Error).message}`);
}

/** The K3Error (exit 1) for a region that came back short (`n` of `want` bytes). */
function regionShortRead(dir: string, what: string, n: number, want: number): K3Error {
  return new K3Error(`${dir}: ${what}: short read (${n} of ${want} bytes): the trunk data is truncated; re-pack it`);
}

/**
 * The pieces of a streamed region that the ring left coded (the products decode them):
 * `keptCoded` says which, `places` where each piece is (`piecePlaces`), and `descriptors`
 * holds where each matrix's words are.
 */
export interface CodedPieces {
  /** Per piece of the region: 1 when it was left coded (its stored bytes are its place). */
  kept: Uint8Array;
  /** Where each piece starts, from the region's start in memory (piecePlaces). */
  places: readonly number[];
  /** The manifest's piece size. */
  piece: number;
  /** The region's decoded bytes. */
  size: number;
  /** Stored bytes of each piece. */
  stored: readonly number[];
  /** Room for the matrices' descriptors (`descriptorBytes`). */
  descriptors: NativeBuffer;
}

/**
 * Writes at `desc` + `off` where matrix `t`'s words are, when any of its pieces was left
 * coded (kernels/k3.h k3_split_matrix); returns the bytes written, 0 when none was.
 */
function describeCoded(t: TensorEntry, base: NativeBuffer, at: number, c: CodedPieces, off: number): number {
  const [p0, p1] = pieceRange(t, c.piece);
  if (!c.kept.subarray(p0, p1 + 1).some((x) => x === 1)) return 0;
  const d = new DataView(c.descriptors.u8.buffer, c.descriptors.u8.byteOffset + off, 16 + 24 * (p1 - p0 + 1));
  d.setBigUint64(0, BigInt(p1 - p0 + 1), true);
  d.setBigUint64(8, BigInt((t.offset - p0 * c.piece) / 2), true);
  for (let p = p0; p <= p1; p++) {
    const o = 16 + 24 * (p - p0);
    d.setBigUint64(o, BigInt(Deno.UnsafePointer.value(base.at(at + c.places[p]))), true);
    d.setBigUint64(o + 8, BigInt(Math.min(c.piece, c.size - p * c.piece)), true);
    d.setBigUint64(o + 16, BigInt(c.kept[p] ? c.stored[p] : 0), true);
  }
  return d.byteLength;
}

/**
 * Bound tensors over a region's bytes at `base` (nothing owned: the region buffer is).
 * `checked` (a streamed layer read unverified): each vector is checked against its tensor
 * check now (throws K3Error, exit 1, on a mismatch) and each matrix carries its check, for
 * the product that uses it to settle. `coded`: a matrix in pieces left coded is bound as a
 * WTYPE.bf16Split descriptor.
 */
export function bindRegion(
  tensors: TensorEntry[],
  base: NativeBuffer,
  at = 0,
  checked?: { k: Kernels; what: string },
  coded?: CodedPieces,
): BoundTensors {
  const matrices = new Map<string, Matrix>();
  const vectors = new Map<string, F32>();
  let descAt = 0;
  // Where a byte of the region is: its piece's place, when pieces left coded moved them.
  const place = (offset: number) => {
    if (!coded) return offset;
    const p = Math.floor(offset / coded.piece);
    return coded.places[p] + offset - p * coded.piece;
  };
  for (const t of tensors) {
    const ptr = base.at(at + place(t.offset));
    const what = checked && `${checked.what}: tensor ${t.name}`;
    if (t.keep === "matrix") {
      const described = coded ? describeCoded(t, base, at, coded, descAt) : 0;
      matrices.set(t.name, {
        ptr: described ? coded!.descriptors.at(descAt) : ptr,
        wtype: described ? WTYPE.bf16Split : t.dtype === "BF16" ? WTYPE.bf16 : WTYPE.f32,
        rows: t.shape[0],
        cols: t.shape.slice(1).reduce((a, b) => a * b, 1),
        check: what ? { expect: t.check, verified: false, what } : undefined,
      });
      descAt += described;
    } else if (t.keep === "vector") {
      if (checked) {
        const got = tensorCheck(checked.k, t, ptr);
        if (got !== t.check) throw checkMismatch(what!, got, t.check);
      }
      vectors.set(t.name, {
        ptr,
        f: new Float32Array(base.u8.buffer, base.u8.byteOffset + at + place(t.offset), t.bytes / 4),
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
    /** Check every piece against the manifest (false only to measure the cost). */
    readonly verify: boolean,
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
    verify = true,
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
    return new TrunkFile(dir, m, f, k, verify);
  }

  /** CPU seconds the I/O threads spent decoding coded pieces read through this file. */
  decodeSeconds = 0;

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
  async readInto(what: string, r: Region, ptr: NonNullable<Deno.PointerValue>): Promise<void> {
    this.decodeSeconds += await readRegionVerified(this.dir, this.file, this.manifest, what, r, ptr, this.verify);
  }

  /**
   * Reads piece `i` of region `r` to its place `dst`, decoded when it is coded (or with
   * `keepCoded` left coded there, its stored bytes only, for the product), not hashed (a
   * streamed layer: its bytes are checked by their tensor checks once bound, trunk_ring.ts).
   * Resolves to the seconds spent decoding. Rejects with a K3Error (exit 1) naming `what`
   * when the read fails or comes back short, or the piece does not decode.
   */
  async readPiece(
    what: string,
    r: Region,
    i: number,
    dst: NonNullable<Deno.PointerValue>,
    keepCoded = false,
  ): Promise<number> {
    const s = pieceSpans(r, this.manifest.piece)[i];
    let got: { n: number; decodeSeconds: number };
    try {
      got = await readOnePiece(this.file, dst, s, i, false, keepCoded);
    } catch (e) {
      throw regionReadError(this.dir, what, r, e);
    }
    if (got.n < s.len) throw regionShortRead(this.dir, what, s.at + got.n, r.size);
    this.decodeSeconds += got.decodeSeconds;
    return got.decodeSeconds;
  }

  /** Closes the data file (the ring and the pinned layers are StreamedTrunk's to free). */
  close(): void {
    this.file.close();
  }
}
