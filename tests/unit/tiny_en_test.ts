/**
 * The trained English tiny model (tests/fixtures/tiny-en, tools/train_tiny) against the
 * independent float64 reference: teacher forcing and greedy decode equal it and the
 * logits agree, resident and at the floor budget (the ring holds one layer, the expert
 * cache top-k + 1 experts). Its tokenizer encodes the committed prompt text to the
 * reference's prompt ids, and the greedy continuation is readable text.
 *
 * The random-weight fixture (tests/fixtures/tiny) keeps the rest of the suite: its
 * weights are adversarial on purpose (logits of std ~2 with every token possible, routing
 * changed by the correction bias, MXFP4 groups that read as zero, experts stored out of
 * order), which a trained model does not guarantee.
 *
 * @module
 */

import assert from "node:assert/strict";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { checkAgainstReference, packedFloor, readReference, tempDir, TINY_EN } from "../helpers.ts";

/** Logit tolerance against the float64 reference (the engine computes in float32). */
const TOLERANCE = 1e-3;

Deno.test("tiny-en: the prompt text encodes to the reference's ids; the continuation decodes to English words", async () => {
  const ref = JSON.parse(await Deno.readTextFile(`${TINY_EN}/reference.json`));
  const tok = Tokenizer.load(TINY_EN);
  assert.deepEqual(tok.encode(ref.prompt_text), ref.prompt_ids);
  const text = tok.decode(ref.generated_ids);
  const words = text.split(/\s+/).filter((w) => /^[A-Za-z,.;'"-]+$/.test(w));
  assert.ok(words.length >= 5, `at least 5 plain words in ${JSON.stringify(text)}`);
  assert.ok(ref.generated_ids.every((id: number) => id < 768), "no added token is generated");
});

Deno.test("tiny-en GATE 1+2 resident: teacher forcing and greedy decode equal the float64 reference", async () => {
  const maxDiff = await checkAgainstReference(
    TINY_EN,
    `${TINY_EN}/reference.json`,
    `${TINY_EN}/reference_logits.f32`,
  );
  console.log(`tiny-en resident: max |logit - reference| = ${maxDiff.toExponential(3)}`);
  assert.ok(maxDiff < TOLERANCE, `max logit difference ${maxDiff} within ${TOLERANCE}`);
});

Deno.test("tiny-en GATE 1+2 at the floor budget: the same tokens and logits, streamed", async () => {
  await using d = await tempDir();
  const { floor } = await packedFloor(TINY_EN, `${d.path}/trunk`);
  const maxDiff = await checkAgainstReference(
    TINY_EN,
    `${TINY_EN}/reference.json`,
    `${TINY_EN}/reference_logits.f32`,
    16,
    floor,
  );
  console.log(`tiny-en floor: max |logit - reference| = ${maxDiff.toExponential(3)}`);
  assert.ok(maxDiff < TOLERANCE, `max logit difference ${maxDiff} within ${TOLERANCE}`);
  const ref = await readReference(`${TINY_EN}/reference.json`);
  assert.ok(ref.generated_ids.length >= 32);
});
