/**
 * Exact speculative decoding through the scheduler on the tiny model: drafts never change a
 * token or a logit bit. Greedy and seeded sampling, alone and in a batch, resident and at the
 * floor budget, with drafts off, chosen by the cost model, forced on every position, and from
 * an oracle that knows the plain tokens (every draft accepted) or knows them up to a cut (the
 * state cut back at every prefix length); a sequence whose drafts never match turns drafting
 * off. In process, but the whole generation stack many times over: the drafters and the cost
 * model on their own are in tests/unit/speculation_test.ts.
 */

import assert from "node:assert/strict";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import type { DraftOptions } from "../../engine/generate/draft.ts";
import { makeSampler, type SamplingParams } from "../../engine/generate/sampling.ts";
import { openModel } from "../../engine/open.ts";
import type { MemoryOptions } from "../../engine/weights/plan_input.ts";
import { packedFloor, tempDir, TINY } from "../helpers.ts";

/** A repetitive prompt (a cycle of 8 ids) and a non-repetitive one. */
const REPETITIVE = Array.from({ length: 40 }, (_, i) => [5, 17, 300, 42, 99, 123, 640, 7][i % 8]);
const PLAIN = Array.from({ length: 23 }, (_, i) => (i * 37) % 700 + 3);
const SEEDED: SamplingParams = { temperature: 0.9, topP: 0.95, topK: 0, minP: 0, seed: 4242 };

interface Job {
  prompt: number[];
  gen: number;
  sampling?: SamplingParams;
  stopIds?: number[];
}

interface Outcome {
  tokens: number[];
  bits: Uint32Array[];
  finish: string;
  drafted: number;
  accepted: number;
  off: boolean;
}

/** Runs `jobs` on one scheduler: all at once when `batch`, else one after another. `draft`
 * is the scheduler's, or each job's. */
async function runJobs(
  model: Awaited<ReturnType<typeof openModel>>["model"],
  jobs: Job[],
  draft: DraftOptions | ((i: number) => DraftOptions),
  batch: boolean,
): Promise<Outcome[]> {
  const sched = new Scheduler(model, {
    maxSequences: batch ? jobs.length : 1,
    chunk: 4,
    draft: typeof draft === "function" ? undefined : draft,
  });
  const one = async (job: Job, i: number): Promise<Outcome> => {
    const bits: Uint32Array[] = [];
    const req: SequenceRequest = {
      prompt: job.prompt,
      maxTokens: job.gen,
      stopIds: job.stopIds,
      choose: makeSampler(job.sampling ?? { temperature: 0, topP: 1, topK: 0, minP: 0, seed: 0 }),
      onToken: (_t, logits) => void bits.push(new Uint32Array(logits.slice().buffer)),
      draft: typeof draft === "function" ? draft(i) : undefined,
    };
    const r = await sched.submit(req);
    return {
      tokens: r.tokens,
      bits,
      finish: r.finishReason,
      drafted: r.draft?.drafted ?? 0,
      accepted: r.draft?.accepted ?? 0,
      off: r.draft?.off ?? false,
    };
  };
  if (batch) return await Promise.all(jobs.map(one));
  const out: Outcome[] = [];
  for (let i = 0; i < jobs.length; i++) out.push(await one(jobs[i], i));
  return out;
}

function assertSame(want: Outcome[], got: Outcome[], what: string): void {
  want.forEach((w, i) => {
    assert.deepEqual(got[i].tokens, w.tokens, `${what}: sequence ${i} tokens`);
    assert.equal(got[i].finish, w.finish, `${what}: sequence ${i} finish`);
    assert.equal(got[i].bits.length, w.bits.length, `${what}: sequence ${i} rows`);
    w.bits.forEach((row, j) => assert.deepEqual(got[i].bits[j], row, `${what}: sequence ${i} token ${j} logit bits`));
  });
}

/** Drafts from the plain run's tokens: right for the first `right` tokens of each draft
 * (Infinity: always right), then wrong. */
function oracle(plain: Outcome, prompt: number[], right: number): DraftOptions {
  return {
    mode: "lookup",
    force: true,
    propose: (text, k) => {
      const at = text.length - prompt.length; // tokens emitted so far
      const d = plain.tokens.slice(at, at + k);
      for (let i = Math.min(right, d.length); i < d.length; i++) d[i] = (d[i] + 1) % 1024;
      return d;
    },
  };
}

Deno.test("speculation: tokens and logit bits equal plain decoding, greedy and seeded, alone and batched, resident and floor", async () => {
  await using d = await tempDir();
  const { floor } = await packedFloor(TINY, `${d.path}/trunk`);
  const jobs: Job[] = [
    { prompt: REPETITIVE, gen: 24 },
    { prompt: PLAIN, gen: 17, sampling: SEEDED },
    { prompt: REPETITIVE.slice(3, 20), gen: 13, sampling: { ...SEEDED, seed: 7, temperature: 1.3 } },
    { prompt: PLAIN.slice(0, 5), gen: 20 },
  ];
  for (const [name, memory] of [["resident", undefined], ["floor", floor]] as [string, MemoryOptions | undefined][]) {
    const opened = await openModel(TINY, { capacity: 80, chunk: 8, sequences: jobs.length, memory, splitMin: 1 });
    try {
      const plain = await runJobs(opened.model, jobs, { mode: "off" }, false);
      for (const batch of [false, true]) {
        const how = `${name}, ${batch ? "batched" : "alone"}`;
        for (const mode of ["lookup", "suffix"] as const) {
          assertSame(plain, await runJobs(opened.model, jobs, { mode }, batch), `${how}, ${mode} (cost model)`);
          const forced = await runJobs(opened.model, jobs, { mode, force: true }, batch);
          assertSame(plain, forced, `${how}, ${mode} forced`);
          assert.ok(forced.every((o) => o.drafted > 0), `${how}: every sequence drafted when forced`);
        }
        const all = await runJobs(opened.model, jobs, (i) => oracle(plain[i], jobs[i].prompt, Infinity), batch);
        assertSame(plain, all, `${how}, oracle drafts`);
        all.forEach((o, i) => assert.equal(o.accepted, o.drafted, `${how}: sequence ${i} accepted every oracle draft`));
        assert.ok(all[0].accepted >= 20, `${how}: the oracle's drafts were accepted (${all[0].accepted})`);
        for (const right of [0, 1, 2, 3, 5]) {
          const cut = await runJobs(opened.model, jobs, (i) => oracle(plain[i], jobs[i].prompt, right), batch);
          assertSame(plain, cut, `${how}, drafts right for ${right} tokens`);
          if (right > 0) assert.ok(cut[0].accepted > 0, `${how}: some of the cut drafts accepted`);
        }
      }
      // A stop id that a verified draft reaches: the sequence ends there with "stop".
      const stopJobs: Job[] = [{ prompt: REPETITIVE, gen: 24, stopIds: [plain[0].tokens[5]] }];
      const stopPlain = await runJobs(opened.model, stopJobs, { mode: "off" }, false);
      const stopDrafted = await runJobs(opened.model, stopJobs, oracle(plain[0], REPETITIVE, Infinity), false);
      assertSame(stopPlain, stopDrafted, `${name}: a stop id inside an accepted draft`);
      assert.equal(stopDrafted[0].finish, "stop");
    } finally {
      await opened.close();
    }
  }
});

Deno.test("speculation: a sequence whose drafts never match turns drafting off, with the plain tokens", async () => {
  const opened = await openModel(TINY, { capacity: 120, chunk: 16 });
  try {
    const job: Job = { prompt: PLAIN, gen: 60 };
    const [plain] = await runJobs(opened.model, [job], { mode: "off" }, false);
    let never = 0; // a token it never emits
    while (plain.tokens.includes(never)) never++;
    const [r] = await runJobs(opened.model, [job], {
      mode: "lookup",
      rowCost: 0.05,
      propose: (_text, k) => Array(k).fill(never),
    }, false);
    assertSame([plain], [r], "never-matching drafts");
    assert.equal(r.accepted, 0);
    assert.ok(r.drafted > 0, "it tried");
    assert.ok(r.off, `drafting turned off after ${r.drafted} drafted tokens`);
    assert.ok(r.drafted < 60, `it stopped drafting early (${r.drafted} drafted tokens)`);
  } finally {
    await opened.close();
  }
});
