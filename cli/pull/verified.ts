/**
 * What `k3 pull` has verified in a directory: `DIR/.k3-pull-verified.json` maps each file
 * to its size, modification time and the hub's hash it matched. A later pull trusts a file
 * whose size and time are unchanged and whose hash is still the hub's, without hashing it
 * again, so a re-pull of a complete, untouched directory takes seconds, not the hours of
 * reading 1.56 TB. Anything that rewrote a file changes its time and makes it hashed again;
 * `--verify` hashes every file regardless (bit rot keeps the time).
 *
 * @module
 */

import type { HubFile } from "./hub.ts";

/** The record's name in the model directory. */
export const VERIFIED_FILE = ".k3-pull-verified.json";

/** One verified file. */
interface Entry {
  size: number;
  mtimeMs: number;
  /** The hub's hash it matched (SHA-256 or git blob id). */
  hash: string;
}

/** The hash `k3 pull` checks a file against (empty when the hub lists none). */
function hubHash(f: HubFile): string {
  return f.sha256 ?? f.blobId ?? "";
}

/** The size and modification time of `path`, or undefined when it is not a file. */
function stamp(path: string): { size: number; mtimeMs: number } | undefined {
  try {
    const s = Deno.statSync(path);
    return s.isFile && s.mtime ? { size: s.size, mtimeMs: s.mtime.getTime() } : undefined;
  } catch {
    return undefined;
  }
}

/** The record of one directory (see the module doc). */
export class VerifiedRecord {
  readonly #path: string;
  readonly #entries: Record<string, Entry>;

  /** Reads `dir`'s record; `ignore` (--verify) starts from an empty one. */
  constructor(readonly dir: string, ignore = false) {
    this.#path = `${dir}/${VERIFIED_FILE}`;
    let entries: Record<string, Entry> = {};
    if (!ignore) {
      try {
        const j = JSON.parse(Deno.readTextFileSync(this.#path));
        if (typeof j === "object" && j !== null && !Array.isArray(j)) entries = j;
      } catch { /* none yet, or unreadable: everything is hashed */ }
    }
    this.#entries = entries;
  }

  /** True when `f` is on disk as it was when it was verified against the same hash. */
  unchanged(f: HubFile): boolean {
    const e = this.#entries[f.path];
    const now = stamp(`${this.dir}/${f.path}`);
    return e !== undefined && now !== undefined && hubHash(f) !== "" && e.hash === hubHash(f) &&
      e.size === f.size && now.size === e.size && now.mtimeMs === e.mtimeMs;
  }

  /** Records `f` as verified as it is on disk now (and saves the record). */
  add(f: HubFile): void {
    const now = stamp(`${this.dir}/${f.path}`);
    if (!now || hubHash(f) === "") return;
    this.#entries[f.path] = { ...now, hash: hubHash(f) };
    this.#save();
  }

  /** Forgets `f` (it is being replaced). */
  forget(f: HubFile): void {
    if (!(f.path in this.#entries)) return;
    delete this.#entries[f.path];
    this.#save();
  }

  /** Writes the record (to a temporary name, then renamed: never half a record). */
  #save(): void {
    const tmp = `${this.#path}.tmp`;
    try {
      Deno.writeTextFileSync(tmp, JSON.stringify(this.#entries, null, 1) + "\n");
      Deno.renameSync(tmp, this.#path);
    } catch {
      // A record that cannot be written only costs the next pull a re-hash.
      try {
        Deno.removeSync(tmp);
      } catch { /* not there */ }
    }
  }
}
