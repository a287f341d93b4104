/**
 * `k3 pack`: writes the packed trunk (format in manifest.ts).
 *
 * Memory is bounded by two staging buffers and one conversion buffer (STAGE bytes each,
 * 64 MB by default) whatever the layer size: each tensor is streamed from its shard in
 * pieces, widened where its bound form needs it, and the staging buffer is hashed (the
 * pieces' k3w64, each tensor's check) and written (O_DIRECT when the filesystem allows)
 * while the next one fills. Tensors are read
 * one by one, so a layer whose tensors are scattered over shards packs the same.
 *
 * The data goes to `trunk.bin.partial` and the manifest to `manifest.json.partial`; the
 * data is synced and renamed first, the manifest last, so an interrupted pack never leaves
 * a trunk that looks valid. An existing trunk built from a different model is not replaced
 * without `force`; one built from the same source is left as it is.
 *
 * @module
 */

import { statfsSync } from "node:fs";
import { configFingerprint, type K3Config, loadConfig } from "../engine/model/config.ts";
import { EXIT, K3Error } from "../engine/errors.ts";
import { isRegularFile, specialKind, writeFailure, writeFileDurable } from "../engine/native/files.ts";
import { type Kernels, kernels } from "../engine/native/ffi.ts";
import { ALIGN, CHECKSUM, Hasher, hashHex, IoFile } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";
import { checkAccounted } from "../engine/weights/bind.ts";
import { RegionChecker } from "../engine/native/tensors.ts";
import {
  DATA_FILE,
  FORMAT,
  MANIFEST_FILE,
  readManifest,
  type TrunkCodec,
  type TrunkManifest,
  VERSION,
  weightSample,
} from "../engine/weights/manifest.ts";
import { type PackRegion, PIECE_BYTES, planLayout } from "../engine/weights/trunk_geometry.ts";
import { codecVerdict, measureDecodeRate } from "../engine/weights/codec.ts";
import { measureDiskRate } from "../engine/weights/rate_probe.ts";
import { libraryPath } from "../engine/native/ffi.ts";
import { SPLIT_BLOCK, splitEncode } from "../engine/native/io.ts";

/** Beside `trunk.bin.partial`, what `k3 pull --pack` has packed into it so far (pack/incremental.ts). */
export const PARTIAL_RECORD = `${DATA_FILE}.partial.json`;

/** Options of packTrunk. */
export interface PackOptions {
  /** Replace an existing trunk packed from something else. */
  force?: boolean;
  /** Staging buffer bytes (multiple of 4096). */
  stageBytes?: number;
  /** Bytes per hashed piece (multiple of 4096; default PIECE_BYTES). */
  pieceBytes?: number;
  /** Progress line sink (stderr by default); null silences it. */
  log?: ((line: string) => void) | null;
  /** How to store the layer pieces: "raw" (the default here, so a packed layout does not
   * depend on the machine); "split" (each piece split-coded where that stores fewer bytes);
   * "auto" (`k3 pack`'s default: split when a streamed trunk byte is predicted faster coded
   * on this machine, engine/weights/codec.ts codecVerdict, else raw). */
  codec?: TrunkCodec | "auto";
}

/** What packTrunk wrote. */
export interface PackResult {
  /** The manifest written. */
  manifest: TrunkManifest;
  /** Seconds taken. */
  seconds: number;
  /** Bytes written. */
  bytes: number;
  /** True when an identical trunk was already there and nothing was written. */
  upToDate: boolean;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Packs the trunk of `modelDir` into `trunkDir`. A trunk directory this call created is
 * removed again when the pack fails (left empty, it would look like a trunk to come).
 */
export async function packTrunk(
  modelDir: string,
  trunkDir: string,
  opts: PackOptions = {},
): Promise<PackResult> {
  const existed = await exists(trunkDir);
  try {
    return await packInto(modelDir, trunkDir, opts);
  } catch (e) {
    if (!existed) await Deno.remove(trunkDir).catch(() => {}); // only when empty
    throw e;
  }
}

/** Free bytes on the filesystem of `dir`, or undefined when it cannot be read. */
function freeBytes(dir: string): number | undefined {
  try {
    const s = statfsSync(dir);
    return Number(s.bavail) * Number(s.bsize);
  } catch {
    return undefined;
  }
}

async function packInto(
  modelDir: string,
  trunkDir: string,
  opts: PackOptions,
): Promise<PackResult> {
  const log = opts.log === undefined ? (s: string) => console.error(s) : opts.log ?? (() => {});
  const stage = opts.stageBytes ?? 64 * 1024 * 1024;
  if (stage % ALIGN !== 0 || stage < ALIGN) {
    throw new Error("stageBytes must be a positive multiple of 4096");
  }
  const piece = opts.pieceBytes ?? PIECE_BYTES;
  if (piece % ALIGN !== 0 || piece < ALIGN) {
    throw new Error("pieceBytes must be a positive multiple of 4096");
  }
  const cfg = await loadConfig(modelDir);
  const fingerprint = await configFingerprint(cfg);
  const ckpt = await Checkpoint.open(modelDir);
  try {
    const shards = await Promise.all(
      ckpt.shards.map(async (f) => ({
        name: f.slice(f.lastIndexOf("/") + 1),
        bytes: (await Deno.stat(f)).size,
      })),
    );
    checkAccounted(cfg, ckpt);
    const layout = planLayout(cfg, ckpt);

    // An existing trunk: identical source -> nothing to do; different -> only with --force.
    await prepareTrunkDir(trunkDir);
    const manifestPath = `${trunkDir}/${MANIFEST_FILE}`, dataPath = `${trunkDir}/${DATA_FILE}`;
    if (await exists(manifestPath) || await exists(dataPath)) {
      let old: TrunkManifest | undefined;
      try {
        old = await readManifest(trunkDir);
      } catch {
        old = undefined;
      }
      const same = old !== undefined && old.fingerprint === fingerprint &&
        old.sample === await weightSample(kernels(), cfg, ckpt) &&
        JSON.stringify(old.source.shards) === JSON.stringify(shards) &&
        (opts.codec === "auto" || (opts.codec ?? "raw") === old.codec) &&
        (await Deno.stat(dataPath).then((s) => s.size, () => -1)) === old.data.bytes;
      if (same && !opts.force) {
        log(
          `pack: ${trunkDir} already holds the trunk of this model (${
            (layout.bytes / 1e9).toFixed(3)
          } GB); nothing to do (--force re-packs)`,
        );
        return { manifest: old!, seconds: 0, bytes: 0, upToDate: true };
      }
      if (!same && !opts.force) {
        throw new K3Error(
          `pack: ${trunkDir} already holds ${
            old ? "a trunk of a different model or source" : "trunk files that are not a complete trunk"
          }; pass --force to replace it`,
        );
      }
    }

    // A full disk is found now, not hours in (the raw size bounds a coded trunk's).
    const free = freeBytes(trunkDir);
    if (free !== undefined && free < layout.bytes) {
      throw new K3Error(
        `pack: the trunk needs ${(layout.bytes / 1e9).toFixed(3)} GB in ${trunkDir}, its disk has ${
          (free / 1e9).toFixed(3)
        } GB free; free space or choose another directory (nothing was written)`,
      );
    }
    const k = kernels();
    const codec = opts.codec === "auto" ? await chooseCodec(k, ckpt.shards[0], log) : opts.codec ?? "raw";
    const t0 = performance.now();
    const partial = `${dataPath}.partial`;
    const out = IoFile.open(partial, { write: true, direct: true });
    let written = 0;
    let lastLog = t0;
    const progress = (force = false) => {
      const now = performance.now();
      if (!force && now - lastLog < 1000) return;
      lastLog = now;
      const s = (now - t0) / 1000, rate = written / Math.max(s, 1e-9);
      log(
        `pack: ${(written / 1e9).toFixed(2)} / ${(layout.bytes / 1e9).toFixed(2)} GB (${
          ((100 * written) / layout.bytes).toFixed(0)
        }%), ${(rate / 1e6).toFixed(0)} MB/s, ETA ${((layout.bytes - written) / Math.max(rate, 1)).toFixed(0)} s`,
      );
    };
    const packer = new RegionPacker(k, {
      stage,
      piece,
      codec,
      directReads: true,
      out: { write: (buf, len, off) => out.pwrite(buf.ptr, len, off) },
      onWritten: (n) => {
        written += n;
        progress();
      },
    });
    let storedTotal = 0;
    try {
      for (const r of regionsInOrder(layout)) {
        storedTotal += await packer.pack(r, storedTotal, layout.layers.includes(r));
      }
      await packer.drain();
      await out.sync();
    } catch (e) {
      await packer.drain().catch(() => {});
      out.close();
      await Deno.remove(partial).catch(() => {});
      if (/no space left|quota/i.test((e as Error)?.message ?? "")) {
        throw new K3Error(
          `pack: cannot write ${partial}: no space left on the device (the trunk needs ${layout.bytes} bytes in ${trunkDir}); nothing was replaced`,
        );
      }
      throw e;
    } finally {
      packer.free();
    }
    out.close();
    progress(true);

    const manifest = trunkManifest({
      cfg,
      fingerprint,
      sample: await weightSample(k, cfg, ckpt),
      source: { dir: modelDir, shards },
      layout,
      bytes: storedTotal,
      piece,
      codec,
    });
    await commitTrunk(trunkDir, manifest);
    const seconds = (performance.now() - t0) / 1000;
    log(packedLine(trunkDir, manifest, layout.bytes, seconds));
    return { manifest, seconds, bytes: storedTotal, upToDate: false };
  } finally {
    ckpt.close();
  }
}

/** The regions of a layout in the order the data file holds them. */
export function regionsInOrder(layout: ReturnType<typeof planLayout>): PackRegion[] {
  return [...layout.layers, layout.finals, layout.embed, layout.head];
}

/** Checks `trunkDir` can be a trunk directory and creates it (one line when it cannot). */
export async function prepareTrunkDir(trunkDir: string): Promise<void> {
  const special = specialKind(trunkDir);
  if (special) throw new K3Error(`pack: ${trunkDir} is ${special}; the trunk needs a directory`, EXIT.usage);
  if (isRegularFile(trunkDir)) {
    throw new K3Error(`pack: ${trunkDir} is a file; the trunk needs a directory`, EXIT.usage);
  }
  try {
    await Deno.mkdir(trunkDir, { recursive: true });
  } catch (e) {
    throw new K3Error(`pack: cannot create ${trunkDir}: ${(e as Error).message}`, EXIT.usage);
  }
}

/** What a trunk's manifest is made of, once its regions are packed. */
export interface ManifestParts {
  /** The model's config. */
  cfg: K3Config;
  /** Its fingerprint (configFingerprint). */
  fingerprint: string;
  /** The weight sample of the source (weightSample). */
  sample: string;
  /** The checkpoint it was packed from. */
  source: TrunkManifest["source"];
  /** The layout, its regions packed (hashes, pieces, stored sizes filled in). */
  layout: ReturnType<typeof planLayout>;
  /** Bytes of the data file. */
  bytes: number;
  /** Bytes per hashed piece. */
  piece: number;
  /** How the layers' pieces are stored. */
  codec: TrunkCodec;
}

/** The manifest of a packed trunk. */
export function trunkManifest(p: ManifestParts): TrunkManifest {
  return {
    format: FORMAT,
    version: VERSION,
    created: new Date().toISOString(),
    fingerprint: p.fingerprint,
    sample: p.sample,
    layers: p.cfg.numLayers,
    hidden: p.cfg.hiddenSize,
    vocab: p.cfg.vocabSize,
    source: p.source,
    data: { file: DATA_FILE, bytes: p.bytes, align: ALIGN },
    checksum: CHECKSUM,
    piece: p.piece,
    codec: p.codec,
    layer: p.layout.layers.map((r) => r.region),
    finals: p.layout.finals.region,
    embed: p.layout.embed.region,
    head: p.layout.head.region,
  };
}

/**
 * Puts a trunk whose data is complete (and synced) in `trunk.bin.partial` in place. The new
 * manifest is written (and synced) under its temporary name before anything valid is
 * replaced: a full disk here leaves the old trunk as it was. Then the old manifest out, the
 * data in, the new manifest in: never a manifest pointing at data it does not describe.
 */
export async function commitTrunk(trunkDir: string, manifest: TrunkManifest): Promise<void> {
  const manifestPath = `${trunkDir}/${MANIFEST_FILE}`, dataPath = `${trunkDir}/${DATA_FILE}`;
  const partial = `${dataPath}.partial`, mpartial = `${manifestPath}.partial`;
  const mbytes = new TextEncoder().encode(JSON.stringify(manifest, null, 1) + "\n");
  try {
    await Deno.remove(mpartial).catch(() => {});
    writeFileDurable(mpartial, mbytes);
  } catch (e) {
    await Deno.remove(mpartial).catch(() => {});
    await Deno.remove(partial).catch(() => {});
    throw writeFailure(mpartial, mbytes.length, e);
  }
  await Deno.remove(manifestPath).catch(() => {});
  await Deno.rename(partial, dataPath);
  await Deno.rename(mpartial, manifestPath);
  // What an interrupted `k3 pull --pack` recorded of its partial data is void now.
  await Deno.remove(`${trunkDir}/${PARTIAL_RECORD}`).catch(() => {});
}

/** The closing line of a pack: what was written, how fast, and what the codec saved. */
export function packedLine(trunkDir: string, m: TrunkManifest, rawBytes: number, seconds: number): string {
  const layerBytes = m.layer.reduce((a, r) => a + r.size, 0);
  const layerStored = m.layer.reduce((a, r) => a + r.stored.reduce((x, y) => x + y, 0), 0);
  return `pack: wrote ${trunkDir}: ${m.layers} layers + embedding, head and final vectors, ${
    (m.data.bytes / 1e9).toFixed(3)
  } GB in ${seconds.toFixed(1)} s${seconds > 0 ? ` (${(rawBytes / 1e6 / seconds).toFixed(0)} MB/s)` : ""}` +
    (m.codec === "split"
      ? `; layers split-coded: ${(layerStored / 1e9).toFixed(3)} GB stored for ${(layerBytes / 1e9).toFixed(3)} GB (${
        (layerStored / layerBytes).toFixed(3)
      })`
      : "");
}

/** Where a RegionPacker writes: `len` bytes of `buf` at `offset` of the data file. */
export interface RegionOutput {
  /** Writes them all, or rejects. */
  write(buf: NativeBuffer, len: number, offset: number): Promise<void>;
}

/** Options of a RegionPacker. */
export interface RegionPackerOptions {
  /** Staging buffer bytes (multiple of 4096). */
  stage: number;
  /** Bytes per hashed piece. */
  piece: number;
  /** How layer pieces are stored. */
  codec: TrunkCodec;
  /** Read the shards with O_DIRECT (k3 pack: the page cache is not polluted) or through
   * the page cache (pull --pack: a shard just written is still there). */
  directReads: boolean;
  /** The data file. */
  out: RegionOutput;
  /** `n` more bytes were written. */
  onWritten: (n: number) => void;
}

/**
 * Packs regions one at a time in bounded memory: two staging buffers, one conversion
 * buffer, and for split coding a piece and two coded-piece buffers. One region's last
 * write may still be in flight when `pack` returns (the next region fills the other
 * buffer meanwhile); `drain` waits for it.
 */
export class RegionPacker {
  readonly #k: Kernels;
  readonly #o: RegionPackerOptions;
  readonly #bufs: NativeBuffer[];
  readonly #conv: NativeBuffer;
  readonly #coding?: { piece: NativeBuffer; out: NativeBuffer[]; next: number };
  readonly #inputs = new Map<string, IoFile>();
  readonly #reader: RangeReader;
  readonly #sink: { next: number; write: (buf: NativeBuffer, len: number, off: number) => Promise<void> };
  #pending: Promise<void> | undefined;

  /** Allocates the buffers (free them with `free`). */
  constructor(k: Kernels, o: RegionPackerOptions) {
    this.#k = k;
    this.#o = o;
    this.#bufs = [NativeBuffer.alloc(k, o.stage, "pack staging"), NativeBuffer.alloc(k, o.stage, "pack staging")];
    this.#conv = NativeBuffer.alloc(k, o.stage, "pack conversion");
    // A coded region's pieces are put together whole, then coded (or copied, when raw is
    // smaller) into one of two output buffers while the other's write may be in flight.
    this.#coding = o.codec === "split"
      ? {
        piece: NativeBuffer.alloc(k, o.piece, "pack piece"),
        out: [NativeBuffer.alloc(k, o.piece, "pack coded piece"), NativeBuffer.alloc(k, o.piece, "pack coded piece")],
        next: 0,
      }
      : undefined;
    this.#reader = new RangeReader(k);
    this.#sink = {
      next: 0,
      write: async (buf, len, off) => {
        if (this.#pending) await this.#pending;
        const p = o.out.write(buf, len, off).then(() => o.onWritten(len));
        // Awaited by the next write or by drain; a failure (a full disk) must not be an
        // unhandled rejection in between, which would kill the process with a stack trace.
        p.catch(() => {});
        this.#pending = p;
      },
    };
  }

  /**
   * Packs region `r` at `offset` of the data file (`coded`: its pieces split-coded when the
   * codec is split); fills in its offset, hashes and stored sizes; returns the bytes it takes.
   */
  async pack(r: PackRegion, offset: number, coded: boolean): Promise<number> {
    Object.assign(r.region, { offset, hash: "", pieces: [], stored: [], storedPieces: [] });
    const input = (f: string, direct: boolean) => {
      const key = `${direct ? "d" : "b"}:${f}`;
      let h = this.#inputs.get(key);
      if (!h) this.#inputs.set(key, h = IoFile.open(f, { direct }));
      return h;
    };
    await packRegion(this.#k, r, this.#bufs, this.#conv, {
      input,
      direct: this.#o.directReads,
      reader: this.#reader,
      sink: this.#sink,
      piece: this.#o.piece,
      coder: coded ? this.#coding : undefined,
    });
    return r.region.stored.reduce((a, b) => a + b, 0);
  }

  /** Waits for the write in flight (rejects when it failed). */
  async drain(): Promise<void> {
    const p = this.#pending;
    this.#pending = undefined;
    if (p) await p;
  }

  /** Closes the shards and frees the buffers. */
  free(): void {
    for (const f of this.#inputs.values()) f.close();
    this.#inputs.clear();
    this.#bufs.forEach((b) => b.free());
    this.#conv.free();
    this.#reader.free();
    this.#coding?.piece.free();
    this.#coding?.out.forEach((b) => b.free());
  }
}

/**
 * Streams one region through the staging buffers: each tensor's bytes (widened if its
 * bound form needs it) at its offset, zero padding between and after, the hash updated
 * and the buffer handed to `write` whenever it fills.
 */
async function packRegion(
  k: Kernels,
  r: PackRegion,
  bufs: NativeBuffer[],
  conv: NativeBuffer,
  src: {
    input: (f: string, direct: boolean) => IoFile;
    direct: boolean;
    reader: RangeReader;
    sink: { next: number; write: (buf: NativeBuffer, len: number, off: number) => Promise<void> };
    piece: number;
    coder?: { piece: NativeBuffer; out: NativeBuffer[]; next: number };
  },
): Promise<void> {
  const { input, reader, sink, piece, coder } = src;
  const stage = bufs[0].bytes;
  const hasher = new Hasher();
  const checker = new RegionChecker(k, r.region.tensors);
  // Start in the buffer the previous region did not end in (its write may be in flight).
  let cur = sink.next, pos = 0, regionPos = 0, fileOff = r.region.offset;
  // The hash of the current piece, fed the staged bytes split at piece boundaries.
  let pieceHasher = new Hasher(), pieceFill = 0;
  // A whole piece of a coded region: coded (or copied when raw is smaller) and written.
  const writeCoded = async (len: number) => {
    const out = coder!.out[coder!.next];
    coder!.next ^= 1;
    let stored = len % (2 * SPLIT_BLOCK) === 0 ? splitEncode(coder!.piece.ptr, len, out.ptr, out.bytes) : 0;
    if (stored === 0) {
      out.u8.set(coder!.piece.u8.subarray(0, len));
      stored = len;
    }
    r.region.stored.push(stored);
    r.region.storedPieces.push(stored === len ? r.region.pieces[r.region.pieces.length - 1] : hashHex(out.ptr, stored));
    await sink.write(out, stored, fileOff);
    fileOff += stored;
  };
  const flush = async () => {
    const b = bufs[cur];
    hasher.update(b.ptr, pos);
    checker.update(b, pos);
    for (let at = 0; at < pos;) {
      const n = Math.min(pos - at, piece - pieceFill);
      pieceHasher.update(b.at(at), n);
      if (coder) coder.piece.u8.set(b.u8.subarray(at, at + n), pieceFill);
      at += n;
      pieceFill += n;
      if (pieceFill === piece || regionPos - pos + at === r.region.size) {
        r.region.pieces.push(pieceHasher.hex());
        if (coder) await writeCoded(pieceFill);
        else {
          r.region.stored.push(pieceFill);
          r.region.storedPieces.push(r.region.pieces[r.region.pieces.length - 1]);
        }
        pieceHasher = new Hasher();
        pieceFill = 0;
      }
    }
    if (!coder) {
      await sink.write(b, pos, fileOff);
      fileOff += pos;
    }
    cur ^= 1;
    sink.next = cur;
    pos = 0;
  };
  // Zero-fills region bytes up to `until`.
  const pad = async (until: number) => {
    while (regionPos < until) {
      const n = Math.min(until - regionPos, stage - pos);
      bufs[cur].u8.fill(0, pos, pos + n);
      pos += n;
      regionPos += n;
      if (pos === stage) await flush();
    }
  };
  for (const t of r.tensors) {
    await pad(t.entry.offset);
    const from = t.src;
    const widen = t.entry.bytes !== from.bytes; // BF16/F16 -> F32
    if (!widen) {
      // Stored as is: stream the bytes through the reader (reads ahead) into staging.
      for await (const piece of reader.range(input(from.file, src.direct), from.offset, from.bytes)) {
        let at = 0;
        while (at < piece.length) {
          const n = Math.min(piece.length - at, stage - pos);
          bufs[cur].u8.set(piece.subarray(at, at + n), pos);
          at += n;
          pos += n;
          regionPos += n;
          if (pos === stage) await flush();
        }
      }
      continue;
    }
    // Widened (vectors, F16 matrices): pieces read into `conv`, converted into staging.
    const f = input(from.file, false);
    const inSize = from.dtype === "F32" ? 4 : 2;
    let done = 0; // source bytes consumed
    while (done < from.bytes) {
      const space = stage - pos;
      const elems = Math.min((from.bytes - done) / inSize, Math.floor(space / 4), Math.floor(conv.bytes / inSize));
      await f.readExact(conv.ptr, elems * inSize, from.offset + done);
      if (from.dtype === "BF16") k.k3_bf16_to_f32(conv.ptr, bufs[cur].at(pos), elems);
      else k.k3_f16_to_f32(conv.ptr, bufs[cur].at(pos), elems);
      pos += elems * 4;
      regionPos += elems * 4;
      done += elems * inSize;
      if (pos === stage) await flush();
    }
  }
  await pad(r.region.size);
  if (pos > 0) await flush();
  r.region.hash = hasher.hex();
  checker.results().forEach((c, i) => r.region.tensors[i].check = c);
}

/**
 * The codec `--codec auto` picks here (engine/weights/codec.ts codecVerdict): split when a
 * streamed trunk byte is predicted faster coded, from this machine's bf16 product rates
 * (plain and from the coded form, all cores) and the sequential read of `sample` (a source
 * shard, on the disk the pack reads). Logs the rates, the prediction and the choice.
 */
export async function chooseCodec(k: Kernels, sample: string, log: (s: string) => void): Promise<TrunkCodec> {
  const dec = await measureDecodeRate(k, libraryPath());
  const disk = await measureDiskRate(k, sample);
  const v = codecVerdict({ disk, plain: dec.plainProduct, split: dec.splitProduct, ratio: dec.ratio });
  const codec = v.pays ? "split" : "raw";
  const gbps = (x: number) => `${(x / 1e9).toFixed(2)} GB/s`;
  log(
    `pack: codec auto: decode ${gbps(dec.bytesPerSecond)} on ${dec.threads} threads, disk ${
      Number.isFinite(disk) ? gbps(disk) : "not measurable (a tiny file)"
    }, bf16 product ${gbps(dec.plainProduct)} plain and ${
      gbps(dec.splitProduct)
    } from the coded form: a streamed trunk byte predicted ${v.predicted.toFixed(2)}x coded: ${codec}`,
  );
  return codec;
}

/**
 * Streams a byte range of a file as pieces, in order, with `depth` aligned reads of
 * `chunk` bytes in flight ahead of the consumer (O_DIRECT when the file has it). A piece
 * is valid until the consumer asks for the next one.
 */
export class RangeReader {
  private readonly bufs: NativeBuffer[];

  /** A reader of `chunk`-byte pieces with `depth` reads in flight. */
  constructor(k: Kernels, readonly chunk = 16 << 20, readonly depth = 4) {
    this.bufs = Array.from({ length: depth }, () => NativeBuffer.alloc(k, chunk + 2 * ALIGN, "pack read-ahead"));
  }

  /** The bytes of `f` from `offset`, `len` of them, in pieces. */
  async *range(f: IoFile, offset: number, len: number): AsyncGenerator<Uint8Array> {
    const start = f.direct ? Math.floor(offset / ALIGN) * ALIGN : offset;
    const end = offset + len;
    const nchunks = Math.ceil((end - start) / this.chunk);
    const inflight: (Promise<number> | undefined)[] = new Array(this.depth);
    const issue = (i: number) => {
      const cs = start + i * this.chunk;
      const want = Math.min(this.chunk, end - cs);
      const len = f.direct ? Math.ceil(want / ALIGN) * ALIGN : want;
      inflight[i % this.depth] = f.pread(this.bufs[i % this.depth].ptr, len, cs);
    };
    try {
      for (let i = 0; i < Math.min(this.depth, nchunks); i++) issue(i);
      for (let i = 0; i < nchunks; i++) {
        const n = await inflight[i % this.depth]!;
        inflight[i % this.depth] = undefined;
        const cs = start + i * this.chunk;
        const from = Math.max(cs, offset) - cs;
        const to = Math.min(cs + this.chunk, end) - cs;
        if (n < to) throw new K3Error(`${f.path}: short read at byte ${cs + n} (the file ends before the tensor does)`);
        yield this.bufs[i % this.depth].u8.subarray(from, to);
        if (i + this.depth < nchunks) issue(i + this.depth);
      }
    } finally {
      await Promise.allSettled(inflight.filter((p) => p !== undefined));
    }
  }

  /** Frees the staging buffers. */
  free(): void {
    this.bufs.forEach((b) => b.free());
  }
}
