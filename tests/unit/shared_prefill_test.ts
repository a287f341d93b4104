/**
 * Choices sharing one prefill (engine/generate/shared_prefill.ts), without the state
 * cache: n sequences of one prompt run its P ids through the model once (P rows), and each
 * gives the tokens and logit bits it gives alone, whether the batch holds all of them at
 * once or one at a time; a leader cancelled before its prefill hands the lead on.
 */

import assert from "node:assert/strict";
import { Scheduler, type SequenceRequest } from "../../engine/generate/scheduler.ts";
import { GREEDY, makeSampler } from "../../engine/generate/sampling.ts";
import { SharedPrefill } from "../../engine/generate/shared_prefill.ts";
import { type OpenedModel, openModel } from "../../engine/open.ts";
import { ids, TINY } from "../helpers.ts";

/** Tokens and the raw bits of every row a token was chosen from. */
interface Run {
  tokens: number[];
  bits: Uint32Array[];
}

/** Choice `i` of `prompt`: sampled at temperature 1 from seed 7 + i. */
function choice(prompt: number[], i: number, gen: number, bits: Uint32Array[]): SequenceRequest {
  return {
    prompt,
    maxTokens: gen,
    choose: makeSampler({ ...GREEDY, temperature: 1, seed: 7 + i }),
    onToken: (_t, logits) => void bits.push(new Uint32Array(logits.slice().buffer)),
  };
}

async function run(s: Scheduler, req: SequenceRequest, bits: Uint32Array[]): Promise<Run> {
  const r = await s.submit(req);
  return { tokens: r.tokens, bits };
}

async function withModel(f: (o: OpenedModel) => Promise<void>): Promise<void> {
  const opened = await openModel(TINY, { capacity: 256, chunk: 16, sequences: 4, threads: 1 });
  try {
    await f(opened);
  } finally {
    await opened.close();
  }
}

Deno.test("n choices of a prompt prefill it once (P rows) and each equals its run alone, 4, 2 or 1 at a time", async () => {
  await withModel(async ({ model }) => {
    const P = 37, N = 4, GEN = 6;
    const prompt = ids(P, 3);
    const alone: Run[] = [];
    for (let i = 0; i < N; i++) {
      const bits: Uint32Array[] = [];
      alone.push(await run(new Scheduler(model, { chunk: 16 }), choice(prompt, i, GEN, bits), bits));
    }
    assert.ok(new Set(alone.map((a) => a.tokens.join())).size > 1, "the seeds sample differently");
    for (const maxSequences of [4, 2, 1]) {
      let prefillRows = 0;
      const s = new Scheduler(model, {
        chunk: 16,
        maxSequences,
        draft: { mode: "off" },
        onPass: (p) => void (prefillRows += p.rows),
      });
      const shared = new SharedPrefill(N);
      const got = await Promise.all(Array.from({ length: N }, (_, i) => {
        const bits: Uint32Array[] = [];
        return run(s, { ...choice(prompt, i, GEN, bits), shared }, bits);
      }));
      assert.deepEqual(got.map((g) => g.tokens), alone.map((a) => a.tokens), `${maxSequences} at a time`);
      assert.deepEqual(got.map((g) => g.bits), alone.map((a) => a.bits), `${maxSequences} at a time`);
      // The prompt once; then every choice's tokens but its first (picked from the prompt's logits).
      assert.equal(prefillRows, P + N * (GEN - 1), `${maxSequences} at a time`);
      assert.equal(shared.prefilled, undefined, "the copy is dropped once every choice started");
    }
  });
});

Deno.test("a leader cancelled before its prefill is done hands the lead to the next choice", async () => {
  await withModel(async ({ model }) => {
    const P = 40, GEN = 3;
    const prompt = ids(P, 5);
    const bits: Uint32Array[] = [];
    const want = await run(new Scheduler(model, { chunk: 16 }), choice(prompt, 1, GEN, bits), bits);
    const s = new Scheduler(model, { chunk: 16, maxSequences: 2 });
    const shared = new SharedPrefill(2);
    const ac = new AbortController();
    const leader = s.submit({
      ...choice(prompt, 0, GEN, []),
      shared,
      signal: ac.signal,
      onPrefill: (done) => void (done >= 16 && ac.abort()),
    });
    const otherBits: Uint32Array[] = [];
    const other = run(s, { ...choice(prompt, 1, GEN, otherBits), shared }, otherBits);
    assert.equal((await leader).finishReason, "interrupted");
    assert.deepEqual((await other).tokens, want.tokens);
    assert.deepEqual(otherBits, want.bits);
  });
});
