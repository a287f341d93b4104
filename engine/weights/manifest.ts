/**
 * The packed trunk's format: layout and manifest.
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
 *   model's config: the shape), `sample` (k3h64 over the raw checkpoint bytes of the final
 *   vectors and every layer's input_layernorm: the weights, so a trunk of a same-shaped
 *   but different model is refused too), `layers` count, `hidden`, `vocab`, `source` {dir, shards [{name,
 *   bytes}]}, `data` {file, bytes, align}, `checksum` "k3h64" (kernels/k3io.h), and the
 *   regions `layer[]`, `finals`, `embed`, `head`, each {offset, size (padded), bytes
 *   (unpadded), hash (k3h64 of all `size` bytes), head4k / tail4k (k3h64 of the first and
 *   last 4096 bytes: the cheap check on every streamed read), tensors [{name, dtype
 *   ("BF16" | "F32"), keep, shape, offset (in the region), bytes}]}.
 *
 * @module
 */

import { type K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import type { Kernels } from "../native/ffi.ts";
import { ALIGN, alignUp, hashHex, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import type { Checkpoint, TensorInfo } from "./safetensors.ts";
import {
  checkTensor,
  globalTensors,
  HEAD_NAME,
  type Keep,
  layerTensors,
  PREFIX,
  type TensorSpec,
} from "../model/weights.ts";

export const FORMAT = "k3-trunk";
export const VERSION = 1;
export const DATA_FILE = "trunk.bin";
export const MANIFEST_FILE = "manifest.json";
/** Tensor alignment inside a region. */
export const TENSOR_ALIGN = 64;

/** One tensor of a region. */
export interface TensorEntry {
  /** Name without the `language_model.model.` prefix (the head: its full name). */
  name: string;
  /** Bound dtype. */
  dtype: "BF16" | "F32";
  keep: Keep;
  /** The checkpoint's shape. */
  shape: number[];
  /** Byte offset inside the region. */
  offset: number;
  bytes: number;
}

/** One aligned region of the data file. */
export interface Region {
  offset: number;
  /** Padded to ALIGN. */
  size: number;
  /** Bytes of content before padding. */
  bytes: number;
  hash: string;
  head4k: string;
  tail4k: string;
  tensors: TensorEntry[];
}

export interface TrunkManifest {
  format: typeof FORMAT;
  version: number;
  created: string;
  fingerprint: string;
  sample: string;
  layers: number;
  hidden: number;
  vocab: number;
  source: { dir: string; shards: { name: string; bytes: number }[] };
  data: { file: string; bytes: number; align: number };
  checksum: "k3h64";
  layer: Region[];
  finals: Region;
  embed: Region;
  head: Region;
}

/** A tensor to pack: where it comes from and where it goes. */
export interface PackTensor {
  src: TensorInfo;
  spec: TensorSpec;
  entry: TensorEntry;
}

/** A region to pack (hashes filled in while writing). */
export interface PackRegion {
  what: string;
  region: Region;
  tensors: PackTensor[];
}

/** Bound dtype and bytes of a checkpoint tensor kept as `keep`. */
export function boundOf(
  src: { dtype: string; bytes: number },
  keep: Keep,
): { dtype: "BF16" | "F32"; bytes: number } {
  const elems = src.bytes / (src.dtype === "F32" ? 4 : 2);
  if (keep === "matrix" && src.dtype === "BF16") return { dtype: "BF16", bytes: src.bytes };
  return { dtype: "F32", bytes: elems * 4 };
}

function region(
  what: string,
  specs: TensorSpec[],
  ckpt: Checkpoint,
  prefix: (s: TensorSpec) => string,
): PackRegion {
  let at = 0;
  const tensors: PackTensor[] = specs.map((spec) => {
    const src = ckpt.get(prefix(spec) + spec.name);
    checkTensor(src, spec);
    const b = boundOf(src, spec.keep);
    at = Math.ceil(at / TENSOR_ALIGN) * TENSOR_ALIGN;
    const entry: TensorEntry = {
      name: spec.name,
      dtype: b.dtype,
      keep: spec.keep,
      shape: src.shape,
      offset: at,
      bytes: b.bytes,
    };
    at += b.bytes;
    return { src, spec, entry };
  });
  const size = Math.max(ALIGN, alignUp(at));
  return {
    what,
    region: {
      offset: 0,
      size,
      bytes: at,
      hash: "",
      head4k: "",
      tail4k: "",
      tensors: tensors.map((t) => t.entry),
    },
    tensors,
  };
}

/** The layout of a trunk for this checkpoint: every region with its tensors and offset. */
export function planLayout(
  cfg: K3Config,
  ckpt: Checkpoint,
): {
  layers: PackRegion[];
  finals: PackRegion;
  embed: PackRegion;
  head: PackRegion;
  bytes: number;
} {
  const D = cfg.hiddenSize, V = cfg.vocabSize;
  const layers = Array.from(
    { length: cfg.numLayers },
    (_, L) => region(`layer ${L}`, layerTensors(cfg, L), ckpt, () => PREFIX),
  );
  const finals = region("finals", globalTensors(cfg), ckpt, () => PREFIX);
  const embed = region(
    "embed",
    [{ name: "embed_tokens.weight", shape: [V, D], keep: "matrix" }],
    ckpt,
    () => PREFIX,
  );
  const head = region("head", [{ name: HEAD_NAME, shape: [V, D], keep: "matrix" }], ckpt, () => "");
  let off = 0;
  for (const r of [...layers, finals, embed, head]) {
    r.region.offset = off;
    off += r.region.size;
  }
  return { layers, finals, embed, head, bytes: off };
}

const HEX16 = /^[0-9a-f]{16}$/;

/** Parses and structurally validates a manifest (K3Error exit 1 naming the problem). */
export function parseManifest(text: string, path: string): TrunkManifest {
  const bad = (why: string): never => {
    throw new K3Error(`${path}: not a usable k3 trunk manifest: ${why}`);
  };
  let m: TrunkManifest;
  try {
    m = JSON.parse(text);
  } catch (e) {
    return bad(`invalid JSON (${(e as Error).message})`);
  }
  if (typeof m !== "object" || m === null) bad("not an object");
  if (m.format !== FORMAT) {
    bad(`format ${JSON.stringify(m.format)}, expected ${JSON.stringify(FORMAT)}`);
  }
  if (m.version !== VERSION) {
    bad(`version ${JSON.stringify(m.version)}, this k3 reads version ${VERSION} (re-pack it)`);
  }
  if (typeof m.fingerprint !== "string") bad("no fingerprint");
  if (typeof m.sample !== "string" || !HEX16.test(m.sample)) bad("no weight sample hash");
  if (!Array.isArray(m.layer) || m.layer.length !== m.layers) {
    bad("layer table does not match the layer count");
  }
  if (!m.data || typeof m.data.bytes !== "number" || m.data.align !== ALIGN) {
    bad("bad data section");
  }
  const regions: [string, Region][] = [
    ...m.layer.map((r, i) => [`layer ${i}`, r] as [string, Region]),
    ["finals", m.finals],
    ["embed", m.embed],
    ["head", m.head],
  ];
  for (const [what, r] of regions) {
    const ok = r && Number.isSafeInteger(r.offset) && Number.isSafeInteger(r.size) &&
      r.offset % ALIGN === 0 && r.size % ALIGN === 0 &&
      r.size > 0 && r.offset + r.size <= m.data.bytes && HEX16.test(r.hash) &&
      HEX16.test(r.head4k) && HEX16.test(r.tail4k) &&
      Array.isArray(r.tensors) && r.tensors.every((t) =>
        typeof t.name === "string" && (t.dtype === "BF16" || t.dtype === "F32") &&
        Number.isSafeInteger(t.offset) && Number.isSafeInteger(t.bytes) &&
        t.offset + t.bytes <= r.size && Array.isArray(t.shape)
      );
    if (!ok) {
      bad(`${what}: bad region entry`);
    }
  }
  return m;
}

/** Reads `<dir>/manifest.json`. */
export async function readManifest(dir: string): Promise<TrunkManifest> {
  const path = `${dir}/${MANIFEST_FILE}`;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new K3Error(
      `${dir}: not a packed trunk (cannot read ${MANIFEST_FILE}: ${(e as Error).message}); make one with k3 pack`,
    );
  }
  return parseManifest(text, path);
}

/**
 * k3h64 over the raw checkpoint bytes of a few small tensors that identify the weights
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
