/**
 * The engine against the independent float64 NumPy reference, committed with the tiny model.
 *
 * Teacher forcing (argmax at every position), greedy decode of 20 tokens, incremental
 * decode equal to full recompute, on the committed tiny model (13 layers, hidden 128,
 * block 3, MLA at one-based 4,8,12,13). Freshly generated models of other shapes, checked
 * against the live reference so the suite is not tuned to one checkpoint, are in
 * tests/oracle/live_reference_test.ts (they start python3).
 */

import assert from "node:assert/strict";
import { generate, teacherForce } from "../../engine/generate/generate.ts";
import { argmax } from "../../engine/generate/sampling.ts";
import { openModel } from "../../engine/open.ts";
import { checkAgainstReference, readReference, TINY } from "../helpers.ts";

Deno.test("tiny model: teacher forcing and greedy 20 tokens equal the reference", async () => {
  const maxDiff = await checkAgainstReference(TINY, `${TINY}/reference.json`, `${TINY}/reference_logits.f32`);
  console.log(`tiny model: max |logit - reference| = ${maxDiff.toExponential(3)}`);
  assert.ok(maxDiff < 1e-3, `max logit difference ${maxDiff} within 1e-3`);
});

Deno.test("decode: incremental decode equals full recompute, and chunked prefill equals token by token, bit for bit", async () => {
  const ref = await readReference(`${TINY}/reference.json`);
  const seq = [...ref.prompt_ids, ...ref.generated_ids];
  const logitsBy = async (chunk: number) => {
    const opened = await openModel(TINY, { capacity: seq.length, chunk });
    try {
      const rows: Float32Array[] = [];
      await teacherForce(opened.model, seq, (_p, row) => rows.push(row.slice()));
      const greedyFull = await generate(opened.model, ref.prompt_ids, { gen: 20, incremental: false });
      const greedyInc = await generate(opened.model, ref.prompt_ids, { gen: 20, incremental: true });
      return { rows, full: greedyFull.map((s) => s.token), inc: greedyInc.map((s) => s.token) };
    } finally {
      opened.close();
    }
  };
  const one = await logitsBy(1);
  const many = await logitsBy(7);
  assert.deepEqual(one.inc, one.full, "incremental == full recompute (chunk 1)");
  assert.deepEqual(many.inc, many.full, "incremental == full recompute (chunk 7)");
  assert.deepEqual(many.full, one.full);
  for (let p = 0; p < seq.length; p++) {
    assert.deepEqual(
      new Uint8Array(many.rows[p].buffer),
      new Uint8Array(one.rows[p].buffer),
      `logits at position ${p} bit-identical`,
    );
  }
  assert.equal(argmax(one.rows[0]), argmax(many.rows[0]));
});

Deno.test("threads never change a bit: 1, 2 and 3 threads give identical logits", async () => {
  const ref = await readReference(`${TINY}/reference.json`);
  const seq = [...ref.prompt_ids, ...ref.generated_ids];
  const logitsWith = async (threads: number) => {
    // splitMin 1: split every product, however small, so the workers really run.
    const opened = await openModel(TINY, { capacity: seq.length, chunk: 5, threads, splitMin: 1 });
    try {
      const rows: number[] = [];
      await teacherForce(opened.model, seq, (_p, row) => rows.push(...new Uint32Array(row.slice().buffer)));
      return rows;
    } finally {
      opened.close();
    }
  };
  const one = await logitsWith(1);
  for (const threads of [2, 3]) {
    const other = await logitsWith(threads);
    assert.equal(other.length, one.length);
    const first = other.findIndex((bits, i) => bits !== one[i]);
    assert.equal(first, -1, `${threads} threads: logit bits differ first at element ${first}`);
  }
});
