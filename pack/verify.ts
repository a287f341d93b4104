/**
 * `k3 pack --verify`: re-reads every region of a packed trunk and checks its k3h64 hash
 * (and the first/last-4-KiB hashes the streamer checks), with two buffers so the next
 * read runs while the current one is hashed. Optionally checks the trunk belongs to a model.
 *
 * @module
 */

import { configFingerprint, loadConfig } from "../engine/model/config.ts";
import { K3Error } from "../engine/errors.ts";
import { kernels } from "../engine/native/ffi.ts";
import { ALIGN, Hasher, hashHex } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import {
  openTrunkData,
  readManifest,
  type Region,
  type TrunkManifest,
  weightSample,
} from "../engine/weights/manifest.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";

/** Refuses a trunk whose fingerprint is not the model's. */
export async function checkFingerprint(dir: string, m: TrunkManifest, modelDir: string): Promise<void> {
  const cfg = await loadConfig(modelDir);
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

export interface VerifyResult {
  regions: number;
  bytes: number;
  seconds: number;
}

/** Checks every region; throws K3Error (exit 1) naming the first bad one. */
export async function verifyTrunk(
  dir: string,
  opts: { modelDir?: string; log?: (s: string) => void; bufBytes?: number } = {},
): Promise<VerifyResult> {
  const log = opts.log ?? ((s: string) => console.error(s));
  const m = await readManifest(dir);
  if (opts.modelDir) await checkFingerprint(dir, m, opts.modelDir);
  const f = openTrunkData(dir, m);
  const k = kernels();
  const B = opts.bufBytes ?? 64 * 1024 * 1024;
  const bufs = [NativeBuffer.alloc(k, B, "verify"), NativeBuffer.alloc(k, B, "verify")];
  const t0 = performance.now();
  let done = 0, lastLog = t0;
  const regions: [string, Region][] = [
    ...m.layer.map((r, i) => [`layer ${i}`, r] as [string, Region]),
    ["finals", m.finals],
    ["embed", m.embed],
    ["head", m.head],
  ];
  let inflight: Promise<number> | undefined;
  try {
    for (const [what, r] of regions) {
      const h = new Hasher();
      const pieces: [number, number][] = [];
      for (let at = 0; at < r.size; at += B) pieces.push([at, Math.min(B, r.size - at)]);
      let cur = 0;
      inflight = f.pread(bufs[0].ptr, pieces[0][1], r.offset);
      for (let i = 0; i < pieces.length; i++) {
        const n = await inflight;
        inflight = undefined;
        const [at, len] = pieces[i];
        if (n !== len) throw new K3Error(`${dir}: ${what}: short read`);
        const b = bufs[cur];
        if (i + 1 < pieces.length) {
          inflight = f.pread(bufs[cur ^ 1].ptr, pieces[i + 1][1], r.offset + pieces[i + 1][0]);
        }
        h.update(b.ptr, len);
        if (at === 0 && hashHex(b.ptr, ALIGN) !== r.head4k) {
          throw new K3Error(
            `${dir}: ${what}: checksum mismatch in its first 4 KiB: the trunk is corrupt; re-pack it`,
          );
        }
        if (at + len === r.size && hashHex(b.at(len - ALIGN), ALIGN) !== r.tail4k) {
          throw new K3Error(
            `${dir}: ${what}: checksum mismatch in its last 4 KiB: the trunk is corrupt; re-pack it`,
          );
        }
        cur ^= 1;
        done += len;
        if (performance.now() - lastLog > 1000) {
          lastLog = performance.now();
          log(`verify: ${(done / 1e9).toFixed(2)} / ${(m.data.bytes / 1e9).toFixed(2)} GB`);
        }
      }
      if (h.hex() !== r.hash) {
        throw new K3Error(
          `${dir}: ${what}: checksum mismatch (manifest ${r.hash}, data ${h.hex()}): the trunk is corrupt; re-pack it`,
        );
      }
    }
  } finally {
    if (inflight) await inflight.catch(() => 0);
    bufs.forEach((b) => b.free());
    f.close();
  }
  const seconds = (performance.now() - t0) / 1000;
  return { regions: regions.length, bytes: m.data.bytes, seconds };
}
