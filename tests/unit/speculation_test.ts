/**
 * The drafters of speculative decoding (lookup, the suffix automaton and pool) and the cost
 * model, on their own. Drafts through the scheduler on the tiny model, token and logit bits
 * against plain decoding, are in tests/e2e/speculation_run_test.ts.
 */

import assert from "node:assert/strict";
import {
  bestDraftLength,
  DraftCost,
  expectedTokens,
  lookupDraft,
  SequenceDrafter,
  SuffixAutomaton,
  SuffixPool,
} from "../../engine/generate/draft.ts";

Deno.test("lookupDraft: the tokens after the most recent occurrence of the longest suffix n-gram", () => {
  assert.deepEqual(lookupDraft([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 3), [4, 5, 1]);
  assert.deepEqual(lookupDraft([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 10), [4, 5, 1, 2, 3]);
  assert.deepEqual(lookupDraft([7, 8, 9], 4), []);
  assert.deepEqual(lookupDraft([7], 4), []);
  assert.deepEqual(lookupDraft([4, 4, 4], 2), [4]);
  assert.deepEqual(lookupDraft([1, 5, 9, 1], 2), [], "a one-token match does not draft");
  assert.deepEqual(lookupDraft([1, 5, 9, 1], 2, 1), [5, 9]);
});

Deno.test("SuffixAutomaton: the longest repeated suffix and its first occurrence equal a brute-force search", () => {
  let seed = 12345;
  const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 16;
  for (const alphabet of [2, 3, 5]) {
    const sam = new SuffixAutomaton();
    const text: number[] = [];
    for (let i = 0; i < 300; i++) {
      const c = rand() % alphabet;
      text.push(c);
      sam.append(c);
      // Brute force: the longest suffix occurring ending before the end, first occurrence.
      let best = 0, end = -1;
      for (let l = 1; l < text.length; l++) {
        const suf = text.slice(text.length - l).join(",");
        let first = -1;
        for (let e = l - 1; e < text.length - 1; e++) {
          if (text.slice(e - l + 1, e + 1).join(",") === suf) {
            first = e;
            break;
          }
        }
        if (first < 0) break;
        best = l;
        end = first;
      }
      const got = sam.repeatedSuffix();
      assert.equal(got.length, best, `alphabet ${alphabet}, length ${text.length}`);
      if (best > 0) assert.equal(got.end, end, `alphabet ${alphabet}, length ${text.length}: first end`);
    }
  }
});

Deno.test("suffix drafts: from the sequence's own text, and from a pool of finished sequences without crossing them", () => {
  const own = new SequenceDrafter({ mode: "suffix" });
  own.append([1, 2, 3, 4, 5, 6, 1, 2, 3]);
  assert.deepEqual(own.propose(2), [4, 5]);
  const pool = new SuffixPool();
  pool.add([10, 11, 12, 13, 14]);
  pool.add([20, 21]);
  const d = new SequenceDrafter({ mode: "suffix" }, pool);
  d.append([99, 11, 12]);
  assert.deepEqual(d.propose(8), [13, 14], "stops at the end of the pooled sequence");
  const forced = new SequenceDrafter({ mode: "lookup", force: true });
  forced.append([3, 1, 2]);
  assert.deepEqual(forced.propose(3), [2, 2, 2], "force pads a missing draft");
});

Deno.test("cost model: E(k) and the best draft length", () => {
  assert.equal(expectedTokens(0, 5), 1);
  assert.equal(expectedTokens(1, 5), 6);
  assert.ok(Math.abs(expectedTokens(0.5, 2) - 1.75) < 1e-12);
  assert.equal(bestDraftLength(0, 0.1, 8), 0, "drafts that never match never pay");
  assert.equal(bestDraftLength(0.9, 1, 8), 0, "rows as dear as a pass never pay");
  assert.equal(bestDraftLength(1, 0.01, 8), 8, "free rows and certain drafts: the most");
  assert.ok(bestDraftLength(0.7, 0.1, 8) > 0);
  const cost = new DraftCost();
  assert.equal(cost.relative, DraftCost.PRIOR, "nothing measured: the prior");
  cost.observe(0.010, 0);
  cost.observe(0.050, 0); // a descheduled pass does not raise the base
  cost.observe(0.018, 4);
  cost.observe(0.090, 4);
  assert.ok(Math.abs(cost.relative - 0.2) < 1e-9, `c from the fastest passes: ${cost.relative}`);
});
