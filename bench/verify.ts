/**
 * The cost of verifying every streamed trunk piece: reads real-width layer regions (1.2 GB,
 * a released KDA+MoE layer's dense tensors in bound form) the way the ring does (readPieces:
 * 16 MB O_DIRECT pieces, 8 in flight), with the per-piece k3w64 checked on the I/O thread
 * and without, alternating, and prints seconds per layer, the ratio and what it means for
 * a floor-budget token (every one of the 93 layers streamed). Verified reads are timed with
 * the piece read by one pread and by smaller preads each hashed while still in cache. Also
 * the raw k3w64 speed, from DRAM and in cache.
 *
 * Data: /var/tmp/k3-bench/verify.bin (random, written once, --clean deletes it).
 *
 *   deno run -A bench/verify.ts [--rounds N] [--json] [--clean]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { kernels } from "../engine/native/ffi.ts";
import { hashHex, IoFile } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { HASH_CHUNK, readPieces } from "../engine/weights/trunk.ts";
import { PIECE_BYTES } from "../engine/weights/manifest.ts";

const { values } = benchArgs("usage: deno run -A bench/verify.ts [--rounds N] [--json] [--clean]", {
  rounds: { type: "string" },
  json: { type: "boolean" },
  clean: { type: "boolean" },
});
const DIR = "/var/tmp/k3-bench";
const FILE = `${DIR}/verify.bin`;
if (values.clean) {
  await Deno.remove(FILE).catch(() => {});
  console.log(`removed ${FILE}`);
  Deno.exit(0);
}
const REGION = 1200 * PIECE_BYTES / 16; // 1.2 GB: 75 pieces of 16 MB
const REGIONS = 2;
const rounds = Number(values.rounds ?? 5);
const k = kernels();
const buf = NativeBuffer.alloc(k, REGION, "verify bench");
await Deno.mkdir(DIR, { recursive: true });
const have = await Deno.stat(FILE).then((s) => s.size, () => 0);
if (have !== REGION * REGIONS) {
  const f = IoFile.open(FILE, { write: true, direct: true });
  for (let r = 0; r < REGIONS; r++) {
    for (let at = 0; at < REGION; at += 1 << 16) crypto.getRandomValues(buf.u8.subarray(at, at + (1 << 16)));
    await f.pwrite(buf.ptr, REGION, r * REGION);
  }
  await f.sync();
  f.close();
}
// The manifest's piece hashes, computed once.
const f = IoFile.open(FILE, { direct: true });
const hashes: string[][] = [];
for (let r = 0; r < REGIONS; r++) {
  await readPieces(f, buf.ptr, REGION, r * REGION);
  const h: string[] = [];
  for (let at = 0; at < REGION; at += PIECE_BYTES) h.push(hashHex(buf.at(at), Math.min(PIECE_BYTES, REGION - at)));
  hashes.push(h);
}
// Variants, alternated in every round so drift hits them alike: no hashing, and verified
// with the piece read in one pread or in smaller preads, each hashed while hot in cache.
const CHUNKS = [0, 1 << 20, 256 << 10];
const times = new Map<string, number[]>([
  ["plain", []],
  ...CHUNKS.map((c) => [`chunk ${c}`, []] as [string, number[]]),
]);
const hashRates: number[] = [], cacheRates: number[] = [];
for (let i = 0; i < rounds; i++) {
  const order = [...times.keys()];
  if (i % 2) order.reverse();
  for (const name of order) {
    const r = i % REGIONS;
    const verify = name !== "plain";
    const chunk = verify ? Number(name.split(" ")[1]) : 0;
    const t0 = performance.now();
    const n = await readPieces(f, buf.ptr, REGION, r * REGION, PIECE_BYTES, 8, verify ? hashes[r] : undefined, chunk);
    times.get(name)!.push((performance.now() - t0) / 1000);
    if (n !== REGION) throw new Error("short read");
  }
  let t0 = performance.now();
  hashHex(buf.ptr, REGION);
  hashRates.push(REGION / ((performance.now() - t0) / 1000) / 1e9);
  const small = 256 << 10, reps = 400;
  t0 = performance.now();
  for (let j = 0; j < reps; j++) hashHex(buf.at((j % 4) * small), small);
  cacheRates.push(small * reps / ((performance.now() - t0) / 1000) / 1e9);
}
f.close();
buf.free();
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const p = med(times.get("plain")!), hr = med(hashRates), cr = med(cacheRates);
const load = Deno.loadavg()[0];
console.log(`| layer region 1.2 GB, 16 MB pieces, depth 8 | s/layer | GB/s | ratio | per 93-layer floor token |`);
console.log(`| ----------------------------------------- | ------: | ---: | ----: | -----------------------: |`);
const row = (what: string, s: number) =>
  console.log(
    `| ${what.padEnd(41)} | ${s.toFixed(3)} | ${(REGION / s / 1e9).toFixed(2)} | ${(s / p).toFixed(3)} | ${
      (93 * s).toFixed(1)
    } s |`,
  );
row("read only", p);
for (const c of CHUNKS) {
  row(`read + verified, ${c ? `${c >> 10} KiB preads` : "one pread per piece"}`, med(times.get(`chunk ${c}`)!));
}
const v = med(times.get(`chunk ${HASH_CHUNK}`)!);
console.log(
  `k3w64 alone on one core: ${hr.toFixed(2)} GB/s from DRAM, ${
    cr.toFixed(2)
  } GB/s in cache; ratio verified (engine default, chunk ${HASH_CHUNK})/plain ${(v / p).toFixed(3)}; load average ${
    load.toFixed(1)
  }; ${rounds} rounds, medians`,
);
if (values.json) {
  console.log(
    JSON.stringify({
      plain_s: p,
      verified_s: v,
      ratio: v / p,
      by_chunk: Object.fromEntries(CHUNKS.map((c) => [c, med(times.get(`chunk ${c}`)!)])),
      hash_gbps: hr,
      hash_cache_gbps: cr,
      region_bytes: REGION,
      rounds,
      load,
    }),
  );
}
