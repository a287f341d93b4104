/**
 * The expert table: one digest per routed expert, kept beside a packed trunk
 * (`<trunk_dir>/experts.json`, made by `k3 pack --hash-experts`), so every expert read
 * from the checkpoint's shards (which carry no checksum) is verified before anything
 * computed from it goes on.
 *
 * An expert's digest is the k3w64 of six little-endian 64-bit words: the matrix check
 * (kernels/k3.h contract 5) of each of its tensors in `expertTensors` order (w1 packed, w1
 * scale, w3 packed, w3 scale, w2 packed, w2 scale), each as its rows (shape[0] of them).
 * The MXFP4 products compute those checks from the bytes they decode anyway
 * (k3_matmul_mxfp4_checked), so an expert read from the shards is verified by its first run
 * (`settleExpert`, before its output is summed) with no second pass over its bytes; once
 * verified, its cache slot stays verified until it is refilled. Version 1 held the k3w64
 * of each tensor's bytes instead, checked on the I/O thread; it is refused with the advice
 * to re-make the table.
 *
 * Format (JSON): `format` "k3-experts", `version` 2, `checksum` "k3w64", `created`,
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
import { hexDigits, JsonFields, problemText } from "../json_fields.ts";
import { notRegular, readInputText, statKind, writeFailure, writeFileDurable } from "../native/files.ts";
import { CHECKSUM, hex64, IoFile } from "../native/io.ts";
import { type Kernels } from "../native/ffi.ts";
import { NativeBuffer } from "../native/memory.ts";
import { type ExpertLocation, locateExpert } from "./experts.ts";
import type { Checkpoint } from "./safetensors.ts";
import { combineDigests, type ExpertCheck, tensorCheckWord } from "../native/tensors.ts";

/** The table's file name, inside the trunk directory. */
export const EXPERTS_FILE = "experts.json";
/** Its format name. */
export const TABLE_FORMAT = "k3-experts";
/** Its format version. */
export const TABLE_VERSION = 2;
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
  // The first problem throws, so every field read below is there and of its type.
  const f = JsonFields.root(j, { absent: "missing", report: (p) => bad(problemText(p)) })!;
  f.oneOf("format", [TABLE_FORMAT]);
  if (j.version !== TABLE_VERSION) {
    bad(`version ${JSON.stringify(j.version)}, this k3 reads version ${TABLE_VERSION} (digests of tensor checks)`);
  }
  f.oneOf("checksum", [CHECKSUM]);
  f.string("fingerprint", hexDigits(32));
  f.string("sample", hexDigits(16));
  const layers = f.int("layers", 1, 1 << 16)!, experts = f.int("experts", 1, 1 << 16)!;
  const first = f.int("first", 0, layers)!;
  const digests = f.array("digests", { length: layers })!;
  const dense = { pattern: /^$/, what: '"" (a dense layer has no expert digests)' };
  const moe = { pattern: hexDigits(16 * experts).pattern, what: `${experts} digests of 16 hex digits` };
  for (let L = 0; L < layers; L++) digests.string(L, L < first ? dense : moe);
  const t = j as unknown as ExpertTable;
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

/** Bytes an expert read needs in a buffer: the expert rounded out to ALIGN on both ends. */
export const readRoom = (bytes: number): number => Math.ceil(bytes / 4096) * 4096 + 2 * 4096;

/**
 * Reads one expert into `buf`. Contiguous: one read of the run (direct file), its tensors at
 * `slotOffsets` + the returned delta; else each tensor at its slot offset (buffered).
 * `file(path, direct)` gives open files. Resolves to the delta and the bytes read from disk.
 */
export async function readExpertSlot(
  loc: ExpertLocation,
  buf: NativeBuffer,
  file: (path: string, direct: boolean) => IoFile,
): Promise<{ delta: number; bytesRead: number }> {
  if (loc.contiguous) {
    const f = file(loc.file, true);
    const delta = await f.readSpan(buf.ptr, buf.bytes, loc.offset, loc.bytes);
    return { delta, bytesRead: f.direct ? Math.ceil((delta + loc.bytes) / 4096) * 4096 : loc.bytes };
  }
  await Promise.all(
    loc.tensors.map((t, i) => file(t.file, false).readExact(buf.at(loc.slotOffsets[i]), t.bytes, t.offset)),
  );
  return { delta: 0, bytesRead: loc.bytes };
}

/** The digest (as the table holds it) of an expert read into `buf` at `delta`. */
export function expertDigest(k: Kernels, loc: ExpertLocation, buf: NativeBuffer, delta: number): string {
  const words = new BigUint64Array(
    loc.tensors.map((t, i) => tensorCheckWord(k, { keep: "matrix", ...t }, buf.at(loc.slotOffsets[i] + delta))),
  );
  return hex64(combineDigests(words));
}

/** The ExpertCheck of an expert read from `loc`, against table `path`'s `expect`. */
export function expertCheck(loc: ExpertLocation, expect: string, path: string): ExpertCheck {
  const shards = [...new Set(loc.tensors.map((t) => t.file.slice(t.file.lastIndexOf("/") + 1)))].join(", ");
  return {
    expect,
    words: new BigUint64Array(6),
    verified: false,
    mismatch:
      `layer ${loc.layer} expert ${loc.expert} (shard ${shards}): checksum mismatch against ${path}: the shard is damaged or the table is stale; re-download the shard, or re-make the table with ${TABLE_ADVICE}`,
  };
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
  const digests = new Map<number, string>();
  const t0 = performance.now();
  let next = 0, done = 0, lastLog = t0;
  const worker = async (buf: NativeBuffer) => {
    while (next < locs.length) {
      const loc = locs[next++];
      const r = await readExpertSlot(loc, buf, file);
      digests.set(loc.layer * NE + loc.expert, expertDigest(k, loc, buf, r.delta));
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
    (_, L) => L < cfg.firstKDense ? "" : Array.from({ length: NE }, (_, E) => digests.get(L * NE + E)!).join(""),
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
