/**
 * The lm_head on one thread and on the pool: a synthetic real-width head (32768 x 7168 bf16,
 * 470 MB) multiplied the way a streamed weight source does it, both ways it has:
 *
 * - resident: the whole matrix in memory, one `compute.matmul` (StreamedWeights' resident
 *   head, and ResidentWeights');
 * - streamed: ultra's chunks (head_stream.ts, from a checkpoint shard read O_DIRECT), each
 *   chunk's rows multiplied on the compute while the next chunk is read.
 *
 * For each, seconds per head (median and best over the rounds, thread counts alternated),
 * the I/O wait of the streamed one, the calling thread's own CPU seconds per head (from
 * /proc/thread-self/stat: what the pool takes off it, whatever else the machine runs), the
 * 1-thread / N-thread ratios, and a check that the logits have the same bits on every
 * thread count.
 * Data: /var/tmp/k3-bench/head/ or --dir (a one-shard checkpoint, written once; --clean
 * deletes it). From a disk the streamed head waits on its reads (the multiply runs while
 * the next chunk is read); `--dir /dev/shm/k3-head` (tmpfs: no O_DIRECT, reads are copies)
 * shows what the multiply itself costs on the chunks.
 *
 *   deno run -A bench/head.ts [--rounds N] [--threads N] [--tokens N] [--dir DIR] [--clean]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { kernels, WTYPE } from "../engine/native/ffi.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { type Compute, startCompute } from "../engine/native/pool.ts";
import { noIoStats } from "../engine/model/weight_source.ts";
import { HEAD_NAME, PREFIX } from "../engine/model/tensors.ts";
import { Checkpoint } from "../engine/weights/safetensors.ts";
import { StreamedEmbedHead } from "../engine/weights/head_stream.ts";

const USAGE = "usage: deno run -A bench/head.ts [--rounds N] [--threads N] [--tokens N] [--dir DIR] [--clean]";
const { values } = benchArgs(USAGE, {
  rounds: { type: "string" },
  threads: { type: "string" },
  tokens: { type: "string" },
  dir: { type: "string" },
  clean: { type: "boolean" },
});
const DIR = values.dir ?? "/var/tmp/k3-bench/head";
if (values.clean) {
  await Deno.remove(DIR, { recursive: true }).catch(() => {});
  Deno.exit(0);
}
const rounds = Number(values.rounds ?? 5), threads = Number(values.threads ?? 2), ntok = Number(values.tokens ?? 1);
const V = 32768, D = 7168, HEAD_BYTES = V * D * 2, ROW = D * 2;
const SHARD = `${DIR}/model.safetensors`;

/** A one-shard checkpoint: a one-row embedding (never read here) and the head, random bf16. */
async function writeShard(): Promise<void> {
  await Deno.mkdir(DIR, { recursive: true });
  const header = JSON.stringify({
    [PREFIX + "embed_tokens.weight"]: { dtype: "BF16", shape: [1, D], data_offsets: [0, ROW] },
    [HEAD_NAME]: { dtype: "BF16", shape: [V, D], data_offsets: [ROW, ROW + HEAD_BYTES] },
  });
  const h = new TextEncoder().encode(header.padEnd(Math.ceil((header.length + 8) / 4096) * 4096 - 8, " "));
  const f = await Deno.open(SHARD, { write: true, create: true, truncate: true });
  const len = new Uint8Array(8);
  new DataView(len.buffer).setBigUint64(0, BigInt(h.length), true);
  await f.write(len);
  await f.write(h);
  const block = new Uint16Array(ROW * 256 / 2);
  let seed = 0x9e3779b9 | 0;
  for (let done = 0; done < ROW + HEAD_BYTES; done += block.byteLength) {
    // xorshift32 sign and mantissa, exponent 2^-7: finite, no NaN or inf
    for (let i = 0; i < block.length; i++) {
      seed ^= seed << 13, seed ^= seed >>> 17, seed ^= seed << 5;
      block[i] = (seed & 0x807f) | 0x3c00;
    }
    const n = Math.min(block.byteLength, ROW + HEAD_BYTES - done);
    await f.write(new Uint8Array(block.buffer, 0, n));
  }
  f.close();
}
const have = await Deno.stat(SHARD).then((s) => s.size, () => 0);
if (have < ROW + HEAD_BYTES) await writeShard();

const k = kernels();
const ckpt = await Checkpoint.open(DIR);
const stats = noIoStats();
const streamed = StreamedEmbedHead.fromCheckpoint(k, { vocabSize: V, hiddenSize: D }, ckpt, stats);
// The resident head: the same bytes read into memory.
const t = ckpt.get(HEAD_NAME);
const headBuf = NativeBuffer.alloc(k, HEAD_BYTES, "head");
{
  const f = await Deno.open(t.file);
  await f.seek(t.offset, Deno.SeekMode.Start);
  for (let at = 0; at < HEAD_BYTES;) {
    const n = await f.read(headBuf.u8.subarray(at, Math.min(HEAD_BYTES, at + (64 << 20))));
    if (n === null) throw new Error("short shard");
    at += n;
  }
  f.close();
}
const resident = { ptr: headBuf.ptr, wtype: WTYPE.bf16, rows: V, cols: D };
const x = NativeBuffer.alloc(k, ntok * D * 4, "x");
new Float32Array(x.u8.buffer, x.u8.byteOffset, ntok * D).forEach((_, i, a) => (a[i] = Math.sin(0.001 * i)));
const ys = new Map<string, NativeBuffer>();
const computes = new Map<number, Compute>([[1, await startCompute(k, 1)], [threads, await startCompute(k, threads)]]);
/** CPU seconds the calling thread has used (user + system; 100 ticks a second). */
function threadCpu(): number {
  const fields = Deno.readTextFileSync("/proc/thread-self/stat").split(") ")[1].split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}
const times = new Map<string, number[]>();
const cpu = new Map<string, number>();
const waits = new Map<string, number[]>();
for (let round = 0; round < rounds; round++) {
  const order = [...computes.keys()];
  if (round % 2) order.reverse();
  for (const n of order) {
    const c = computes.get(n)!;
    for (const way of ["resident", "streamed"]) {
      const name = `${way} ${n}`;
      const y = ys.get(name) ?? NativeBuffer.alloc(k, ntok * V * 4, name);
      ys.set(name, y);
      const w0 = stats.ioWaitSeconds, t0 = performance.now(), c0 = threadCpu();
      if (way === "resident") c.matmul(resident, x.ptr, y.ptr, ntok);
      else await streamed.matmul(x.ptr, y.ptr, ntok, c);
      cpu.set(name, (cpu.get(name) ?? 0) + threadCpu() - c0);
      times.set(name, [...times.get(name) ?? [], (performance.now() - t0) / 1000]);
      waits.set(name, [...waits.get(name) ?? [], stats.ioWaitSeconds - w0]);
    }
  }
}
const median = (a: number[]) => [...a].sort((p, q) => p - q)[Math.floor(a.length / 2)];
const best = (a: number[]) => Math.min(...a);
const same = [...ys.values()].every((y) => y.u8.every((b, i) => b === ys.get("resident 1")!.u8[i]));
console.log(`lm_head ${V} x ${D} bf16, ${ntok} token(s), ${rounds} rounds; logits bit-identical everywhere: ${same}`);
for (const way of ["resident", "streamed"]) {
  const line = (n: number) => {
    const tn = times.get(`${way} ${n}`)!, wn = waits.get(`${way} ${n}`)!;
    return `${n} thread(s) ${median(tn).toFixed(3)} s median, ${best(tn).toFixed(3)} best (I/O wait ${
      median(wn).toFixed(3)
    } median, calling thread's CPU ${(cpu.get(`${way} ${n}`)! / rounds).toFixed(3)} s)`;
  };
  const ratio = (f: (a: number[]) => number) => f(times.get(`${way} 1`)!) / f(times.get(`${way} ${threads}`)!);
  console.log(
    `  ${way}: ${line(1)}; ${line(threads)}; 1/${threads}: ${ratio(median).toFixed(2)} median, ${
      ratio(best).toFixed(2)
    } best`,
  );
}
for (const c of computes.values()) c.close();
await streamed.close();
for (const b of [headBuf, x, ...ys.values()]) b.free();
ckpt.close();
