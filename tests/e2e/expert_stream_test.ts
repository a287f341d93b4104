/**
 * The order experts are read and run in never changes a bit: a layer's experts claimed at
 * its routing and run as they land (expert_stream.ts), the next layer's read ahead on a
 * guess (model.ts guessNextExperts, on by default), and experts landing in a shuffled order (the test hook
 * K3_TEST_EXPERT_SHUFFLE, hits too) give the resident model's tokens and logits bit for bit,
 * with the trunk pinned and the cache at its floor (top-k + 1 slots, so a prefill chunk's
 * union flows through it) and at the floor budget; with the expert table, every expert is
 * verified and a damaged one is still refused, named, when the reads land shuffled.
 *
 * @module
 */

import assert from "node:assert/strict";
import { packTrunk } from "../../pack/pack.ts";
import { hashExperts } from "../../pack/experts.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { Checkpoint } from "../../engine/weights/safetensors.ts";
import { locateExpert } from "../../engine/weights/experts.ts";
import { openModel } from "../../engine/open.ts";
import { generate, teacherForce } from "../../engine/generate/generate.ts";
import { expertBytesOf, expertSlotBytes } from "../../engine/weights/plan_experts.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { readManifest } from "../../engine/weights/manifest.ts";
import { copyDir, tempDir, TINY } from "../helpers.ts";
import { assertRejectsLast, runIds } from "../damage.ts";
import { readAheadPays } from "../../engine/model/expert_stream.ts";

const SEQ = [5, 17, 300, 12, 99, 1000, 7, 640, 33, 250, 511, 2, 870, 64, 123, 456, 9, 81];
const PROMPT = [5, 17, 300, 12], GEN = 10;

/** Teacher-forced logits (5-row chunks) and greedy tokens at `memory`, with test hooks `env`
 * set and the engine's `expertReadAhead` switch (undefined: its default). */
async function run(
  memory: MemoryOptions | undefined,
  env: Record<string, string> = {},
  expertReadAhead?: boolean,
): Promise<{ logits: Uint8Array; tokens: number[]; prefetched: number; hits: number; taken: number }> {
  for (const [k, v] of Object.entries(env)) Deno.env.set(k, v);
  try {
    const opened = await openModel(TINY, { capacity: SEQ.length + GEN, chunk: 5, memory, expertReadAhead });
    try {
      const V = opened.cfg.vocabSize;
      const logits = new Float32Array(SEQ.length * V);
      await teacherForce(opened.model, SEQ, (pos, row) => logits.set(row, pos * V));
      const tokens = (await generate(opened.model, PROMPT, { gen: GEN, incremental: true })).map((s) => s.token);
      const io = opened.model.weights.ioStats?.();
      return {
        logits: new Uint8Array(logits.buffer),
        tokens,
        prefetched: io?.expertPrefetched ?? 0,
        hits: io?.expertHits ?? 0,
        taken: io?.expertPrefetchHits ?? 0,
      };
    } finally {
      await opened.close();
    }
  } finally {
    for (const k of Object.keys(env)) Deno.env.delete(k);
  }
}

Deno.test("experts read ahead and landing shuffled: the resident tokens and logit bits, pinned and at the floor", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  await packTrunk(TINY, trunk, { log: null });
  await hashExperts(TINY, trunk, () => {});
  const cfg = await loadConfig(TINY);
  const cacheGB = (cfg.moe.topK + 1) * expertSlotBytes(expertBytesOf(cfg)) / 1e9;
  const largest = Math.max(...(await readManifest(trunk)).layer.map((r) => r.size)) / 1e9;
  const want = await run(undefined);
  // [name, memory, test hooks, the expertReadAhead switch, reads ahead]
  const cases: [string, MemoryOptions, Record<string, string>, boolean | undefined, boolean][] = [
    ["pinned, top-k + 1 slots, read-ahead", { trunkDir: trunk, cacheGB }, {}, true, true],
    [
      "pinned, read-ahead, shuffled (seed 1)",
      { trunkDir: trunk, cacheGB },
      { K3_TEST_EXPERT_SHUFFLE: "1" },
      true,
      true,
    ],
    [
      "pinned, read-ahead, shuffled (seed 2)",
      { trunkDir: trunk, cacheGB },
      { K3_TEST_EXPERT_SHUFFLE: "2" },
      true,
      true,
    ],
    [
      "pinned, shuffled, read-ahead by default",
      { trunkDir: trunk, cacheGB },
      { K3_TEST_EXPERT_SHUFFLE: "3" },
      undefined,
      true,
    ],
    ["pinned, read-ahead turned off", { trunkDir: trunk, cacheGB }, {}, false, false],
    [
      "floor, shuffled, read-ahead asked",
      { trunkDir: trunk, trunkGB: largest, cacheGB },
      { K3_TEST_EXPERT_SHUFFLE: "4" },
      true,
      false,
    ],
  ];
  for (const [name, memory, env, expertReadAhead, readsAhead] of cases) {
    const got = await run(memory, env, expertReadAhead);
    assert.deepEqual(got.tokens, want.tokens, `${name}: greedy tokens`);
    assert.ok(got.logits.every((b, i) => b === want.logits[i]), `${name}: teacher-forced logits bit for bit`);
    // Read-ahead happens only where the next layer is in memory for good (pinned), and its
    // right guesses come back as hits.
    if (readsAhead) {
      assert.ok(got.prefetched > 0 && got.hits > 0, `${name}: ${got.prefetched} read ahead, ${got.hits} hits`);
      // The guess is worth its reads: most of what it reads is taken.
      assert.ok(2 * got.taken > got.prefetched, `${name}: ${got.taken} of ${got.prefetched} guesses taken`);
    } else assert.equal(got.prefetched, 0, `${name}: nothing read ahead`);
  }
});

Deno.test("a damaged expert is refused, named, when the experts are read ahead and land shuffled", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`, model = `${d.path}/model`;
  await packTrunk(TINY, trunk, { log: null });
  await hashExperts(TINY, trunk, () => {});
  await Deno.mkdir(model);
  await copyDir(TINY, model);
  const cfg = await loadConfig(TINY);
  const ckpt = await Checkpoint.open(TINY);
  const L = 3, E = 2;
  const loc = locateExpert(cfg, ckpt, L, E);
  ckpt.close();
  const t = loc.tensors[4]; // w2's packed nibbles, mid-tensor
  const name = t.file.slice(t.file.lastIndexOf("/") + 1);
  const bad = await Deno.readFile(`${model}/${name}`);
  bad[t.offset + Math.floor(t.bytes / 2)] ^= 0x10;
  await Deno.writeFile(`${model}/${name}`, bad);
  const cacheGB = (cfg.moe.topK + 1) * expertSlotBytes(expertBytesOf(cfg)) / 1e9;
  Deno.env.set("K3_TEST_EXPERT_SHUFFLE", "5");
  try {
    await assertRejectsLast(
      runIds(model, SEQ, 3, { trunkDir: trunk, cacheGB }),
      1,
      new RegExp(`layer ${L} expert ${E} \\(shard ${name.replace(/\./g, "\\.")}\\): checksum mismatch`),
    );
  } finally {
    Deno.env.delete("K3_TEST_EXPERT_SHUFFLE");
  }
});

Deno.test("read-ahead turns itself off when most guesses miss, or when the cache alone serves 19 lookups in 20", () => {
  const io = (guessed: number, taken: number, hits = 0, misses = 0) => ({
    expertPrefetched: guessed,
    expertPrefetchHits: taken,
    expertHits: hits,
    expertMisses: misses,
  });
  assert.equal(readAheadPays(io(0, 0), 16), true, "no guess yet");
  assert.equal(readAheadPays(io(127, 0), 16), true, "too few guesses to judge");
  assert.equal(readAheadPays(io(128, 63), 16), false, "under half taken");
  assert.equal(readAheadPays(io(128, 64), 16), true, "half taken");
  assert.equal(readAheadPays(io(1000, 900, 950, 50), 16), true, "the hits are the guesses'");
  assert.equal(readAheadPays(io(0, 0, 127, 0), 16), true, "too few lookups to judge");
  assert.equal(readAheadPays(io(0, 0, 190, 10), 16), false, "the cache alone serves 95%");
  assert.equal(readAheadPays(io(100, 60, 250, 10), 16), true, "190 of 260 by the cache alone");
});
