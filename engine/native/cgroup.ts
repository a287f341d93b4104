/**
 * The memory a cgroup still lets this process use: the smallest remaining limit of the
 * process's memory cgroup and every ancestor, cgroup v2 or v1, read-only. A run under a
 * container or systemd limit is OOM-killed at the limit, whatever MemAvailable says.
 *
 * Where things are: `/proc/self/cgroup` names the process's cgroup per hierarchy (v2
 * `0::/path`, v1 `N:memory:/path`), `/proc/self/mountinfo` where each hierarchy is mounted
 * and which part of it the mount shows. From the process's directory up to the mount's
 * top, each level's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`; `max` or v1's
 * ~2^63 sentinel = no limit) minus its usage (`memory.current`, `memory.usage_in_bytes`)
 * is what that level leaves; the smallest wins.
 *
 * Page cache: usage counts it, but the kernel reclaims cache before it OOM-kills. We count
 * the level's inactive file pages (`inactive_file` in `memory.stat`; v1 `total_inactive_file`,
 * the hierarchical figure) as free, as the kubelet's working set (usage - inactive_file)
 * does: those are the pages reclaimed first and cheaply; active file pages are hot (often
 * our own mapped weights), so counting them would promise memory that costs thrashing.
 *
 * Files are read through a reader passed in (the native one by default), under a root
 * directory passed in, so tests run the parser on fake trees.
 *
 * @module
 */

import { readSmallFile } from "./io.ts";

/** The tightest cgroup memory limit on this process. */
export interface CgroupMemory {
  /** "v1" or "v2". */
  version: "v1" | "v2";
  /** The cgroup (path inside its hierarchy) whose limit is tightest. */
  cgroup: string;
  /** Its limit in bytes. */
  limit: number;
  /** Its usage in bytes (page cache included). */
  usage: number;
  /** Inactive page cache in it, counted as free. */
  reclaimable: number;
  /** What it leaves: limit - usage + reclaimable, at least 0. */
  remaining: number;
}

/** Reads a small text file; undefined when it cannot be read. */
export type SmallFileReader = (path: string) => string | undefined;

/** Values at or above this are v1's "no limit" (PAGE_COUNTER_MAX pages, ~2^63 bytes). */
const V1_UNLIMITED = 2 ** 60;

/** Undoes mountinfo's octal escapes (`\040` for a space). */
function unescapeMount(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
}

/** A cgroup mount from /proc/self/mountinfo. */
export interface CgroupMount {
  /** cgroup2, or cgroup v1 with the memory controller. */
  version: "v1" | "v2";
  /** The part of the hierarchy it shows. */
  root: string;
  /** Where it is mounted. */
  point: string;
}

/** The cgroup2 mounts and the cgroup v1 mounts carrying the memory controller. */
export function parseMountinfo(text: string): CgroupMount[] {
  const mounts: CgroupMount[] = [];
  for (const line of text.split("\n")) {
    const f = line.split(" ");
    const dash = f.indexOf("-");
    if (dash < 5 || dash + 1 >= f.length) continue;
    const fstype = f[dash + 1], superOpts = (f[dash + 3] ?? "").split(",");
    const version = fstype === "cgroup2" ? "v2" : fstype === "cgroup" && superOpts.includes("memory") ? "v1" : null;
    if (version) mounts.push({ version, root: unescapeMount(f[3]), point: unescapeMount(f[4]) });
  }
  return mounts;
}

/** The process's memory cgroup paths from /proc/self/cgroup: the v2 one and the v1 memory one. */
export function parseProcCgroup(text: string): { v2?: string; v1?: string } {
  const out: { v2?: string; v1?: string } = {};
  for (const line of text.split("\n")) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line);
    if (!m) continue;
    if (m[1] === "0" && m[2] === "") out.v2 = m[3];
    else if (m[2].split(",").includes("memory")) out.v1 = m[3];
  }
  return out;
}

/** A byte count in a cgroup file: a non-negative integer, or "max" (Infinity). */
function bytesOf(text: string | undefined): number | undefined {
  const t = text?.trim();
  if (t === undefined) return undefined;
  if (t === "max") return Infinity;
  if (!/^\d+$/.test(t)) return undefined;
  return Number(t);
}

/** One key of a memory.stat file. */
function statOf(text: string | undefined, key: string): number | undefined {
  const m = text === undefined ? null : new RegExp(`^${key} (\\d+)$`, "m").exec(text);
  return m ? Number(m[1]) : undefined;
}

/** The levels of `path` inside a mount showing `root`, deepest first, as [cgroup, dir]. */
function levels(mount: CgroupMount, path: string, rootDir: string): [string, string][] {
  const base = mount.root === "/" ? "" : mount.root.replace(/\/+$/, "");
  if (base !== "" && path !== base && !path.startsWith(base + "/")) return [];
  const rel = path.slice(base.length).split("/").filter((x) => x !== "");
  const out: [string, string][] = [];
  for (let n = rel.length; n >= 0; n--) {
    const sub = rel.slice(0, n).join("/");
    out.push([`${base}/${sub}`.replace(/\/+$/, "") || "/", `${rootDir}${mount.point}${sub ? "/" + sub : ""}`]);
  }
  return out;
}

/**
 * The tightest memory limit of this process's cgroups (v2 and v1, every ancestor), or
 * undefined when no level has a limit (or nothing can be read). `rootDir` prefixes every
 * path read (a fake tree in tests; "" for the real one).
 */
export function cgroupMemory(rootDir = "", read: SmallFileReader = readSmallFile): CgroupMemory | undefined {
  const procCgroup = read(`${rootDir}/proc/self/cgroup`);
  const mountinfo = read(`${rootDir}/proc/self/mountinfo`);
  if (procCgroup === undefined || mountinfo === undefined) return undefined;
  const paths = parseProcCgroup(procCgroup);
  let best: CgroupMemory | undefined;
  for (const mount of parseMountinfo(mountinfo)) {
    const path = mount.version === "v2" ? paths.v2 : paths.v1;
    if (path === undefined) continue;
    const [limitFile, usageFile, cacheKey] = mount.version === "v2"
      ? ["memory.max", "memory.current", "inactive_file"]
      : ["memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"];
    for (const [cgroup, dir] of levels(mount, path, rootDir)) {
      const limit = bytesOf(read(`${dir}/${limitFile}`));
      if (limit === undefined || limit === Infinity || limit >= V1_UNLIMITED) continue;
      const usage = bytesOf(read(`${dir}/${usageFile}`)) ?? 0;
      const reclaimable = Math.min(usage, statOf(read(`${dir}/memory.stat`), cacheKey) ?? 0);
      const remaining = Math.max(0, limit - usage + reclaimable);
      if (!best || remaining < best.remaining) {
        best = { version: mount.version, cgroup, limit, usage, reclaimable, remaining };
      }
    }
  }
  return best;
}
