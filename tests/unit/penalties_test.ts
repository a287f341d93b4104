/**
 * presence, frequency and repetition penalties and logit_bias: the filter's logits equal a
 * float64 reference of the documented arithmetic, written here over the whole vocabulary,
 * at every step of random runs; runs repeat exactly; the request fields parse and their
 * bounds are 400s.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { type Penalties, PenaltyFilter, withPenalties } from "../../engine/generate/penalties.ts";
import { makeSampler } from "../../engine/generate/sampling.ts";
import { parseChatRequest, parseCompletionRequest } from "../../cli/openai.ts";

const V = 300;
const RUNS = Number(Deno.env.get("K3_FUZZ_RUNS") ?? 40);

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

/** The reference: every token of the vocabulary, in float64, rounded to float32 once. */
function reference(logits: Float32Array, p: Penalties, prompt: number[], out: number[]): Float32Array {
  const ref = new Float32Array(logits.length);
  for (let t = 0; t < logits.length; t++) {
    let count = 0;
    for (const o of out) if (o === t) count++;
    let x = logits[t];
    x += p.bias.has(t) ? p.bias.get(t)! : 0;
    if ((count > 0 || prompt.includes(t)) && p.repetition !== 1) {
      if (x > 0) x = x / p.repetition;
      else x = x * p.repetition;
    }
    x = x - p.frequency * count;
    x = x - p.presence * (count > 0 ? 1 : 0);
    ref[t] = x;
  }
  return ref;
}

const penaltiesArb: fc.Arbitrary<Penalties> = fc.record({
  presence: fc.constantFrom(0, 0.5, -1.25, 2, 0.1),
  frequency: fc.constantFrom(0, 0.3, -2, 1.7),
  repetition: fc.constantFrom(1, 1.1, 0.7, 2, 1.3),
  bias: fc.uniqueArray(fc.tuple(fc.nat(V + 20), fc.constantFrom(-100, -3.5, 0.25, 7, 100)), {
    maxLength: 6,
    selector: ([t]) => t,
  }).map((pairs) => new Map(pairs)),
});

Deno.test("penalties: the logits each pick sees equal the float64 reference at every step", () => {
  fc.assert(
    fc.property(penaltiesArb, fc.integer({ min: 1, max: 2 ** 31 }), fc.boolean(), (p, seed, sampled) => {
      const r = rng(seed);
      const prompt = Array.from({ length: 1 + Math.floor(r() * 30) }, () => Math.floor(r() * V));
      const filter = new PenaltyFilter(p, prompt);
      const sampler = sampled ? makeSampler({ temperature: 1, topP: 1, topK: 0, minP: 0, seed }) : undefined;
      const out: number[] = [];
      for (let step = 0; step < 40; step++) {
        // Few distinct values, so repeated tokens (and the penalties on them) are common.
        const logits = Float32Array.from({ length: V }, () => Math.fround((r() - 0.3) * 6));
        const want = reference(logits, p, prompt, out);
        let seen: Float32Array | undefined;
        const t = filter.pick(logits, (l) => {
          seen = l.slice();
          return sampler ? sampler(l) : Math.floor(r() * V);
        });
        assert.deepEqual(seen, want, `step ${step}`);
        out.push(t);
      }
    }),
    { numRuns: RUNS },
  );
});

Deno.test("penalties: a run repeats token for token; neutral penalties add no filter; a grammar still picks", () => {
  const p: Penalties = { presence: 0.7, frequency: 0.4, repetition: 1.2, bias: new Map([[3, 5]]) };
  const run = () => {
    const r = rng(99);
    const f = new PenaltyFilter(p, [1, 2, 3]);
    const choose = makeSampler({ temperature: 0.8, topP: 0.95, topK: 0, minP: 0, seed: 5 });
    return Array.from({ length: 60 }, () => f.pick(Float32Array.from({ length: V }, () => r() * 3), choose));
  };
  assert.deepEqual(run(), run());
  assert.equal(withPenalties(undefined, { presence: 0, frequency: 0, repetition: 1, bias: new Map() }, [1]), undefined);
  // An inner filter (a grammar) picks from the adjusted logits.
  const inner = { pick: (l: Float32Array) => (assert.equal(l[3], Math.fround(1 + 5)), 3) };
  const f = withPenalties(inner, p, [])!;
  assert.equal(f.pick(new Float32Array(V).fill(1), () => 0), 3);
});

Deno.test("penalties: the request fields parse (chat and completions); out of range is a 400 naming the field", () => {
  const msg = [{ role: "user", content: "hi" }];
  const r = parseChatRequest({
    messages: msg,
    presence_penalty: 0.5,
    frequency_penalty: -1,
    repetition_penalty: 1.1,
    logit_bias: { "7": 10, "12": -100 },
  });
  assert.deepEqual(r.penalties, {
    presence: 0.5,
    frequency: -1,
    repetition: 1.1,
    bias: new Map([[7, 10], [12, -100]]),
  });
  assert.deepEqual(parseCompletionRequest({ prompt: "x", presence_penalty: 1 }, 1024).penalties.presence, 1);
  const rejects = (body: Record<string, unknown>, param: string) =>
    assert.throws(
      () => parseChatRequest({ messages: msg, ...body }),
      (e: { status: number; param: string }) => e.status === 400 && e.param === param,
    );
  rejects({ presence_penalty: 2.5 }, "presence_penalty");
  rejects({ frequency_penalty: "x" }, "frequency_penalty");
  rejects({ repetition_penalty: 0 }, "repetition_penalty");
  rejects({ logit_bias: { a: 1 } }, "logit_bias.a");
  rejects({ logit_bias: { "5": 101 } }, "logit_bias.5");
});
