/**
 * This disk, measured the way the engine reads it: O_DIRECT sequential reads (readPieces
 * into a 1 GB region: 16 MB pieces, 8 in flight, like a streamed trunk layer) and random
 * 17.5 MB reads (one routed expert each, 16 in flight, like a layer's cache misses) through
 * engine/native/io.ts, into buffers already faulted in.
 *
 *   deno run -A bench/disk.ts FILE [--gb 2]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { kernels } from "../engine/native/ffi.ts";
import { ALIGN, alignUp, IoFile } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { readPieces } from "../engine/weights/trunk_file.ts";

export interface DiskResult {
  direct: boolean;
  seqGBps: number;
  randGBps: number;
  seqBytes: number;
  randBytes: number;
}

/** Sequential then random O_DIRECT reads of `file` (at most `maxBytes` each). */
export async function measureDisk(
  file: string,
  maxBytes = 2e9,
  opts: { piece?: number; depth?: number; randReads?: number; randDepth?: number } = {},
): Promise<DiskResult> {
  const k = kernels();
  const f = IoFile.open(file, { direct: true });
  const piece = opts.piece ?? 16 << 20, depth = opts.depth ?? 8;
  const expert = alignUp(17_547_264);
  const randDepth = opts.randDepth ?? 16;
  const bufs = Array.from({ length: randDepth }, () => NativeBuffer.alloc(k, expert, "disk bench"));
  try {
    const size = f.size();
    // Sequential, as a streamed layer is read: a 1 GB region (pages already faulted in, as
    // the ring's are after the first token) filled by readPieces (16 MB pieces, `depth` in
    // flight), region after region.
    const region = Math.min(1 << 30, Math.floor(maxBytes / ALIGN) * ALIGN);
    const seqBuf = NativeBuffer.alloc(k, region, "disk bench region");
    let seqBytes = 0, seqS = 0;
    try {
      seqBuf.u8.fill(0);
      const t0 = performance.now();
      for (let off = 0; off + region <= Math.min(size, maxBytes); off += region) {
        seqBytes += await readPieces(f, seqBuf.ptr, region, off, piece, depth);
      }
      seqS = (performance.now() - t0) / 1000;
    } finally {
      seqBuf.free();
    }
    // Random expert-sized reads at aligned offsets.
    for (const b of bufs) b.u8.fill(0); // fault the slots in, as a warm cache has them
    const n = opts.randReads ?? Math.max(randDepth, Math.floor(Math.min(maxBytes, size) / expert));
    let seed = 12345;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const offsets = Array.from({ length: n }, () => Math.floor((rand() * (size - expert)) / ALIGN) * ALIGN);
    const t0 = performance.now();
    let i = 0;
    const rworker = async (b: NativeBuffer) => {
      while (i < offsets.length) await f.readExact(b.ptr, expert, offsets[i++]);
    };
    await Promise.all(bufs.slice(0, randDepth).map(rworker));
    const randS = (performance.now() - t0) / 1000;
    return {
      direct: f.direct,
      seqGBps: seqBytes / seqS / 1e9,
      randGBps: (n * expert) / randS / 1e9,
      seqBytes,
      randBytes: n * expert,
    };
  } finally {
    bufs.forEach((b) => b.free());
    f.close();
  }
}

if (import.meta.main) {
  const usage = "usage: deno run -A bench/disk.ts FILE [--gb N]   (FILE: a scratch file it writes, then removes)";
  const { values, positionals } = benchArgs(usage, { gb: { type: "string" } }, true);
  const file = positionals[0];
  if (!file || positionals.length > 1) {
    console.error(usage);
    Deno.exit(2);
  }
  const r = await measureDisk(file, Number(values.gb ?? 2) * 1e9);
  console.log(
    `${file}: ${r.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)"}; sequential ${r.seqGBps.toFixed(2)} GB/s over ${
      (r.seqBytes / 1e9).toFixed(2)
    } GB; random 17.5 MB reads ${r.randGBps.toFixed(2)} GB/s over ${(r.randBytes / 1e9).toFixed(2)} GB`,
  );
}
