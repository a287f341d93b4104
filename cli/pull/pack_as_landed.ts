/**
 * `k3 pull --pack`: the trunk laid out from the shards' headers before the shards are
 * fetched (a ranged GET of each shard's first bytes: the 8-byte header length, then the
 * JSON header), then packed region by region as the shards land and verify
 * (pack/incremental.ts), its progress on the pull's progress block.
 *
 * @module
 */

import { K3Error } from "../../engine/errors.ts";
import { readFull } from "../../engine/weights/safetensors.ts";
import type { TrunkCodec } from "../../engine/weights/manifest.ts";
import { type ComingShard, IncrementalPack } from "../../pack/incremental.ts";
import { fetchBytes, type HubClient, type HubFile, resolveUrl } from "./hub.ts";
import type { PullProgress } from "./progress.ts";

/** The first request asks for this much: the header length and, mostly, the whole header. */
const FIRST_BYTES = 64 * 1024;

/** Header requests in flight at once. */
const HEADERS_AT_ONCE = 8;

/** The largest header read (as engine/weights/safetensors.ts accepts). */
const MAX_HEADER_BYTES = 256 * 1024 * 1024;

/** True for the files `k3 pack` reads as shards: `*.safetensors` at the top of the directory. */
export function isShard(f: HubFile): boolean {
  return f.path.endsWith(".safetensors") && !f.path.includes("/");
}

/** The header's length from a shard's first 8 bytes, checked against the file's size. */
function headerLength(first8: Uint8Array, size: number, what: string): number {
  const len = Number(new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true));
  if (len < 2 || len > MAX_HEADER_BYTES || 8 + len > size) {
    throw new K3Error(`pull: ${what}: header length ${len} does not fit in a file of ${size} bytes`);
  }
  return len;
}

/**
 * The first 8 + N bytes of a shard on the hub: its header length and JSON header, in one
 * ranged GET of `firstBytes` when the header fits, else a second for the rest.
 */
export async function shardHead(
  hub: HubClient,
  repo: string,
  commit: string,
  f: HubFile,
  firstBytes = FIRST_BYTES,
): Promise<Uint8Array> {
  const url = resolveUrl(hub, repo, commit, f.path);
  const first = await fetchBytes(hub, url, f.path, 0, Math.min(f.size, firstBytes));
  if (first.length < 8) {
    throw new K3Error(`pull: ${f.path}: the hub served ${first.length} bytes, not a safetensors header`);
  }
  const len = headerLength(first, f.size, f.path);
  if (8 + len <= first.length) return first.slice(0, 8 + len);
  const head = new Uint8Array(8 + len);
  head.set(first);
  const rest = await fetchBytes(hub, url, f.path, first.length, head.length - first.length);
  if (rest.length !== head.length - first.length) throw new K3Error(`pull: ${f.path}: the hub ended its header early`);
  head.set(rest, first.length);
  return head;
}

/** The same bytes of a shard already on disk (verified before: no request for it). */
async function localHead(path: string, size: number): Promise<Uint8Array> {
  const file = await Deno.open(path, { read: true });
  try {
    const first = new Uint8Array(8);
    await readFull(file, first, 0, path);
    const head = new Uint8Array(8 + headerLength(first, size, path));
    head.set(first);
    await readFull(file, head.subarray(8), 8, path);
    return head;
  } finally {
    file.close();
  }
}

/**
 * Fetches every shard's header (`verified` ones read from `dir`) and starts the pack into
 * `trunkDir` (config.json must be in `dir` already); the pack's progress and notes go to
 * `progress`.
 */
export async function startPack(
  hub: HubClient,
  repo: string,
  commit: string,
  dir: string,
  trunkDir: string,
  shards: HubFile[],
  codec: TrunkCodec | "auto",
  progress: PullProgress,
  verified: (f: HubFile) => boolean,
): Promise<IncrementalPack> {
  // A few headers at a time: each is a round trip or two, and there are 96 of them; a
  // shard verified before and unchanged since gives its own.
  const coming: ComingShard[] = new Array(shards.length);
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < shards.length; i = next++) {
      const f = shards[i];
      const head = verified(f) ? await localHead(`${dir}/${f.path}`, f.size) : await shardHead(hub, repo, commit, f);
      coming[i] = { name: f.path, bytes: f.size, sha256: f.sha256, head };
    }
  };
  await Promise.all(Array.from({ length: Math.min(HEADERS_AT_ONCE, shards.length) }, worker));
  const pack = await IncrementalPack.start(dir, trunkDir, coming, {
    codec,
    log: (line) => progress.note(line),
    onPacked: (n) => progress.packed(n),
  });
  progress.packTotal = pack.total;
  return pack;
}
