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
 * @module
 */

import { statfsSync } from "node:fs";
import { loadConfig } from "../engine/model/config.ts";
import { EXIT, usageError } from "../engine/errors.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";
import { checkCheckpoint } from "../engine/weights/bind.ts";
import { defaultLibraryPath, isaName, type Kernels, kernels, libraryPath } from "../engine/native/ffi.ts";
import { CODEC_GAIN, codecVerdict, measureDecodeRate } from "../engine/weights/codec.ts";
import { cpuFlags } from "../engine/native/libpath.ts";
import { IoFile } from "../engine/native/io.ts";
import { cgroupText } from "../engine/native/available.ts";
import { availableMemory } from "./environment.ts";
import { fmtBytes, intFlag, parseFlags } from "./common.ts";
import { progress } from "./progress.ts";
import { releasedPlan } from "./presets.ts";
import { MAX_PROMPT_IDS } from "./run_options.ts";

/** Usage text of `k3 doctor`. */
export const USAGE = `usage: k3 doctor [--dir PATH] [--size-mb N] [--checkpoint MODEL_DIR]

Checks this machine for Kimi K3: CPU features and the kernels' SIMD path, available memory
and the preset that fits, free disk at PATH, and PATH's read speed measured the way the
engine reads (17.5 MB aligned random reads with O_DIRECT at depth 1 and 16, and large
sequential reads) on a temporary file it writes under PATH and removes. Then the command
to run next.

exit codes: 0 the model can run here; 1 it cannot (not enough memory for even the
smallest plan, too little disk, or no loadable kernel library); 2 usage error.

  --dir PATH     the disk that holds (or will hold) the checkpoint and packed trunk
                 (default: the current directory)
  --size-mb N    size of the temporary test file in MiB (default 1024, 64..65536);
                 larger is slower and more accurate
  --positions N  context (prompt + generated) to size the memory plan for (default 4096)
  --no-read      skip the read-speed test (writes nothing)
  --checkpoint D verify a downloaded checkpoint: every shard header valid and each shard's
                 size exactly what its header describes, every tensor the engine binds
                 present with its shape and dtype, and, for the released Kimi K3, 96
                 shards, 497,220 tensors and 1,560,936,091,448 bytes in all
  -h, --help     this help

examples:
  k3 doctor --dir /data
  k3 doctor --no-read --checkpoint /data/kimi-k3
`;

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

/** Bytes of disk the model still needs at --dir. */
export function diskNeeded(hasCheckpoint: boolean): number {
  return (hasCheckpoint ? 0 : CHECKPOINT_BYTES) + TRUNK_BYTES;
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
  if (f.diskFree !== undefined && f.diskFree < diskNeeded(f.hasCheckpoint)) {
    out.push(
      `${fmtBytes(f.diskFree)} free on the disk of --dir; ` +
        (f.hasCheckpoint
          ? `packing the trunk needs ${fmtBytes(TRUNK_BYTES)}`
          : `the checkpoint (${fmtBytes(CHECKPOINT_BYTES)}) and its packed trunk (${fmtBytes(TRUNK_BYTES)}) need ${
            fmtBytes(diskNeeded(false))
          }`),
    );
  }
  return out;
}

/** Total memory in bytes (Deno.systemMemoryInfo: MemTotal on Linux). */
function memTotal(): number | undefined {
  try {
    return Deno.systemMemoryInfo().total || undefined;
  } catch {
    return undefined;
  }
}

/** CPU model and the feature flags the kernels care about. */
function cpuInfo(): { model: string; flags: Set<string> } {
  try {
    const t = Deno.readTextFileSync("/proc/cpuinfo");
    const model = t.match(/^(?:model name|Model|Hardware)\s*:\s*(.+)$/m)?.[1] ?? "unknown";
    const flags = new Set((t.match(/^(?:flags|Features)\s*:\s*(.+)$/m)?.[1] ?? "").split(/\s+/));
    return { model, flags };
  } catch {
    // Deno reads /proc only with --allow-all: ask the kernel library instead (cpuid).
    const flags = cpuFlags(() => defaultLibraryPath());
    return { model: `${Deno.build.arch} (model unknown: /proc/cpuinfo needs --allow-all)`, flags };
  }
}

/** Read-speed results in bytes per second (undefined: not measured). */
interface Speeds {
  direct: boolean;
  write?: number;
  random1?: number;
  random16?: number;
  sequential?: number;
}

/** Writes a size-byte file, then measures random and sequential reads on it. */
async function measure(k: Kernels, path: string, size: number): Promise<Speeds> {
  const CHUNK = 16 * 1024 * 1024;
  const SEQ = 64 * 1024 * 1024;
  const bufs: Deno.PointerValue[] = [];
  const alloc = (n: number) => {
    const p = k.k3_alloc(BigInt(n));
    if (!p) throw new Error(`cannot allocate ${n} bytes`);
    bufs.push(p);
    return p;
  };
  const speeds: Speeds = { direct: false };
  try {
    // Write random bytes (not zeros: some filesystems would store those as holes).
    const wbuf = alloc(CHUNK)!;
    const view = new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(wbuf, CHUNK));
    for (let i = 0; i < CHUNK; i += 65536) crypto.getRandomValues(view.subarray(i, i + 65536));
    const w = IoFile.open(path, { write: true, direct: true });
    try {
      const t0 = performance.now();
      for (let off = 0; off < size; off += CHUNK) {
        view[0] = off & 0xff; // not a repeated block
        await w.pwrite(wbuf, Math.min(CHUNK, size - off), off);
        progress("doctor: write", off + CHUNK, size, off + CHUNK);
      }
      await w.sync();
      speeds.write = size / ((performance.now() - t0) / 1000);
    } finally {
      w.close();
    }
    const r = IoFile.open(path, { direct: true });
    speeds.direct = r.direct;
    try {
      const slots = Array.from({ length: 16 }, () => alloc(EXPERT_READ)!);
      const maxBlock = Math.floor((size - EXPERT_READ) / 4096);
      const offset = () => 4096 * Math.floor(Math.random() * (maxBlock + 1));
      // Enough reads to cover the file about once per depth, at least 16.
      const reads = Math.max(16, Math.ceil(size / EXPERT_READ));
      for (const depth of [1, 16]) {
        let issued = 0, done = 0;
        const t0 = performance.now();
        const lane = async (slot: NonNullable<Deno.PointerValue>) => {
          while (issued < reads) {
            issued++;
            await r.readExact(slot, EXPERT_READ, offset());
            progress(`doctor: random reads, depth ${depth}`, ++done, reads, done * EXPERT_READ);
          }
        };
        await Promise.all(slots.slice(0, depth).map(lane));
        const bps = (reads * EXPERT_READ) / ((performance.now() - t0) / 1000);
        if (depth === 1) speeds.random1 = bps;
        else speeds.random16 = bps;
      }
      const sbuf = alloc(SEQ)!;
      const t0 = performance.now();
      for (let off = 0; off < size; off += SEQ) {
        await r.pread(sbuf, Math.min(SEQ, size - off), off);
        progress(
          "doctor: sequential reads",
          Math.min(off + SEQ, size),
          size,
          Math.min(off + SEQ, size),
        );
      }
      speeds.sequential = size / ((performance.now() - t0) / 1000);
    } finally {
      r.close();
    }
  } finally {
    for (const p of bufs) k.k3_free(p);
  }
  return speeds;
}

const gbps = (x?: number) => (x === undefined ? "-" : `${(x / 1e9).toFixed(2)} GB/s`);

/**
 * The trunk codec's line: the split decode rate and the bf16 product's rates (plain and
 * from the coded form) measured on every thread (engine/weights/codec.ts), beside the
 * disk's sequential O_DIRECT rate when it was measured, and what `k3 pack --codec auto`
 * would choose here.
 */
async function codecLine(k: Kernels, disk: number | undefined, line: (label: string, text: string) => void) {
  try {
    const dec = await measureDecodeRate(k, libraryPath());
    const v = disk === undefined
      ? undefined
      : codecVerdict({ disk, plain: dec.plainProduct, split: dec.splitProduct, ratio: dec.ratio });
    const verdict = disk === undefined || v === undefined
      ? "the disk's rate was not measured, so auto's choice is not known here"
      : `${(dec.bytesPerSecond / disk).toFixed(2)}x the disk's sequential ${
        gbps(disk)
      }; a streamed trunk byte is predicted ${
        v.predicted.toFixed(2)
      }x coded (the slower of its read and its product): k3 pack --codec auto ${
        v.pays ? "codes the trunk (split)" : "keeps the trunk raw"
      } (it codes when that is ${CODEC_GAIN}x faster)`;
    line(
      "codec",
      `split decode ${gbps(dec.bytesPerSecond)} on ${dec.threads} threads (a weight-like piece stored at ${
        dec.ratio.toFixed(3)
      } of its size), bf16 product ${gbps(dec.plainProduct)} plain, ${
        gbps(dec.splitProduct)
      } from the coded form; ${verdict}`,
    );
  } catch (e) {
    line("codec", `not measured: ${(e as Error).message}`);
  }
}

/**
 * Verifies a checkpoint directory: headers (Checkpoint.open refuses a bad one with exit 1),
 * shard sizes against their headers, the tensors the engine binds, and the release's
 * totals when the config is the released shape.
 */
export async function verifyCheckpoint(dir: string): Promise<{ lines: string[]; problems: string[] }> {
  const cfg = await loadConfig(dir);
  const ckpt = await Checkpoint.open(dir, (d, n) => progress("headers", d, n));
  try {
    const problems: string[] = [];
    const sizes = await ckpt.shardSizes();
    const total = sizes.reduce((a, s) => a + s.bytes, 0);
    for (const s of sizes) {
      if (s.bytes !== s.described) {
        problems.push(`${s.file}: ${s.bytes} bytes, but its header describes ${s.described}`);
      }
    }
    try {
      checkCheckpoint(cfg, ckpt);
    } catch (e) {
      problems.push((e as Error).message);
    }
    const released = cfg.numLayers === 93 && cfg.hiddenSize === 7168 && cfg.moe.numExperts === 896;
    if (released) {
      const want: [string, number, number][] = [
        ["shards", sizes.length, CHECKPOINT_SHARDS],
        ["tensors", ckpt.tensors.size, CHECKPOINT_TENSORS],
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
    const lines = [
      `${dir}: ${sizes.length} shards, ${total.toLocaleString("en-US")} bytes, ${
        ckpt.tensors.size.toLocaleString("en-US")
      } tensors; ` +
      (problems.length
        ? `${problems.length} problem(s)`
        : released
        ? "the released Kimi K3, complete"
        : "complete (not the released shape)"),
    ];
    return { lines, problems };
  } finally {
    ckpt.close();
  }
}

/** Runs `k3 doctor`; returns the exit code (0: the model can run here). */
export async function main(args: string[]): Promise<number> {
  const { values, positionals } = parseFlags("doctor", args, {
    dir: { type: "string" },
    "size-mb": { type: "string" },
    positions: { type: "string" },
    "no-read": { type: "boolean" },
    checkpoint: { type: "string" },
    help: { type: "boolean", short: "h" },
  }, false);
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  void positionals;
  // The disk that matters: --dir, else the checkpoint's own directory, else here.
  const dir = values.dir ?? values.checkpoint ?? ".";
  const sizeMb = intFlag("size-mb", values["size-mb"], 1024, 64, 65536);
  // The longest run: the longest prompt plus the most --gen (4096).
  const positions = intFlag("positions", values.positions, 4096, 1, MAX_PROMPT_IDS + 4096);
  if (values["no-read"] && values["size-mb"] !== undefined) {
    throw usageError("doctor: --size-mb and --no-read conflict: choose one");
  }
  // Named by the flag it came from (--checkpoint alone measures the checkpoint's disk).
  const dirFlag = values.dir !== undefined ? "--dir" : values.checkpoint !== undefined ? "--checkpoint" : "--dir";
  try {
    if (!Deno.statSync(dir).isDirectory) throw usageError(`${dirFlag}: ${dir} is not a directory`);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      throw usageError(
        `${dirFlag}: ${dir} does not exist (${
          dirFlag === "--checkpoint" ? "the directory of the downloaded shards and config.json" : "the disk to check"
        })`,
      );
    }
    throw e;
  }
  const line = (label: string, text: string) => console.log(`${label.padEnd(10)}${text}`);
  const warnings: string[] = [];

  // CPU and kernels.
  const cpu = cpuInfo();
  const want = Deno.build.arch === "aarch64"
    ? ["asimd"]
    : ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"];
  line(
    "cpu",
    `${cpu.model}; ${navigator.hardwareConcurrency} threads; ${
      want.map((f) => `${f} ${cpu.flags.has(f) ? "yes" : "no"}`).join(", ")
    }`,
  );
  const facts: Facts = { hasCheckpoint: false };
  let k: Kernels | undefined;
  try {
    k = kernels();
    const isa = isaName(k);
    line(
      "kernels",
      `${isa} path (${isa === "scalar" ? "no SIMD: correct but slow" : "SIMD"}); the same tokens on every path`,
    );
    if (Deno.build.arch === "x86_64" && isa === "scalar" && cpu.flags.has("avx2")) {
      warnings.push(
        "the kernel library was built without SIMD although this CPU has AVX2: rebuild with `make -C kernels`",
      );
    }
  } catch (e) {
    facts.kernelError = (e as Error).message;
    line("kernels", `NOT LOADABLE: ${facts.kernelError}`);
  }

  // Memory: the engine's own memory plan for the full model at each preset.
  const avail = availableMemory();
  facts.memAvailable = avail?.bytes;
  facts.memTotal = memTotal();
  const needs = presetNeeds(positions);
  facts.minNeed = presetNeeds(MIN_POSITIONS).find((n) => n.name === "ultra")?.bytes;
  const fit = facts.memAvailable === undefined ? undefined : fittingPreset(facts.memAvailable, needs);
  if (facts.memAvailable === undefined) {
    line("memory", "unknown (no /proc/meminfo); choose a preset with k3 presets");
  } else {
    const next = needs.find((n) => n.bytes > facts.memAvailable!);
    line(
      "memory",
      `${fmtBytes(facts.memAvailable)} available of ${fmtBytes(facts.memTotal ?? 0)}; at ${positions} positions ` +
        (fit ? `fits --preset ${fit.name} (plan ${fmtBytes(fit.bytes)} with the runtime)` : "fits no preset") +
        (next ? `; ${next.name} would need ${fmtBytes(next.bytes)}` : ""),
    );
    if (avail?.cgroup) {
      line(
        "cgroup",
        `${cgroupText(avail.cgroup)}: leaves ${fmtBytes(avail.cgroup.remaining)}` +
          (avail.source === "MemAvailable" ? " (MemAvailable is smaller)" : " (the smaller: used)"),
      );
    } else if (avail?.source === "MemAvailable") line("cgroup", "no memory limit");
    if (!fit && facts.minNeed !== undefined && facts.memAvailable >= facts.minNeed) {
      warnings.push(
        `only --preset ultra with a short context fits (${MIN_POSITIONS} positions: ${fmtBytes(facts.minNeed)})`,
      );
    }
  }

  // Disk: count only what still has to be written. A checkpoint named by --checkpoint, or
  // found at --dir, is already on disk; only its packed trunk is still to come.
  facts.hasCheckpoint = values.checkpoint !== undefined || holdsCheckpoint(dir);
  try {
    const s = statfsSync(dir);
    facts.diskFree = Number(s.bavail) * Number(s.bsize);
    line(
      "disk",
      `${fmtBytes(facts.diskFree)} free at ${dir}; ${
        facts.hasCheckpoint
          ? `the checkpoint is already on disk${
            values.checkpoint ? ` (${values.checkpoint})` : ""
          }; packing its trunk needs`
          : "the checkpoint and its packed trunk need"
      } ${fmtBytes(diskNeeded(facts.hasCheckpoint))}`,
    );
  } catch (e) {
    line("disk", `cannot read free space at ${dir}: ${(e as Error).message}`);
  }

  // Read speed.
  let diskRate: number | undefined;
  if (values["no-read"]) line("reads", "not measured (--no-read)");
  else if (!k) line("reads", "not measured (needs the kernel library)");
  else if (facts.diskFree !== undefined && facts.diskFree < sizeMb * 1048576 * 1.1) {
    line("reads", `not measured (the ${sizeMb} MiB test file does not fit)`);
  } else {
    const path = `${dir}/.k3-doctor-${Deno.pid}-${Date.now()}.tmp`;
    let sp: Speeds | undefined;
    try {
      sp = await measure(k, path, sizeMb * 1048576);
    } catch (e) {
      line("reads", `not measured: ${(e as Error).message}`);
    } finally {
      try {
        Deno.removeSync(path);
      } catch { /* never created */ }
    }
    if (sp) {
      diskRate = sp.direct ? sp.sequential : undefined;
      line(
        "reads",
        `${sp.direct ? "O_DIRECT" : "buffered (this filesystem refuses O_DIRECT)"} on a ${sizeMb} MiB file: ` +
          `17.5 MB random ${gbps(sp.random1)} at depth 1, ${gbps(sp.random16)} at depth 16; sequential ${
            gbps(sp.sequential)
          }; write ${gbps(sp.write)}`,
      );
      if (!sp.direct) {
        warnings.push(
          "without O_DIRECT the reads above were served from the page cache (the file was just written): they measure memory, not the disk",
        );
      } else {
        warnings.push(
          `a ${sizeMb} MiB file can sit in the drive's own cache; the 1.56 TB checkpoint cannot, ` +
            "so a larger --size-mb is closer to the truth",
        );
      }
      const perToken = 16 * 92 * EXPERT_READ; // worst case: every routed expert of every layer missed
      const best = Math.max(sp.random1 ?? 0, sp.random16 ?? 0);
      if (best > 0) {
        line(
          "",
          `at the better of those rates an all-miss token (16 experts x 92 layers = ${fmtBytes(perToken)}) ` +
            `reads in ${(perToken / best).toFixed(1)} s; the expert cache cuts this`,
        );
      }
    }
  }

  if (k) await codecLine(k, diskRate, line);

  const bad = problems(facts);
  if (values.checkpoint !== undefined) {
    const found = await verifyCheckpoint(values.checkpoint);
    found.lines.forEach((l, i) => line(i === 0 ? "model" : "", l));
    bad.push(...found.problems);
  }
  for (const w of warnings) line("note", w);
  if (bad.length) {
    for (const p of bad) line("PROBLEM", p);
    console.log(
      "\nverdict: this machine cannot run Kimi K3 as it is. Fix the problems above, then run k3 doctor again.",
    );
    return EXIT.runtime;
  }
  const preset = fit?.name ?? "ultra";
  const ctx = fit ? "" : ` (keep prompt + --gen under ${MIN_POSITIONS} positions)`;
  console.log(`\nverdict: this machine can run Kimi K3 with --preset ${preset}${ctx}. Next:`);
  if (!facts.hasCheckpoint) {
    console.log(
      `  download the checkpoint (96 shards, ${
        CHECKPOINT_BYTES.toLocaleString("en-US")
      } bytes) into a directory on this disk, then`,
    );
  }
  console.log(`  k3 pack MODEL_DIR TRUNK_DIR`);
  console.log(`  k3 run MODEL_DIR --trunk TRUNK_DIR --preset ${preset} --prompt "Hello"`);
  return EXIT.ok;
}
