/**
 * The trunk codec's measured speeds: how fast this machine decodes split-coded pieces
 * (kernels/k3io.h) on all its cores and how fast its disk reads a trunk, and whether coding
 * pays here (`codecVerdict`). `k3 pack --codec auto` codes a trunk only where it does; `k3
 * doctor` prints both rates and the verdict.
 *
 * The verdict is deliberately the worst case: the decode runs on the I/O threads, on the
 * same cores as the forward pass, so when the cores are busy its time adds to the token
 * instead of hiding behind the read. Measured on a 2-core machine whose streamed token was
 * already close to its compute, a coded trunk made the floor token slower although the
 * decode ran several times the disk's rate (README, "Trunk codec").
 *
 * @module
 */

import type { Kernels } from "../native/ffi.ts";
import { splitEncode } from "../native/io.ts";
import { NativeBuffer } from "../native/memory.ts";

/** Decode rate over disk rate below which `--codec auto` never codes (the decode must keep
 * ahead of the disk on the cores there are). */
export const CODEC_MARGIN = 1.5;
/** Predicted raw over coded time per streamed byte at which `--codec auto` codes. */
export const CODEC_GAIN = 1.1;

/** Bytes of the piece the decode rate is measured on (one trunk piece). */
const SAMPLE_PIECE = 16 << 20;

/** The decode symbol on Deno's blocking pool, so several decode at once (one per core). */
const decodeSymbols = {
  decode: {
    name: "k3io_split_decode",
    parameters: ["pointer", "u64", "pointer", "u64"],
    result: "i64",
    nonblocking: true,
  },
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
  /** Decoded bytes per second, all threads together. */
  bytesPerSecond: number;
  /** Decodes run at once. */
  threads: number;
  /** Stored over decoded bytes of the sample piece. */
  ratio: number;
}

/**
 * Decodes a coded sample piece (normalBf16) on `threads` threads at once for about
 * `seconds` and returns the decoded bytes per second of them all (each thread its own
 * buffers, decoded from a separate copy as the pread leaves it).
 */
export async function measureDecodeRate(
  k: Kernels,
  libPath: string,
  threads = navigator.hardwareConcurrency,
  seconds = 0.5,
): Promise<DecodeRate> {
  decodeLib ??= Deno.dlopen(libPath, decodeSymbols);
  const raw = NativeBuffer.alloc(k, SAMPLE_PIECE, "codec sample");
  const coded = NativeBuffer.alloc(k, SAMPLE_PIECE, "codec sample");
  const outs = Array.from({ length: threads }, () => NativeBuffer.alloc(k, SAMPLE_PIECE, "codec sample"));
  try {
    normalBf16(new Uint16Array(raw.u8.buffer, raw.u8.byteOffset, SAMPLE_PIECE / 2));
    const stored = splitEncode(raw.ptr, SAMPLE_PIECE, coded.ptr, SAMPLE_PIECE);
    if (stored === 0) throw new Error("internal: the codec sample piece does not code");
    const once = async (o: NativeBuffer) => {
      const n = Number(await decodeLib!.symbols.decode(coded.ptr, BigInt(stored), o.ptr, BigInt(SAMPLE_PIECE)));
      if (n !== SAMPLE_PIECE) throw new Error("internal: the codec sample piece does not decode");
      return n;
    };
    // Once untimed: the first touch of fresh output pages is not the decode's cost (the ring's
    // slots are written over and over).
    await Promise.all(outs.map(once));
    let decoded = 0;
    const t0 = performance.now(), until = t0 + seconds * 1000;
    await Promise.all(outs.map(async (o) => {
      do decoded += await once(o); while (performance.now() < until);
    }));
    const s = (performance.now() - t0) / 1000;
    return { bytesPerSecond: decoded / s, threads, ratio: stored / SAMPLE_PIECE };
  } finally {
    raw.free();
    coded.free();
    outs.forEach((o) => o.free());
  }
}

/** The rates a codec verdict weighs, bytes per second. */
export interface CodecRates {
  /** Split decode on all threads (measureDecodeRate). */
  decode: number;
  /** The disk's sequential read (rate_probe.ts measureDiskRate). */
  disk: number;
  /** Stored over decoded bytes of the trunk's layers (or the sample piece's). */
  ratio: number;
}

/**
 * Whether coding pays with these rates, and the predicted coded over raw time of a token
 * bound by the trunk read: `ratio` + disk / decode (the coded read, plus the decode's time on
 * all cores as if it overlapped nothing). Pays when the decode keeps ahead of the disk by
 * CODEC_MARGIN and the prediction is faster by CODEC_GAIN.
 */
export function codecVerdict(r: CodecRates): { pays: boolean; predicted: number } {
  const predicted = r.ratio + r.disk / r.decode;
  return { pays: r.decode >= CODEC_MARGIN * r.disk && predicted * CODEC_GAIN <= 1, predicted };
}
