/**
 * The cost of verifying every streamed trunk piece: reads real-width layer regions (1.2 GB,
 * a released KDA+MoE layer's dense tensors in bound form) the way the ring does (readPieces:
 * 16 MB O_DIRECT pieces, 8 in flight), with the per-piece k3h64 checked on the I/O thread
 * and without, alternating, and prints seconds per layer, the ratio and what it means for
 * a floor-budget token (every one of the 93 layers streamed). Also the raw k3h64 speed.
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
import { readPieces } from "../engine/weights/trunk.ts";
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
const plain: number[] = [], verified: number[] = [], hashRates: number[] = [];
for (let i = 0; i < rounds; i++) {
  for (const verify of i % 2 ? [true, false] : [false, true]) {
    const r = i % REGIONS;
    const t0 = performance.now();
    const n = await readPieces(f, buf.ptr, REGION, r * REGION, PIECE_BYTES, 8, verify ? hashes[r] : undefined);
    const s = (performance.now() - t0) / 1000;
    if (n !== REGION) throw new Error("short read");
    (verify ? verified : plain).push(s);
  }
  const t0 = performance.now();
  hashHex(buf.ptr, REGION);
  hashRates.push(REGION / ((performance.now() - t0) / 1000) / 1e9);
}
f.close();
buf.free();
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const p = med(plain), v = med(verified), hr = med(hashRates);
const load = Deno.loadavg()[0];
console.log(`| layer region 1.2 GB, 16 MB pieces, depth 8 | s/layer | GB/s | per 93-layer floor token |`);
console.log(`| ----------------------------------------- | ------: | ---: | -----------------------: |`);
console.log(
  `| read only                                 | ${p.toFixed(3)} | ${(REGION / p / 1e9).toFixed(2)} | ${
    (93 * p).toFixed(1)
  } s |`,
);
console.log(
  `| read + every piece verified               | ${v.toFixed(3)} | ${(REGION / v / 1e9).toFixed(2)} | ${
    (93 * v).toFixed(1)
  } s |`,
);
console.log(
  `ratio verified/plain ${(v / p).toFixed(3)}; k3h64 alone ${hr.toFixed(2)} GB/s on one core; load average ${
    load.toFixed(1)
  }; ${rounds} rounds, medians`,
);
if (values.json) {
  console.log(
    JSON.stringify({ plain_s: p, verified_s: v, ratio: v / p, hash_gbps: hr, region_bytes: REGION, rounds, load }),
  );
}
