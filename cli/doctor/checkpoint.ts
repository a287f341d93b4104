/**
 * `k3 doctor --checkpoint`: a downloaded checkpoint verified (headers, shard sizes, the
 * tensors the engine binds, the release's totals).
 *
 * @module
 */

import { loadConfig } from "../../engine/model/config.ts";
import { Checkpoint } from "../../engine/weights/safetensors.ts";
import { checkCheckpoint } from "../../engine/weights/bind.ts";
import { progress } from "../progress.ts";
import { CHECKPOINT_BYTES, CHECKPOINT_SHARDS, CHECKPOINT_TENSORS } from "./facts.ts";

/**
 * Verifies a checkpoint directory: headers (Checkpoint.open refuses a bad one with exit 1),
 * shard sizes against their headers, the tensors the engine binds, and the release's
 * totals when the config is the released shape.
 */
export async function verifyCheckpoint(dir: string): Promise<{ lines: string[]; problems: string[] }> {
  const cfg = await loadConfig(dir);
  const ckpt = await Checkpoint.open(dir, (d, n) => progress("headers", d, n));
  try {
    const problems: string[] = [];
    const sizes = await ckpt.shardSizes();
    const total = sizes.reduce((a, s) => a + s.bytes, 0);
    for (const s of sizes) {
      if (s.bytes !== s.described) {
        problems.push(`${s.file}: ${s.bytes} bytes, but its header describes ${s.described}`);
      }
    }
    try {
      checkCheckpoint(cfg, ckpt);
    } catch (e) {
      problems.push((e as Error).message);
    }
    const released = cfg.numLayers === 93 && cfg.hiddenSize === 7168 && cfg.moe.numExperts === 896;
    if (released) {
      const want: [string, number, number][] = [
        ["shards", sizes.length, CHECKPOINT_SHARDS],
        ["tensors", ckpt.tensors.size, CHECKPOINT_TENSORS],
        ["bytes", total, CHECKPOINT_BYTES],
      ];
      for (const [what, got, expected] of want) {
        if (got !== expected) {
          problems.push(
            `${dir}: ${got.toLocaleString("en-US")} ${what}, the release has ${expected.toLocaleString("en-US")}`,
          );
        }
      }
    }
    const lines = [
      `${dir}: ${sizes.length} shards, ${total.toLocaleString("en-US")} bytes, ${
        ckpt.tensors.size.toLocaleString("en-US")
      } tensors; ` +
      (problems.length
        ? `${problems.length} problem(s)`
        : released
        ? "the released Kimi K3, complete"
        : "complete (not the released shape)"),
    ];
    return { lines, problems };
  } finally {
    ckpt.close();
  }
}
