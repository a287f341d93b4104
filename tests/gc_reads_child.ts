/**
 * Child of gc_reads_test.ts (run with --v8-flags=--expose-gc): hashed reads in flight on
 * the I/O threads while the JS thread churns garbage and forces collections, each result
 * checked against hashing the bytes afterwards. Prints one JSON line of counts.
 *
 *   deno run --v8-flags=--expose-gc -P=k3 tests/gc_reads_child.ts <dir> <rounds>
 *
 * @module
 */

import { hashHex, IoFile } from "../engine/native/io.ts";
import { kernels } from "../engine/native/ffi.ts";
import { NativeBuffer } from "../engine/native/memory.ts";

const [dir, roundsArg] = Deno.args;
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error("run with --v8-flags=--expose-gc");
const k = kernels();
const N = 16 << 20, path = `${dir}/data.bin`;
const bytes = new Uint8Array(N);
for (let i = 0; i < N; i += 65536) crypto.getRandomValues(bytes.subarray(i, i + 65536));
Deno.writeFileSync(path, bytes);
const f = IoFile.open(path, { direct: true });
const bufs = Array.from({ length: 8 }, () => NativeBuffer.alloc(k, N + 8192, "gc probe"));
const counts = { calls: 0, badHash: 0 };
const whole = hashHex(Deno.UnsafePointer.of(bytes)!, N);
let junk: unknown[] = [];
for (let round = 0; round < Number(roundsArg); round++) {
  const reads = bufs.map(async (b) => {
    const r = await f.preadHashed(b.ptr, N, 0);
    counts.calls++;
    if (r.hash !== whole) counts.badHash++;
  });
  // While the reads are in flight: garbage of the sizes the reads' own arrays have, then a
  // full GC. (On this machine a part list that JS did not use after the call was lost from
  // round 86 on, once the read function was optimized; 16 MB reads stay in flight long
  // enough for that.)
  for (let j = 0; j < 4000; j++) junk.push(new BigUint64Array(j % 13));
  if (junk.length > 50000) junk = [];
  gc();
  await Promise.all(reads);
}
f.close();
bufs.forEach((b) => b.free());
console.log(JSON.stringify(counts));
