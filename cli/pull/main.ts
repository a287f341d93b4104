/**
 * `k3 pull REPO DIR`: a model from the Hugging Face Hub (or a mirror, HF_ENDPOINT) into
 * DIR, every file verified against the hub's hash before it counts, resumable after any
 * interruption, several files at once; with `--pack TRUNK`, the trunk packed as each shard
 * lands (cli/pull/pack_as_landed.ts). Run again on the same DIR it verifies what is there
 * (trusting what it verified before and is unchanged since, cli/pull/verified.ts) and
 * fetches only what is missing or wrong.
 *
 * Its phases: the revision's file list (cli/pull/hub.ts), the files to fetch (`--text-only`
 * drops those only vision needs), free space for them and the trunk, the transfers
 * (cli/pull/transfer.ts) with their progress; with `--pack` the small files first, then the
 * shards' headers, then the shards, each packed as it lands.
 *
 * @module
 */

import { statfsSync } from "node:fs";
import { EXIT, K3Error, usageError } from "../../engine/errors.ts";
import { isRegularFile } from "../../engine/native/files.ts";
import type { IncrementalPack } from "../../pack/incremental.ts";
import { CHECKPOINT_BYTES, TRUNK_BYTES } from "../doctor/facts.ts";
import { type CommandFlags, commandFlags } from "../flags.ts";
import { fmtSize, info, transferLine } from "../progress.ts";
import { checkRepo, type HubClient, type HubFile, hubFromEnv, listRevision } from "./hub.ts";
import { transferFile, type TransferResult } from "./transfer.ts";
import { PullProgress } from "./progress.ts";
import { VerifiedRecord } from "./verified.ts";
import { isShard, startPack } from "./pack_as_landed.ts";

/** `k3 pull`'s flags and help. */
export const PULL_FLAGS: CommandFlags = commandFlags({
  name: "pull",
  head: `usage: k3 pull <repo> <dir> [--revision REV] [--text-only] [--pack TRUNK_DIR [--codec C]]
                  [--jobs N] [--verify]

Downloads the model <repo> (OWNER/NAME on the Hugging Face Hub) into <dir>. Every file is
checked against the hub's SHA-256 (LFS) or git blob id before it counts; a transfer that
stops (network, Ctrl-C, a full disk) resumes from its <file>.part on the next run; run on a
directory that holds the model, it checks every file (those verified before and unchanged
since by their size and time, all of them with --verify) and fetches only what is missing
or wrong. With --pack the trunk is packed as each shard lands and verifies. Free space for
the files (and, with --pack, the trunk) is checked before the first shard. HF_TOKEN=... is sent to the hub as a Bearer token (gated or private models);
HF_ENDPOINT=URL uses a mirror.`,
  groups: [{
    name: "pull",
    title: "",
    column: 20,
    flags: {
      revision: { type: "string", value: "REV", help: "branch, tag or commit (default main)" },
      "text-only": {
        type: "boolean",
        help: "skip what only the vision tower needs (its shards and processor files)",
      },
      pack: {
        type: "string",
        value: "TRUNK_DIR",
        help: "pack the trunk there as the shards land (the trunk k3 pack <dir>\n" +
          "TRUNK_DIR makes; an interrupted pull resumes its pack too)",
      },
      codec: { type: "string", value: "C", help: "with --pack: auto, raw or split (as k3 pack --codec)" },
      verify: { type: "boolean", help: "hash every file on disk again, even those recorded as verified" },
      jobs: { type: "string", value: "N", help: "files downloaded at once (default 4, 1-16)" },
    },
  }],
  tail: `examples:
  k3 pull moonshotai/Kimi-K3 /data/kimi-k3 --pack /data/k3-trunk
  HF_ENDPOINT=https://mirror.example k3 pull moonshotai/Kimi-K3 /data/kimi-k3 --text-only`,
});

/** The index that maps tensors to shards. */
const INDEX = "model.safetensors.index.json";

/** Files only the vision tower reads (its processor configuration and code). */
const VISION_FILE =
  /(^|\/)((video_)?pre_?processor_config\.json|processor_config\.json|[\w-]*(image|video)_process[\w-]*\.py|media_utils\.py)$/;

/** Tensors the text model never reads (K3-MODEL.md §3). */
const VISION_TENSOR = /^(vision_tower|mm_projector)\./;

/**
 * The files to fetch: all of the revision's, or with `textOnly` all but the vision
 * processor files and the shards that hold only vision tensors (by the index's map).
 */
export function selectFiles(files: HubFile[], textOnly: boolean, weightMap?: Record<string, string>): HubFile[] {
  if (!textOnly) return files;
  const textShards = new Set<string>(), anyShard = new Set<string>();
  for (const [tensor, shard] of Object.entries(weightMap ?? {})) {
    anyShard.add(shard);
    if (!VISION_TENSOR.test(tensor)) textShards.add(shard);
  }
  return files.filter((f) => !VISION_FILE.test(f.path) && !(anyShard.has(f.path) && !textShards.has(f.path)));
}

/** Free bytes on the filesystem that holds `path` (or would: its nearest existing parent). */
function freeAt(path: string): { free: number; dev: number; where: string } {
  let where = path;
  for (;;) {
    try {
      const dev = Deno.statSync(where).dev;
      const s = statfsSync(where);
      return { free: Number(s.bavail) * Number(s.bsize), dev, where };
    } catch (e) {
      const up = where.replace(/\/[^/]*\/?$/, "");
      if (up === where || up === "") {
        if (where !== "/" && !where.startsWith("/")) {
          where = ".";
          continue;
        }
        throw new K3Error(`pull: cannot find the disk of ${path}: ${(e as Error).message}`);
      }
      where = up;
    }
  }
}

/** Bytes the files still need in `dir`: their sizes less what is already there. */
function stillNeeded(files: HubFile[], dir: string): number {
  let need = 0;
  for (const f of files) {
    let have = 0;
    for (const p of [`${dir}/${f.path}`, `${dir}/${f.path}.part`]) {
      try {
        have = Math.max(have, Math.min(Deno.statSync(p).size, f.size));
      } catch { /* absent */ }
    }
    need += f.size - have;
  }
  return need;
}

/**
 * The trunk `k3 pack` makes from these shards: the released model's measured size, else
 * the shards' total (a bound: the trunk is the part of them that is not routed experts).
 */
export function trunkEstimate(files: HubFile[]): number {
  const shards = files.filter((f) => f.path.endsWith(".safetensors")).reduce((a, f) => a + f.size, 0);
  return shards === CHECKPOINT_BYTES ? TRUNK_BYTES : shards;
}

/** Refuses to start when the disks cannot hold what is to come. */
function checkSpace(dir: string, need: number, trunk?: { dir: string; bytes: number }): void {
  const d = freeAt(dir);
  const t = trunk ? freeAt(trunk.dir) : undefined;
  const sameDisk = t !== undefined && t.dev === d.dev;
  const atDir = need + (sameDisk ? trunk!.bytes : 0);
  const parts = `${fmtSize(need)} for the files${sameDisk ? ` and ${fmtSize(trunk!.bytes)} for the trunk` : ""}`;
  if (atDir > d.free) {
    throw new K3Error(
      `pull: ${dir} needs ${fmtSize(atDir)} (${parts}), its disk has ${
        fmtSize(d.free)
      } free; free space or choose another directory`,
    );
  }
  if (t && !sameDisk && trunk!.bytes > t.free) {
    throw new K3Error(
      `pull: the trunk needs ${fmtSize(trunk!.bytes)} at ${trunk!.dir}, its disk has ${fmtSize(t.free)} free`,
    );
  }
}

/** Reads the index's tensor-to-shard map (after it is downloaded). */
function readWeightMap(dir: string): Record<string, string> | undefined {
  if (!isRegularFile(`${dir}/${INDEX}`)) return undefined;
  try {
    const j = JSON.parse(Deno.readTextFileSync(`${dir}/${INDEX}`));
    return typeof j?.weight_map === "object" && j.weight_map !== null ? j.weight_map : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Runs the transfers, `jobs` at a time, small files first; stops taking new ones on a
 * failure. `landed` runs once each file is verified and in place, before its worker takes
 * the next file.
 */
async function transferAll(
  run: PullRun,
  files: HubFile[],
  jobs: number,
  landed?: (f: HubFile) => Promise<void>,
): Promise<Map<TransferResult, number>> {
  const { hub, repo, commit, dir, progress, verified } = run;
  // Small files first; but shards to pack in name order, the order a checkpoint's layers
  // are written in, so the trunk's regions complete (and pack) as early as they can.
  const queue = landed
    ? [...files].sort((a, b) => a.path.localeCompare(b.path))
    : [...files].sort((a, b) => a.size - b.size || a.path.localeCompare(b.path));
  const results = new Map<TransferResult, number>();
  let failure: unknown;
  const worker = async () => {
    for (let f = queue.shift(); f && failure === undefined; f = queue.shift()) {
      progress.begin(f.path, f.size);
      try {
        let r: TransferResult = "unchanged";
        if (verified.unchanged(f)) progress.bytes(f.path, f.size, false);
        else {
          r = await transferFile(hub, repo, commit, f, dir, {
            bytes: (n, fetched) => progress.bytes(f!.path, n, fetched),
            note: (line) => progress.note(line),
          });
          verified.add(f);
        }
        results.set(r, (results.get(r) ?? 0) + 1);
        progress.end(f.path, r);
        // Verified and in place: what it holds may be used now (pull --pack packs it).
        await landed?.(f);
      } catch (e) {
        failure ??= e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(jobs, Math.max(queue.length, 1)) }, worker));
  progress.finish();
  if (failure !== undefined) throw failure;
  return results;
}

/** What every transfer of one pull shares. */
interface PullRun {
  hub: HubClient;
  repo: string;
  /** The commit the revision resolved to. */
  commit: string;
  /** The model directory. */
  dir: string;
  progress: PullProgress;
  /** The files verified before, and unchanged since, are not hashed again. */
  verified: VerifiedRecord;
}

/** Runs `k3 pull`; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const flags = PULL_FLAGS.parse(args);
  if (flags.bool("help")) {
    console.log(PULL_FLAGS.usage());
    return EXIT.ok;
  }
  if (flags.positionals.length !== 2) throw usageError("pull: expected <repo> <dir> (see k3 pull --help)");
  const [repo, dir] = flags.positionals;
  checkRepo(repo);
  const jobsText = flags.str("jobs") ?? "4";
  const jobs = Number(jobsText);
  if (!/^\d+$/.test(jobsText) || jobs < 1 || jobs > 16) throw usageError(`pull: --jobs ${jobsText}: expected 1-16`);
  const trunkDir = flags.str("pack");
  const codec = flags.str("codec") ?? "auto";
  if (codec !== "auto" && codec !== "raw" && codec !== "split") {
    throw usageError(`pull: --codec ${JSON.stringify(codec)}: expected auto, raw or split`);
  }
  if (flags.str("codec") !== undefined && trunkDir === undefined) throw usageError("pull: --codec needs --pack");
  const revision = flags.str("revision") ?? "main";
  try {
    if (Deno.statSync(dir).isDirectory === false) throw usageError(`pull: ${dir} exists and is not a directory`);
  } catch (e) {
    if (e instanceof K3Error) throw e;
  }

  const progress = new PullProgress();
  const hub = hubFromEnv((line) => progress.note(line));
  const listing = await listRevision(hub, repo, revision);
  Deno.mkdirSync(dir, { recursive: true });
  info(`pull: ${repo} at ${revision} (commit ${listing.commit.slice(0, 12)}) into ${dir}`);

  // The index first (it is small): --text-only needs its map before choosing shards.
  const index = listing.files.find((f) => f.path === INDEX);
  const run: PullRun = {
    hub,
    repo,
    commit: listing.commit,
    dir,
    progress,
    verified: new VerifiedRecord(dir, flags.bool("verify")),
  };
  let results = new Map<TransferResult, number>();
  if (index) {
    progress.setTotal(index.size);
    results = await transferAll(run, [index], 1);
  }
  const files = selectFiles(listing.files, flags.bool("text-only"), readWeightMap(dir)).filter((f) => f !== index);
  const skipped = listing.files.length - files.length - (index ? 1 : 0);
  const trunk = trunkDir === undefined ? undefined : { dir: trunkDir, bytes: trunkEstimate(files) };
  checkSpace(dir, stillNeeded(files, dir), trunk);

  progress.setTotal(files.reduce((a, f) => a + f.size, 0) + (index?.size ?? 0));
  const add = (more: Map<TransferResult, number>) => {
    for (const [r, n] of more) results.set(r, (results.get(r) ?? 0) + n);
  };
  let pack: IncrementalPack | undefined;
  try {
    if (trunkDir === undefined) add(await transferAll(run, files, jobs));
    else {
      // The small files first (the pack needs config.json), then each shard's header, then
      // the shards, each packed into the trunk as it lands.
      const shards = files.filter(isShard);
      add(await transferAll(run, files.filter((f) => !isShard(f)), jobs));
      pack = await startPack(
        hub,
        repo,
        listing.commit,
        dir,
        trunkDir,
        shards,
        codec,
        progress,
        (f) => run.verified.unchanged(f),
      );
      const packer = pack;
      add(await transferAll(run, shards, jobs, (f) => packer.landed(f.path)));
    }
  } catch (e) {
    pack?.close();
    throw e;
  }
  const count = (r: TransferResult) => results.get(r) ?? 0;
  info(
    `pull: ${dir}: ${files.length + (index ? 1 : 0)} files, ${fmtSize(progress.total)}, every one verified ` +
      `(${count("fetched")} downloaded, ${count("resumed")} resumed, ${count("repaired")} repaired, ${
        count("present") + count("unchanged")
      } already there${skipped ? `; ${skipped} vision-only skipped` : ""})`,
  );
  if (progress.fetchedBytes > 0) {
    info(transferLine("pull: transferred", progress.fetchedBytes, progress.fetchedBytes, progress.rate()));
  }
  if (pack) {
    try {
      await pack.finish();
    } finally {
      pack.close();
    }
  }
  return EXIT.ok;
}
