/**
 * The expert table: one k3w64 digest per routed expert, kept beside a packed trunk
 * (`<trunk_dir>/experts.json`, made by `k3 pack --hash-experts`), so every expert read
 * from the checkpoint's shards (which carry no checksum) is verified on the I/O thread
 * that read it (expert_cache.ts).
 *
 * An expert's digest is the k3w64 of six little-endian 64-bit words: the k3w64 of each of
 * its tensors in `expertTensors` order (w1 packed, w1 scale, w3 packed, w3 scale, w2
 * packed, w2 scale). Per tensor, so the contiguous read (one pread, its tensors at their
 * offsets) and the per-tensor read give the same digest (kernels/k3io.h k3io_pread_parts).
 *
 * Format (JSON): `format` "k3-experts", `version` 1, `checksum` "k3w64", `created`,
 * `fingerprint` (configFingerprint of the whole model's config) and `sample`
 * (weightSample: the weights) as in the trunk manifest, so a table of another model or of
 * other weights is refused, `layers`, `experts` (per MoE layer), `first` (first MoE
 * layer) and `digests`: one string per layer, "" for a dense layer, else 16 hex digits per
 * expert. Nothing in it is trusted: `parseExpertTable` checks every field and
 * `checkExpertTable` compares it with the model before any digest is used.
 *
 * @module
 */

import type { K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import { notRegular, readInputText, statKind, writeFailure, writeFileDurable } from "../native/files.ts";
import { CHECKSUM, io, IoFile } from "../native/io.ts";
import { type Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import { type ExpertLocation, locateExpert } from "./experts.ts";
import type { Checkpoint } from "./safetensors.ts";

/** The table's file name, inside the trunk directory. */
export const EXPERTS_FILE = "experts.json";
/** Its format name. */
export const TABLE_FORMAT = "k3-experts";
/** Its format version. */
export const TABLE_VERSION = 1;
/** The largest table read (the full model's: 93 x 896 digests, ~1.4 MB). */
const MAX_TABLE_BYTES = 64 << 20;
/** How to make one (for messages). */
export const TABLE_ADVICE = "k3 pack --hash-experts <model_dir> <trunk_dir>";

/** experts.json. */
export interface ExpertTable {
  /** Always TABLE_FORMAT. */
  format: typeof TABLE_FORMAT;
  /** TABLE_VERSION. */
  version: number;
  /** Always CHECKSUM. */
  checksum: typeof CHECKSUM;
  /** When it was made (ISO 8601). */
  created: string;
  /** configFingerprint of the model. */
  fingerprint: string;
  /** weightSample of the model. */
  sample: string;
  /** Decoder layers. */
  layers: number;
  /** Routed experts per MoE layer. */
  experts: number;
  /** First MoE layer (layers before it are dense). */
  first: number;
  /** Per layer: "" (dense) or 16 hex digits per expert. */
  digests: string[];
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const int = (v: unknown, min: number, max: number) =>
  Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max;

/** Parses a table and checks its whole structure (K3Error exit 1 naming the problem). */
export function parseExpertTable(text: string, path: string): ExpertTable {
  const bad = (why: string): never => {
    throw new K3Error(`${path}: not a usable k3 expert table: ${why}; re-make it with ${TABLE_ADVICE}`);
  };
  let j: unknown;
  try {
    j = JSON.parse(text);
  } catch (e) {
    return bad(`invalid JSON (${(e as Error).message})`);
  }
  if (!isObj(j)) return bad("not an object");
  if (j.format !== TABLE_FORMAT) bad(`format ${JSON.stringify(j.format)}, expected ${JSON.stringify(TABLE_FORMAT)}`);
  if (j.version !== TABLE_VERSION) bad(`version ${JSON.stringify(j.version)}, this k3 reads version ${TABLE_VERSION}`);
  if (j.checksum !== CHECKSUM) bad(`checksum ${JSON.stringify(j.checksum)}, expected "${CHECKSUM}"`);
  if (typeof j.fingerprint !== "string" || !/^[0-9a-f]{32}$/.test(j.fingerprint)) bad("no fingerprint");
  if (typeof j.sample !== "string" || !/^[0-9a-f]{16}$/.test(j.sample)) bad("no weight sample hash");
  if (!int(j.layers, 1, 1 << 16) || !int(j.experts, 1, 1 << 16) || !int(j.first, 0, j.layers as number)) {
    bad("layers, experts and first must be integers with 0 <= first <= layers");
  }
  const t = j as unknown as ExpertTable;
  if (!Array.isArray(t.digests) || t.digests.length !== t.layers) bad(`needs ${t.layers} digest strings`);
  const hex = new RegExp(`^[0-9a-f]{${16 * t.experts}}$`);
  for (const [L, d] of t.digests.entries()) {
    if (typeof d !== "string") bad(`layer ${L}: digests not a string`);
    if (L < t.first ? d !== "" : !hex.test(d)) {
      bad(`layer ${L}: ${L < t.first ? "a dense layer has no expert digests" : `needs ${t.experts} digests`}`);
    }
  }
  return t;
}

/** Refuses (exit 1) a table that is not this model's: config fingerprint, weights, sizes. */
export function checkExpertTable(
  t: ExpertTable,
  cfg: K3Config,
  fingerprint: string,
  sample: string,
  path: string,
): void {
  const bad = (why: string): never => {
    throw new K3Error(`${path}: this expert table ${why}; re-make it with ${TABLE_ADVICE}`);
  };
  if (t.fingerprint !== fingerprint) bad(`was made for a different model (fingerprint ${t.fingerprint})`);
  if (t.sample !== sample) bad(`was made from different weights (weight sample ${t.sample})`);
  if (t.layers !== cfg.numLayers || t.experts !== cfg.moe.numExperts || t.first !== cfg.firstKDense) {
    bad(`describes ${t.layers} layers of ${t.experts} experts from layer ${t.first}, not this model`);
  }
}

/** The digest table's digest for expert E of layer L (16 hex digits). */
export function tableDigest(t: ExpertTable, L: number, E: number): string {
  return t.digests[L].slice(16 * E, 16 * E + 16);
}

/** Reads and checks `<trunkDir>/experts.json`; undefined when there is none. */
export function readExpertTable(
  trunkDir: string,
  cfg: K3Config,
  fingerprint: string,
  sample: string,
): ExpertTable | undefined {
  const path = `${trunkDir}/${EXPERTS_FILE}`;
  if (statKind(path) === "missing") return undefined;
  const why = notRegular(path);
  if (why !== undefined) throw new K3Error(`${path}: ${why}`);
  const t = parseExpertTable(readInputText(path, { what: "expert table", maxBytes: MAX_TABLE_BYTES }), path);
  checkExpertTable(t, cfg, fingerprint, sample, path);
  return t;
}

/** Hex of a 64-bit digest. */
export const hex64 = (h: bigint): string => h.toString(16).padStart(16, "0");

/** The expert digest from its tensors' digests (k3w64 of the little-endian words). */
export function combineDigests(parts: readonly bigint[]): bigint {
  const words = new BigUint64Array(parts);
  return io().k3io_hash(Deno.UnsafePointer.of(words), BigInt(8 * words.length));
}

/** Bytes an expert read needs in a buffer: the expert rounded out to ALIGN on both ends. */
export const readRoom = (bytes: number): number => Math.ceil(bytes / 4096) * 4096 + 2 * 4096;

/**
 * Reads one expert into `buf` (capacity `cap`) and digests it on the I/O thread. Contiguous:
 * one read of the run (direct file), its tensors at `slotOffsets` + the returned delta;
 * else each tensor at its slot offset (buffered). `file(path, direct)` gives open files;
 * `chunk`: bytes per pread of a contiguous expert (0: one pread, the default: 64 real-width
 * experts read 16 at a time took 0.45-0.52 s hashed in one pread each vs 0.49-0.55 s in
 * 1 MiB preads, 0.44-0.48 s unhashed, side by side on a loaded machine).
 */
export async function readExpertHashed(
  loc: ExpertLocation,
  buf: NativeBuffer,
  file: (path: string, direct: boolean) => IoFile,
  chunk = 0,
): Promise<{ delta: number; digest: bigint; bytesRead: number }> {
  if (loc.contiguous) {
    const f = file(loc.file, true);
    const parts = loc.tensors.map((t, i) => [loc.slotOffsets[i], t.bytes] as const);
    const r = await f.readSpanParts(buf.ptr, buf.bytes, loc.offset, loc.bytes, parts, chunk);
    const bytesRead = f.direct ? Math.ceil((r.delta + loc.bytes) / 4096) * 4096 : loc.bytes;
    return { delta: r.delta, digest: r.digest, bytesRead };
  }
  const parts = await Promise.all(
    loc.tensors.map(async (t, i) => {
      const at = loc.slotOffsets[i];
      const r = await file(t.file, false).readSpanParts(buf.at(at), buf.bytes - at, t.offset, t.bytes, [[0, t.bytes]]);
      return r.parts[0];
    }),
  );
  return { delta: 0, digest: combineDigests(parts), bytesRead: loc.bytes };
}

/**
 * Digests every routed expert of the model in one pass over the shards, in file order,
 * `depth` reads in flight; progress through `log` (bytes, rate, ETA) about once a second.
 */
export async function hashAllExperts(
  k: Kernels,
  cfg: K3Config,
  ckpt: Checkpoint,
  log: (line: string) => void,
  depth = 4,
): Promise<string[]> {
  const NE = cfg.moe.numExperts;
  const locs: ExpertLocation[] = [];
  for (let L = cfg.firstKDense; L < cfg.numLayers; L++) {
    for (let E = 0; E < NE; E++) locs.push(locateExpert(cfg, ckpt, L, E));
  }
  locs.sort((a, b) => (a.file < b.file ? -1 : a.file > b.file ? 1 : a.offset - b.offset));
  const total = locs.reduce((a, l) => a + l.bytes, 0);
  const room = Math.max(...locs.map((l) => readRoom(l.bytes)), 4096);
  const bufs = Array.from(
    { length: Math.min(depth, Math.max(1, locs.length)) },
    () => NativeBuffer.alloc(k, room, "expert hashing"),
  );
  const files = new Map<string, IoFile>();
  const file = (path: string, direct: boolean) => {
    const key = `${direct ? "d" : "b"}:${path}`;
    let f = files.get(key);
    if (!f) files.set(key, f = IoFile.open(path, { direct }));
    return f;
  };
  const digests = new Map<number, bigint>();
  const t0 = performance.now();
  let next = 0, done = 0, lastLog = t0;
  const worker = async (buf: NativeBuffer) => {
    while (next < locs.length) {
      const loc = locs[next++];
      const r = await readExpertHashed(loc, buf, file);
      digests.set(loc.layer * NE + loc.expert, r.digest);
      done += loc.bytes;
      const now = performance.now();
      if (now - lastLog > 1000) {
        lastLog = now;
        const rate = done / ((now - t0) / 1000);
        log(
          `pack: hashing experts: ${(done / 1e9).toFixed(2)} / ${(total / 1e9).toFixed(2)} GB, ${
            (rate / 1e6).toFixed(0)
          } MB/s, ETA ${((total - done) / Math.max(rate, 1)).toFixed(0)} s`,
        );
      }
    }
  };
  try {
    await Promise.all(bufs.map(worker));
  } finally {
    bufs.forEach((b) => b.free());
    for (const f of files.values()) f.close();
  }
  const s = (performance.now() - t0) / 1000;
  log(
    `pack: hashed ${locs.length} experts, ${(total / 1e9).toFixed(2)} GB in ${s.toFixed(1)} s (${
      (total / 1e6 / Math.max(s, 1e-9)).toFixed(0)
    } MB/s)`,
  );
  return Array.from(
    { length: cfg.numLayers },
    (_, L) => L < cfg.firstKDense ? "" : Array.from({ length: NE }, (_, E) => hex64(digests.get(L * NE + E)!)).join(""),
  );
}

/** Writes the table to `<trunkDir>/experts.json` atomically (temporary file, sync, rename). */
export async function writeExpertTable(trunkDir: string, t: ExpertTable): Promise<void> {
  const path = `${trunkDir}/${EXPERTS_FILE}`, tmp = `${path}.partial`;
  const bytes = new TextEncoder().encode(JSON.stringify(t) + "\n");
  try {
    await Deno.remove(tmp).catch(() => {});
    writeFileDurable(tmp, bytes);
    await Deno.rename(tmp, path);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw writeFailure(path, bytes.length, e);
  }
}
