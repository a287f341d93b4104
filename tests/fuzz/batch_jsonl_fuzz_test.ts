/** Fuzz: batch JSONL input lines (cli/batch/jobs.ts parseJob) on structure-aware mutations of real lines. */

import assert from "node:assert/strict";
import fc from "fast-check";
import { parseJob } from "../../cli/batch/jobs.ts";
import { Tokenizer } from "../../engine/text/tokenizer.ts";
import { oneLine } from "../../engine/errors.ts";
import { check, jsonMutations, mutateAll } from "./fuzz.ts";
import { TINY } from "../helpers.ts";

Deno.test("fuzz batch JSONL: a line is refused with a plain message (printed as one line) or gives a sound job", () => {
  const tok = Tokenizer.load(TINY);
  const opts = { vocab: 1024, maxPromptIds: 8192, gen: 8, stopIds: [], tokenizer: () => tok };
  const lines = [
    { id: 1, ids: [5, 17, 300], gen: 4 },
    { id: "a", prompt: "Once upon a time", stop_ids: [2] },
    { id: 7, prompt: "The capital of France is", gen: 2, stop_ids: [] },
  ];
  const arb = fc.tuple(fc.nat({ max: lines.length - 1 }), jsonMutations, fc.boolean());
  check("batch JSONL", arb, ([i, ms, raw]) => {
    let text = JSON.stringify(mutateAll(lines[i], ms));
    if (raw) text = text.slice(0, text.length - 1 - (ms[0].op % 4)); // torn line
    let job;
    try {
      job = parseJob(text, 3, opts);
    } catch (e) {
      assert.ok(e instanceof Error && !(e instanceof TypeError) && !(e instanceof RangeError), String(e));
      assert.ok(!/\n/.test(oneLine(e.message)));
      return;
    }
    assert.ok(job.promptIds.length >= 1 && job.promptIds.length <= opts.maxPromptIds);
    assert.ok(job.promptIds.every((x) => Number.isInteger(x) && x >= 0 && x < opts.vocab));
    assert.ok(Number.isInteger(job.maxTokens) && job.maxTokens >= 1 && job.maxTokens <= 4096);
    assert.ok(job.stopIds.every((x) => Number.isInteger(x) && x >= 0 && x < opts.vocab));
  });
});
