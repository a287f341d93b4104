/**
 * Checked products (engine/native/pool.ts): a matrix with an open check is verified by its
 * product, on the calling thread alone or split over workers (each thread adds its rows'
 * words into its own slot); a match marks it verified and changes no output bit, a mismatch
 * throws K3Error (exit 1) naming it, and a verified matrix is not checked again.
 *
 * @module
 */
import assert from "node:assert/strict";
import { kernels, WTYPE } from "../../engine/native/ffi.ts";
import { NativeBuffer } from "../../engine/native/memory.ts";
import { type Compute, HEAD_OP, serialCompute, startCompute } from "../../engine/native/pool.ts";
import { type Matrix, tensorCheck } from "../../engine/native/tensors.ts";
import { EXIT, K3Error } from "../../engine/errors.ts";

Deno.test("checked products: serial and over 3 threads, any token count; mismatch throws K3Error; MXFP4 sums", async () => {
  const k = kernels();
  const rows = 61, cols = 200, ntokMax = 5;
  const w = NativeBuffer.alloc(k, rows * cols * 2, "w");
  const x = NativeBuffer.alloc(k, ntokMax * cols * 4, "x");
  const y0 = NativeBuffer.alloc(k, ntokMax * rows * 4, "y0"), y1 = NativeBuffer.alloc(k, ntokMax * rows * 4, "y1");
  const wv = new Uint16Array(w.u8.buffer, w.u8.byteOffset, rows * cols);
  for (let i = 0; i < wv.length; i++) wv[i] = 0x3c00 | ((i * 7919) & 0x80ff);
  new Float32Array(x.u8.buffer, x.u8.byteOffset, ntokMax * cols).forEach((_, i, a) => a[i] = Math.sin(i));
  const expect = tensorCheck(k, { keep: "matrix", shape: [rows, cols], bytes: rows * cols * 2 }, w.ptr);
  const pool = await startCompute(k, 3, 1);
  try {
    for (const [name, c] of [["serial", serialCompute(k)], ["3 threads", pool]] as [string, Compute][]) {
      for (const ntok of [1, 2, 5]) {
        const plain: Matrix = { ptr: w.ptr, wtype: WTYPE.bf16, rows, cols };
        serialCompute(k).matmul(plain, x.ptr, y0.ptr, ntok);
        const m: Matrix = { ...plain, check: { expect, verified: false, what: "test matrix" } };
        c.matmul(m, x.ptr, y1.ptr, ntok);
        assert.ok(m.check!.verified, `${name} ntok ${ntok}`);
        assert.deepEqual(y1.u8.subarray(0, ntok * rows * 4), y0.u8.subarray(0, ntok * rows * 4));
        const bad: Matrix = { ...plain, check: { expect: "0123456789abcdef", verified: false, what: "test matrix" } };
        assert.throws(
          () => c.matmul(bad, x.ptr, y1.ptr, ntok),
          (e) =>
            e instanceof K3Error && e.exitCode === EXIT.runtime &&
            /^test matrix: checksum mismatch \(manifest 0123456789abcdef, data [0-9a-f]{16}\)/.test(e.message),
        );
        assert.equal(bad.check!.verified, false);
        // once verified, not checked again (a wrong expectation is no longer looked at)
        m.check!.expect = "0123456789abcdef";
        c.matmul(m, x.ptr, y1.ptr, ntok);
      }
      // a damaged weight: the split product sums to another check
      wv[rows * cols - 1] ^= 1;
      const m: Matrix = { ptr: w.ptr, wtype: WTYPE.bf16, rows, cols, check: { expect, verified: false, what: "w" } };
      assert.throws(() => c.matmul(m, x.ptr, y1.ptr, 1), K3Error);
      wv[rows * cols - 1] ^= 1;
    }
    // MXFP4: the packed and scale rows' checks, summed over the threads' shares
    const mrows = 64, mcols = 256;
    const packed = NativeBuffer.alloc(k, mrows * mcols / 2, "packed"),
      scales = NativeBuffer.alloc(k, mrows * mcols / 32, "scales");
    try {
      packed.u8.forEach((_, i, a) => (a[i] = (i * 2654435761) >>> 24));
      scales.u8.forEach((_, i, a) => (a[i] = i % 7 === 0 ? 255 : 124 + (i % 6)));
      const mx = { packed: packed.ptr, scales: scales.ptr, rows: mrows, cols: mcols };
      const want = new BigUint64Array(2);
      k.k3_matrix_check(packed.ptr, mcols / 2, 0, mrows, Deno.UnsafePointer.of(want));
      k.k3_matrix_check(scales.ptr, mcols / 32, 0, mrows, Deno.UnsafePointer.offset(Deno.UnsafePointer.of(want)!, 8));
      for (const c of [serialCompute(k), pool]) {
        for (const ntok of [1, 3]) {
          const sums = new BigUint64Array([5n, 7n]); // added to, not overwritten
          c.mxfp4(mx, x.ptr, y1.ptr, ntok, sums);
          assert.deepEqual([...sums], [BigInt.asUintN(64, want[0] + 5n), BigInt.asUintN(64, want[1] + 7n)]);
        }
      }
    } finally {
      packed.free();
      scales.free();
    }
  } finally {
    pool.close();
    for (const b of [w, x, y0, y1]) b.free();
  }
});

Deno.test("attention heads over 3 threads: the KDA step and MLA attend give the serial bits", async () => {
  const k = kernels();
  const H = 7, d = 16, npos = 9, dc = 24, dr = 8;
  const buf = (n: number, seed: number) => {
    const b = NativeBuffer.alloc(k, n * 4, "heads test");
    new Float32Array(b.u8.buffer, b.u8.byteOffset, n).forEach((_, i, a) => (a[i] = Math.sin(i * 0.37 + seed) * 0.5));
    return b;
  };
  const f32 = (b: NativeBuffer, n: number) => new Float32Array(b.u8.buffer, b.u8.byteOffset, n).slice();
  const pool = await startCompute(k, 3, 1);
  const all: NativeBuffer[] = [];
  try {
    const run = (c: Compute) => {
      // Fresh inputs per run: the KDA step updates its state in place.
      const S = buf(H * d * d, 1), q = buf(H * d, 2), kk = buf(H * d, 3), v = buf(H * d, 4);
      const beta = buf(H, 5), alpha = buf(H * d, 6), o = buf(H * d, 7);
      const ql = buf(H * (dc + dr), 8), lat = buf(npos * dc, 9), kr = buf(npos * dr, 10);
      const out = buf(H * dc, 11), scores = buf(H * npos, 12);
      all.push(S, q, kk, v, beta, alpha, o, ql, lat, kr, out, scores);
      c.heads(
        { op: HEAD_OP.kda, ptrs: [S.ptr, q.ptr, kk.ptr, v.ptr, beta.ptr, alpha.ptr, o.ptr], ints: [d, H, 1], scale: 0 },
        H,
        1,
      );
      c.heads(
        {
          op: HEAD_OP.attend,
          ptrs: [ql.ptr, lat.ptr, kr.ptr, lat.ptr, out.ptr, scores.ptr],
          ints: [npos, 1, H, 1, dc, dr, dc],
          scale: 0.25,
        },
        H,
        1,
      );
      return [f32(S, H * d * d), f32(o, H * d), f32(out, H * dc)];
    };
    const serial = run(serialCompute(k)), split = run(pool);
    serial.forEach((want, i) =>
      assert.deepEqual(new Uint8Array(split[i].buffer), new Uint8Array(want.buffer), `output ${i} bit-identical`)
    );
    assert.ok(serial[1].some((x) => x !== 0), "the KDA step wrote its output");
  } finally {
    pool.close();
    all.forEach((b) => b.free());
  }
});
