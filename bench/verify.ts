/**
 * The cost of verifying what k3 reads.
 *
 * 1. Trunk pieces: reads real-width layer regions (1.2 GB, a released KDA+MoE layer's
 *    dense tensors in bound form) the way the ring does (readPieces: 16 MB O_DIRECT
 *    pieces, VERIFIED_DEPTH in flight), with the per-piece k3w64 checked on the I/O thread and without,
 *    alternating; verified reads are timed with the piece read by one pread and by smaller
 *    preads each hashed while still in cache. Also the raw k3w64 speed, from DRAM and in
 *    cache, and a bound: the plain read followed by one read-only pass over each piece
 *    on an I/O thread (k3_read_sum: loads only, no hash arithmetic), i.e. what any check
 *    that reads the bytes a second time costs this machine's reads.
 *    Data: /var/tmp/k3-bench/verify.bin (random, written once, --clean deletes it).
 * 2. The floor-budget token (unless --skip-floor): the 3-layer 32-expert real-width slice
 *    (bench/slice.ts, packed with its expert table; re-packed when the trunk format moved
 *    on) at trunk 2.5 GB + cache 0.31 GB, so every layer streams and most experts miss:
 *    seconds per decode token with everything verified (each streamed tensor against its
 *    tensor check, the matrices inside their products; each expert read by its first run's
 *    products against the expert table)
 *    and with verification off (openModel's `verify: false`, which exists for this),
 *    alternating runs, medians, and their ratio.
 *
 *   deno run -A bench/verify.ts [--rounds N] [--tokens N] [--skip-floor] [--json] [--clean]
 *
 * @module
 */

import { benchArgs } from "./args.ts";
import { defaultLibraryPath, kernels } from "../engine/native/ffi.ts";
import { hashHex, IoFile } from "../engine/native/io.ts";
import { NativeBuffer } from "../engine/native/memory.ts";
import { nonblocking, symbols } from "../engine/native/symbols.ts";
import { HASH_CHUNK, readPieces, VERIFIED_DEPTH } from "../engine/weights/trunk_file.ts";
import { PIECE_BYTES } from "../engine/weights/trunk_geometry.ts";
import { openModel } from "../engine/open.ts";
import type { IoStats } from "../engine/model/weight_source.ts";
import { prefill } from "../engine/generate/generate.ts";
import { ensureSlice, ensureTrunk, ROUTER_SLICE } from "./slice.ts";

const USAGE = "usage: deno run -A bench/verify.ts [--rounds N] [--tokens N] [--skip-floor] [--json] [--clean]";
const { values } = benchArgs(USAGE, {
  rounds: { type: "string" },
  tokens: { type: "string" },
  "skip-floor": { type: "boolean" },
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
// Variants, alternated in every round so drift hits them alike: no hashing, verified with
// the piece read in one pread or in smaller preads (each hashed while hot in cache), and
// the plain read plus a read-only pass.
const CHUNKS = [0, 1 << 20, 256 << 10];
const times = new Map<string, number[]>([
  ["plain", []],
  ...CHUNKS.map((c) => [`chunk ${c}`, []] as [string, number[]]),
  ["touch", []],
]);
const probe = Deno.dlopen(defaultLibraryPath(), nonblocking(symbols, "k3_read_sum"));
/** Reads like readPieces (VERIFIED_DEPTH in flight), then loads every byte of each piece once more. */
async function readThenTouch(offset: number): Promise<number> {
  let next = 0, total = 0;
  const worker = async () => {
    while (next < REGION) {
      const at = next;
      next += PIECE_BYTES;
      const want = Math.min(PIECE_BYTES, REGION - at), dst = buf.at(at);
      const n = await f.pread(dst, want, offset + at);
      total += n;
      await probe.symbols.k3_read_sum(dst, BigInt(n));
    }
  };
  await Promise.all(Array.from({ length: VERIFIED_DEPTH }, worker));
  return total;
}
const hashRates: number[] = [], cacheRates: number[] = [];
for (let i = 0; i < rounds; i++) {
  const order = [...times.keys()];
  if (i % 2) order.reverse();
  for (const name of order) {
    const r = i % REGIONS;
    const verify = name.startsWith("chunk");
    const chunk = verify ? Number(name.split(" ")[1]) : 0;
    const t0 = performance.now();
    const n = name === "touch" ? await readThenTouch(r * REGION) : await readPieces(
      f,
      buf.ptr,
      REGION,
      r * REGION,
      PIECE_BYTES,
      VERIFIED_DEPTH,
      verify ? hashes[r] : undefined,
      chunk,
    );
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
probe.close();
buf.free();
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const p = med(times.get("plain")!), hr = med(hashRates), cr = med(cacheRates);
const load = Deno.loadavg()[0];
console.log(
  `| layer region 1.2 GB, 16 MB pieces, depth ${VERIFIED_DEPTH} | s/layer | GB/s | ratio | per 93-layer floor token |`,
);
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
row("read + a read-only pass per piece", med(times.get("touch")!));
const v = med(times.get(`chunk ${HASH_CHUNK}`)!), touch = med(times.get("touch")!);
console.log(
  `k3w64 alone on one core: ${hr.toFixed(2)} GB/s from DRAM, ${
    cr.toFixed(2)
  } GB/s in cache; ratio verified (engine default, chunk ${HASH_CHUNK})/plain ${(v / p).toFixed(3)}; load average ${
    load.toFixed(1)
  }; ${rounds} rounds, medians`,
);
// ---- The floor-budget token on a real-width slice, verification on and off. ----
let floorFigure: Record<string, number> | undefined;
if (!values["skip-floor"]) {
  const tokens = Number(values.tokens ?? 4);
  const recipe = { ...ROUTER_SLICE, experts: 32 };
  const model = await ensureSlice(recipe);
  const trunk = await ensureTrunk(model);
  const BUDGET = { trunkDir: trunk, trunkGB: 2.5, cacheGB: 0.31 };
  const run = async (verify: boolean) => {
    const opened = await openModel(model, { capacity: 64, chunk: 16, memory: BUDGET, verify });
    try {
      const m = opened.model;
      const state = m.newState();
      await prefill(m, state, [11, 12]); // warm-up: first touch of the ring, slots, scratch
      const t: number[] = [];
      for (let i = 0; i < tokens; i++) {
        const t0 = performance.now();
        await m.forward(state, [100 + 7 * i]);
        t.push((performance.now() - t0) / 1000);
      }
      state.free();
      return { s: med(t), io: opened.model.weights.ioStats?.() };
    } finally {
      await opened.close();
    }
  };
  const on: number[] = [], off: number[] = [];
  let lastIo: IoStats | undefined;
  for (let i = 0; i < rounds; i++) {
    for (const verify of i % 2 ? [true, false] : [false, true]) {
      const r = await run(verify);
      (verify ? on : off).push(r.s);
      lastIo = r.io;
    }
  }
  const sOn = med(on), sOff = med(off), loadF = Deno.loadavg()[0];
  // Each round ran both, back to back: the ratio within a round is the least drift-prone figure.
  const pairs = on.map((s, i) => s / off[i]).sort((a, b) => a - b);
  console.log("");
  console.log(
    `| floor budget (trunk 2.5 GB, cache 0.31 GB), slice ${recipe.layers}l-${recipe.experts}e | s/token |`,
  );
  console.log(`| --------------------------------------------------- | ------: |`);
  console.log(`| every streamed tensor and expert read verified      | ${sOn.toFixed(3)} |`);
  console.log(`| verification off (openModel verify: false)          | ${sOff.toFixed(3)} |`);
  console.log(
    `ratio verified/unverified ${(sOn / sOff).toFixed(3)} (${((sOn / sOff - 1) * 100).toFixed(1)}% of a token); ${
      lastIo ? `${((lastIo.trunkBytes + lastIo.expertBytes) / 1e9).toFixed(1)} GB read over the last run; ` : ""
    }load average ${loadF.toFixed(1)}; ${rounds} runs each of ${tokens} tokens, medians`,
  );
  console.log(
    `ratio within each round: median ${med(pairs).toFixed(3)}, range ${pairs[0].toFixed(3)}..${
      pairs[pairs.length - 1].toFixed(3)
    } (${pairs.map((x) => x.toFixed(3)).join(" ")})`,
  );
  floorFigure = {
    floor_verified_s_per_token: sOn,
    floor_unverified_s_per_token: sOff,
    floor_ratio: sOn / sOff,
    floor_pair_ratio_median: med(pairs),
    floor_pair_ratio_min: pairs[0],
    floor_pair_ratio_max: pairs[pairs.length - 1],
    floor_load: loadF,
  };
}
if (values.json) {
  console.log(
    JSON.stringify({
      plain_s: p,
      verified_s: v,
      ratio: v / p,
      by_chunk: Object.fromEntries(CHUNKS.map((c) => [c, med(times.get(`chunk ${c}`)!)])),
      touch_s: touch,
      touch_ratio: touch / p,
      hash_gbps: hr,
      hash_cache_gbps: cr,
      region_bytes: REGION,
      rounds,
      load,
      ...floorFigure,
    }),
  );
}
