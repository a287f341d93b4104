/**
 * `k3 pack --verify`: checks the manifest completely, then re-reads every region of a
 * packed trunk and checks each piece's k3w64 in both forms (as stored, and decoded when it
 * is split-coded), each tensor's check (what runs check: the
 * pieces of what they pin, the tensor checks of what they stream) and the region's whole
 * hash, with two buffers so the next read runs while the current one is
 * hashed. Optionally checks the trunk belongs to a model.
 *
 * @module
 */

import { configFingerprint, type K3Config, loadConfig } from "../engine/model/config.ts";
import { K3Error } from "../engine/errors.ts";
import { kernels } from "../engine/native/ffi.ts";
import { Hasher, hashHex, splitDecode } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import {
  checkLayout,
  DATA_FILE,
  openTrunkData,
  readManifest,
  type TrunkManifest,
  weightSample,
} from "../engine/weights/manifest.ts";
import { pieceSpans, regionsOf } from "../engine/weights/trunk_geometry.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";
import { checkMismatch, RegionChecker } from "../engine/native/tensors.ts";

/** Refuses a trunk whose fingerprint is not the model's (`cfg`, read from `modelDir`). */
export async function checkFingerprint(
  dir: string,
  m: TrunkManifest,
  modelDir: string,
  cfg: K3Config,
): Promise<void> {
  const fp = await configFingerprint(cfg);
  if (fp !== m.fingerprint) {
    throw new K3Error(
      `${dir}: this trunk was packed from a different model (fingerprint ${m.fingerprint}, ${modelDir} has ${fp}); re-pack it with k3 pack`,
    );
  }
  const ckpt = await Checkpoint.open(modelDir);
  try {
    const sample = await weightSample(kernels(), cfg, ckpt);
    if (sample !== m.sample) {
      throw new K3Error(
        `${dir}: this trunk was packed from different weights (weight sample ${m.sample}, ${modelDir} has ${sample}); re-pack it with k3 pack`,
      );
    }
  } finally {
    ckpt.close();
  }
}

/** What verifyTrunk checked. */
export interface VerifyResult {
  /** Regions verified. */
  regions: number;
  /** Bytes verified. */
  bytes: number;
  /** Seconds taken. */
  seconds: number;
}

/**
 * Checks the manifest completely (structure always; against the model's config and weights
 * when `modelDir` is given), then every piece of every region against its k3w64, every
 * tensor against its check and each region's whole hash. Throws K3Error (exit 1) naming the first bad one.
 */
export async function verifyTrunk(
  dir: string,
  opts: { modelDir?: string; log?: (s: string) => void } = {},
): Promise<VerifyResult> {
  const log = opts.log ?? ((s: string) => console.error(s));
  const m = await readManifest(dir);
  if (opts.modelDir) {
    const cfg = await loadConfig(opts.modelDir);
    checkLayout(m, cfg, dir);
    await checkFingerprint(dir, m, opts.modelDir, cfg);
  }
  const f = openTrunkData(dir, m);
  const k = kernels();
  const bufs = [NativeBuffer.alloc(k, m.piece, "verify"), NativeBuffer.alloc(k, m.piece, "verify")];
  const t0 = performance.now();
  let done = 0, lastLog = t0;
  const regions = regionsOf(m);
  let inflight: Promise<{ n: number; hash?: string }> | undefined;
  try {
    for (const [what, r] of regions) {
      const h = new Hasher();
      const checker = new RegionChecker(k, r.tensors);
      const spans = pieceSpans(r, m.piece);
      const n = spans.length;
      const len = (i: number) => spans[i].len;
      // Each piece's stored bytes land at the end of its buffer (where the engine's reads put
      // them), are checked against their stored hash, decoded there when coded, and the
      // decoded bytes checked against the piece hash: both forms verified.
      const read = (i: number) =>
        f.preadHashed(bufs[i % 2].at(spans[i].len - spans[i].stored), spans[i].stored, spans[i].file);
      const corrupt = (i: number, form: string) =>
        new K3Error(
          `${dir}: ${what}: checksum mismatch in piece ${i} (${form}, bytes ${
            spans[i].file
          }.. of ${DATA_FILE}): the trunk is corrupt; re-pack it`,
        );
      inflight = read(0);
      for (let i = 0; i < n; i++) {
        const got = await inflight!;
        inflight = i + 1 < n ? read(i + 1) : undefined;
        const s = spans[i], b = bufs[i % 2];
        if (got.n !== s.stored) {
          throw new K3Error(`${dir}: ${what}: short read: the trunk data is truncated; re-pack it`);
        }
        if (got.hash !== r.storedPieces[i]) throw corrupt(i, "stored form");
        if (s.stored < s.len) {
          if (!splitDecode(b.at(s.len - s.stored), s.stored, b.ptr, s.len)) throw corrupt(i, "does not decode");
          if (hashHex(b.ptr, s.len) !== r.pieces[i]) throw corrupt(i, "decoded form");
        }
        h.update(bufs[i % 2].ptr, len(i));
        checker.update(bufs[i % 2], len(i));
        done += len(i);
        if (performance.now() - lastLog > 1000) {
          lastLog = performance.now();
          log(`verify: ${(done / 1e9).toFixed(2)} / ${(m.data.bytes / 1e9).toFixed(2)} GB`);
        }
      }
      const checks = checker.results();
      r.tensors.forEach((t, i) => {
        if (checks[i] !== t.check) throw checkMismatch(`${dir}: ${what}: tensor ${t.name}`, checks[i], t.check);
      });
      if (h.hex() !== r.hash) {
        throw new K3Error(
          `${dir}: ${what}: checksum mismatch (manifest ${r.hash}, data ${h.hex()}): the trunk is corrupt; re-pack it`,
        );
      }
    }
  } finally {
    if (inflight) await inflight.catch(() => undefined);
    bufs.forEach((b) => b.free());
    f.close();
  }
  const seconds = (performance.now() - t0) / 1000;
  return { regions: regions.length, bytes: m.data.bytes, seconds };
}
