/**
 * `k3 doctor [--dir PATH]`: can this machine run Kimi K3, with which preset, and how fast
 * does its disk read the way the engine reads?
 *
 * Checks: the CPU features the kernels use and the kernel library's SIMD path; available
 * memory and the largest preset that fits; free disk at --dir; read speed on a temporary
 * file under --dir (17.5 MB aligned random reads with O_DIRECT at depth 1 and 16, and large
 * sequential reads), removed afterwards. Exit 1 when the machine cannot run the model at
 * all (under 4 GB available, too little disk, no loadable kernel library).
 *
 * Its phases: options (cli/doctor/options.ts), the checks (CPU and kernels, memory,
 * disk, reads, codec, checkpoint), the verdict; the facts and the measurements live in
 * cli/doctor/.
 *
 * @module
 */

import { statfsSync } from "node:fs";
import { EXIT } from "../engine/errors.ts";
import { isaName, type Kernels, kernels } from "../engine/native/ffi.ts";
import { cgroupText } from "../engine/native/available.ts";
import { availableMemory } from "./environment.ts";
import { fmtBytes } from "./common.ts";
import { type DoctorOptions, doctorOptions } from "./doctor/options.ts";
import {
  CHECKPOINT_BYTES,
  cpuInfo,
  diskNeeded,
  EXPERT_READ,
  type Facts,
  fittingPreset,
  holdsCheckpoint,
  memTotal,
  MIN_POSITIONS,
  presetNeeds,
  problems,
} from "./doctor/facts.ts";
import { codecLine, gbps, measure, type Speeds } from "./doctor/measure.ts";
import { verifyCheckpoint } from "./doctor/checkpoint.ts";

/** What the checks write to: the report's lines, the facts for the verdict, the notes. */
interface Findings {
  /** Prints one labelled line of the report. */
  line: (label: string, text: string) => void;
  /** What the verdict is made of. */
  facts: Facts;
  /** Notes printed before the verdict. */
  warnings: string[];
}

/** The CPU's features and the kernel library's path; the kernels, when they load. */
function checkCpu(f: Findings): Kernels | undefined {
  const cpu = cpuInfo();
  const want = Deno.build.arch === "aarch64"
    ? ["asimd"]
    : ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"];
  f.line(
    "cpu",
    `${cpu.model}; ${navigator.hardwareConcurrency} threads; ${
      want.map((x) => `${x} ${cpu.flags.has(x) ? "yes" : "no"}`).join(", ")
    }`,
  );
  try {
    const k = kernels();
    const isa = isaName(k);
    f.line(
      "kernels",
      `${isa} path (${isa === "scalar" ? "no SIMD: correct but slow" : "SIMD"}); the same tokens on every path`,
    );
    if (Deno.build.arch === "x86_64" && isa === "scalar" && cpu.flags.has("avx2")) {
      f.warnings.push(
        "the kernel library was built without SIMD although this CPU has AVX2: rebuild with `make -C kernels`",
      );
    }
    return k;
  } catch (e) {
    f.facts.kernelError = (e as Error).message;
    f.line("kernels", `NOT LOADABLE: ${f.facts.kernelError}`);
    return undefined;
  }
}

/** Memory: the engine's own memory plan for the full model at each preset; the preset that fits. */
function checkMemory(f: Findings, positions: number): { name: string; bytes: number } | undefined {
  const { facts } = f;
  const avail = availableMemory();
  facts.memAvailable = avail?.bytes;
  facts.memTotal = memTotal();
  const needs = presetNeeds(positions);
  facts.minNeed = presetNeeds(MIN_POSITIONS).find((n) => n.name === "ultra")?.bytes;
  if (facts.memAvailable === undefined) {
    f.line("memory", "unknown (no /proc/meminfo); choose a preset with k3 presets");
    return undefined;
  }
  const fit = fittingPreset(facts.memAvailable, needs);
  const next = needs.find((n) => n.bytes > facts.memAvailable!);
  f.line(
    "memory",
    `${fmtBytes(facts.memAvailable)} available of ${fmtBytes(facts.memTotal ?? 0)}; at ${positions} positions ` +
      (fit ? `fits --preset ${fit.name} (plan ${fmtBytes(fit.bytes)} with the runtime)` : "fits no preset") +
      (next ? `; ${next.name} would need ${fmtBytes(next.bytes)}` : ""),
  );
  if (avail?.cgroup) {
    f.line(
      "cgroup",
      `${cgroupText(avail.cgroup)}: leaves ${fmtBytes(avail.cgroup.remaining)}` +
        (avail.source === "MemAvailable" ? " (MemAvailable is smaller)" : " (the smaller: used)"),
    );
  } else if (avail?.source === "MemAvailable") f.line("cgroup", "no memory limit");
  if (!fit && facts.minNeed !== undefined && facts.memAvailable >= facts.minNeed) {
    f.warnings.push(
      `only --preset ultra with a short context fits (${MIN_POSITIONS} positions: ${fmtBytes(facts.minNeed)})`,
    );
  }
  return fit;
}

/** Disk: count only what still has to be written. A checkpoint named by --checkpoint, or
 * found at --dir, is already on disk; only its packed trunk is still to come. */
function checkDisk(f: Findings, o: DoctorOptions, trunkBytes?: number): void {
  const { facts } = f;
  facts.hasCheckpoint = o.checkpoint !== undefined || holdsCheckpoint(o.dir);
  facts.trunkBytes = trunkBytes;
  try {
    const s = statfsSync(o.dir);
    facts.diskFree = Number(s.bavail) * Number(s.bsize);
    f.line(
      "disk",
      `${fmtBytes(facts.diskFree)} free at ${o.dir}; ${
        facts.hasCheckpoint
          ? `the checkpoint is already on disk${o.checkpoint ? ` (${o.checkpoint})` : ""}; packing its trunk needs`
          : "the checkpoint and its packed trunk need"
      } ${fmtBytes(diskNeeded(facts.hasCheckpoint, trunkBytes))}`,
    );
  } catch (e) {
    f.line("disk", `cannot read free space at ${o.dir}: ${(e as Error).message}`);
  }
}

/** Read speed on a temporary file; the sequential O_DIRECT rate when measured. */
async function checkReads(f: Findings, o: DoctorOptions, k: Kernels | undefined): Promise<number | undefined> {
  const { sizeMb } = o;
  const notMeasured = (why: string) => void f.line("reads", `not measured${why}`);
  if (o.noRead) return notMeasured(" (--no-read)");
  if (!k) return notMeasured(" (needs the kernel library)");
  if (f.facts.diskFree !== undefined && f.facts.diskFree < sizeMb * 1048576 * 1.1) {
    return notMeasured(` (the ${sizeMb} MiB test file does not fit)`);
  }
  const path = `${o.dir}/.k3-doctor-${Deno.pid}-${Date.now()}.tmp`;
  let sp: Speeds;
  try {
    sp = await measure(k, path, sizeMb * 1048576);
  } catch (e) {
    return notMeasured(`: ${(e as Error).message}`);
  } finally {
    try {
      Deno.removeSync(path);
    } catch { /* never created */ }
  }
  f.line(
    "reads",
    `${sp.direct ? "O_DIRECT" : "buffered (this filesystem refuses O_DIRECT)"} on a ${sizeMb} MiB file: ` +
      `17.5 MB random ${gbps(sp.random1)} at depth 1, ${gbps(sp.random16)} at depth 16; sequential ${
        gbps(sp.sequential)
      }; write ${gbps(sp.write)}`,
  );
  if (!sp.direct) {
    f.warnings.push(
      "without O_DIRECT the reads above were served from the page cache (the file was just written): they measure memory, not the disk",
    );
  } else {
    f.warnings.push(
      `a ${sizeMb} MiB file can sit in the drive's own cache; the 1.56 TB checkpoint cannot, ` +
        "so a larger --size-mb is closer to the truth",
    );
  }
  const perToken = 16 * 92 * EXPERT_READ; // worst case: every routed expert of every layer missed
  const best = Math.max(sp.random1 ?? 0, sp.random16 ?? 0);
  if (best > 0) {
    f.line(
      "",
      `at the better of those rates an all-miss token (16 experts x 92 layers = ${fmtBytes(perToken)}) ` +
        `reads in ${(perToken / best).toFixed(1)} s; the expert cache cuts this`,
    );
  }
  return sp.direct ? sp.sequential : undefined;
}

/** The verdict and the commands to run next; the exit code. */
function verdict(f: Findings, bad: string[], fit: { name: string } | undefined): number {
  for (const w of f.warnings) f.line("note", w);
  if (bad.length) {
    for (const p of bad) f.line("PROBLEM", p);
    console.log(
      "\nverdict: this machine cannot run Kimi K3 as it is. Fix the problems above, then run k3 doctor again.",
    );
    return EXIT.runtime;
  }
  const preset = fit?.name ?? "ultra";
  const ctx = fit ? "" : ` (keep prompt + --gen under ${MIN_POSITIONS} positions)`;
  console.log(`\nverdict: this machine can run Kimi K3 with --preset ${preset}${ctx}. Next:`);
  if (!f.facts.hasCheckpoint) {
    console.log(
      `  k3 pull moonshotai/Kimi-K3 MODEL_DIR --pack TRUNK_DIR   (96 shards, ${
        CHECKPOINT_BYTES.toLocaleString("en-US")
      } bytes, on this disk)`,
    );
  } else console.log(`  k3 pack MODEL_DIR TRUNK_DIR`);
  console.log(`  k3 run MODEL_DIR --trunk TRUNK_DIR --preset ${preset} --prompt "Hello"`);
  return EXIT.ok;
}

/** Runs `k3 doctor`; returns the exit code (0: the model can run here). */
export async function main(args: string[]): Promise<number> {
  const o = doctorOptions(args);
  if (!o) return EXIT.ok;
  const f: Findings = {
    line: (label, text) => console.log(`${label.padEnd(10)}${text}`),
    facts: { hasCheckpoint: false },
    warnings: [],
  };
  const k = checkCpu(f);
  const fit = checkMemory(f, o.positions);
  // The checkpoint first: its own trunk is what the disk still has to hold.
  const found = o.checkpoint === undefined ? undefined : await verifyCheckpoint(o.checkpoint);
  checkDisk(f, o, found?.trunkBytes);
  const diskRate = await checkReads(f, o, k);
  if (k) await codecLine(k, diskRate, f.line);
  const bad = problems(f.facts);
  if (found) {
    found.lines.forEach((l, i) => f.line(i === 0 ? "model" : "", l));
    bad.push(...found.problems);
  }
  return verdict(f, bad, fit);
}
