/**
 * Saved sequence states (`--save-state`, `--load-state`, chat's `--state`): the exact
 * prefix a state represents, so a later run continues it instead of prefilling again.
 *
 * Layout (little-endian):
 *   0   8 bytes  magic "K3STATE\n"
 *   8   u32      version (2: the weight sample became k3w64; a version 1 file is refused)
 *   12  u32      header length H
 *   16  H bytes  header, UTF-8 JSON: format, version, config (fingerprint of the config the
 *                state was made with), weights (k3w64 of the weight sample), layers, pos,
 *                tokens (exactly pos ids), kda and mla (layer indices), payload_bytes, meta
 *   ..  payload  float32: each KDA layer in order (convQ, convK, convV, S: fixed size),
 *                then each MLA layer (latent [pos][kvLoraRank], krope [pos][ropeDim])
 *   end 32 bytes SHA-256 of everything before it
 * Written to a temporary sibling, fsync'ed, renamed into place.
 *
 * Loading checks, in this order, before one byte reaches a native buffer: length, magic,
 * version, header JSON, declared length against the file, checksum, then every header
 * field against the model (fingerprints, layer lists, pos within capacity, token ids in
 * the vocabulary, payload size from the config). Each damage is one K3Error line.
 *
 * A KDA state cannot be rewound (its recurrent state folds every token in), so a saved
 * state is only ever reused for its exact token prefix.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { configFingerprint, type K3Config } from "../model/config.ts";
import { K3Error } from "../errors.ts";
import type { K3Model } from "../model/model.ts";
import type { SequenceState } from "../model/state.ts";
import type { Kernels } from "../native/ffi.ts";
import type { Checkpoint } from "../weights/safetensors.ts";
import { weightSample } from "../weights/manifest.ts";
import { IoFile } from "../native/io.ts";

const MAGIC = new TextEncoder().encode("K3STATE\n");
/** The state file version this build writes and reads. */
export const STATE_VERSION = 2;
const PREFIX = 16;
const DIGEST = 32;

/** What identifies a model for a saved state: its config and a sample of its weights. */
export interface ModelFingerprint {
  /** configFingerprint of the config as opened. */
  config: string;
  /** weightSample (k3w64) of the layers in use. */
  weights: string;
}

/** The fingerprint of an opened model (config as opened, --layers included). */
export async function modelFingerprint(
  opened: { k: Kernels; cfg: K3Config; ckpt: Checkpoint },
): Promise<ModelFingerprint> {
  return {
    config: await configFingerprint(opened.cfg),
    weights: await weightSample(opened.k, opened.cfg, opened.ckpt),
  };
}

/** The header of a state file. */
export interface StateHeader {
  /** Always "k3-state". */
  format: "k3-state";
  /** Same as the binary prefix's version. */
  version: number;
  /** {@link ModelFingerprint.config} of the model that made it. */
  config: string;
  /** {@link ModelFingerprint.weights} of the model that made it. */
  weights: string;
  /** Layers of the config it was made with. */
  layers: number;
  /** Positions processed. */
  pos: number;
  /** The token prefix the state represents (pos ids). */
  tokens: number[];
  /** KDA layer indices, in payload order. */
  kda: number[];
  /** MLA layer indices, in payload order. */
  mla: number[];
  /** Bytes of float32 payload after the header. */
  payload_bytes: number;
  /** Free-form data of the writer (chat: which history the state belongs to). */
  meta: Record<string, unknown>;
}

/** A loaded state: the native state filled in, and what it represents. */
export interface LoadedState {
  /** A fresh state of the model, filled in (pos = tokens.length). */
  state: SequenceState;
  /** The token prefix it represents. */
  tokens: number[];
  /** The writer's meta data. */
  meta: Record<string, unknown>;
}

function layersOf(cfg: K3Config, kind: "kda" | "mla"): number[] {
  return cfg.layerKinds.flatMap((k, L) => (k === kind ? [L] : []));
}

/** Floats of each KDA layer's fixed state, and of one MLA position. */
function sizes(cfg: K3Config): { kdaFloats: number; latent: number; rope: number } {
  const C = cfg.kda.numHeads * cfg.kda.headDim;
  return {
    kdaFloats: 3 * 3 * C + cfg.kda.numHeads * cfg.kda.headDim * cfg.kda.headDim,
    latent: cfg.mla.kvLoraRank,
    rope: cfg.mla.ropeDim,
  };
}

/** Payload bytes of a state of `pos` positions. */
export function payloadBytes(cfg: K3Config, pos: number): number {
  const s = sizes(cfg);
  return 4 * (layersOf(cfg, "kda").length * s.kdaFloats + layersOf(cfg, "mla").length * pos * (s.latent + s.rope));
}

/**
 * Writes `state` (which has processed exactly `tokens`) atomically: a temporary sibling,
 * fsync'ed, then renamed over `path`.
 */
export async function saveState(
  path: string,
  model: K3Model,
  state: SequenceState,
  tokens: readonly number[],
  fp: ModelFingerprint,
  meta: Record<string, unknown> = {},
): Promise<void> {
  if (tokens.length !== state.pos) {
    throw new Error(`saveState: ${tokens.length} tokens for a state at position ${state.pos}`);
  }
  await writeStatePayload(path, model.cfg, tokens, state.regions(), fp, meta);
}

/**
 * How a state file is written into a directory other processes share and scan (the state
 * cache's spill directory): making room for it and creating its temporary at its full
 * size, then renaming it into place, each happen under the directory's lock, so that a
 * scan under the lock sees every file exactly once and at its full size.
 */
export interface SharedDirectory {
  /** Runs `f` holding the directory's lock. */
  locked<T>(f: () => Promise<T>): Promise<T>;
  /** Makes room for a file of `bytes` bytes (called under the lock); false: write nothing. */
  makeRoom(bytes: number): Promise<boolean>;
}

/**
 * Writes a state file from its payload (`parts`: {@link SequenceState.regions} of a state
 * that has processed exactly `tokens`, or one {@link SequenceState.snapshot}) atomically:
 * a temporary sibling (`PATH.tmp-PID-TIME`), fsync'ed, then renamed over `path`. In a
 * `shared` directory the file is written only when room is made for it (false: nothing was
 * written).
 */
export async function writeStatePayload(
  path: string,
  cfg: K3Config,
  tokens: readonly number[],
  parts: readonly Uint8Array[],
  fp: ModelFingerprint,
  meta: Record<string, unknown> = {},
  shared?: SharedDirectory,
): Promise<boolean> {
  const pos = tokens.length;
  const size = parts.reduce((n, p) => n + p.length, 0);
  if (size !== payloadBytes(cfg, pos)) {
    throw new Error(
      `writeStatePayload: ${size} payload bytes for ${pos} positions (${payloadBytes(cfg, pos)} expected)`,
    );
  }
  const header: StateHeader = {
    format: "k3-state",
    version: STATE_VERSION,
    config: fp.config,
    weights: fp.weights,
    layers: cfg.numLayers,
    pos,
    tokens: [...tokens],
    kda: layersOf(cfg, "kda"),
    mla: layersOf(cfg, "mla"),
    payload_bytes: size,
    meta,
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const prefix = new Uint8Array(PREFIX);
  prefix.set(MAGIC);
  const dv = new DataView(prefix.buffer);
  dv.setUint32(8, STATE_VERSION, true);
  dv.setUint32(12, json.length, true);
  const file = [prefix, json, ...parts];
  const hash = createHash("sha256");
  for (const p of file) hash.update(p);
  file.push(new Uint8Array(hash.digest()));

  const bytes = file.reduce((n, p) => n + p.length, 0);
  const tmp = `${path}.tmp-${Deno.pid}-${Date.now()}`;
  let f: Deno.FsFile | undefined;
  const create = async () => {
    if (shared && !(await shared.makeRoom(bytes))) return false;
    f = await Deno.open(tmp, { write: true, create: true, truncate: true });
    await f.truncate(bytes); // its full size at once: what a scan of the directory counts
    return true;
  };
  const rename = () => Deno.rename(tmp, path);
  try {
    if (!(await (shared ? shared.locked(create) : create()))) return false;
    if (!f) throw new Error("the temporary file was not created");
    for (const p of file) {
      let off = 0;
      while (off < p.length) off += await f.write(p.subarray(off));
    }
    await f.sync();
    f.close();
    f = undefined;
    await (shared ? shared.locked(rename) : rename());
    return true;
  } catch (e) {
    f?.close();
    await Deno.remove(tmp).catch(() => {});
    throw new K3Error(`cannot write state ${path}: ${(e as Error).message}`);
  }
}

/** A state file read and checked for layout and checksum; `at` is where the payload starts. */
export interface StateFile {
  /** Where it was read from. */
  path: string;
  /** The parsed header (fields not yet checked against a model). */
  header: StateHeader;
  /** The whole file. */
  bytes: Uint8Array;
  /** Offset of the payload. */
  at: number;
}

/** Bytes per read of a state file: the JS thread hashes one chunk while the next is read. */
const READ_CHUNK = 8 << 20;

/**
 * Reads a whole file on the I/O threads (engine/native/io.ts: nonblocking FFI reads), a
 * chunk at a time, hashing all but its last {@link DIGEST} bytes as they land, so other
 * work (a server's pass loop) runs between the chunks. The digest is of the file's body.
 */
async function readHashed(path: string): Promise<{ bytes: Uint8Array; digest: Uint8Array }> {
  let f: IoFile;
  try {
    f = IoFile.open(path);
  } catch (e) {
    throw new K3Error(`cannot read state ${path}: ${(e as Error).message}`);
  }
  try {
    const size = f.size();
    const bytes = new Uint8Array(size);
    const body = Math.max(0, size - DIGEST);
    const hash = createHash("sha256");
    for (let off = 0; off < size;) {
      const len = Math.min(READ_CHUNK, size - off);
      const n = await f.pread(Deno.UnsafePointer.of(bytes.subarray(off, off + len))!, len, off);
      if (n === 0) throw new K3Error(`cannot read state ${path}: it shrank while being read`);
      if (off < body) hash.update(bytes.subarray(off, Math.min(off + n, body)));
      off += n;
    }
    return { bytes, digest: new Uint8Array(hash.digest()) };
  } finally {
    f.close();
  }
}

/** Reads a state file and checks everything that needs no model: layout, version, checksum. */
export async function readStateFile(path: string): Promise<StateFile> {
  const { bytes, digest } = await readHashed(path);
  const bad = (why: string) => new K3Error(`state ${path}: ${why}; refusing it`);
  if (bytes.length < PREFIX) {
    if (bytes.length === 0 || !MAGIC.subarray(0, bytes.length).every((b, i) => b === bytes[i])) {
      throw bad("not a k3 state file");
    }
    throw bad(`truncated (${bytes.length} bytes)`);
  }
  if (!MAGIC.every((b, i) => b === bytes[i])) throw bad("not a k3 state file");
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = dv.getUint32(8, true);
  if (version !== STATE_VERSION) {
    throw bad(`version ${version}; this k3 reads version ${STATE_VERSION}`);
  }
  const H = dv.getUint32(12, true);
  if (PREFIX + H + DIGEST > bytes.length) throw bad(`truncated (${bytes.length} bytes, the header alone needs ${H})`);
  let header: StateHeader;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(PREFIX, PREFIX + H)));
  } catch {
    throw bad("corrupt header (not JSON)");
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) throw bad("corrupt header");
  const pb = header.payload_bytes;
  if (!Number.isSafeInteger(pb) || pb < 0) throw bad("corrupt header (payload_bytes)");
  const want = PREFIX + H + pb + DIGEST;
  if (bytes.length < want) throw bad(`truncated (${bytes.length} bytes, its header says ${want})`);
  if (bytes.length > want) throw bad(`too long (${bytes.length} bytes, its header says ${want})`);
  // The file is exactly `want` bytes long here, so readHashed's digest is of its body.
  if (!digest.every((b, i) => b === bytes[want - DIGEST + i])) {
    throw bad("corrupt (checksum mismatch)");
  }
  return { path, header, bytes, at: PREFIX + H };
}

const sameList = (a: unknown, b: number[]) =>
  Array.isArray(a) && a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * Loads a state file (a path, or one {@link readStateFile} already read) for `model`: every field is checked against the model before the
 * fresh state's native buffers are written. Throws K3Error (one line) for any damage, a
 * different model, or more positions than the model was opened for.
 */
export async function loadState(
  file: string | StateFile,
  model: K3Model,
  fp: ModelFingerprint,
): Promise<LoadedState> {
  const { header: h, payload } = checkStateFile(typeof file === "string" ? await readStateFile(file) : file, model, fp);
  const state = model.newState();
  try {
    state.restore(payload, h.pos);
  } catch (e) {
    state.free();
    throw e;
  }
  return { state, tokens: h.tokens, meta: h.meta };
}

/**
 * Checks every header field of a read state file against `model` (fingerprints, layer
 * lists, pos within capacity, token ids, payload size) and returns its payload (what
 * {@link SequenceState.restore} takes). Throws K3Error (one line) for any mismatch.
 */
export function checkStateFile(
  file: StateFile,
  model: K3Model,
  fp: ModelFingerprint,
): { header: StateHeader; payload: Uint8Array } {
  const { path, header: h, bytes, at } = file;
  const bad = (why: string) => new K3Error(`state ${path}: ${why}; refusing it`);
  const cfg = model.cfg;
  if (h.format !== "k3-state" || h.version !== STATE_VERSION) throw bad("corrupt header (format or version)");
  // What to do: a state only continues the model (and --layers) that saved it.
  const redo = "use the model directory it was saved with, or drop --load-state/--state to start afresh";
  if (h.config !== fp.config || h.layers !== cfg.numLayers) {
    throw bad(
      `saved with a different model config (fingerprint ${
        String(h.config)
      }, ${h.layers} layers; this model has ${fp.config}, ${cfg.numLayers} layers): ${redo}`,
    );
  }
  if (h.weights !== fp.weights) {
    throw bad(
      `saved with different weights (weight sample ${String(h.weights)}, this model has ${fp.weights}): ${redo}`,
    );
  }
  if (!sameList(h.kda, layersOf(cfg, "kda")) || !sameList(h.mla, layersOf(cfg, "mla"))) {
    throw bad("corrupt header (layer lists do not match the config)");
  }
  if (!Number.isSafeInteger(h.pos) || h.pos < 0) throw bad("corrupt header (pos)");
  if (h.pos > model.capacity) {
    throw bad(`holds ${h.pos} positions, more than the ${model.capacity} this model was opened for`);
  }
  if (!Array.isArray(h.tokens) || h.tokens.length !== h.pos) throw bad("corrupt header (tokens do not match pos)");
  const badId = h.tokens.find((t) => !Number.isInteger(t) || t < 0 || t >= cfg.vocabSize);
  if (badId !== undefined) throw bad(`corrupt header (token ${JSON.stringify(badId)} outside the vocabulary)`);
  if (h.payload_bytes !== payloadBytes(cfg, h.pos)) {
    throw bad("corrupt header (payload size does not match the config)");
  }
  if (typeof h.meta !== "object" || h.meta === null || Array.isArray(h.meta)) throw bad("corrupt header (meta)");

  return { header: h, payload: bytes.subarray(at, at + h.payload_bytes) };
}
