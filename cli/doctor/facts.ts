/**
 * What `k3 doctor` knows and concludes: the released checkpoint's totals, the memory each
 * preset needs, the disk still needed, this CPU and memory, and the problems that stop
 * the model from running here.
 *
 * @module
 */

import { fmtBytes } from "../common.ts";
import { releasedPlan } from "../presets.ts";
import { defaultLibraryPath } from "../../engine/native/ffi.ts";
import { cpuFlags } from "../../engine/native/libpath.ts";
import { readSmallFile } from "../../engine/native/io.ts";

/** The real checkpoint: 96 shards. */
export const CHECKPOINT_BYTES = 1_560_936_091_448;
/** Tensors in the released checkpoint. */
export const CHECKPOINT_TENSORS = 497_220;
/** Shards in the released checkpoint. */
export const CHECKPOINT_SHARDS = 96;
/** The packed trunk (`k3 pack`). */
export const TRUNK_BYTES = 113.5e9;
/** The shortest context worth running: below what the ultra plan needs for this many
 * positions, the machine cannot run the model at all. */
export const MIN_POSITIONS = 256;
/** One routed expert's read: 3 x 3072 x 3584 MXFP4 weights = 17,547,264 bytes (17.5 MB,
 * a multiple of 4096). */
export const EXPERT_READ = 17_547_264;

/** What doctor found, for the verdict. */
export interface Facts {
  /** Available memory in bytes (undefined: unknown). */
  memAvailable?: number;
  /** Total memory in bytes. */
  memTotal?: number;
  /** What the smallest plan (ultra, MIN_POSITIONS) needs, runtime included. */
  minNeed?: number;
  /** Free bytes on the disk measured. */
  diskFree?: number;
  /** The trunk still to pack: the checkpoint's own (doctor --checkpoint), else the released one's. */
  trunkBytes?: number;
  /** --dir already holds a checkpoint (model.safetensors.index.json). */
  hasCheckpoint: boolean;
  /** Why the kernel library could not be loaded, if it could not. */
  kernelError?: string;
}

/** What each fixed preset's memory plan needs for the full K3 (packed trunk) at
 * `positions`, runtime overhead included; the plan of engine/weights/plan.ts, as k3 presets shows. */
export function presetNeeds(positions: number): { name: string; bytes: number }[] {
  const out: { name: string; bytes: number }[] = [];
  for (const name of ["ultra", "laptop", "desktop", "workstation", "server", "max"]) {
    const p = releasedPlan(name, positions);
    if (typeof p !== "string") out.push({ name, bytes: p.totalBytes + p.overheadBytes });
  }
  return out;
}

/** The preset with the largest plan that fits in `available` bytes. */
export function fittingPreset(
  available: number,
  needs: { name: string; bytes: number }[],
): { name: string; bytes: number } | undefined {
  return needs.filter((n) => n.bytes <= available).sort((a, b) => b.bytes - a.bytes)[0];
}

/** True when `dir` holds a checkpoint (its index, or safetensors shards). */
export function holdsCheckpoint(dir: string): boolean {
  try {
    for (const e of Deno.readDirSync(dir)) {
      if (e.isFile && (e.name === "model.safetensors.index.json" || e.name.endsWith(".safetensors"))) return true;
    }
  } catch { /* unreadable: treat as empty */ }
  return false;
}

/** Bytes of disk the model still needs at --dir: the checkpoint unless it is there, and its
 * trunk (`trunkBytes`: the checkpoint's own, from doctor --checkpoint; default the released one). */
export function diskNeeded(hasCheckpoint: boolean, trunkBytes = TRUNK_BYTES): number {
  return (hasCheckpoint ? 0 : CHECKPOINT_BYTES) + trunkBytes;
}

/** Reasons the model cannot run here at all (empty: it can). */
export function problems(f: Facts): string[] {
  const out: string[] = [];
  if (f.kernelError) out.push(`no loadable kernel library: ${f.kernelError}`);
  if (f.memAvailable !== undefined && f.minNeed !== undefined && f.memAvailable < f.minNeed) {
    out.push(
      `only ${
        fmtBytes(f.memAvailable)
      } of memory available; the smallest plan (--preset ultra, ${MIN_POSITIONS} positions) needs ${
        fmtBytes(f.minNeed)
      }`,
    );
  }
  if (f.diskFree !== undefined && f.diskFree < diskNeeded(f.hasCheckpoint, f.trunkBytes)) {
    out.push(
      `${fmtBytes(f.diskFree)} free on the disk of --dir; ` +
        (f.hasCheckpoint
          ? `packing the trunk needs ${fmtBytes(f.trunkBytes ?? TRUNK_BYTES)}`
          : `the checkpoint (${fmtBytes(CHECKPOINT_BYTES)}) and its packed trunk (${fmtBytes(TRUNK_BYTES)}) need ${
            fmtBytes(diskNeeded(false))
          }`),
    );
  }
  return out;
}

/** Total memory in bytes (Deno.systemMemoryInfo: MemTotal on Linux). */
export function memTotal(): number | undefined {
  try {
    return Deno.systemMemoryInfo().total || undefined;
  } catch {
    return undefined;
  }
}

/** CPU model and the feature flags the kernels care about. */
export function cpuInfo(): { model: string; flags: Set<string> } {
  const t = procCpuinfo();
  if (t !== undefined) {
    const model = t.match(/^(?:model name|Model|Hardware)\s*:\s*(.+)$/m)?.[1] ?? "unknown";
    const flags = new Set((t.match(/^(?:flags|Features)\s*:\s*(.+)$/m)?.[1] ?? "").split(/\s+/));
    return { model, flags };
  }
  // No /proc/cpuinfo at all: ask the kernel library instead (cpuid).
  const flags = cpuFlags(() => defaultLibraryPath());
  return { model: `${Deno.build.arch} (model unknown: no /proc/cpuinfo)`, flags };
}

/** /proc/cpuinfo's text: the runtime reads /proc only with --allow-all, so under k3's own
 * permissions the kernel library reads it (k3io_read_small). */
function procCpuinfo(): string | undefined {
  try {
    return Deno.readTextFileSync("/proc/cpuinfo");
  } catch {
    try {
      return readSmallFile("/proc/cpuinfo", 1 << 22);
    } catch {
      return undefined; // no kernel library either
    }
  }
}
