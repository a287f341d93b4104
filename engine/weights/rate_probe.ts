/**
 * Start-up probes of the rates the plan's tokens/s prediction uses (weights/throughput.ts):
 * the disk's O_DIRECT read rate the way the ring reads (16 MB pieces, 8 in flight) and the
 * bf16 product's rate on every compute thread at once, both measured as the machine is now
 * (a loaded machine computes and reads slower, and the prediction should say so).
 *
 * @module
 */

import { type Kernels, libraryPath } from "../native/ffi.ts";
import { nonblocking, symbols } from "../native/symbols.ts";
import { ALIGN, IoFile } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { DEFAULT_COMPUTE, GROWTH_ROWS, type PassRates, TILE_GROWTH_ROWS } from "./throughput.ts";

/** The bf16 product as a nonblocking call, so that one runs on each thread at once. */
const probeSymbols = nonblocking(symbols, "k3_matmul");

let probeLib: Deno.DynamicLibrary<typeof probeSymbols> | undefined;

/** Rows of the probe matrix per thread, at the model's width: 58.7 MB each, beyond the caches. */
const PROBE_ROWS = 4096;
const PROBE_COLS = 7168;

/** What the bf16 probe measures (measureDense). */
export interface DenseProbe {
  /** Bytes per second of bf16 weights one-row products consume, on all threads at once. */
  rate: number;
  /** What each row beyond the first adds to a product over the same weights, as a share of
   * the first row's cost (PassRates.rowGrowth), from GROWTH_ROWS-row products. */
  rowGrowth: number;
  /** The same from TILE_GROWTH_ROWS-row products (PassRates.tileRowGrowth). */
  tileRowGrowth: number;
}

/**
 * The bf16 product on `threads` threads at once (each its own rows of one matrix, as the
 * compute pool splits them): one-row, GROWTH_ROWS-row and TILE_GROWTH_ROWS-row products
 * alternated, `rounds` of each, medians (not the best: on a shared machine the run gets the
 * typical share of the cores, not the luckiest).
 */
export async function measureDense(k: Kernels, threads: number, rounds = 5): Promise<DenseProbe> {
  probeLib ??= Deno.dlopen(libraryPath(), probeSymbols);
  const rows = PROBE_ROWS * threads, bytes = rows * PROBE_COLS * 2;
  const w = NativeBuffer.alloc(k, bytes, "rate probe matrix");
  const x = NativeBuffer.alloc(k, TILE_GROWTH_ROWS * PROBE_COLS * 4, "rate probe x");
  const y = NativeBuffer.alloc(k, TILE_GROWTH_ROWS * rows * 4, "rate probe y");
  try {
    new Uint16Array(w.u8.buffer, w.u8.byteOffset, bytes / 2).fill(0x3c00); // 2^-7: finite, and faults every page in
    x.f32().fill(0.5);
    const product = async (ntok: number) => {
      const t0 = performance.now();
      await Promise.all(
        Array.from(
          { length: threads },
          (_, t) =>
            probeLib!.symbols.k3_matmul(
              w.ptr,
              1,
              x.ptr,
              y.ptr,
              ntok,
              rows,
              PROBE_COLS,
              t * PROBE_ROWS,
              (t + 1) * PROBE_ROWS,
            ),
        ),
      );
      return (performance.now() - t0) / 1000;
    };
    const one: number[] = [], many: number[] = [], tile: number[] = [];
    for (let r = 0; r < rounds; r++) {
      one.push(await product(1));
      many.push(await product(GROWTH_ROWS));
      tile.push(await product(TILE_GROWTH_ROWS));
    }
    const t1 = Math.max(median(one), 1e-9);
    const growth = (times: number[], n: number) => Math.max(0, (median(times) / t1 - 1) / (n - 1));
    return { rate: bytes / t1, rowGrowth: growth(many, GROWTH_ROWS), tileRowGrowth: growth(tile, TILE_GROWTH_ROWS) };
  } finally {
    [w, x, y].forEach((b) => b.free());
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1];
}

/** Bytes of the disk probe: a second or less at this class of disk's rate, enough that the
 * 8 reads in flight are a small part of it. */
const DISK_PROBE_BYTES = 512 << 20;

/**
 * The sequential O_DIRECT read rate of the first `bytes` of `path` (bytes per second): 16 MB
 * pieces, 8 in flight (how the ring reads), into buffers faulted in first; Infinity for a
 * file under 4096 bytes. It counts what it asked for, every read checked to be whole: a
 * running `done += await read()` would lose the counts of reads that finish together.
 * The plan's prediction, the codec's verdict (`pack --codec auto`) and the benches use it.
 */
export async function measureDiskRate(k: Kernels, path: string, bytes = DISK_PROBE_BYTES): Promise<number> {
  const f = IoFile.open(path, { direct: true });
  const piece = 16 << 20, depth = 8;
  const bufs = Array.from({ length: depth }, () => NativeBuffer.alloc(k, piece, "read rate"));
  bufs.forEach((b) => b.prefault());
  try {
    const size = Math.floor(Math.min(f.size(), bytes) / ALIGN) * ALIGN;
    if (size === 0) return Infinity;
    let next = 0;
    const t0 = performance.now();
    await Promise.all(bufs.map(async (b) => {
      while (next < size) {
        const at = next, len = Math.min(piece, size - at);
        next += piece;
        const n = await f.pread(b.ptr, len, at);
        if (n !== len) throw new Error(`${path}: short read of ${n} of ${len} bytes at ${at}`);
      }
    }));
    return size / Math.max((performance.now() - t0) / 1000, 1e-9);
  } finally {
    bufs.forEach((b) => b.free());
    f.close();
  }
}

/**
 * The rates the plan predicts with, measured now: the disk on `path` (the packed trunk's
 * data, or a shard), the bf16 product and its row growth on `threads` threads; the MXFP4
 * product at the share of the bf16 rate DEFAULT_COMPUTE assumes, and its row growth taken
 * as the bf16 product's (both kernels carry several rows per pass over the weights: at 16
 * rows bench/limits.ts measures 0.19 and 0.21 of one row's time per row).
 */
export async function measureRates(k: Kernels, path: string, threads: number): Promise<PassRates> {
  const disk = await measureDiskRate(k, path);
  const dense = await measureDense(k, threads);
  return {
    disk,
    dense: dense.rate,
    expert: dense.rate * DEFAULT_COMPUTE.expert / DEFAULT_COMPUTE.dense,
    rowGrowth: dense.rowGrowth,
    expertRowGrowth: dense.rowGrowth,
    tileRowGrowth: dense.tileRowGrowth,
  };
}
