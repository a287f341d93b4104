/**
 * The trunk codec's measured speeds: how fast this machine decodes split-coded pieces
 * (kernels/k3io.h) on all its cores, how fast the bf16 product runs from the plain words and
 * from the coded form (WTYPE.bf16Split: the product decodes as it multiplies, as the trunk
 * ring has it do), and whether coding pays here (`codecVerdict`). `k3 pack --codec auto`
 * codes a trunk only where it does; `k3 doctor` prints the rates and the verdict.
 *
 * The verdict weighs a streamed pass the way the plan does (weights/throughput.ts): the
 * reads and the products overlap, so a trunk byte costs the slower of its read and its
 * product. Coding shrinks the read to the stored ratio and slows the product to its coded
 * rate; it pays when that is faster by CODEC_GAIN. On a disk that outruns the coded product
 * it does not, however well the pieces code.
 *
 * @module
 */

import { type Kernels, WTYPE } from "../native/ffi.ts";
import { splitEncode } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";
import { ioSymbols, nonblocking, symbols } from "../native/symbols.ts";

/** Predicted raw over coded time per streamed byte at which `--codec auto` codes. */
export const CODEC_GAIN = 1.1;

/** Bytes of the piece the decode rate is measured on (one trunk piece). */
const SAMPLE_PIECE = 16 << 20;

/** The decode symbol on Deno's blocking pool, so several decode at once (one per core). */
const decodeSymbols = {
  decode: { name: "k3io_split_decode", ...nonblocking(ioSymbols, "k3io_split_decode").k3io_split_decode },
  matmul: { name: "k3_matmul", ...nonblocking(symbols, "k3_matmul").k3_matmul },
} as const;

let decodeLib: Deno.DynamicLibrary<typeof decodeSymbols> | undefined;

/**
 * Fills `u16` with bf16 words of normally distributed weights of standard deviation `std`
 * (a fixed generator, so every machine measures the same piece). Their high bytes take a
 * few values, like real weights'; their low bytes are noise.
 */
export function normalBf16(u16: Uint16Array, std = 0.02, seed = 1): void {
  let s = seed >>> 0 || 1;
  const uniform = () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return (s + 1) / 4294967297;
  };
  const f = new Float32Array(1), w = new Uint32Array(f.buffer);
  for (let i = 0; i < u16.length; i++) {
    f[0] = std * Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
    u16[i] = w[0] >>> 16;
  }
}

/** What a decode-rate measurement found. */
export interface DecodeRate {
  /** Decoded bytes per second, all threads together (in place, as the I/O threads do). */
  bytesPerSecond: number;
  /** One-row bf16 product over plain words, weight bytes per second on all threads. */
  plainProduct: number;
  /** The same product from the coded form (WTYPE.bf16Split), decoded weight bytes per second. */
  splitProduct: number;
  /** Decodes (and products) run at once. */
  threads: number;
  /** Stored over decoded bytes of the sample piece. */
  ratio: number;
}

/** The sample piece as a matrix: rows x cols bf16 words. */
const SAMPLE_COLS = 8192, SAMPLE_ROWS = SAMPLE_PIECE / 2 / SAMPLE_COLS;

/**
 * Decodes a coded sample piece (normalBf16) on `threads` threads at once for about
 * `seconds` and returns the decoded bytes per second of them all (each thread its own
 * buffers, decoded from a separate copy as the pread leaves it); then times a one-row bf16
 * product over the decoded copies (one a thread), plain and from as many coded copies, its
 * rows split over the threads, for about `seconds` each. About 16 MB + 28 MB a thread.
 */
export async function measureDecodeRate(
  k: Kernels,
  libPath: string,
  threads = navigator.hardwareConcurrency,
  seconds = 0.5,
): Promise<DecodeRate> {
  decodeLib ??= Deno.dlopen(libPath, decodeSymbols);
  const lib = decodeLib.symbols;
  const bufs: NativeBuffer[] = [];
  const alloc = (bytes: number) => {
    const b = NativeBuffer.alloc(k, bytes, "codec sample");
    bufs.push(b);
    return b;
  };
  try {
    const coded = alloc(SAMPLE_PIECE), outs = Array.from({ length: threads }, () => alloc(SAMPLE_PIECE));
    const raw = outs[0]; // the sample, until the decodes write it back over itself
    normalBf16(new Uint16Array(raw.u8.buffer, raw.u8.byteOffset, SAMPLE_PIECE / 2));
    const stored = splitEncode(raw.ptr, SAMPLE_PIECE, coded.ptr, SAMPLE_PIECE);
    if (stored === 0) throw new Error("internal: the codec sample piece does not code");
    const once = async (o: NativeBuffer) => {
      const n = Number(await lib.decode(coded.ptr, BigInt(stored), o.ptr, BigInt(SAMPLE_PIECE)));
      if (n !== SAMPLE_PIECE) throw new Error("internal: the codec sample piece does not decode");
      return n;
    };
    // Once untimed: the first touch of fresh output pages is not the decode's cost (the ring's
    // slots are written over and over).
    await Promise.all(outs.map(once));
    const decode = await timed(seconds, () => Promise.all(outs.map(once)).then((n) => n.reduce((a, b) => a + b, 0)));

    // The products: over the decoded copies, and over as many coded ones with a descriptor
    // each (kernels/k3.h k3_split_matrix), so that with several threads they come from memory.
    const slots = [coded, ...outs.slice(1).map(() => alloc(stored))];
    const descs = slots.map((slot) => {
      slot.u8.set(coded.u8.subarray(0, stored));
      const d = alloc(16 + 24);
      const v = new DataView(d.u8.buffer, d.u8.byteOffset, 40);
      v.setBigUint64(0, 1n, true);
      v.setBigUint64(8, 0n, true);
      v.setBigUint64(16, BigInt(Deno.UnsafePointer.value(slot.ptr)), true);
      v.setBigUint64(24, BigInt(SAMPLE_PIECE), true);
      v.setBigUint64(32, BigInt(stored), true);
      return d;
    });
    const x = alloc(SAMPLE_COLS * 4), ys = Array.from({ length: threads }, () => alloc(SAMPLE_ROWS * 4));
    new Float32Array(x.u8.buffer, x.u8.byteOffset, SAMPLE_COLS).fill(1 / 64);
    const product = (ws: NativeBuffer[], wtype: number) => {
      let next = 0;
      return async () => {
        const w = ws[next++ % ws.length];
        await Promise.all(ys.map((y, t) => {
          const r0 = Math.floor(t * SAMPLE_ROWS / threads), r1 = Math.floor((t + 1) * SAMPLE_ROWS / threads);
          return lib.matmul(w.ptr, wtype, x.ptr, y.ptr, 1, SAMPLE_ROWS, SAMPLE_COLS, r0, r1);
        }));
        return SAMPLE_PIECE;
      };
    };
    const plainRun = product(outs, WTYPE.bf16), splitRun = product(descs, WTYPE.bf16Split);
    await plainRun();
    await splitRun();
    const plainProduct = await timed(seconds, plainRun), splitProduct = await timed(seconds, splitRun);
    return { bytesPerSecond: decode, plainProduct, splitProduct, threads, ratio: stored / SAMPLE_PIECE };
  } finally {
    bufs.forEach((b) => b.free());
  }
}

/** Bytes per second of `step` (which resolves to the bytes it did), repeated for about `seconds`. */
async function timed(seconds: number, step: () => Promise<number>): Promise<number> {
  let bytes = 0;
  const t0 = performance.now(), until = t0 + seconds * 1000;
  do bytes += await step(); while (performance.now() < until);
  return bytes / ((performance.now() - t0) / 1000);
}

/** The rates a codec verdict weighs, bytes per second. */
export interface CodecRates {
  /** The disk's sequential read (rate_probe.ts measureDiskRate). */
  disk: number;
  /** The bf16 product over plain words on all threads (DecodeRate.plainProduct). */
  plain: number;
  /** The bf16 product from the coded form on all threads (DecodeRate.splitProduct). */
  split: number;
  /** Stored over decoded bytes of the trunk's layers (or the sample piece's). */
  ratio: number;
}

/**
 * Whether coding pays with these rates, and the predicted coded over raw time of a streamed
 * trunk byte: max(ratio / disk, 1 / split) over max(1 / disk, 1 / plain) (the read and the
 * product overlap; the product decodes the coded form). Pays when coded is faster by
 * CODEC_GAIN.
 */
export function codecVerdict(r: CodecRates): { pays: boolean; predicted: number } {
  const predicted = Math.max(r.ratio / r.disk, 1 / r.split) / Math.max(1 / r.disk, 1 / r.plain);
  return { pays: predicted * CODEC_GAIN <= 1, predicted };
}
