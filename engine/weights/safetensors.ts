/**
 * A reader for a checkpoint split over many safetensors shards.
 *
 * Every header is validated before any tensor is used: the header length is sane, every
 * tensor's byte range lies inside its file, its size equals numel x element size, no two
 * tensors of a file overlap and no name appears twice across shards. A bad file is refused
 * with one line naming the file and the tensor (exit 1).
 *
 * @module
 */

import { K3Error } from "../errors.ts";
import { isRegularFile, requireRegular } from "../native/files.ts";
import type { Kernels } from "../native/ffi.ts";
import { alignDown, alignUp, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";

/** Bytes per element of the dtypes safetensors defines. */
export const DTYPE_BYTES: Record<string, number> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  I64: 8,
  U64: 8,
  F64: 8,
};

/** Where one tensor's bytes are. */
export interface TensorInfo {
  /** Tensor name. */
  name: string;
  /** dtype as in the header (BF16, F16, F32, U8, ...). */
  dtype: string;
  /** Shape. */
  shape: number[];
  /** The shard holding it. */
  file: string;
  /** Absolute byte offset in the file. */
  offset: number;
  /** Bytes of the data. */
  bytes: number;
}

/** The largest header we accept; the released shards' headers are a few MB. */
const MAX_HEADER_BYTES = 256 * 1024 * 1024;

/** Reads and validates one shard's header (parseShardHeader on the file's first bytes). */
export async function readShardHeader(file: string): Promise<TensorInfo[]> {
  let f: Deno.FsFile;
  try {
    f = await Deno.open(file, { read: true });
  } catch (e) {
    throw new K3Error(`${file}: cannot open: ${(e as Error).message}`);
  }
  try {
    const fileSize = (await f.stat()).size;
    if (fileSize < 8) throw new K3Error(`${file}: truncated: ${fileSize} bytes, not even a header length`);
    const lenBytes = new Uint8Array(8);
    await readFull(f, lenBytes, 0, file);
    const headerLen = Number(new DataView(lenBytes.buffer).getBigUint64(0, true));
    checkHeaderLength(file, headerLen, fileSize);
    const bytes = new Uint8Array(8 + headerLen);
    bytes.set(lenBytes);
    await readFull(f, bytes.subarray(8), 8, file);
    return parseShardHeader(file, bytes, fileSize);
  } finally {
    f.close();
  }
}

function checkHeaderLength(file: string, headerLen: number, fileSize: number): void {
  if (headerLen < 2 || headerLen > MAX_HEADER_BYTES || 8 + headerLen > fileSize) {
    throw new K3Error(`${file}: header length ${headerLen} does not fit in a file of ${fileSize} bytes`);
  }
}

/**
 * Validates a shard header: `bytes` holds the 8-byte length and the JSON header, `fileSize`
 * is the whole file's size. Throws K3Error (exit 1) naming the file and the tensor.
 */
export function parseShardHeader(file: string, bytes: Uint8Array, fileSize: number): TensorInfo[] {
  const fail = (why: string): never => {
    throw new K3Error(`${file}: ${why}`);
  };
  if (bytes.length < 8) fail("truncated: not even a header length");
  const headerLen = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  checkHeaderLength(file, headerLen, fileSize);
  if (bytes.length < 8 + headerLen) fail(`header of ${headerLen} bytes, only ${bytes.length - 8} given`);
  const headerBytes = bytes.subarray(8, 8 + headerLen);
  {
    let header: unknown;
    try {
      header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(headerBytes));
    } catch (e) {
      fail(`header is not valid JSON: ${(e as Error).message}`);
    }
    if (typeof header !== "object" || header === null || Array.isArray(header)) {
      fail("header is not a JSON object");
    }
    const dataStart = 8 + headerLen;
    const dataSize = fileSize - dataStart;
    const tensors: TensorInfo[] = [];
    for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
      if (name === "__metadata__") continue;
      const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      const bad = (why: string) => fail(`tensor ${name}: ${why}`);
      if (typeof e !== "object" || e === null) bad("entry is not an object");
      if (typeof e.dtype !== "string" || !(e.dtype in DTYPE_BYTES)) bad(`unknown dtype ${JSON.stringify(e.dtype)}`);
      const shape = e.shape;
      if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) bad("bad shape");
      const offs = e.data_offsets;
      if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0)) {
        bad("bad data_offsets");
      }
      const [begin, end] = offs as number[];
      if (end < begin) bad(`data_offsets end ${end} before begin ${begin}`);
      if (end > dataSize) {
        fail(
          `shorter than its header says: ${fileSize} bytes, but tensor ${name} ends at byte ${dataStart + end} ` +
            `(data_offsets [${begin}, ${end}) run past the end of the file); an incomplete download? fetch it again (k3 pull)`,
        );
      }
      const numel = (shape as number[]).reduce((a, b) => a * b, 1);
      const want = numel * DTYPE_BYTES[e.dtype as string];
      if (end - begin !== want) bad(`holds ${end - begin} bytes but ${e.dtype} ${JSON.stringify(shape)} needs ${want}`);
      tensors.push({
        name,
        dtype: e.dtype as string,
        shape: shape as number[],
        file,
        offset: dataStart + begin,
        bytes: end - begin,
      });
    }
    // Zero-size tensors hold no bytes and overlap nothing; every other tensor must start at
    // or after the furthest end seen so far (not just the previous tensor's end, which a
    // zero-size tensor placed between two overlapping ones would hide).
    const byOffset = tensors.filter((t) => t.bytes > 0).sort((a, b) => a.offset - b.offset);
    let furthest: TensorInfo | undefined;
    for (const cur of byOffset) {
      if (furthest && furthest.offset + furthest.bytes > cur.offset) {
        fail(`tensor ${cur.name} overlaps tensor ${furthest.name}`);
      }
      if (!furthest || cur.offset + cur.bytes > furthest.offset + furthest.bytes) furthest = cur;
    }
    return tensors;
  }
}

/** Reads exactly dst.length bytes at `position`, or fails naming the file. */
export async function readFull(f: Deno.FsFile, dst: Uint8Array, position: number, file: string): Promise<void> {
  await f.seek(position, Deno.SeekMode.Start);
  let done = 0;
  while (done < dst.length) {
    const n = await f.read(dst.subarray(done));
    if (n === null || n === 0) {
      throw new K3Error(`${file}: short read at byte ${position + done} (wanted ${dst.length - done} more bytes)`);
    }
    done += n;
  }
}

/** A tensor read into native memory by `Checkpoint.readTensors`: its bytes start `delta` into `buf`. */
export interface TensorRead {
  /** The buffer (it covers the tensor's 4096-aligned span of the file). */
  buf: NativeBuffer;
  /** Where the tensor's first byte is in `buf`. */
  delta: number;
}

/** Bytes per read of `readTensors` (as the trunk is read). */
const READ_PIECE = 16 << 20;
/** Reads in flight at once. */
const READ_DEPTH = 8;

/** All tensors of a checkpoint directory, by name. */
export class Checkpoint {
  private handles = new Map<string, Deno.FsFile>();
  private direct = new Map<string, IoFile>();

  private constructor(readonly dir: string, readonly shards: string[], readonly tensors: Map<string, TensorInfo>) {}

  /**
   * Each shard's size against the size its own header describes (8 + header + the end of
   * its last tensor): a complete download matches exactly.
   */
  async shardSizes(): Promise<{ file: string; bytes: number; described: number }[]> {
    const described = new Map<string, number>();
    for (const t of this.tensors.values()) {
      described.set(t.file, Math.max(described.get(t.file) ?? 0, t.offset + t.bytes));
    }
    const out = [];
    for (const file of this.shards) {
      const bytes = (await Deno.stat(file)).size;
      out.push({ file, bytes, described: described.get(file) ?? bytes });
    }
    return out;
  }

  /** Indexes every `*.safetensors` in `dir` (sorted by name; names are never assumed). */
  static async open(dir: string, onShard?: (done: number, total: number) => void): Promise<Checkpoint> {
    let shards: string[];
    try {
      shards = [];
      for await (const e of Deno.readDir(dir)) {
        if (e.name.endsWith(".safetensors")) shards.push(`${dir}/${e.name}`); // any type: checked below
      }
    } catch (e) {
      throw new K3Error(`cannot list ${dir}: ${(e as Error).message}`);
    }
    if (shards.length === 0) throw new K3Error(`${dir}: no *.safetensors files`);
    shards.sort();
    // A shard must be a regular file (a symlink to a directory or a FIFO is refused, never read).
    for (const f of shards) requireRegular(f, "checkpoint shard");
    const headers: TensorInfo[][] = [];
    for (let i = 0; i < shards.length; i++) {
      headers.push(await readShardHeader(shards[i]));
      onShard?.(i + 1, shards.length);
    }
    return Checkpoint.fromHeaders(dir, shards, headers);
  }

  /**
   * The checkpoint the shards `shards` of `dir` make, from their headers (parsed with
   * parseShardHeader, one list per shard): `k3 pull --pack` lays out the trunk from the
   * headers before the shards themselves are downloaded.
   */
  static fromHeaders(dir: string, shards: string[], headers: TensorInfo[][]): Checkpoint {
    const tensors = new Map<string, TensorInfo>();
    for (const list of headers) {
      for (const t of list) {
        const prev = tensors.get(t.name);
        if (prev) throw new K3Error(`${t.file}: tensor ${t.name} also in ${prev.file}`);
        tensors.set(t.name, t);
      }
    }
    return new Checkpoint(dir, shards, tensors);
  }

  /** The tensor's info, or a K3Error naming what is missing. */
  get(name: string): TensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw new K3Error(`${this.dir}: missing tensor ${name}${this.#whereIndexed(name)}`);
    return t;
  }

  /** Where model.safetensors.index.json puts a missing tensor, as the end of the message. */
  #whereIndexed(name: string): string {
    const index = `${this.dir}/model.safetensors.index.json`;
    if (!isRegularFile(index)) return "";
    let shard: unknown;
    try {
      shard = JSON.parse(Deno.readTextFileSync(index))?.weight_map?.[name];
    } catch {
      return "";
    }
    if (typeof shard !== "string") return "";
    const there = this.shards.some((f) => f.endsWith(`/${shard}`));
    return there
      ? ` (model.safetensors.index.json puts it in ${shard}, which does not hold it: fetch that shard again with k3 pull)`
      : ` (model.safetensors.index.json puts it in ${shard}, which is missing: fetch it with k3 pull)`;
  }

  /** True when the checkpoint has a tensor `name`. */
  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** Reads `dst.length` bytes of the file at absolute `offset`. */
  async readAt(file: string, offset: number, dst: Uint8Array): Promise<void> {
    let f = this.handles.get(file);
    if (!f) {
      f = await Deno.open(file, { read: true });
      this.handles.set(file, f);
    }
    await readFull(f, dst, offset, file);
  }

  /** Reads a whole tensor into `dst` (exactly t.bytes long). */
  read(t: TensorInfo, dst: Uint8Array): Promise<void> {
    if (dst.length !== t.bytes) throw new Error(`read ${t.name}: buffer ${dst.length} != ${t.bytes}`);
    return this.readAt(t.file, t.offset, dst);
  }

  /**
   * Reads whole tensors (or any named byte ranges of the shards) into fresh native buffers the way the trunk is read: O_DIRECT where
   * the filesystem allows (no page-cache copy and no doubled footprint), 16 MB pieces, several
   * in flight across tensor boundaries. The disk runs deep, and each I/O thread faults in the
   * fresh pages of its own piece, so first-touch zeroing runs on both cores beside the reads
   * instead of in one loop ahead of them. `onTensor(i, read)` runs as soon as tensor i is
   * complete (in any order) and takes ownership of its buffer; on failure the buffers not yet
   * handed over are freed and a K3Error names the shard.
   */
  async readTensors(
    k: Kernels,
    list: readonly Pick<TensorInfo, "name" | "file" | "offset" | "bytes">[],
    onTensor: (i: number, read: TensorRead) => void,
  ): Promise<void> {
    const spans = list.map((t) => {
      const f = this.directFile(t.file);
      const start = f.direct ? alignDown(t.offset) : t.offset;
      const delta = t.offset - start;
      return {
        f,
        start,
        delta,
        span: f.direct ? alignUp(delta + t.bytes) : t.bytes,
        left: 0,
        buf: undefined as NativeBuffer | undefined,
      };
    });
    let ti = 0, at = 0;
    let failure: unknown;
    const next = (): { i: number; at: number } | undefined => {
      while (ti < list.length && at >= spans[ti].span) {
        ti++;
        at = 0;
      }
      if (ti >= list.length) return undefined;
      const s = spans[ti];
      if (at === 0) {
        s.buf = NativeBuffer.alloc(k, Math.max(s.span, 1), list[ti].name);
        s.left = Math.ceil(s.span / READ_PIECE);
        if (s.left === 0) {
          s.left = 1; // a zero-size tensor: one empty "piece" completes it
        }
      }
      const job = { i: ti, at };
      at += READ_PIECE;
      return job;
    };
    const worker = async () => {
      for (let job = next(); job && failure === undefined; job = next()) {
        const t = list[job.i], s = spans[job.i];
        const want = Math.min(READ_PIECE, s.span - job.at);
        // The bytes of this piece that belong to the tensor (a direct span may run past EOF).
        const needed = Math.min(want, s.delta + t.bytes - job.at);
        try {
          const n = want > 0 ? await s.f.pread(s.buf!.at(job.at), want, s.start + job.at) : 0;
          if (n < needed) {
            throw new K3Error(
              `${t.file}: short read of tensor ${t.name}: the file ends at byte ${s.start + job.at + n}`,
            );
          }
        } catch (e) {
          failure ??= e;
          return;
        }
        if (--s.left === 0) {
          const buf = s.buf!;
          s.buf = undefined;
          try {
            onTensor(job.i, { buf, delta: s.delta });
          } catch (e) {
            failure ??= e;
          }
        }
      }
    };
    await Promise.all(Array.from({ length: READ_DEPTH }, worker));
    if (failure !== undefined) {
      for (const s of spans) s.buf?.free();
      throw failure;
    }
  }

  /** Shard `file` opened (once) for O_DIRECT reads, buffered where the filesystem refuses. */
  private directFile(file: string): IoFile {
    let f = this.direct.get(file);
    if (!f) {
      f = IoFile.open(file, { direct: true });
      this.direct.set(file, f);
    }
    return f;
  }

  /** Closes the shards. */
  close(): void {
    for (const f of this.handles.values()) f.close();
    this.handles.clear();
    for (const f of this.direct.values()) f.close();
    this.direct.clear();
  }
}
