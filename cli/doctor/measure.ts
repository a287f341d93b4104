/**
 * `k3 doctor`'s measurements: the disk's read speed the way the engine reads (a temporary
 * file, O_DIRECT random and sequential reads) and the trunk codec's decode rate.
 *
 * @module
 */

import { type Kernels, libraryPath } from "../../engine/native/ffi.ts";
import { CODEC_GAIN, codecVerdict, measureDecodeRate } from "../../engine/weights/codec.ts";
import { IoFile } from "../../engine/native/io.ts";
import { progress } from "../progress.ts";
import { EXPERT_READ } from "./facts.ts";

/** Read-speed results in bytes per second (undefined: not measured). */
export interface Speeds {
  /** Whether the reads bypassed the page cache (O_DIRECT). */
  direct: boolean;
  /** Writing the file. */
  write?: number;
  /** 17.5 MB random reads, one at a time. */
  random1?: number;
  /** 17.5 MB random reads, 16 in flight. */
  random16?: number;
  /** Large sequential reads. */
  sequential?: number;
}

/** Writes a size-byte file, then measures random and sequential reads on it. */
export async function measure(k: Kernels, path: string, size: number): Promise<Speeds> {
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

/** A rate as "1.23 GB/s" ("-": not measured). */
export const gbps = (x?: number): string => (x === undefined ? "-" : `${(x / 1e9).toFixed(2)} GB/s`);

/**
 * The trunk codec's line: the split decode rate and the bf16 product's rates (plain and
 * from the coded form) measured on every thread (engine/weights/codec.ts), beside the
 * disk's sequential O_DIRECT rate when it was measured, and what `k3 pack --codec auto`
 * would choose here.
 */
export async function codecLine(
  k: Kernels,
  disk: number | undefined,
  line: (label: string, text: string) => void,
): Promise<void> {
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
