/**
 * The packed trunk's format: its files and manifest. Where every region, tensor and piece
 * lies (the layout the manifest records) is trunk_geometry.ts.
 *
 * A trunk directory holds two files:
 *
 * - `trunk.bin`: every decoder layer's dense tensors (everything but the routed experts;
 *   the shared experts are in), one REGION per layer, then the final vectors, the embedding
 *   and the lm_head, each its own region. Regions start at 4096-aligned offsets and their
 *   sizes are padded to 4096 with zeros, so one aligned (O_DIRECT) read fetches a layer,
 *   and ultra can read embedding rows and lm_head chunks straight from their regions.
 *   Tensors are stored in their BOUND form, the form the kernels use: BF16 and F32
 *   matrices as stored, F16 matrices widened to F32, every vector widened to F32. A streamed
 *   layer is therefore usable the moment its read completes, with no conversion and no
 *   second buffer. Inside a region, tensors follow `layerTensors` order at 64-byte-aligned
 *   offsets.
 * - `manifest.json` (written last, so a trunk without it is never used):
 *   `format` "k3-trunk", `version` 1, `created`, `fingerprint` (configFingerprint of the
 *   model's config: the shape), `sample` (k3w64 over the raw checkpoint bytes of the final
 *   vectors and every layer's input_layernorm: the weights, so a trunk of a same-shaped
 *   but different model is refused too), `layers` count, `hidden`, `vocab`, `source` {dir, shards [{name,
 *   bytes}]}, `data` {file, bytes, align}, `checksum` "k3w64" (kernels/k3io.h), and the
 *   regions `layer[]`, `finals`, `embed`, `head`, each {offset, size (padded), bytes
 *   (unpadded), hash (k3w64 of all `size` bytes), pieces (k3w64 of each `piece`-byte piece
 *   of the region, the last one shorter: checked on the reads that bring a region in to be
 *   pinned, and on ultra's embedding and lm_head reads), tensors [{name, dtype ("BF16" |
 *   "F32"), keep, shape, offset (in the region), bytes, check (the tensor's matrix check,
 *   native/tensors.ts: verified by the product that uses a streamed matrix, and for a streamed
 *   layer's vectors when it is handed out)}], stored [per piece: the bytes it takes in the
 *   data file, a multiple of 4096; its length means raw, fewer split-coded (kernels/k3io.h)],
 *   storedPieces [per piece: k3w64 of its stored bytes, equal to `pieces` for a raw one]},
 *   `piece` (bytes per hashed piece, a multiple of 4096), and `codec` ("raw": every piece
 *   raw; "split": layer pieces may be coded).
 *
 * A region's `offset` is where its stored pieces start in the data file; they follow each
 * other, so piece i is at `offset` + the stored bytes of the pieces before it, and the
 * regions are back to back by their stored sizes. Only layer regions are ever coded: the
 * final vectors, embedding and lm_head are read by rows and chunks (head_stream.ts).
 *
 * Version 2 added the per-piece hashes, version 3 changed the checksum from k3h64 to the
 * faster k3w64, version 4 added the tensor checks, version 5 the stored pieces and the
 * codec. A version-4 trunk is read as a version-5 one with every piece raw; an older one is
 * refused with the advice to re-pack. Nothing in a manifest is trusted: `checkLayout` recomputes the whole layout
 * (region offsets and sizes, every tensor's offset, bytes, dtype and shape) and refuses any
 * difference, before any byte of the data file is bound to a kernel.
 *
 * @module
 */

import { type K3Config } from "../model/config.ts";
import { EXIT, K3Error } from "../errors.ts";
import { hexDigits, JsonFields, problemText } from "../json_fields.ts";
import { directoryProblem } from "../paths.ts";
import type { Kernels } from "../native/ffi.ts";
import { ALIGN, alignUp, CHECKSUM, hashHex, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { notRegular, readInputText } from "../native/files.ts";

/** The largest manifest read (the full model's, with piece hashes: ~0.3 MB). */
const MAX_MANIFEST_BYTES = 256 << 20;
import type { Checkpoint } from "./safetensors.ts";
import { checkRows } from "../native/tensors.ts";
import { globalTensors, PREFIX, type TensorSpec } from "../model/tensors.ts";
import { type Region, regionsOf, storedSize, TENSOR_ALIGN, trunkRegionSpecs } from "./trunk_geometry.ts";

/** The manifest's format name. */
export const FORMAT = "k3-trunk";
/** The manifest's format version. */
export const VERSION = 5;
/** The oldest version read (as VERSION with every piece raw). */
export const OLDEST_READ = 4;
/** How a trunk's pieces are stored: all raw, or layer pieces split-coded where that is smaller. */
export type TrunkCodec = "raw" | "split";
/** File name of the packed data. */
export const DATA_FILE = "trunk.bin";
/** File name of the manifest. */
export const MANIFEST_FILE = "manifest.json";

/** manifest.json of a packed trunk. */
export interface TrunkManifest {
  /** Always FORMAT. */
  format: typeof FORMAT;
  /** Format version (VERSION). */
  version: number;
  /** When it was packed (ISO 8601). */
  created: string;
  /** Fingerprint of the model config. */
  fingerprint: string;
  /** Hash of sample weights of the source. */
  sample: string;
  /** Layers packed. */
  layers: number;
  /** Hidden size. */
  hidden: number;
  /** Vocabulary size. */
  vocab: number;
  /** The checkpoint it was packed from. */
  source: { dir: string; shards: { name: string; bytes: number }[] };
  /** The data file, its size and alignment. */
  data: { file: string; bytes: number; align: number };
  /** The checksum used. */
  checksum: typeof CHECKSUM;
  /** Bytes per hashed piece. */
  piece: number;
  /** How the pieces are stored. */
  codec: TrunkCodec;
  /** One region per layer. */
  layer: Region[];
  /** The final vectors. */
  finals: Region;
  /** The embedding. */
  embed: Region;
  /** The lm_head. */
  head: Region;
}

const HEX16 = hexDigits(16);
/** A tensor name as a manifest may hold one. */
const TENSOR_NAME = { pattern: /^.{1,256}$/s, what: "a name of 1 to 256 characters" };
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
/** The largest number of layers, width or vocabulary a manifest may claim (sanity bounds). */
const MAX_DIM = 1 << 24;
/** The longest row (a vector: all its bytes) a tensor check takes (an i32 for the kernel). */
const MAX_ROW_BYTES = 1 << 30;

/**
 * Parses a manifest and checks its whole structure (K3Error exit 1 naming the problem):
 * every field typed, the regions back to back from offset 0 in file order and exactly
 * covering `data.bytes`, each region's size its content padded to 4096, one piece hash per
 * `piece` bytes, and inside every region the tensors back to back at 64-byte-aligned
 * offsets, each `bytes` equal to its shape times its dtype's size (vectors F32). The
 * layout is thereby fully determined by the tensor shapes and dtypes, which `checkLayout`
 * compares with the model's config.
 */
export function parseManifest(text: string, path: string): TrunkManifest {
  const bad = (why: string): never => {
    throw new K3Error(`${path}: not a usable k3 trunk manifest: ${why}`);
  };
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    return bad(`invalid JSON (${(e as Error).message})`);
  }
  if (!isObj(j)) return bad("not an object");
  // The first problem throws, so every field read below is there and of its type.
  const f = JsonFields.root(j, { absent: "missing", report: (p) => bad(problemText(p)) })!;
  f.oneOf("format", [FORMAT]);
  if (j.version !== VERSION && j.version !== OLDEST_READ) {
    bad(
      `version ${
        JSON.stringify(j.version)
      }, this k3 reads versions ${OLDEST_READ} and ${VERSION} (per-piece ${CHECKSUM} checksums and tensor checks); re-pack it with k3 pack --force`,
    );
  }
  const m = j as unknown as TrunkManifest;
  if (j.version === OLDEST_READ) readAsRaw(m);
  f.oneOf("codec", ["raw", "split"]);
  const int = (v: unknown, min: number, max: number) =>
    Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max;
  f.string("fingerprint", hexDigits(32));
  f.string("sample", hexDigits(16));
  f.oneOf("checksum", [CHECKSUM]);
  for (const k of ["layers", "hidden", "vocab"]) f.int(k, 1, MAX_DIM);
  if (f.int("piece", ALIGN, 1 << 30)! % ALIGN !== 0) {
    bad(`piece ${JSON.stringify(m.piece)} is not a multiple of ${ALIGN}`);
  }
  const data = f.object("data")!;
  data.oneOf("file", [DATA_FILE]);
  data.int("bytes", 0);
  data.oneOf("align", [ALIGN]);
  f.array("layer", { length: m.layers });
  let at = 0;
  for (const [what, r] of regionsOf(m)) {
    const rb = (why: string) => bad(`${what}: ${why}`);
    if (!isObj(r)) return rb("not an object");
    const rf = JsonFields.root(r, { absent: "missing", report: (p) => rb(problemText(p)) })!;
    if (r.offset !== at) rb(`offset ${JSON.stringify(r.offset)}, expected ${at} (regions are back to back)`);
    rf.int("bytes", 1);
    if (r.size !== Math.max(ALIGN, alignUp(r.bytes))) {
      rb(`size ${JSON.stringify(r.size)}, expected its bytes padded to ${ALIGN}`);
    }
    rf.string("hash", HEX16);
    const npieces = Math.ceil(r.size / m.piece);
    const pieces = rf.array("pieces", { length: npieces })!;
    for (let i = 0; i < npieces; i++) pieces.string(i, HEX16);
    if (!Array.isArray(r.stored) || r.stored.length !== npieces || !Array.isArray(r.storedPieces)) {
      rb(`needs ${npieces} stored sizes and hashes`);
    }
    for (let i = 0; i < npieces; i++) {
      const len = Math.min(m.piece, r.size - i * m.piece), st = r.stored[i], h = r.storedPieces[i];
      const coded = m.codec === "split" && what.startsWith("layer ");
      if (!int(st, ALIGN, len) || st % ALIGN !== 0 || (!coded && st !== len)) {
        rb(
          `piece ${i}: stored ${JSON.stringify(st)} bytes, expected ${coded ? "a multiple of 4096 up to" : ""} ${len}`,
        );
      }
      if (typeof h !== "string" || !HEX16.pattern.test(h) || (st === len && h !== r.pieces[i])) {
        rb(`piece ${i}: bad stored hash`);
      }
    }
    if (!Array.isArray(r.tensors) || r.tensors.length === 0) return rb("no tensor table");
    let end = 0;
    for (const [i, t] of r.tensors.entries()) {
      const tb = (why: string) => rb(`tensor ${i}: ${why}`);
      if (!isObj(t)) return tb("not an object");
      const tf = JsonFields.root(t, { absent: "missing", report: (p) => tb(problemText(p)) })!;
      tf.string("name", TENSOR_NAME);
      tf.oneOf("keep", ["matrix", "vector"]);
      if (t.dtype !== "F32" && (t.dtype !== "BF16" || t.keep !== "matrix")) {
        tb(`dtype ${JSON.stringify(t.dtype)} for a ${t.keep}`);
      }
      const shape = tf.array("shape", { maxLength: 4 })!;
      if (shape.length < 1) tb("shape: expected 1 to 4 dimensions, got none");
      for (let d = 0; d < shape.length; d++) shape.int(d, 1, MAX_DIM);
      const want = t.shape.reduce((a, b) => a * b, 1) * (t.dtype === "F32" ? 4 : 2);
      if (t.bytes !== want) {
        tb(`bytes ${JSON.stringify(t.bytes)}, but ${t.dtype} ${JSON.stringify(t.shape)} takes ${want}`);
      }
      if (checkRows(t).rowbytes > MAX_ROW_BYTES) tb(`rows of over ${MAX_ROW_BYTES} bytes`);
      tf.string("check", HEX16);
      const off = Math.ceil(end / TENSOR_ALIGN) * TENSOR_ALIGN;
      if (t.offset !== off) tb(`offset ${JSON.stringify(t.offset)}, expected ${off}`);
      end = off + want;
    }
    if (r.bytes !== end) rb(`bytes ${r.bytes}, but its tensors end at ${end}`);
    at += storedSize(r);
  }
  if (m.data.bytes !== at) bad(`data.bytes ${m.data.bytes}, but the regions end at ${at}`);
  return m;
}

/** A version-4 manifest read as version 5: every piece raw (what version 4 wrote). */
function readAsRaw(m: TrunkManifest): void {
  m.codec = "raw";
  if (!Array.isArray(m.layer) || !Number.isSafeInteger(m.piece) || m.piece <= 0) return; // parseManifest says why
  for (const [, r] of regionsOf(m)) {
    if (!isObj(r) || !Array.isArray(r.pieces) || !Number.isSafeInteger(r.size)) continue; // parseManifest says why
    r.stored = r.pieces.map((_, i) => Math.min(m.piece, r.size - i * m.piece));
    r.storedPieces = [...r.pieces];
  }
}

/**
 * Checks a parsed manifest against the model's config: every region used holds exactly
 * the tensors the config implies (names, order, keep, shapes), with the bound dtype a
 * kernel reads. With parseManifest this pins every byte range the engine binds.
 */
export function checkLayout(m: TrunkManifest, cfg: K3Config, dir: string): void {
  const bad = (why: string): never => {
    throw new K3Error(`${dir}: the trunk manifest does not match the model: ${why}; re-pack it with k3 pack --force`);
  };
  if (m.layers < cfg.numLayers || m.hidden !== cfg.hiddenSize || m.vocab !== cfg.vocabSize) {
    bad(`${m.layers} layers, hidden ${m.hidden}, vocab ${m.vocab}`);
  }
  const specs = trunkRegionSpecs(cfg);
  const want: [string, Region, TensorSpec[]][] = [
    ...specs.layers.map((s, L) => [`layer ${L}`, m.layer[L], s] as [string, Region, TensorSpec[]]),
    ["finals", m.finals, specs.finals],
    ["embed", m.embed, specs.embed],
    ["head", m.head, specs.head],
  ];
  for (const [what, r, specs] of want) {
    if (r.tensors.length !== specs.length) bad(`${what}: ${r.tensors.length} tensors, the model has ${specs.length}`);
    for (const [i, s] of specs.entries()) {
      const t = r.tensors[i];
      const shapeOk = s.atLeast
        ? t.shape.length === 1 && t.shape[0] >= s.shape[0]
        : t.shape.length === s.shape.length && t.shape.every((d, k) => d === s.shape[k]);
      if (t.name !== s.name || t.keep !== s.keep || !shapeOk) {
        bad(
          `${what}: tensor ${i} is ${JSON.stringify(t.name)} ${t.keep} ${JSON.stringify(t.shape)}, expected ${
            JSON.stringify(s.name)
          } ${s.keep} ${s.atLeast ? ">= " : ""}${JSON.stringify(s.shape)}`,
        );
      }
    }
  }
}

/** Reads `<dir>/manifest.json`. */
export async function readManifest(dir: string): Promise<TrunkManifest> {
  const path = `${dir}/${MANIFEST_FILE}`;
  const why = notRegular(path);
  if (why !== undefined) {
    // Trunk data without a manifest is an interrupted pack (damaged: exit 1); anything else is
    // a path of the wrong kind (exit 2: the command line must change).
    let partial: string | undefined;
    try {
      partial = [...Deno.readDirSync(dir)].find((e) => e.name.startsWith(DATA_FILE))?.name;
    } catch { /* not a readable directory: directoryProblem says what it is */ }
    if (partial !== undefined && why === "no such file") {
      throw new K3Error(
        `${dir} is not a packed trunk: ${partial} without ${MANIFEST_FILE} (an interrupted k3 pack?); pack again with k3 pack MODEL_DIR ${dir} --force`,
      );
    }
    const problem = directoryProblem(dir, "a packed trunk", MANIFEST_FILE) ?? `${path}: ${why}`;
    throw new K3Error(`${problem}; make one with k3 pack MODEL_DIR ${dir}`, EXIT.usage);
  }
  const text = readInputText(path, { what: "trunk manifest", maxBytes: MAX_MANIFEST_BYTES });
  return await Promise.resolve(parseManifest(text, path));
}

/**
 * k3w64 over the raw checkpoint bytes of a few small tensors that identify the weights
 * (final vectors, each layer's input_layernorm): cheap to recompute at start-up.
 */
export async function weightSample(
  k: Kernels,
  cfg: K3Config,
  ckpt: Checkpoint,
  layers = cfg.numLayers,
): Promise<string> {
  const names = [
    ...globalTensors(cfg).map((t) => PREFIX + t.name),
    ...Array.from({ length: layers }, (_, L) => `${PREFIX}layers.${L}.input_layernorm.weight`),
  ];
  const infos = names.map((n) => ckpt.get(n));
  const total = infos.reduce((a, t) => a + t.bytes, 0);
  const buf = NativeBuffer.alloc(k, total, "weight sample");
  try {
    let at = 0;
    for (const t of infos) {
      await ckpt.read(t, buf.u8.subarray(at, at + t.bytes));
      at += t.bytes;
    }
    return hashHex(buf.ptr, total);
  } finally {
    buf.free();
  }
}

/** Opens a trunk's data file and checks its length against the manifest. */
export function openTrunkData(dir: string, m: TrunkManifest, direct = true): IoFile {
  let f: IoFile;
  try {
    f = IoFile.open(`${dir}/${DATA_FILE}`, { direct });
  } catch (e) {
    throw new K3Error(`${dir}: trunk data missing: ${(e as Error).message}`);
  }
  const size = f.size();
  if (size !== m.data.bytes) {
    f.close();
    throw new K3Error(
      `${dir}/${DATA_FILE}: ${
        size < m.data.bytes ? "truncated" : "too long"
      }: ${size} bytes, the manifest says ${m.data.bytes}; re-pack it`,
    );
  }
  return f;
}
