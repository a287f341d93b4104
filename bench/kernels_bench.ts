/**
 * Kernel throughput, one thread: bf16 matmul at the model's real widths and MXFP4 expert
 * matmuls, for every kernel build present (native libk3 and the scalar/avx2/avx512 variants
 * from `make -C kernels variants`, built here if missing), side by side.
 *
 *   deno bench --allow-all bench/kernels_bench.ts
 *
 * Weights are bigger than the last-level cache (bf16: one 176 MB matrix; MXFP4: 16 distinct
 * experts rotated), so the numbers are weight-streaming rates. After the run a table of GB/s
 * of weight bytes read per second (median call) is printed.
 *
 * @module
 */
import { openKernels } from "../engine/native/ffi.ts";
import { symbols } from "../engine/native/symbols.ts";

type K = Deno.DynamicLibrary<typeof symbols>["symbols"];

const KDIR = new URL("../kernels/", import.meta.url).pathname;
const EXT = Deno.build.os === "darwin" ? "dylib" : Deno.build.os === "windows" ? "dll" : "so";

new Deno.Command("make", { args: ["-s", "-C", KDIR, "all", "variants"] }).outputSync();

const libs: [string, K][] = [];
for (
  const [name, file] of [
    ["native", "libk3"],
    ["avx512", "libk3-avx512"],
    ["avx2", "libk3-avx2"],
    ["scalar", "libk3-scalar"],
  ]
) {
  try {
    libs.push([name, openKernels(`${KDIR}build/${file}.${EXT}`).symbols]);
  } catch { /* not built for this CPU */ }
}

const P = (a: ArrayBufferView) => Deno.UnsafePointer.of(a);

function fill16(a: Uint16Array): Uint16Array {
  // Cheap pseudo-random bf16 values of magnitude < 1 (exponent 0x3F and below, no NaN).
  let s = 0x9e3779b9;
  for (let i = 0; i < a.length; i++) {
    s = (s ^ (s << 13)) >>> 0;
    s = (s ^ (s >>> 17)) >>> 0;
    s = (s ^ (s << 5)) >>> 0;
    a[i] = (s & 0x807f) | 0x3c00 | ((s >>> 16) & 0x0380);
  }
  return a;
}
function fill8(a: Uint8Array, lo = 0, span = 256): Uint8Array {
  let s = 0x12345678;
  for (let i = 0; i < a.length; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    a[i] = lo + ((s >>> 24) % span);
  }
  return a;
}
const xs = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 0.5);

const results: { name: string; lib: string; bytes: number; ms: number[] }[] = [];
function bench(group: string, lib: string, bytes: number, fn: () => void, n: number): void {
  const rec = { name: group, lib, bytes, ms: [] as number[] };
  results.push(rec);
  Deno.bench({
    name: `${group} [${lib}]`,
    group,
    baseline: lib === "native",
    n,
    warmup: 1,
    fn() {
      const t = performance.now();
      fn();
      rec.ms.push(performance.now() - t);
    },
  });
}

// Dense bf16: [12288][7168] (q/k/v/g proj) and [7168][12288] (o_proj).
for (const [rows, cols] of [[12288, 7168], [7168, 12288]]) {
  const w = fill16(new Uint16Array(rows * cols));
  for (const ntok of [1, 8]) {
    const x = xs(ntok * cols), y = new Float32Array(ntok * rows);
    for (const [name, k] of libs) {
      const slow = name === "scalar";
      bench(`bf16 ${rows}x${cols} ntok=${ntok}`, name, rows * cols * 2, () => {
        k.k3_matmul(P(w), 1, P(x), P(y), ntok, rows, cols, 0, rows);
      }, slow ? 3 : 10);
    }
  }
}

// MXFP4 experts: w1/w3 [3072][3584], w2 [3584][3072]; 16 experts rotated (~94 MB).
for (const [rows, cols] of [[3072, 3584], [3584, 3072]]) {
  const NE = 16, pb = rows * cols / 2, sb = rows * cols / 32;
  const packed = fill8(new Uint8Array(NE * pb)), scales = fill8(new Uint8Array(NE * sb), 118, 12);
  const x = xs(8 * cols), y = new Float32Array(8 * rows);
  for (const ntok of [1, 8]) {
    for (const [name, k] of libs) {
      let e = 0;
      bench(`mxfp4 ${rows}x${cols} ntok=${ntok}`, name, pb + sb, () => {
        const p = packed.subarray(e * pb, (e + 1) * pb), s = scales.subarray(e * sb, (e + 1) * sb);
        k.k3_matmul_mxfp4(P(p), P(s), P(x), P(y), ntok, rows, cols, 0, rows);
        e = (e + 1) % NE;
      }, name === "scalar" ? 16 : 64);
    }
  }
}

globalThis.addEventListener("unload", () => {
  const rows = results.filter((r) => r.ms.length > 0);
  if (rows.length === 0) return;
  console.log("\nweight bytes streamed per second, one thread (median call; best call):");
  for (const r of rows) {
    const sorted = r.ms.slice().sort((a, b) => a - b), ms = sorted[r.ms.length >> 1];
    const gbs = r.bytes / (ms * 1e6), best = r.bytes / (sorted[0] * 1e6);
    console.log(
      `  ${r.name.padEnd(28)} ${r.lib.padEnd(7)} ${ms.toFixed(2).padStart(8)} ms  ${
        gbs.toFixed(2).padStart(6)
      } GB/s  (best ${best.toFixed(2)} GB/s)`,
    );
  }
});
