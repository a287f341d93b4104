/**
 * Parallel matrix products, attention heads and SiTU's elements over Web Workers.
 *
 * Each worker dlopens the same kernel library, so native pointers (weights, activations)
 * are valid in every thread and nothing is copied. A job is posted through a
 * SharedArrayBuffer and woken with Atomics (a round trip costs ~10-40 us, so only large
 * products are split). The rows of a product are divided between the main thread and the
 * workers; each row's dot product has the same bits whichever thread computes it, so the
 * thread count never changes a token. A matrix with a check still to settle (a streamed
 * one, tensors.ts) is multiplied by k3_matmul_checked, and an expert fresh from the
 * shards by k3_matmul_mxfp4_checked: each thread adds its rows' checks into its own words,
 * and the words' sums go to the manifest's or the expert table's comparison. The attention
 * kernels (KDA's steps, MLA's absorb, attend and expand) split the same way by head ranges:
 * each head's result does not depend on the range (kernels/k3.h); SiTU-GLU by element
 * ranges, each element its own.
 *
 * @module
 */

import { type Kernels, libraryPath } from "./ffi.ts";
import { workerUrl } from "./embedded.ts";
import { NativeBuffer } from "./memory.ts";
import { type Matrix, type MatrixCheck, type Mxfp4, settleCheck } from "./tensors.ts";

/** A native pointer that is not null. */
export type Ptr = NonNullable<Deno.PointerValue>;

/** The products the forward pass needs; the single-threaded form calls the kernels directly. */
export interface Compute {
  /** y[t][r] = W[r] . x[t] for t < ntok; settles m.check when it is still open (throws
   * K3Error, exit 1, when the matrix's bytes do not match it). With `rows` [r0, r1), only
   * those rows (y keeps m.rows per token, and only those rows of m are read: a streamed
   * lm_head chunk); a check covers the whole matrix, so m must then have none open. */
  matmul(m: Matrix, x: Ptr, y: Ptr, ntok: number, rows?: RowRange): void;
  /** The same with an MXFP4 matrix; with `sums`, adds the checks of its packed and scale
   * rows (kernels/k3.h contract 5) to sums[0] and sums[1]. */
  mxfp4(m: Mxfp4, x: Ptr, y: Ptr, ntok: number, sums?: BigUint64Array): void;
  /** Heads [0, H) of one attention kernel call (see HeadCall), split across the threads
   * when its `work` (about the floats it touches) is worth it. */
  heads(call: HeadCall, H: number, work: number): void;
  /** Stops the workers. */
  close(): void;
}

/** The attention kernels that split by heads. */
export const HEAD_OP = { kda: 3, absorb: 4, attend: 5, expand: 6, situ: 7 } as const;

/**
 * One call of a per-head kernel, less its head range: `ptrs` and `ints` in the kernel's
 * order (the pointers first, then the integers, each group as the kernel takes them),
 * `scale` for attend.
 *   kda:    k3_kda_steps(S, q, k, v, beta, alpha, o | d, H, nrows)
 *   absorb: k3_mla_absorb(kvb, q, qlat | wtype, nrows, H, dn, dr, dv, dc)
 *   attend: k3_mla_attend_rows(q, knope, krope, v, out, scores | npos, nrows, H, kvheads, dn, dr, dv; scale)
 *   expand: k3_mla_expand(kvb, olat, out | wtype, H, dn, dv, dc)
 *   situ:   k3_situ_glu(g, u, out | ; scale, scale2), its "heads" the elements (each one's
 *           bits its own, so any split gives the same)
 */
export interface HeadCall {
  /** Which kernel (HEAD_OP). */
  op: number;
  /** Its pointer arguments. */
  ptrs: Ptr[];
  /** Its integer arguments. */
  ints: number[];
  /** Attend's score scale, SiTU's gate beta (0 for the others). */
  scale: number;
  /** SiTU's linear beta. */
  scale2?: number;
}

/** Runs heads [h0, h1) of `c` on this thread. */
export function runHeads(
  k: Kernels,
  c: { op: number; ptrs: Deno.PointerValue[]; ints: number[]; scale: number; scale2?: number },
  h0: number,
  h1: number,
): void {
  const p = c.ptrs, n = c.ints;
  switch (c.op) {
    case HEAD_OP.kda:
      return k.k3_kda_steps(p[0], p[1], p[2], p[3], p[4], p[5], p[6], n[0], n[1], n[2], h0, h1);
    case HEAD_OP.absorb:
      return k.k3_mla_absorb(p[0], n[0], p[1], p[2], n[1], n[2], n[3], n[4], n[5], n[6], h0, h1);
    case HEAD_OP.attend:
      return k.k3_mla_attend_rows(
        p[0],
        p[1],
        p[2],
        p[3],
        p[4],
        p[5],
        n[0],
        n[1],
        n[2],
        n[3],
        n[4],
        n[5],
        n[6],
        c.scale,
        h0,
        h1,
      );
    case HEAD_OP.expand:
      return k.k3_mla_expand(p[0], n[0], p[1], p[2], n[1], n[2], n[3], n[4], h0, h1);
    case HEAD_OP.situ: {
      const at = (q: Deno.PointerValue) => Deno.UnsafePointer.offset(q!, 4 * h0);
      return k.k3_situ_glu(at(p[0]), at(p[1]), at(p[2]), h1 - h0, c.scale, c.scale2 ?? 0);
    }
    default:
      throw new Error(`internal: head op ${c.op}`);
  }
}

/** Rows [r0, r1) of a product. */
export type RowRange = readonly [number, number];

/** The rows of m a product computes, and the check it settles (none for part of m). */
function productRows(m: Matrix, rows?: RowRange): { r0: number; r1: number; check?: MatrixCheck } {
  const check = m.check && !m.check.verified ? m.check : undefined;
  const [r0, r1] = rows ?? [0, m.rows];
  if (check && (r0 !== 0 || r1 !== m.rows)) throw new Error(`internal: ${check.what}: a check covers every row`);
  return { r0, r1, check };
}

/** Adds to target[j] (j = 0, 1) each thread's word j (words[2 * thread + j]), mod 2^64. */
function addWords(target: BigUint64Array, words: BigUint64Array, threads: number): void {
  for (let j = 0; j < 2; j++) {
    let s = target[j];
    for (let i = 0; i < threads; i++) s += words[2 * i + j];
    target[j] = BigInt.asUintN(64, s);
  }
}

/** Direct kernel calls on the calling thread. */
export function serialCompute(k: Kernels): Compute {
  const sum = new BigUint64Array(2), sumPtr = Deno.UnsafePointer.of(sum);
  return {
    matmul(m, x, y, ntok, rows) {
      const { r0, r1, check: c } = productRows(m, rows);
      sum[0] = 0n;
      k.k3_matmul_checked(m.ptr, m.wtype, x, y, ntok, m.rows, m.cols, r0, r1, c ? sumPtr : null);
      if (c) settleCheck(c, sum[0]);
    },
    mxfp4(m, x, y, ntok, sums) {
      sum.fill(0n);
      k.k3_matmul_mxfp4_checked(m.packed, m.scales, x, y, ntok, m.rows, m.cols, 0, m.rows, sums ? sumPtr : null);
      if (sums) addWords(sums, sum, 1);
    },
    heads(call, H) {
      runHeads(k, call, 0, H);
    },
    close() {},
  };
}

/** Layout of a worker's control block (Int32 slots, then pointer slots). */
export const CTRL = {
  /** Job sequence number; the worker waits on it. Negative: exit. */
  seq: 0,
  /** Last finished job sequence; the main thread waits on it. */
  done: 1,
  op: 2,
  /** i32 arguments: a product's wtype, ntok, rows, cols, r0, r1; a head call's integers,
   * with h0 and h1 in the last two. */
  args: 3,
  nargs: 12,
  /** The f32 slots of a head call's scale and scale2. */
  scale: 15,
  scale2: 16,
  /** Byte offset of the BigUint64 pointer slots: a product's w (or packed), scales, x, y,
   * check word; a head call's pointers. */
  ptrBytes: 72,
  nptr: 8,
  bytes: 136,
} as const;

/** Operation codes of a job in the control block (and HEAD_OP's). */
export const OP = { matmul: 1, mxfp4: 2 } as const;

/** Products smaller than this many weight elements stay on the main thread by default. */
export const SPLIT_MIN_ELEMS = 1 << 18;

interface WorkerSlot {
  worker: Worker;
  ctrl: Int32Array;
  /** The control block as f32 (a head call's scale). */
  f32: Float32Array;
  ptrs: BigUint64Array;
  seq: number;
}

/** A pool of `threads - 1` workers plus the calling thread. */
export class WorkerPool implements Compute {
  /** Two check words per thread (the calling one first): a dense product uses the first, an
   * MXFP4 one both (packed, scales). */
  private readonly sums: NativeBuffer;
  private readonly sumWords: BigUint64Array;

  private constructor(
    private readonly k: Kernels,
    private readonly slots: WorkerSlot[],
    private readonly splitMin: number,
  ) {
    this.sums = NativeBuffer.alloc(k, 16 * (slots.length + 1), "check words");
    this.sumWords = new BigUint64Array(this.sums.u8.buffer, this.sums.u8.byteOffset, 2 * (slots.length + 1));
  }

  /** Starts the workers and waits until each has loaded the kernel library. `splitMin`:
   * products with fewer weight elements run on the calling thread alone. */
  static async start(k: Kernels, threads: number, splitMin = SPLIT_MIN_ELEMS): Promise<WorkerPool> {
    const slots: WorkerSlot[] = [];
    const ready: Promise<void>[] = [];
    for (let i = 0; i < threads - 1; i++) {
      const sab = new SharedArrayBuffer(CTRL.bytes);
      const worker = new Worker(workerUrl(new URL("./pool_worker.ts", import.meta.url)), { type: "module" });
      ready.push(
        new Promise((resolve, reject) => {
          worker.onmessage = (e) => (e.data === "ready" ? resolve() : reject(new Error(String(e.data))));
          worker.onerror = (e) => {
            e.preventDefault();
            reject(new Error(`compute worker failed: ${e.message}`));
          };
        }),
      );
      worker.postMessage({ sab, libPath: libraryPath() });
      slots.push({
        worker,
        ctrl: new Int32Array(sab),
        f32: new Float32Array(sab),
        ptrs: new BigUint64Array(sab, CTRL.ptrBytes, CTRL.nptr),
        seq: 0,
      });
    }
    const pool = new WorkerPool(k, slots, splitMin);
    try {
      await Promise.all(ready);
    } catch (e) {
      pool.close();
      throw e;
    }
    return pool;
  }

  /** Threads in use, the calling one included. */
  get threads(): number {
    return this.slots.length + 1;
  }

  matmul(m: Matrix, x: Ptr, y: Ptr, ntok: number, rows?: RowRange): void {
    const { r0, r1, check: c } = productRows(m, rows);
    if (c) this.sumWords.fill(0n);
    this.run(OP.matmul, m.ptr, null, m.wtype, x, y, ntok, m.rows, m.cols, c !== undefined, r0, r1);
    if (c) {
      const total = new BigUint64Array(2);
      addWords(total, this.sumWords, this.slots.length + 1);
      settleCheck(c, total[0]);
    }
  }

  mxfp4(m: Mxfp4, x: Ptr, y: Ptr, ntok: number, sums?: BigUint64Array): void {
    if (sums) this.sumWords.fill(0n);
    this.run(OP.mxfp4, m.packed, m.scales, 0, x, y, ntok, m.rows, m.cols, sums !== undefined);
    if (sums) addWords(sums, this.sumWords, this.slots.length + 1);
  }

  heads(call: HeadCall, H: number, work: number): void {
    const n = this.slots.length + 1;
    if (n === 1 || work < this.splitMin || H < n) {
      runHeads(this.k, call, 0, H);
      return;
    }
    const bound = (i: number) => Math.floor((H * i) / n);
    this.dispatch((s, i) => {
      const c = s.ctrl;
      c[CTRL.op] = call.op;
      call.ints.forEach((v, j) => (c[CTRL.args + j] = v));
      c[CTRL.args + CTRL.nargs - 2] = bound(i + 1);
      c[CTRL.args + CTRL.nargs - 1] = bound(i + 2);
      s.f32[CTRL.scale] = call.scale;
      s.f32[CTRL.scale2] = call.scale2 ?? 0;
      call.ptrs.forEach((p, j) => (s.ptrs[j] = BigInt(Deno.UnsafePointer.value(p))));
    }, () => runHeads(this.k, call, 0, bound(1)));
  }

  /** Fills each worker's control block (`fill`), wakes them, runs the calling thread's
   * share (`own`), then waits for every worker. */
  private dispatch(fill: (s: WorkerSlot, i: number) => void, own: () => void): void {
    for (let i = 0; i < this.slots.length; i++) {
      const s = this.slots[i];
      fill(s, i);
      s.seq++;
      Atomics.store(s.ctrl, CTRL.seq, s.seq);
      Atomics.notify(s.ctrl, CTRL.seq);
    }
    own();
    for (const s of this.slots) {
      while (Atomics.load(s.ctrl, CTRL.done) !== s.seq) Atomics.wait(s.ctrl, CTRL.done, s.seq - 1, 50);
    }
  }

  /** Splits rows [r0, r1) (all by default; `rows` is the output's stride) evenly; the main
   * thread takes the first share, workers the rest. */
  private run(
    op: number,
    w: Ptr,
    scales: Ptr | null,
    wtype: number,
    x: Ptr,
    y: Ptr,
    ntok: number,
    rows: number,
    cols: number,
    check = false,
    r0 = 0,
    r1 = rows,
  ): void {
    const k = this.k;
    const sum = (i: number) => check ? this.sums.at(16 * i) : null;
    const call = (r0: number, r1: number) =>
      op === OP.matmul
        ? k.k3_matmul_checked(w, wtype, x, y, ntok, rows, cols, r0, r1, sum(0))
        : k.k3_matmul_mxfp4_checked(w, scales!, x, y, ntok, rows, cols, r0, r1, sum(0));
    const n = this.slots.length + 1, share = r1 - r0;
    if (n === 1 || share * cols < this.splitMin || share < 2 * n) {
      call(r0, r1);
      return;
    }
    const bound = (i: number) => r0 + Math.floor((share * i) / n);
    const pw = Deno.UnsafePointer.value(w), ps = scales ? Deno.UnsafePointer.value(scales) : 0n;
    const px = Deno.UnsafePointer.value(x), py = Deno.UnsafePointer.value(y);
    this.dispatch((s, i) => {
      const c = s.ctrl;
      c[CTRL.op] = op;
      c[CTRL.args] = wtype;
      c[CTRL.args + 1] = ntok;
      c[CTRL.args + 2] = rows;
      c[CTRL.args + 3] = cols;
      c[CTRL.args + 4] = bound(i + 1);
      c[CTRL.args + 5] = bound(i + 2);
      s.ptrs[0] = BigInt(pw);
      s.ptrs[1] = BigInt(ps);
      s.ptrs[2] = BigInt(px);
      s.ptrs[3] = BigInt(py);
      s.ptrs[4] = check ? BigInt(Deno.UnsafePointer.value(sum(i + 1))) : 0n;
    }, () => call(r0, bound(1)));
  }

  /** Stops the workers. */
  close(): void {
    for (const s of this.slots) {
      Atomics.store(s.ctrl, CTRL.seq, -1);
      Atomics.notify(s.ctrl, CTRL.seq);
      s.worker.terminate();
    }
    this.slots.length = 0;
    this.sums.free();
  }
}

/** The pool for `threads` (1: no workers). */
export async function startCompute(
  k: Kernels,
  threads: number,
  splitMin?: number,
): Promise<Compute> {
  return threads <= 1 ? serialCompute(k) : await WorkerPool.start(k, threads, splitMin);
}
