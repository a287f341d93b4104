/**
 * The conversation state cache's flags (`k3 serve`, `k3 batch`) and the cache they open:
 * `--state-cache-gb` (RAM, in the memory plan), `--state-cache-dir` (spill files) and
 * `--state-cache-disk-gb` (their bound).
 *
 * @module
 */

import type { FlagGroup } from "./flags.ts";
import { usageError } from "../engine/errors.ts";
import { StateCache } from "../engine/generate/state_cache.ts";
import { modelFingerprint } from "../engine/generate/state_file.ts";
import type { OpenedModel } from "../engine/open.ts";
import { bytesText } from "../engine/native/available.ts";
import { numFlag } from "./common.ts";

/** The state cache group. */
export const STATE_CACHE_GROUP: FlagGroup = {
  name: "state cache",
  title: "state cache (exact token prefixes; never changes a token)",
  column: 25,
  flags: {
    "state-cache-gb": {
      type: "string",
      value: "X",
      help: "GB of RAM for kept states, in the memory plan (default: half of\n" +
        "what the plan leaves, at most 8; 0 turns the cache off)",
    },
    "state-cache-dir": {
      type: "string",
      value: "DIR",
      help: "write states evicted from RAM here (saved-state files, verified\n" +
        "when read back; a restart finds them again)",
    },
    "state-cache-disk-gb": {
      type: "string",
      value: "X",
      help: "GB of spill files at most (default 50; oldest used go first)",
    },
  },
};

/** What the flags asked for. */
export interface StateCacheFlags {
  /** GB of RAM (undefined: the plan's default; 0: off). */
  gb?: number;
  /** Spill directory. */
  dir?: string;
  /** GB of spill files at most. */
  diskGB: number;
}

/** Parses the flags; a bound without a directory or a bad number is a usage error. */
export function stateCacheFlags(values: Record<string, unknown>): StateCacheFlags {
  const str = (k: string) => values[k] as string | undefined;
  const gb = str("state-cache-gb");
  const dir = str("state-cache-dir");
  const disk = str("state-cache-disk-gb");
  if (disk !== undefined && dir === undefined) throw usageError("--state-cache-disk-gb needs --state-cache-dir");
  if (dir !== undefined && dir.length === 0) throw usageError("--state-cache-dir: the path is empty");
  return {
    gb: gb === undefined ? undefined : numFlag("state-cache-gb", gb, 0, 1e6),
    dir,
    diskGB: disk === undefined ? 50 : numFlag("state-cache-disk-gb", disk, 0, 1e9),
  };
}

/**
 * The cache the flags and the model's plan give (undefined: off), its spill directory
 * indexed; `log` gets one line saying what it holds.
 */
export async function openStateCache(
  opened: OpenedModel,
  flags: StateCacheFlags,
  log: (line: string) => void,
): Promise<StateCache | undefined> {
  const ramBytes = opened.plan.stateCache?.bytes ?? 0;
  if (flags.gb === 0 || (ramBytes === 0 && !flags.dir)) {
    log("state cache: off");
    return undefined;
  }
  const cache = new StateCache(opened.model, {
    ramBytes,
    dir: flags.dir,
    diskBytes: flags.diskGB * 1e9,
    fingerprint: flags.dir ? await modelFingerprint(opened) : undefined,
    log,
  });
  try {
    await cache.index();
  } catch (e) {
    throw usageError(`--state-cache-dir ${flags.dir}: ${(e as Error).message}`);
  }
  const s = cache.stats;
  log(
    `state cache: ${bytesText(ramBytes)} RAM${
      flags.dir
        ? `, spills to ${flags.dir} (at most ${bytesText(flags.diskGB * 1e9)}; ${s.diskEntries} kept from before)`
        : ""
    }`,
  );
  return cache;
}
