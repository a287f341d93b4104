/**
 * Layer-major prefill against the float64 reference (tests/oracle/reference.py, a Python
 * process): every row of one 601-row pass, in tiles of 7, agrees with it.
 */

import assert from "node:assert/strict";
import { openModel } from "../../engine/open.ts";
import { maxAbsDiff, python, tempDir, TINY } from "../helpers.ts";
import { CAPACITY, greedy, PROMPT } from "../layer_major.ts";

Deno.test("layer-major: the one-pass prefill agrees with the float64 reference at every position", async () => {
  await using dir = await tempDir();
  await python("reference.py", [
    TINY,
    "--ids",
    PROMPT.join(","),
    "--gen",
    "2",
    "--out",
    `${dir.path}/ref.json`,
    "--logits",
    `${dir.path}/ref.f32`,
  ]);
  const ref = JSON.parse(await Deno.readTextFile(`${dir.path}/ref.json`));
  const refLogits = new Float32Array((await Deno.readFile(`${dir.path}/ref.f32`)).buffer);
  const seq = [...PROMPT, ref.generated_ids[0]];
  // Every row's logits out of one 601-row pass (tiles of 7).
  const opened = await openModel(TINY, {
    capacity: CAPACITY,
    chunk: seq.length,
    rows: { tileRows: 7, logitRows: seq.length },
    threads: 1,
  });
  try {
    const V = opened.cfg.vocabSize;
    const logits = await opened.model.forward(opened.model.newState(), seq, true);
    let worst = 0;
    for (let p = 0; p < seq.length; p++) {
      const row = logits.subarray(p * V, (p + 1) * V), want = refLogits.subarray(p * V, (p + 1) * V);
      worst = Math.max(worst, maxAbsDiff(row, want));
      const am = row.indexOf(Math.max(...row));
      assert.equal(am, ref.argmax[p], `argmax at position ${p}`);
    }
    console.log(`600 ids in one pass: max |logit - reference| = ${worst.toExponential(3)}`);
    assert.ok(worst < 1e-3, `max logit difference ${worst} within 1e-3`);
  } finally {
    await opened.close();
  }
  const got = await greedy({ chunk: PROMPT.length }, PROMPT, 2);
  assert.deepEqual(got.tokens, ref.generated_ids, "greedy tokens equal the reference's");
});
