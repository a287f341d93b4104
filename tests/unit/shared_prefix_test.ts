/** Batch prefix sharing: every length of prefix a line shares with another, nested ones too. */

import assert from "node:assert/strict";
import { sharedPrefixes } from "../../cli/batch/shared_prefix.ts";

Deno.test("sharedPrefixes: nested shares, lines sharing nothing, the minimum", () => {
  const base = Array.from({ length: 10 }, (_, i) => i + 1);
  const a = [...base, 50, 51, 52], b = [...base, 50, 51, 60], c = [...base, 70], d = [99, 98], e = [...base];
  assert.deepEqual(sharedPrefixes([a, b, c, d, e], 4), [[10, 12], [10, 12], [10], [], [10]]);
  assert.deepEqual(sharedPrefixes([a, b, c], 11), [[12], [12], []]);
  assert.deepEqual(sharedPrefixes([a], 1), [[]]);
  assert.deepEqual(sharedPrefixes([a, [...a]], 1), [[13], [13]]);
});
