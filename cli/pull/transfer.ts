/**
 * One file of `k3 pull`: downloaded into `PATH.part` with ranged requests that resume
 * where the part ends (after a dropped connection in this run, or a killed run before),
 * hashed as it is written, and renamed to PATH only once its hash matches the hub's (the
 * LFS SHA-256, or the git blob id of a small file). `PATH.part.json` names what the part
 * is a part of, so a part of another revision's file is started over, never appended to.
 * A file already at PATH is verified the same way: kept when it matches, resumed when it
 * is short, fetched again when it is wrong.
 *
 * @module
 */

import { createHash, type Hash } from "node:crypto";
import { EXIT, K3Error } from "../../engine/errors.ts";
import { writeAllSync, writeFailure } from "../../engine/native/files.ts";
import { type HubClient, type HubFile, hubGet, resolveUrl } from "./hub.ts";

/** What a transfer reports as it goes. */
export interface TransferEvents {
  /** `n` more bytes of the file are in place (negative when a part is discarded);
   * `fetched`: they came over the network (else they were already on disk). */
  bytes(n: number, fetched: boolean): void;
  /** A one-line note (a retry, a wrong hash). */
  note(line: string): void;
}

/** How a file ended up in place ("unchanged": as it was when an earlier pull verified it,
 * cli/pull/verified.ts, so not hashed again). */
export type TransferResult = "present" | "unchanged" | "fetched" | "resumed" | "repaired";

/** The hash the hub publishes for `file`, as a running hasher, and its expected digest. */
function hasher(file: HubFile): { hash: Hash | undefined; want: string | undefined; name: string } {
  if (file.sha256) return { hash: createHash("sha256"), want: file.sha256, name: "SHA-256" };
  if (file.blobId) {
    // Git's blob id: SHA-1 of "blob <size>\0" and the content.
    const h = createHash("sha1");
    h.update(`blob ${file.size}\0`);
    return { hash: h, want: file.blobId, name: "git blob id" };
  }
  return { hash: undefined, want: undefined, name: "size" };
}

function sizeOf(path: string): number | undefined {
  try {
    const s = Deno.statSync(path);
    return s.isFile ? s.size : undefined;
  } catch {
    return undefined;
  }
}

function removeQuietly(path: string): void {
  try {
    Deno.removeSync(path);
  } catch { /* already gone */ }
}

const READ_CHUNK = 8 * 1024 * 1024;

/** Feeds the first `length` bytes of `path` to `hash`, reporting them as present. */
async function hashExisting(path: string, length: number, hash: Hash | undefined, ev: TransferEvents): Promise<void> {
  const f = await Deno.open(path, { read: true });
  try {
    const buf = new Uint8Array(READ_CHUNK);
    let done = 0;
    while (done < length) {
      const n = await f.read(buf.subarray(0, Math.min(buf.length, length - done)));
      if (n === null) throw new K3Error(`pull: ${path} ended at ${done} bytes while being verified`);
      hash?.update(buf.subarray(0, n));
      done += n;
      ev.bytes(n, false);
    }
  } finally {
    f.close();
  }
}

/** The identity a part belongs to: size and the hub's hashes. */
function identity(file: HubFile): string {
  return JSON.stringify({ size: file.size, sha256: file.sha256 ?? null, blobId: file.blobId ?? null });
}

/** Downloads (or verifies) one file into `dir`; see the module doc. */
export async function transferFile(
  hub: HubClient,
  repo: string,
  commit: string,
  file: HubFile,
  dir: string,
  ev: TransferEvents,
): Promise<TransferResult> {
  const target = `${dir}/${file.path}`;
  const part = `${target}.part`, meta = `${part}.json`;
  const slash = target.lastIndexOf("/");
  Deno.mkdirSync(target.slice(0, slash), { recursive: true });

  // A file already in place: verified whole, or (short) carried on as a part.
  let repaired = false;
  const existing = sizeOf(target);
  if (existing !== undefined) {
    if (existing === file.size) {
      const h = hasher(file);
      await hashExisting(target, existing, h.hash, ev);
      if (h.hash === undefined || h.hash.digest("hex") === h.want) return "present";
      ev.bytes(-existing, false);
      ev.note(`pull: ${file.path}: its ${h.name} does not match the hub's; downloading it again`);
      removeQuietly(target);
    } else if (existing < file.size) {
      ev.note(`pull: ${file.path}: ${existing} of ${file.size} bytes on disk; resuming it`);
      Deno.renameSync(target, part);
      Deno.writeTextFileSync(meta, identity(file));
    } else {
      ev.note(`pull: ${file.path}: ${existing} bytes on disk, the hub's is ${file.size}; downloading it again`);
      removeQuietly(target);
    }
    repaired = true;
  }

  const url = resolveUrl(hub, repo, commit, file.path);
  for (let round = 1; round <= 2; round++) {
    // A part of this very file is resumed; anything else there is started over.
    let have = 0;
    const partSize = sizeOf(part);
    let sameFile = false;
    try {
      sameFile = Deno.readTextFileSync(meta) === identity(file);
    } catch { /* no meta: not ours */ }
    if (partSize !== undefined && sameFile && partSize <= file.size) have = partSize;
    else {
      removeQuietly(part);
      Deno.writeTextFileSync(meta, identity(file));
    }
    const resumed = have > 0;
    const h = hasher(file);
    if (have > 0) await hashExisting(part, have, h.hash, ev);

    const f = Deno.openSync(part, { write: true, create: true });
    try {
      f.truncateSync(have);
      f.seekSync(have, Deno.SeekMode.Start);
      let failures = 0;
      while (have < file.size) {
        // The bytes as stored (no transparent compression: a Range counts stored bytes).
        const headers: Record<string, string> = { "accept-encoding": "identity" };
        if (have > 0) headers.range = `bytes=${have}-`;
        const res = await hubGet(hub, url, file.path, headers);
        const from = res.status === 206 ? Number(res.headers.get("content-range")?.match(/^bytes (\d+)-/)?.[1]) : 0;
        if (from !== have) {
          // The server would not continue where the part ends: start the file over.
          ev.bytes(-have, false);
          f.truncateSync(0);
          f.seekSync(0, Deno.SeekMode.Start);
          have = 0;
          h.hash = hasher(file).hash;
          if (res.status !== 200) {
            await res.body?.cancel();
            continue;
          }
        }
        const before = have;
        try {
          for await (const chunk of res.body!) {
            if (have + chunk.length > file.size) {
              throw new K3Error(`pull: ${file.path}: the server sent more than the listed ${file.size} bytes`);
            }
            try {
              writeAllSync(f, chunk);
            } catch (e) {
              throw new K3Error(
                `pull: ${
                  writeFailure(part, file.size - have, e).message
                }; the part so far is kept: run k3 pull again to resume`,
                EXIT.runtime,
              );
            }
            h.hash?.update(chunk);
            have += chunk.length;
            ev.bytes(chunk.length, true);
          }
        } catch (e) {
          if (e instanceof K3Error) throw e;
          // A dropped connection: resume from where the part ends.
          failures = have > before ? 1 : failures + 1;
          if (failures >= hub.attempts) {
            throw new K3Error(`pull: ${file.path}: the transfer kept failing (${(e as Error).message})`);
          }
          ev.note(`pull: ${file.path}: transfer interrupted at ${have} bytes (${(e as Error).message}); resuming`);
          continue;
        }
        if (have < file.size) {
          failures = have > before ? 1 : failures + 1;
          if (failures >= hub.attempts) throw new K3Error(`pull: ${file.path}: the server keeps ending it early`);
          ev.note(`pull: ${file.path}: the response ended at ${have} of ${file.size} bytes; resuming`);
        }
      }
      f.syncSync();
    } finally {
      f.close();
    }
    const got = h.hash?.digest("hex");
    if (got === h.want) {
      Deno.renameSync(part, target);
      removeQuietly(meta);
      return repaired ? "repaired" : resumed ? "resumed" : "fetched";
    }
    ev.bytes(-file.size, false);
    removeQuietly(part);
    if (round === 1) ev.note(`pull: ${file.path}: ${h.name} ${got}, the hub's is ${h.want}; downloading it again`);
    else {
      removeQuietly(meta);
      throw new K3Error(
        `pull: ${file.path}: ${h.name} ${got} twice, the hub lists ${h.want}: the server or a proxy is corrupting it`,
      );
    }
  }
  throw new Error("unreachable");
}
