/**
 * Sampling: the named generator against its reference outputs, temperature 0 equal to the
 * argmax, the documented filter order, and reproducibility per seed.
 *
 * @module
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import {
  argmax,
  CHAT_DEFAULTS,
  GREEDY,
  makeSampler,
  type SamplingParams,
  Xoshiro128,
} from "../../engine/generate/sampling.ts";
import { K3Error } from "../../engine/errors.ts";

const params = (p: Partial<SamplingParams>): SamplingParams => ({ ...GREEDY, temperature: 1, ...p });

Deno.test("xoshiro128**: the reference implementation's outputs, and SplitMix64 seeding", () => {
  // From the authors' C code (prng.di.unimi.it/xoshiro128starstar.c), state {1, 2, 3, 4}.
  const r = new Xoshiro128([1, 2, 3, 4]);
  assert.deepEqual(Array.from({ length: 6 }, () => r.nextU32()), [11520, 0, 5927040, 70819200, 2031721883, 1637235492]);
  // The same C code seeded by the reference splitmix64.c from 42 (two outputs, low word first).
  const s = Xoshiro128.seeded(42);
  assert.deepEqual(
    Array.from({ length: 6 }, () => s.nextU32()),
    [1776835114, 4165204688, 17111135, 2317295270, 2792088233, 2554630222],
  );
  const f = Xoshiro128.seeded(7);
  for (let i = 0; i < 1000; i++) {
    const u = f.nextFloat();
    assert.ok(u >= 0 && u < 1);
  }
});

Deno.test("temperature 0 (and top-k 1) is exactly the argmax, ties to the lowest id", () => {
  fc.assert(
    fc.property(
      fc.array(fc.float({ noNaN: true, noDefaultInfinity: true, min: -30, max: 30 }), { minLength: 1, maxLength: 64 }),
      (xs) => {
        const logits = Float32Array.from(xs);
        assert.equal(makeSampler(GREEDY)(logits), argmax(logits));
        assert.equal(makeSampler(params({ topK: 1, seed: 5 }))(logits), argmax(logits));
      },
    ),
  );
  assert.equal(makeSampler(GREEDY)(Float32Array.from([1, 3, 3, 2])), 1);
});

Deno.test("the same seed gives the same tokens, another seed other tokens; draws follow the probabilities", () => {
  const logits = Float32Array.from({ length: 50 }, (_, i) => Math.sin(i) * 2);
  const run = (seed: number) => {
    const s = makeSampler(params({ seed }));
    return Array.from({ length: 200 }, () => s(logits));
  };
  assert.deepEqual(run(1), run(1));
  assert.notDeepEqual(run(1), run(2));
  // Frequencies within a few standard errors of softmax over 20000 draws.
  const s = makeSampler(params({ seed: 3 }));
  const counts = new Float64Array(50);
  const N = 20000;
  for (let i = 0; i < N; i++) counts[s(logits)]++;
  const w = Array.from(logits, (x) => Math.exp(x));
  const Z = w.reduce((a, b) => a + b);
  for (let i = 0; i < 50; i++) {
    const p = w[i] / Z, sd = Math.sqrt((p * (1 - p)) / N);
    assert.ok(Math.abs(counts[i] / N - p) < 5 * sd + 1e-9, `token ${i}: ${counts[i] / N} vs ${p}`);
  }
});

Deno.test("top-k, top-p and min-p keep exactly the documented candidates", () => {
  // Logits chosen so the weights exp(x - max) are 1, 1/2, 1/4, 1/8, 1/16 (ids shuffled).
  const ln2 = Math.LN2;
  const logits = Float32Array.from([-2 * ln2, 0, -4 * ln2, -ln2, -3 * ln2]); // ranks: 1, 3, 0, 4, 2
  const seen = (p: Partial<SamplingParams>) => {
    const out = new Set<number>();
    for (let seed = 0; seed < 400; seed++) out.add(makeSampler(params({ ...p, seed }))(logits));
    return [...out].sort();
  };
  assert.deepEqual(seen({}), [0, 1, 2, 3, 4]);
  assert.deepEqual(seen({ topK: 2 }), [1, 3]);
  assert.deepEqual(seen({ topK: 3 }), [0, 1, 3]);
  // Total 1.9375; top-p 0.7 needs 1.35625: 1 + 0.5 reaches it, so two candidates.
  assert.deepEqual(seen({ topP: 0.7 }), [1, 3]);
  // 1/1.9375 = 0.516 < 0.52: the first alone is not enough.
  assert.deepEqual(seen({ topP: 0.5 }), [1]);
  assert.deepEqual(seen({ topP: 0.52 }), [1, 3]);
  // min-p keeps weights >= min-p (the fp32 logits make 1/4 a hair less than 0.25).
  assert.deepEqual(seen({ minP: 0.24 }), [0, 1, 3]);
  assert.deepEqual(seen({ minP: 0.26 }), [1, 3]);
  // Order: top-k before top-p (top-p of the top 3 = 1.75 * 0.9 = 1.575 needs three).
  assert.deepEqual(seen({ topK: 3, topP: 0.9 }), [0, 1, 3]);
  // A high temperature flattens, a low one sharpens: at 0.05 the best is all but certain.
  assert.deepEqual(seen({ temperature: 0.01 }), [1]);
  // Ties in the order go to the lower id: with top-k 1 of equal logits, id 0.
  assert.equal(makeSampler(params({ topK: 1 }))(Float32Array.from([5, 5])), 0);
});

Deno.test("sampling parameters out of range are usage errors", () => {
  for (
    const p of [
      { temperature: -1 },
      { topP: 0 },
      { topP: 1.5 },
      { topK: -1 },
      { topK: 1.5 },
      { minP: 1 },
      {
        seed: -1,
      },
      { seed: 2 ** 60 },
      { temperature: NaN },
    ]
  ) {
    assert.throws(() => makeSampler(params(p)), (e) => e instanceof K3Error && e.exitCode === 2);
  }
  assert.equal(CHAT_DEFAULTS.temperature, 1);
  assert.equal(CHAT_DEFAULTS.topP, 0.95);
});
