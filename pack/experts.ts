/**
 * `k3 pack --hash-experts`: the expert table (engine/weights/expert_table.ts) beside a
 * packed trunk, made in one pass over the routed experts of the checkpoint, and its check
 * by `k3 pack --verify <trunk_dir> <model_dir>`. The trunk itself is not rewritten, so a
 * table can be added to an existing trunk.
 *
 * @module
 */

import { configFingerprint, loadConfig } from "../engine/model/config.ts";
import { K3Error } from "../engine/errors.ts";
import { kernels } from "../engine/native/ffi.ts";
import { CHECKSUM } from "../engine/native/io.ts";
import { readInputText, statKind } from "../engine/native/files.ts";
import { checkAccounted } from "../engine/weights/bind.ts";
import { locateExpert } from "../engine/weights/experts.ts";
import { readManifest, weightSample } from "../engine/weights/manifest.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";
import {
  EXPERTS_FILE,
  type ExpertTable,
  hashAllExperts,
  parseExpertTable,
  readExpertTable,
  TABLE_ADVICE,
  TABLE_FORMAT,
  TABLE_VERSION,
  writeExpertTable,
} from "../engine/weights/expert_table.ts";

/** The model's identity as a trunk and a table record it. */
async function identity(modelDir: string) {
  const cfg = await loadConfig(modelDir);
  const ckpt = await Checkpoint.open(modelDir);
  try {
    checkAccounted(cfg, ckpt);
    return { cfg, ckpt, fingerprint: await configFingerprint(cfg), sample: await weightSample(kernels(), cfg, ckpt) };
  } catch (e) {
    ckpt.close();
    throw e;
  }
}

/**
 * Hashes every routed expert of `modelDir` into `<trunkDir>/experts.json` (atomic). The
 * trunk must be this model's (its manifest's fingerprint and weight sample).
 */
export async function hashExperts(
  modelDir: string,
  trunkDir: string,
  log: (line: string) => void = (s) => console.error(s),
): Promise<ExpertTable> {
  const { cfg, ckpt, fingerprint, sample } = await identity(modelDir);
  try {
    const m = await readManifest(trunkDir);
    if (m.fingerprint !== fingerprint || m.sample !== sample) {
      throw new K3Error(`pack: ${trunkDir} is not the trunk of ${modelDir}; pack it first (k3 pack --force)`);
    }
    const digests = await hashAllExperts(kernels(), cfg, ckpt, log);
    const table: ExpertTable = {
      format: TABLE_FORMAT,
      version: TABLE_VERSION,
      checksum: CHECKSUM,
      created: new Date().toISOString(),
      fingerprint,
      sample,
      layers: cfg.numLayers,
      experts: cfg.moe.numExperts,
      first: cfg.firstKDense,
      digests,
    };
    await writeExpertTable(trunkDir, table);
    log(`pack: wrote ${trunkDir}/${EXPERTS_FILE}`);
    return table;
  } finally {
    ckpt.close();
  }
}

/**
 * `pack --verify`'s part for the experts: without a table, undefined; with `modelDir`, the
 * table checked against the model and every expert re-hashed against it (K3Error exit 1
 * naming the first bad one); without `modelDir`, only the table's structure.
 */
export async function verifyExperts(
  trunkDir: string,
  modelDir: string | undefined,
  log: (line: string) => void,
): Promise<{ experts: number; checked: boolean } | undefined> {
  if (modelDir === undefined) {
    // The structure only: the fingerprint and digests need the model.
    const path = `${trunkDir}/${EXPERTS_FILE}`;
    if (statKind(path) === "missing") return undefined;
    const t = parseExpertTable(readInputText(path, { what: "expert table", maxBytes: 64 << 20 }), path);
    return { experts: (t.layers - t.first) * t.experts, checked: false };
  }
  const { cfg, ckpt, fingerprint, sample } = await identity(modelDir);
  try {
    const t = readExpertTable(trunkDir, cfg, fingerprint, sample);
    if (!t) return undefined;
    const digests = await hashAllExperts(kernels(), cfg, ckpt, log);
    const NE = cfg.moe.numExperts;
    for (let L = cfg.firstKDense; L < cfg.numLayers; L++) {
      if (digests[L] === t.digests[L]) continue;
      const E = Array.from({ length: NE }, (_, e) => e).find((e) =>
        digests[L].slice(16 * e, 16 * e + 16) !== t.digests[L].slice(16 * e, 16 * e + 16)
      )!;
      const loc = locateExpert(cfg, ckpt, L, E);
      const shards = [...new Set(loc.tensors.map((x) => x.file.slice(x.file.lastIndexOf("/") + 1)))].join(", ");
      throw new K3Error(
        `${trunkDir}/${EXPERTS_FILE}: layer ${L} expert ${E} (shard ${shards}): checksum mismatch: the shard is damaged or the table is stale; re-download the shard, or re-make the table with ${TABLE_ADVICE}`,
      );
    }
    return { experts: (cfg.numLayers - cfg.firstKDense) * NE, checked: true };
  } finally {
    ckpt.close();
  }
}
