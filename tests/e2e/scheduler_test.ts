/**
 * Batched generation: every sequence of a batch gets the tokens and the logit bits it gets
 * alone, whatever shares its passes (different prompt lengths and `gen`, a stop id hit
 * mid-batch, sequences joining while others decode), at the resident and the floor budget,
 * with 1 and 2 threads, on the tiny model and a freshly generated shape; and the tiny
 * model's batch equals the float64 reference.
 */

import assert from "node:assert/strict";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import { K3Error } from "../../engine/errors.ts";
import { fitSequences } from "../../engine/weights/plan.ts";
import type { MemoryPlan } from "../../engine/weights/plan.ts";
import { openModel } from "../../engine/open.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { loadConfig } from "../../engine/model/config.ts";
import { packTrunk } from "../../pack/pack.ts";
import { k3, packedFloor, python, readReference, tempDir, TINY } from "../helpers.ts";

/** One job of a batch: a prompt, how many tokens, stop ids, when it joins (pass count). */
interface Job {
  prompt: number[];
  gen: number;
  stopIds?: number[];
}

interface Outcome {
  tokens: number[];
  logits: Uint32Array[]; // raw bits of every row a token was chosen from
  finish: string;
}

function request(job: Job, out: Outcome, onToken?: () => void): SequenceRequest {
  return {
    prompt: job.prompt,
    maxTokens: job.gen,
    stopIds: job.stopIds,
    onToken: (_t, logits) => {
      out.logits.push(new Uint32Array(logits.slice().buffer));
      onToken?.();
    },
  };
}

/** Runs every job alone, then all together (joining in two waves), and returns both. */
async function soloAndBatched(dir: string, jobs: Job[], memory: MemoryOptions | undefined, threads: number) {
  const capacity = Math.max(...jobs.map((j) => j.prompt.length + j.gen));
  const chunk = 4;
  const opened = await openModel(dir, { capacity, chunk, sequences: jobs.length, memory, threads, splitMin: 1 });
  try {
    const solo: Outcome[] = [];
    for (const job of jobs) {
      const out: Outcome = { tokens: [], logits: [], finish: "" };
      const r = await new Scheduler(opened.model, { chunk }).submit(request(job, out));
      out.tokens = r.tokens;
      out.finish = r.finishReason;
      solo.push(out);
    }
    let passes = 0, mixed = 0;
    const sched = new Scheduler(opened.model, {
      maxSequences: jobs.length,
      chunk,
      onPass: (p) => {
        passes++;
        if (p.sequences > 1) mixed++;
      },
    });
    const batched: Outcome[] = jobs.map(() => ({ tokens: [], logits: [], finish: "" }));
    // The first half starts together; the rest join once the first have begun decoding.
    const half = Math.ceil(jobs.length / 2);
    // The first wave is decoding once one of its sequences has chosen its second token.
    const decoding = Promise.withResolvers<void>();
    const first = jobs.slice(0, half).map((j, i) =>
      sched.submit(request(j, batched[i], () => {
        if (batched[i].logits.length >= 2) decoding.resolve();
      }))
    );
    // A first wave that ends before any sequence has two tokens lets the rest join then.
    Promise.all(first).then(() => decoding.resolve(), () => decoding.resolve());
    await decoding.promise;
    const rest = jobs.slice(half).map((j, i) => sched.submit(request(j, batched[half + i])));
    const results = await Promise.all([...first, ...rest]);
    results.forEach((r, i) => {
      batched[i].tokens = r.tokens;
      batched[i].finish = r.finishReason;
    });
    return { solo, batched, passes, mixed, io: opened.model.weights.ioStats?.() };
  } finally {
    await opened.close();
  }
}

function assertSame(solo: Outcome[], batched: Outcome[], what: string) {
  solo.forEach((s, i) => {
    assert.deepEqual(batched[i].tokens, s.tokens, `${what}: sequence ${i} tokens`);
    assert.equal(batched[i].finish, s.finish, `${what}: sequence ${i} finish reason`);
    assert.equal(batched[i].logits.length, s.logits.length, `${what}: sequence ${i} logit rows`);
    s.logits.forEach((row, j) =>
      assert.deepEqual(batched[i].logits[j], row, `${what}: sequence ${i} step ${j} logit bits`)
    );
  });
}

const ref = await readReference(`${TINY}/reference.json`);

/** Prompts of different lengths, different gen, and one whose stop id is hit mid-batch. */
function tinyJobs(): Job[] {
  const p = ref.prompt_ids;
  const stopAt = ref.generated_ids[3]; // the 4th greedy token of the reference prompt
  return [
    { prompt: p, gen: ref.generated_ids.length },
    { prompt: p.slice(0, 3), gen: 7 },
    { prompt: [...p, ...p.slice(0, 5)], gen: 5 },
    { prompt: p, gen: 12, stopIds: [stopAt] },
    { prompt: [p[1]], gen: 9 },
  ];
}

Deno.test("batch: every sequence equals its solo run bit for bit, resident and floor, 1 and 2 threads; and the reference", async () => {
  await using d = await tempDir();
  const { floor } = await packedFloor(TINY, `${d.path}/trunk`);
  const jobs = tinyJobs();
  for (const [name, memory] of [["resident", undefined], ["floor", floor]] as const) {
    for (const threads of [1, 2]) {
      const r = await soloAndBatched(TINY, jobs, memory, threads);
      assertSame(r.solo, r.batched, `${name}, ${threads} thread(s)`);
      assert.ok(r.mixed > 0, `${name}: some passes carried several sequences (${r.mixed} of ${r.passes})`);
      // The reference prompt's greedy tokens, and the stop id ends sequence 3 with "stop".
      assert.deepEqual(r.batched[0].tokens, ref.generated_ids, `${name}: sequence 0 equals the reference`);
      assert.deepEqual(r.batched[3].tokens, ref.generated_ids.slice(0, 4), `${name}: stop id hit after 4 tokens`);
      assert.equal(r.batched[3].finish, "stop");
      assert.equal(r.batched[1].finish, "length");
    }
  }
});

Deno.test("batch: a freshly generated shape (block 2, top-3, 16 experts) batches bit-identically at the floor", async () => {
  await using d = await tempDir();
  const dir = `${d.path}/model`;
  await python("gen_model.py", [
    dir,
    "--preset",
    "tiny",
    "--seed",
    "31",
    "--layers",
    "6",
    "--block",
    "2",
    "--experts",
    "16",
    "--topk",
    "3",
    "--full-attn",
    "3,6",
  ]);
  const { floor } = await packedFloor(dir, `${d.path}/trunk`);
  const V = (await loadConfig(dir)).vocabSize;
  const jobs: Job[] = [
    { prompt: [1, 2, 3, 4, 5, 6, 7], gen: 6 },
    { prompt: [9 % V, 8 % V], gen: 8 },
    { prompt: [40 % V, 41 % V, 42 % V, 43 % V, 44 % V, 45 % V, 46 % V, 47 % V, 48 % V, 49 % V], gen: 3 },
  ];
  for (const threads of [1, 2]) {
    const r = await soloAndBatched(dir, jobs, floor, threads);
    assertSame(r.solo, r.batched, `generated shape, floor, ${threads} thread(s)`);
  }
});

Deno.test("floor budget: a 48-token prompt reads the trunk once per 16-token prefill chunk (from the run report)", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  const { floor, layerSizes: sizes } = await packedFloor(TINY, trunk);
  const prompt = Array.from({ length: 48 }, (_, i) => (i * 37) % 700 + 3).join(",");
  const report = `${d.path}/report.json`;
  const out = await k3([
    "run",
    TINY,
    "--ids",
    prompt,
    "--gen",
    "1",
    "--chunk",
    "16",
    "--trunk",
    trunk,
    "--trunk-gb",
    String(floor.trunkGB),
    "--cache-gb",
    String(floor.cacheGB),
    "--out",
    report,
  ]);
  assert.equal(out.code, 0, out.stderr);
  const r = JSON.parse(await Deno.readTextFile(report));
  const total = sizes.reduce((a, b) => a + b, 0);
  assert.equal(r.trunk_bytes_read, 3 * total, "three passes of 16 tokens, each layer read once per pass");
});

Deno.test("batch --parallel: more than the memory plan holds is a usage error naming the largest that fits", async () => {
  // The rule, on a plan that fits 2 sequences and refuses 3 or more.
  const planFor = (n: number) => {
    if (n > 2) throw new K3Error(`memory plan needs more than is available for ${n} sequences`);
    return { n } as unknown as MemoryPlan;
  };
  assert.throws(() => fitSequences(planFor, 5, false), /--parallel 5 does not fit .*the largest that fits is 2/);
  assert.deepEqual(fitSequences(planFor, 5, true), { n: 2 }, "auto takes the most that fit");
  assert.deepEqual(fitSequences(planFor, 2, false), { n: 2 });
  assert.throws(() =>
    fitSequences(
      () => {
        throw new K3Error("nothing fits");
      },
      3,
      true,
    ), /nothing fits/);
  // Through the CLI: the flag's own range.
  await using d = await tempDir();
  const input = `${d.path}/in.jsonl`;
  await Deno.writeTextFile(input, JSON.stringify({ id: 1, ids: [5], gen: 2 }) + "\n");
  for (const v of ["0", "-2", "many"]) {
    const bad = await k3(["batch", TINY, "--input", input, "--output", `${d.path}/o.jsonl`, `--parallel=${v}`]);
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /--parallel: expected auto or an integer/);
  }
});

Deno.test("the run report's ledger: every kind of time non-negative, adding up to the wall clock; bytes by kind", async () => {
  await using d = await tempDir();
  const trunk = `${d.path}/trunk`;
  await packTrunk(TINY, trunk, { log: null });
  const report = `${d.path}/r.json`;
  const out = await k3([
    "run",
    TINY,
    "--ids",
    "5,6,7,8",
    "--gen",
    "3",
    "--trunk",
    trunk,
    "--trunk-gb",
    "0.0005",
    "--ledger",
    "--out",
    report,
  ]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /ledger \(wall [\d.]+ s\):/);
  assert.match(out.stderr, /expert read wait/);
  const { ledger } = JSON.parse(await Deno.readTextFile(report));
  const parts = Object.entries(ledger).filter(([k]) => k.endsWith("_seconds") && k !== "wall_seconds");
  assert.equal(parts.length, 9, "trunk, expert waits; dense, expert, attention, head, sampling; state cache; other");
  for (const [k, v] of parts) if (k !== "other_seconds") assert.ok((v as number) >= 0, `${k} >= 0`);
  const sum = parts.reduce((a, [, v]) => a + (v as number), 0);
  assert.ok(
    Math.abs(sum - ledger.wall_seconds) < 1e-6,
    `parts add up to the wall clock (${sum} vs ${ledger.wall_seconds})`,
  );
  assert.ok(ledger.trunk_bytes_read > 0 && ledger.expert_bytes_read > 0, "a streamed run reads both kinds");
  assert.ok(ledger.read_bytes_per_second_in_flight > 0);
});
