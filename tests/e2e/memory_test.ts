/**
 * Memory is a dial: the tiny model gives the reference tokens, and logits bit-identical to
 * the all-resident run, at the floor budget and at budgets up to full residency, with and
 * without a packed trunk, in full-recompute and incremental mode, and with the embedding
 * and head streamed (ultra). A failed expert read and a plan that does not fit are refused.
 */

import assert from "node:assert/strict";
import { generate, teacherForce } from "../../engine/generate/generate.ts";
import { openModel } from "../../engine/open.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { estimatedInput, makePlan } from "../../engine/weights/plan.ts";
import { expertBytesOf, expertSlotBytes } from "../../engine/weights/plan_experts.ts";
import { pinLayers } from "../../engine/weights/plan_trunk.ts";
import { releasedK3 } from "../../engine/model/shapes.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { packTrunk } from "../../pack/pack.ts";
import { readManifest } from "../../engine/weights/manifest.ts";
import { k3, readReference, tempDir, TINY } from "../helpers.ts";

const ref = await readReference(`${TINY}/reference.json`);
const seq = [...ref.prompt_ids, ...ref.generated_ids.slice(0, -1)];

/** Teacher-forced logits at every position, and greedy tokens in both modes. */
async function runAt(memory: MemoryOptions | undefined, full = true, chunk = 16) {
  const opened = await openModel(TINY, { capacity: seq.length + 1, chunk, memory });
  try {
    const rows: Float32Array[] = [];
    await teacherForce(opened.model, seq, (_p, row) => rows.push(row.slice()));
    const greedy = async (incremental: boolean) =>
      (await generate(opened.model, ref.prompt_ids, { gen: ref.generated_ids.length, incremental })).map((s) =>
        s.token
      );
    const inc = await greedy(true);
    return {
      rows,
      full: full ? await greedy(false) : undefined,
      inc,
      plan: opened.plan,
      io: opened.model.weights.ioStats?.(),
    };
  } finally {
    await opened.close();
  }
}

Deno.test("same tokens and bit-identical logits at every budget, with and without a packed trunk", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  await packTrunk(TINY, trunk, { log: null });
  const m = await readManifest(trunk);
  const cfg = await loadConfig(TINY);
  const sizes = m.layer.map((r) => r.size);
  const total = sizes.reduce((a, b) => a + b, 0);
  const largest = Math.max(...sizes);
  const slot = expertSlotBytes(expertBytesOf(cfg));
  const GB = 1e9;
  const floorCache = ((cfg.moe.topK + 1) * slot) / GB;
  // [name, options, also check full recompute (slow at chunk 1: kept to a few budgets)]
  const budgets: [string, MemoryOptions, boolean?][] = [
    [
      "floor (ring = largest layer, top-k+1 slots)",
      { trunkDir: trunk, trunkGB: largest / GB, cacheGB: floorCache },
      true,
    ],
    ["floor, ultra (embedding rows and head chunks streamed)", {
      trunkDir: trunk,
      trunkGB: largest / GB,
      cacheGB: floorCache,
      streamEmbed: true,
      preset: "ultra",
    }, true],
    ["two-layer ring, 5 slots", { trunkDir: trunk, trunkGB: (2 * largest) / GB, cacheGB: (5 * slot) / GB }],
    ["a third pinned, 20 slots", {
      trunkDir: trunk,
      trunkGB: (total / 3 + 2 * largest) / GB,
      cacheGB: (20 * slot) / GB,
    }, true],
    ["all but a few pinned, 60 slots", {
      trunkDir: trunk,
      trunkGB: (total - 2 * largest) / GB,
      cacheGB: (60 * slot) / GB,
    }],
    ["trunk all pinned, every expert cached", { trunkDir: trunk }],
    ["no trunk, floor cache", { cacheGB: floorCache }, true],
    ["no trunk, 11 slots, ultra", { cacheGB: (11 * slot) / GB, streamEmbed: true }],
  ];
  const resident = await runAt(undefined);
  assert.deepEqual(resident.full, ref.generated_ids);
  assert.deepEqual(resident.inc, ref.generated_ids);
  assert.equal(resident.plan.mode, "resident");
  for (const [name, mem, full] of budgets) {
    const r = await runAt(mem, !!full);
    assert.equal(r.plan.mode, "streamed", name);
    if (full) assert.deepEqual(r.full, ref.generated_ids, `${name}: full recompute`);
    assert.deepEqual(r.inc, ref.generated_ids, `${name}: incremental`);
    for (let p = 0; p < seq.length; p++) {
      assert.deepEqual(
        new Uint8Array(r.rows[p].buffer),
        new Uint8Array(resident.rows[p].buffer),
        `${name}: logits at ${p} bit-identical`,
      );
    }
    const io = r.io!;
    console.log(
      `${name}: pinned ${r.plan.trunk.pinned.length}/13, ring ${r.plan.trunk.ringBytes} B, ${r.plan.experts.slots} slots, chunk ${r.plan.chunk}; ` +
        `read ${io.trunkBytes} B trunk, ${io.expertBytes} B experts, hit rate ${
          (io.expertHits / Math.max(1, io.expertHits + io.expertMisses)).toFixed(2)
        }`,
    );
    if (mem.trunkDir && mem.trunkGB !== undefined) assert.ok(io.trunkBytes > 0, `${name}: streamed some trunk`);
    if (mem.cacheGB !== undefined) assert.ok(r.plan.experts.slots >= cfg.moe.topK + 1);
  }
});

Deno.test("the CLI gives the reference tokens at the floor budget with a packed trunk, incremental and full recompute", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  await packTrunk(TINY, trunk, { log: null });
  for (const mode of [[], ["--full-recompute"]]) {
    const out = await k3([
      "run",
      TINY,
      "--ids",
      ref.prompt_ids.join(","),
      "--gen",
      "20",
      "--preset",
      "laptop",
      "--trunk",
      trunk,
      "--trunk-gb",
      "0.00025",
      "--cache-gb",
      "0.00003",
      "--out",
      `${d.path}/r.json`,
      ...mode,
    ]);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stderr, /memory plan \(streamed, preset laptop/);
    assert.match(out.stderr, /0 of 13 layers pinned/);
    const report = JSON.parse(await Deno.readTextFile(`${d.path}/r.json`));
    assert.deepEqual(report.generated_ids, ref.generated_ids);
    assert.equal(out.stdout, report.generated_text + "\n", "the text, streamed");
    assert.ok(report.trunk_bytes_read > 0 && report.expert_bytes_read > 0);
    assert.ok(report.peak_rss_bytes > 0);
    assert.equal(report.memory.experts.slots, 3);
    assert.ok(report.io_share >= 0 && report.io_share <= 1);
  }
});

Deno.test("a failed expert read stops the run with exit 1 naming the layer and the expert", async () => {
  // Find an expert the prompt routes to: with every expert cached, count which are read.
  const env = { K3_FAULT_EXPERT_READ: "2:5" };
  let hit = false;
  for (const E of [5, 0, 1, 2, 3, 4, 6, 7]) {
    env.K3_FAULT_EXPERT_READ = `2:${E}`;
    const out = await k3(["run", TINY, "--ids", ref.prompt_ids.join(","), "--gen", "3", "--cache-gb", "0.0001"], {
      env,
    });
    if (out.code === 0) continue; // this expert was never routed to
    assert.equal(out.code, 1, out.stderr);
    assert.match(out.stderr, new RegExp(`layer 2 expert ${E}: read failed: short read`));
    assert.equal(out.stdout, "", "no token printed");
    hit = true;
    break;
  }
  assert.ok(hit, "some expert of layer 2 is routed to");
});

Deno.test("memory refusals: a plan over MemAvailable, a cache below top-k + 1, a trunk budget below the largest layer", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  await packTrunk(TINY, trunk, { log: null });
  const base = ["run", TINY, "--ids", "5,17,300", "--gen", "2"];
  let out = await k3([...base, "--cache-gb", "0.0001"], { env: { K3_MEM_AVAILABLE_GB: "0.05" } });
  assert.equal(out.code, 1);
  assert.match(out.stderr, /memory plan needs .* but only 50\.0 MB is available/);
  out = await k3([...base, "--cache-gb", "0.00001"]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, /needs at least top-k \+ 1 = 3 slots/);
  out = await k3([...base, "--trunk", trunk, "--trunk-gb", "0.0001"]);
  assert.equal(out.code, 1);
  assert.match(out.stderr, /cannot hold the largest trunk layer/);
  // A later flag overrides an earlier one: the preset's 0.31 GB cache is replaced.
  out = await k3([...base, "--preset", "ultra", "--cache-gb", "0.00001"]);
  assert.equal(out.code, 1);
  out = await k3([...base, "--cache-gb", "0.00001", "--preset", "ultra"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /streamed: one embedding row/);
});

Deno.test("plan: the full K3 at each preset (pinning, ring, slots) and the pinning rule", () => {
  const k = releasedK3();
  const plan = (trunkGB: number, cacheGB: number) =>
    makePlan(estimatedInput(k, { trunkDir: "x", trunkGB, cacheGB, preset: "x" }, 64));
  const laptop = plan(3, 1);
  assert.equal(laptop.trunk.pinned.length, 0);
  assert.equal(laptop.experts.slots, 56);
  // The latent MLA cache: 24 MLA layers x (512 latent + 64 k_rope) fp32.
  assert.equal(laptop.state.kvPerPosition, 24 * 576 * 4, "KV 55,296 bytes per position");
  const server = plan(110, 13);
  assert.equal(server.trunk.pinned.length, 93);
  assert.ok(Math.abs(server.trunk.totalBytes - 108.81e9) < 0.1e9, "per-layer trunk ~108.81 GB");
  assert.throws(() => plan(3, 0.2), /top-k \+ 1 = 17/);
  // Pinning never leaves the ring smaller than the largest streamed layer.
  const P = 4096;
  const sizes = [5, 3, 3, 3, 2, 3].map((x) => x * P);
  for (let b = 5; b <= 19; b++) {
    const { pinned, ring } = pinLayers(sizes, b * P);
    const streamed = sizes.filter((_, i) => !pinned.includes(i));
    if (streamed.length) assert.ok(ring >= Math.max(...streamed), `budget ${b}`);
    assert.ok(pinned.reduce((a, i) => a + sizes[i], 0) + ring <= b * P);
    if (b >= 19) assert.equal(pinned.length, 6);
  }
  assert.throws(() => pinLayers(sizes, 4 * P), /largest trunk layer/);
});

Deno.test("k3 presets and --list-presets list every preset and the full K3's plan at each; bad usage exits 2", async () => {
  for (const args of [["presets"], ["--list-presets"]]) {
    const out = await k3(args);
    assert.equal(out.code, 0, out.stderr);
    for (const name of ["ultra", "laptop", "desktop", "workstation", "server", "max", "auto"]) {
      assert.match(out.stdout, new RegExp(`^  ${name} `, "m"));
    }
    assert.match(out.stdout, /^ {2}laptop +0\/93 +3\.00 GB +56 /m);
    assert.match(out.stdout, /^ {2}server +93\/93 /m);
  }
  assert.equal((await k3(["presets", "extra"])).code, 2);
  assert.equal((await k3(["presets", "--positions", "0"])).code, 2);
});

Deno.test("expert cache: in-flight reads are shared, held slots are never evicted, LRU order, publish after a full read", async () => {
  const { ExpertCache } = await import("../../engine/weights/expert_cache.ts");
  const { Checkpoint } = await import("../../engine/weights/safetensors.ts");
  const { kernels } = await import("../../engine/native/ffi.ts");
  const cfg = await loadConfig(TINY);
  const ckpt = await Checkpoint.open(TINY);
  const stats = (await import("../../engine/model/weight_source.ts")).noIoStats();
  const cache = new ExpertCache(kernels(), cfg, ckpt, 3, expertSlotBytes(expertBytesOf(cfg)), stats);
  try {
    // Two requests for the same experts at once: read once, the second waits.
    const [a, b] = await Promise.all([cache.get(1, [0, 1]), cache.get(1, [0, 1])]);
    assert.equal(stats.expertMisses, 2);
    assert.equal(stats.expertHits, 2);
    assert.equal(a[0].w1.packed, b[0].w1.packed);
    const bytesAfter = stats.expertBytes;
    // Layer 1 holds two slots, layer 2 takes the third; layer 3 cannot evict a held slot.
    await cache.get(2, [0]);
    await assert.rejects(cache.get(3, [0]), /cannot hold/);
    cache.release(1);
    cache.release(2);
    // Least recently used goes first: touch 1:1, then 3:0 evicts 1:0.
    await cache.get(1, [1]);
    cache.release(1);
    await cache.get(3, [0]);
    cache.release(3);
    const hits = stats.expertHits;
    await cache.get(1, [1]);
    assert.equal(stats.expertHits, hits + 1, "1:1 survived");
    cache.release(1);
    const misses = stats.expertMisses;
    await cache.get(1, [0]);
    assert.equal(stats.expertMisses, misses + 1, "1:0 was evicted");
    cache.release(1);
    assert.ok(stats.expertBytes > bytesAfter);
  } finally {
    await cache.close();
    ckpt.close();
  }
});
