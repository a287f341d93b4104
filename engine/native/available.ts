/**
 * How much memory this process can still use: MemAvailable and the process's cgroup limits,
 * the smaller of the two, probed once when a model is opened (engine/open.ts) or by
 * `k3 doctor`. The memory plan itself (engine/weights/plan.ts) only takes the figure.
 *
 * @module
 */

import { type CgroupMemory, cgroupMemory } from "./cgroup.ts";

/** Bytes as the plan and its refusals say them (GB, MB, kB: powers of ten). */
export function bytesText(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}

/** Memory this process can still use, and where the figure comes from. */
export interface Availability {
  /** Bytes available. */
  bytes: number;
  /** Where the figure comes from, for messages: "MemAvailable", or the cgroup limit. */
  source: string;
  /** The tightest cgroup limit, when there is one (whether or not it is the smaller). */
  cgroup?: CgroupMemory;
}

/**
 * Available memory: the smaller of MemAvailable (Deno.systemMemoryInfo; /proc itself is
 * readable only with --allow-all) and what the process's cgroups still allow (cgroup.ts:
 * limit - usage + inactive page cache, v1 and v2, every ancestor). Undefined when neither is
 * known. (A caller that plans against another figure, e.g. the CLI's K3_MEM_AVAILABLE_GB,
 * passes it instead: engine/open.ts OpenOptions.memoryAvailable.)
 */
export function memoryAvailability(): Availability | undefined {
  let sys: number | undefined;
  try {
    sys = Deno.systemMemoryInfo().available || undefined;
  } catch {
    sys = undefined;
  }
  let cg: CgroupMemory | undefined;
  try {
    cg = cgroupMemory();
  } catch {
    cg = undefined; // no kernel library: MemAvailable alone
  }
  if (cg && (sys === undefined || cg.remaining < sys)) {
    return { bytes: cg.remaining, source: cgroupText(cg), cgroup: cg };
  }
  return sys === undefined ? undefined : { bytes: sys, source: "MemAvailable", cgroup: cg };
}

/** "cgroup v1 /k3-test limit 150.0 MB, 80.1 MB in use, 2.0 MB of it reclaimable cache". */
export function cgroupText(cg: CgroupMemory): string {
  return `cgroup ${cg.version} ${cg.cgroup} limit ${bytesText(cg.limit)}, ${bytesText(cg.usage)} in use` +
    (cg.reclaimable > 0 ? `, ${bytesText(cg.reclaimable)} of it reclaimable cache` : "");
}
