/**
 * `k3 doctor --checkpoint`: a downloaded checkpoint judged by what it is. Its own config
 * and index say what it should hold: every shard the index names must be there and whole
 * (each one missing, short or unreadable is named by file), the tensors the engine binds
 * must be there, and only a checkpoint whose config is the released shape is held to the
 * release's totals. A damaged checkpoint is a list of problems and a verdict, never a stop.
 *
 * @module
 */

import { loadConfig } from "../../engine/model/config.ts";
import { Checkpoint, readShardHeader, type TensorInfo } from "../../engine/weights/safetensors.ts";
import { checkCheckpoint } from "../../engine/weights/bind.ts";
import { isRegularFile } from "../../engine/native/files.ts";
import { progress } from "../progress.ts";
import { CHECKPOINT_BYTES, CHECKPOINT_SHARDS, CHECKPOINT_TENSORS, TRUNK_BYTES } from "./facts.ts";

/** What the check found. */
export interface CheckpointFindings {
  /** The report's lines (the first is the summary). */
  lines: string[];
  /** Problems, each naming the file. */
  problems: string[];
  /** Bytes its packed trunk will take: the released trunk's, else its non-expert tensors'. */
  trunkBytes: number;
}

/** The index's shard of every tensor, or undefined when there is no readable index. */
function indexMap(dir: string): Map<string, string[]> | undefined {
  const path = `${dir}/model.safetensors.index.json`;
  if (!isRegularFile(path)) return undefined;
  let map: unknown;
  try {
    map = JSON.parse(Deno.readTextFileSync(path))?.weight_map;
  } catch {
    return undefined;
  }
  if (typeof map !== "object" || map === null) return undefined;
  const byShard = new Map<string, string[]>();
  for (const [tensor, shard] of Object.entries(map as Record<string, unknown>)) {
    if (typeof shard !== "string") continue;
    byShard.set(shard, [...byShard.get(shard) ?? [], tensor]);
  }
  return byShard;
}

/** Names of the `*.safetensors` files in `dir`, sorted. */
function shardFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(dir)) if (e.name.endsWith(".safetensors")) out.push(e.name);
  return out.sort();
}

/** The routed experts stay on disk; everything else of the language model is the trunk. */
function trunkBytesOf(tensors: TensorInfo[]): number {
  return tensors
    .filter((t) => t.name.startsWith("language_model.") && !/\.experts\.\d+\./.test(t.name))
    .reduce((a, t) => a + t.bytes, 0);
}

/**
 * Verifies a checkpoint directory (see the module doc). Never throws for a damaged
 * checkpoint: every finding is a problem line.
 */
export async function verifyCheckpoint(dir: string): Promise<CheckpointFindings> {
  const problems: string[] = [];
  let cfg: Awaited<ReturnType<typeof loadConfig>> | undefined;
  try {
    cfg = await loadConfig(dir);
  } catch (e) {
    problems.push((e as Error).message);
  }
  const index = indexMap(dir);
  const files = shardFiles(dir);
  const onDisk = new Set(files);
  const damaged: string[] = [];
  for (const [shard, tensors] of index ?? []) {
    if (!onDisk.has(shard)) {
      damaged.push(shard);
      problems.push(`${dir}/${shard}: missing (model.safetensors.index.json puts ${tensors.length} tensors there)`);
    }
  }
  if (!index) problems.push(`${dir}: no readable model.safetensors.index.json (shards cannot be checked against it)`);

  // Every shard's header on its own, so one damaged shard does not hide the others.
  const tensors: TensorInfo[] = [];
  let total = 0, whole = 0;
  for (let i = 0; i < files.length; i++) {
    const path = `${dir}/${files[i]}`;
    try {
      const size = Deno.statSync(path).size;
      total += size;
      const ts = await readShardHeader(path);
      const described = ts.reduce((a, t) => Math.max(a, t.offset + t.bytes), 0);
      if (size !== described) {
        damaged.push(files[i]);
        problems.push(`${path}: ${size} bytes, but its header describes ${described}`);
      } else whole++;
      tensors.push(...ts);
    } catch (e) {
      damaged.push(files[i]);
      problems.push((e as Error).message);
    }
    progress("headers", i + 1, files.length);
  }

  // The tensors the engine binds: only once every shard reads (else the list above says why).
  if (cfg && damaged.length === 0 && files.length > 0) {
    try {
      const ckpt = await Checkpoint.open(dir);
      try {
        checkCheckpoint(cfg, ckpt);
      } finally {
        ckpt.close();
      }
    } catch (e) {
      problems.push((e as Error).message);
    }
  }
  if (files.length === 0) problems.push(`${dir}: no *.safetensors files`);

  const released = cfg !== undefined && cfg.numLayers === 93 && cfg.hiddenSize === 7168 &&
    cfg.moe.numExperts === 896;
  if (released && damaged.length === 0) {
    const want: [string, number, number][] = [
      ["shards", files.length, CHECKPOINT_SHARDS],
      ["tensors", tensors.length, CHECKPOINT_TENSORS],
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
  if (damaged.length) {
    problems.push(
      `download ${damaged.length === 1 ? "that shard" : `those ${damaged.length} shards`} again: ` +
        `k3 pull <repo> ${dir} (it verifies what is there and fetches only what is missing or wrong)`,
    );
  }
  const shardCount = index ? `${whole} of ${index.size} shards whole` : `${files.length} shards`;
  const lines = [
    `${dir}: ${shardCount}, ${total.toLocaleString("en-US")} bytes, ${
      tensors.length.toLocaleString("en-US")
    } tensors; ` +
    (problems.length
      ? `${problems.length} problem(s)`
      : released
      ? "the released Kimi K3, complete"
      : "complete (not the released shape)"),
  ];
  return { lines, problems, trunkBytes: released ? TRUNK_BYTES : trunkBytesOf(tensors) };
}
