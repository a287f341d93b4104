/**
 * The matrix check (kernels/k3.h, contract 5): on every build of the library (scalar, avx2,
 * avx512 where present, native) k3_matmul_checked gives the same check as k3_matrix_check
 * and the same products as k3_matmul, for one token (computed inside the product) and
 * several (a pass after it), whatever the row split. Any changed bit and any swap of two
 * rows changes the check. (`make -C kernels check-arm` compares NEON to scalar;
 * tests/oracle/k3check_test.ts compares every build with the Python definition.)
 *
 * @module
 */
import assert from "node:assert/strict";
import { kernels, WTYPE } from "../../engine/native/ffi.ts";
import { symbols } from "../../engine/native/symbols.ts";
import { libraryBuilds, matrixCheckHex, noise } from "../helpers.ts";
import { NativeBuffer } from "../../engine/native/memory.ts";
import type { TensorEntry } from "../../engine/weights/trunk_geometry.ts";
import { RegionChecker, tensorCheck } from "../../engine/native/tensors.ts";

/** Every build, opened for the kernel symbols. */
const libs = () => libraryBuilds(symbols);

const hex = (b: bigint) => b.toString(16).padStart(16, "0");
const ptr = (a: ArrayBufferView) => Deno.UnsafePointer.of(a)!;

/** bf16 weights of moderate size (no inf or NaN), rows x cols. */
function bf16Matrix(rows: number, cols: number, seed: number): Uint16Array {
  const w = new Uint16Array(noise(rows * cols * 2, seed).buffer);
  for (let i = 0; i < w.length; i++) w[i] = (w[i] & 0x807f) | 0x3c00; // |value| in [2^-7, 2^-6)
  return w;
}

Deno.test("matrix check: k3_matmul_checked = k3_matrix_check and k3_matmul, any tokens, any split", () => {
  const all = libs();
  try {
    for (const [name, l] of all) {
      const k = l.symbols;
      for (const [rows, cols] of [[9, 16], [7, 33], [13, 1000], [6, 7168], [5, 7]]) {
        for (const wtype of [WTYPE.bf16, WTYPE.f32]) {
          const w = wtype === WTYPE.bf16
            ? new Uint8Array(bf16Matrix(rows, cols, rows * cols).buffer)
            : new Uint8Array(new Float32Array(rows * cols).map((_, i) => Math.sin(i) / 8).buffer);
          const rowbytes = cols * (wtype === WTYPE.bf16 ? 2 : 4);
          const whole = matrixCheckHex(l, w, rowbytes, 0, rows);
          for (const ntok of [1, 3, 17]) {
            const x = new Float32Array(ntok * cols).map((_, i) => Math.cos(i));
            const plain = new Float32Array(ntok * rows), checked = new Float32Array(ntok * rows);
            k.k3_matmul(ptr(w), wtype, ptr(x), ptr(plain), ntok, rows, cols, 0, rows);
            const sum = new BigUint64Array(1);
            const cut = Math.floor(rows / 3);
            // two calls over a split of the rows add up to the whole matrix's check
            k.k3_matmul_checked(ptr(w), wtype, ptr(x), ptr(checked), ntok, rows, cols, 0, cut, ptr(sum));
            k.k3_matmul_checked(ptr(w), wtype, ptr(x), ptr(checked), ntok, rows, cols, cut, rows, ptr(sum));
            const what = `${name} ${rows}x${cols} wtype ${wtype} ntok ${ntok}`;
            assert.equal(hex(sum[0]), whole, what);
            assert.deepEqual(new Uint8Array(checked.buffer), new Uint8Array(plain.buffer), what);
            // a null sum is the plain product
            k.k3_matmul_checked(ptr(w), wtype, ptr(x), ptr(checked), ntok, rows, cols, 0, rows, null);
            assert.deepEqual(new Uint8Array(checked.buffer), new Uint8Array(plain.buffer), what);
          }
        }
      }
    }
  } finally {
    for (const [, l] of all) l.close();
  }
});

Deno.test("matrix check: any flipped bit and any swap of two rows change it", () => {
  const all = libs();
  try {
    const l = all.find(([n]) => n === "native")![1];
    const rows = 3, cols = 40, rowbytes = cols * 2;
    const w = new Uint8Array(bf16Matrix(rows, cols, 77).buffer);
    const clean = matrixCheckHex(l, w, rowbytes, 0, rows);
    const x = new Float32Array(cols).fill(1), y = new Float32Array(rows);
    for (let i = 0; i < w.length; i++) {
      for (let b = 0; b < 8; b++) {
        w[i] ^= 1 << b;
        assert.notEqual(matrixCheckHex(l, w, rowbytes, 0, rows), clean, `byte ${i} bit ${b}`);
        const sum = new BigUint64Array(1);
        l.symbols.k3_matmul_checked(ptr(w), WTYPE.bf16, ptr(x), ptr(y), 1, rows, cols, 0, rows, ptr(sum));
        assert.notEqual(hex(sum[0]), clean, `byte ${i} bit ${b} (in the product)`);
        w[i] ^= 1 << b;
      }
    }
    const swapped = new Uint8Array(w);
    swapped.set(w.subarray(0, rowbytes), rowbytes);
    swapped.set(w.subarray(rowbytes, 2 * rowbytes), 0);
    assert.notEqual(matrixCheckHex(l, swapped, rowbytes, 0, rows), clean, "rows 0 and 1 swapped");
    assert.equal(matrixCheckHex(l, w, rowbytes, 0, rows), clean);
  } finally {
    for (const [, l] of all) l.close();
  }
});

Deno.test("RegionChecker: fed in any split, gives each tensor's one-shot check", () => {
  const k = kernels();
  // matrices and vectors at 64-byte offsets, rows that do not divide the feeds
  const tensors: TensorEntry[] = [];
  let at = 0;
  for (
    const [keep, shape, dtype] of [
      ["vector", [130], "F32"],
      ["matrix", [7, 40], "BF16"],
      ["matrix", [3, 9], "F32"],
      ["vector", [1, 3, 4], "F32"],
      ["matrix", [50, 100], "BF16"],
    ] as const
  ) {
    at = Math.ceil(at / 64) * 64;
    const bytes = (shape as readonly number[]).reduce((a, b) => a * b, 1) * (dtype === "F32" ? 4 : 2);
    tensors.push({ name: `t${tensors.length}`, keep, shape: [...shape], dtype, offset: at, bytes, check: "" });
    at += bytes;
  }
  const region = NativeBuffer.alloc(k, at, "region");
  const feed = NativeBuffer.alloc(k, at, "feed");
  try {
    region.u8.set(noise(at, 99));
    const want = tensors.map((t) => tensorCheck(k, t, region.at(t.offset)));
    for (const step of [1, 3, 64, 100, 333, 4096, at]) {
      const c = new RegionChecker(k, tensors);
      for (let p = 0; p < at; p += step) {
        const n = Math.min(step, at - p);
        feed.u8.set(region.u8.subarray(p, p + n));
        c.update(feed, n);
      }
      assert.deepEqual(c.results(), want, `feeds of ${step} bytes`);
    }
  } finally {
    region.free();
    feed.free();
  }
});

Deno.test("matrix check: k3_matmul_mxfp4_checked = the checks of its packed and scale rows, and k3_matmul_mxfp4", () => {
  const all = libs();
  try {
    for (const [name, l] of all) {
      const k = l.symbols;
      for (const [rows, cols] of [[7, 32], [9, 96], [5, 1024], [6, 3584]]) {
        const packed = noise(rows * cols / 2, rows + cols), scales = noise(rows * cols / 32, 7 * cols);
        // scales near 2^0, some groups skipped (255): their bytes are checked all the same
        scales.forEach((v, i) => (scales[i] = v % 9 === 0 ? 255 : 120 + (v % 14)));
        const want = [matrixCheckHex(l, packed, cols / 2, 0, rows), matrixCheckHex(l, scales, cols / 32, 0, rows)];
        for (const ntok of [1, 4, 19]) {
          const x = new Float32Array(ntok * cols).map((_, i) => Math.cos(i * 0.37));
          const plain = new Float32Array(ntok * rows), checked = new Float32Array(ntok * rows);
          k.k3_matmul_mxfp4(ptr(packed), ptr(scales), ptr(x), ptr(plain), ntok, rows, cols, 0, rows);
          const sums = new BigUint64Array(2), cut = Math.floor(rows / 2);
          const checkedRows = (r0: number, r1: number) =>
            k.k3_matmul_mxfp4_checked(
              ptr(packed),
              ptr(scales),
              ptr(x),
              ptr(checked),
              ntok,
              rows,
              cols,
              r0,
              r1,
              ptr(sums),
            );
          checkedRows(0, cut);
          checkedRows(cut, rows);
          const what = `${name} ${rows}x${cols} ntok ${ntok}`;
          assert.deepEqual([...sums].map(hex), want, what);
          assert.deepEqual(new Uint8Array(checked.buffer), new Uint8Array(plain.buffer), what);
          // a flipped nibble in a skipped group changes no output, but the check
          const g = scales.indexOf(255), saved = packed[g * 16 + 3];
          if (g >= 0) {
            packed[g * 16 + 3] ^= 0x10;
            sums.fill(0n);
            checkedRows(0, rows);
            assert.notEqual(hex(sums[0]), want[0], what);
            assert.deepEqual(new Uint8Array(checked.buffer), new Uint8Array(plain.buffer), what);
            packed[g * 16 + 3] = saved;
          }
        }
      }
    }
  } finally {
    for (const [, l] of all) l.close();
  }
});
