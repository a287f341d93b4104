/**
 * A compute worker of WorkerPool (pool.ts): loads the kernel library, then waits on its
 * control block for row ranges of matrix products and runs them.
 *
 * @module
 */

/// <reference lib="deno.worker" />

import { kernels } from "./ffi.ts";
import { CTRL, OP, runHeads } from "./pool.ts";

self.onmessage = (e: MessageEvent<{ sab: SharedArrayBuffer; libPath: string }>) => {
  let k;
  try {
    k = kernels(e.data.libPath);
  } catch (err) {
    self.postMessage(`compute worker cannot load kernels: ${(err as Error).message}`);
    return;
  }
  const ctrl = new Int32Array(e.data.sab);
  const ptrs = new BigUint64Array(e.data.sab, CTRL.ptrBytes, CTRL.nptr);
  const f32 = new Float32Array(e.data.sab);
  self.postMessage("ready");
  let last = 0;
  for (;;) {
    // Spin briefly before sleeping: jobs come in bursts, one per projection.
    let seq = Atomics.load(ctrl, CTRL.seq);
    for (let spin = 0; seq === last && spin < 2000; spin++) seq = Atomics.load(ctrl, CTRL.seq);
    if (seq === last) {
      Atomics.wait(ctrl, CTRL.seq, last);
      seq = Atomics.load(ctrl, CTRL.seq);
    }
    if (seq < 0) return;
    if (seq === last) continue;
    last = seq;
    const a = CTRL.args;
    const p = (i: number) => Deno.UnsafePointer.create(ptrs[i]);
    const [ntok, rows, cols, r0, r1] = [ctrl[a + 1], ctrl[a + 2], ctrl[a + 3], ctrl[a + 4], ctrl[a + 5]];
    // p(4): where this share's checks go (null: none wanted)
    const op = ctrl[CTRL.op];
    if (op === OP.matmul) k.k3_matmul_checked(p(0), ctrl[a], p(2), p(3), ntok, rows, cols, r0, r1, p(4));
    else if (op === OP.mxfp4) k.k3_matmul_mxfp4_checked(p(0), p(1), p(2), p(3), ntok, rows, cols, r0, r1, p(4));
    else {
      // A head call: its pointers, its integers, the scale; heads [h0, h1) in the last two.
      const ints = Array.from(ctrl.subarray(a, a + CTRL.nargs - 2));
      const all = Array.from({ length: CTRL.nptr }, (_, i) => p(i));
      runHeads(
        k,
        { op, ptrs: all, ints, scale: f32[CTRL.scale], scale2: f32[CTRL.scale2] },
        ctrl[a + CTRL.nargs - 2],
        ctrl[a + CTRL.nargs - 1],
      );
    }
    Atomics.store(ctrl, CTRL.done, seq);
    Atomics.notify(ctrl, CTRL.done);
  }
};
