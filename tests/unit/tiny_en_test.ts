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

Deno.test("tiny-en: the committed shards are the ones tools/train_tiny/README.md gives as a retraining's output; its perplexities are training.json's", async () => {
  // The bit-for-bit retraining is documented (CI has no PyTorch); this ties that record to
  // the files in the repo, so a changed fixture cannot keep an old claim.
  const doc = await Deno.readTextFile(`${TINY_EN}/../../../tools/train_tiny/README.md`);
  const listed = [...doc.matchAll(/^([0-9a-f]{64}) {2}(model-\d{5}-of-\d{5}\.safetensors)$/gm)];
  assert.equal(listed.length, 3, "three shards listed");
  for (const [, sha, name] of listed) {
    const bytes = await Deno.readFile(`${TINY_EN}/${name}`);
    const got = [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))]
      .map((b) => b.toString(16).padStart(2, "0")).join("");
    assert.equal(got, sha, name);
  }
  const training = JSON.parse(await Deno.readTextFile(`${TINY_EN}/training.json`));
  assert.match(doc, new RegExp(`unigram baseline: held-out perplexity ${training.unigram_perplexity.toFixed(2)}`));
  assert.match(
    doc,
    new RegExp(`exported \\(BF16 \\+ MXFP4 experts\\) ${training.heldout_perplexity_exported.toFixed(2)}`),
  );
  assert.ok(training.heldout_perplexity_exported < training.unigram_perplexity / 4, "well below the unigram baseline");
  assert.match(doc, /^Time: \d+ s of training/m, "the retraining time is documented");
});
