/**
 * One draw for every mode (issue 35): on the tiny tokenizer, a constrained sequence picks
 * the same tokens for the same seed whether its caller reads the logits (log
 * probabilities: the whole mask first) or not, over random schemas, seeds and sampling
 * settings, greedy included.
 */

import assert from "node:assert/strict";
import fc from "fast-check";
import { TINY } from "../helpers.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { compileSchema } from "../../engine/generate/grammar/schema.ts";
import { startState } from "../../engine/generate/grammar/forms.ts";
import { TokenConstraint, tokenSymbols } from "../../engine/generate/grammar/mask.ts";
import { makeSampler, type SamplingParams, Xoshiro128 } from "../../engine/generate/sampling.ts";

const tok = Tokenizer.load(TINY);
const V = 1024;
const symbols = tokenSymbols(tok, V);
const EOS = tok.specialId("[EOS]");
const RUNS = Number(Deno.env.get("K3_FUZZ_RUNS") ?? 40);

const SCHEMAS: Record<string, unknown>[] = [
  {},
  { type: "object", properties: { a: { type: "string", maxLength: 4 }, n: { type: "integer" } }, required: ["a"] },
  { type: "array", items: { enum: ["x", "yes", 3, null] }, maxItems: 4 },
  { type: "object", properties: { ok: { type: "boolean" }, tags: { type: "array", items: { type: "string" } } } },
  { type: ["string", "null"], maxLength: 6 },
  { type: "number" },
];

const settings: fc.Arbitrary<SamplingParams> = fc.record({
  temperature: fc.oneof(fc.constant(0), fc.double({ min: 0.05, max: 2, noNaN: true })),
  topP: fc.oneof(fc.constant(1), fc.double({ min: 0.05, max: 1, noNaN: true })),
  topK: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 50 })),
  minP: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 0.5, noNaN: true })),
  seed: fc.integer({ min: 0, max: 2 ** 31 }),
});

Deno.test("one draw: a constrained pick is the same token with and without the whole mask first (logprobs on or off)", () => {
  fc.assert(
    fc.property(fc.constantFrom(...SCHEMAS), settings, fc.integer({ min: 1, max: 2 ** 31 }), (schema, p, logitSeed) => {
      const spec = { kind: "value" as const, value: compileSchema(schema) };
      const plain = new TokenConstraint(symbols, startState(spec, tok, [EOS]));
      const masked = new TokenConstraint(symbols, startState(spec, tok, [EOS]), true);
      const choosePlain = makeSampler(p), chooseMasked = makeSampler(p);
      const rng = Xoshiro128.seeded(logitSeed);
      for (let step = 0; step < 40 && !plain.finished; step++) {
        const logits = Float32Array.from({ length: V }, () => (rng.nextFloat() - 0.5) * 8);
        const t = plain.pick(logits.slice(), choosePlain);
        assert.equal(masked.pick(logits.slice(), chooseMasked), t, `step ${step} of ${JSON.stringify(schema)}`);
        if (t === EOS) break;
      }
    }),
    { numRuns: RUNS },
  );
});
