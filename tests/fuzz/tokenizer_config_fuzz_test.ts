/** Fuzz: tokenizer_config.json (parseAddedTokens) on structure-aware mutations of the real file. */

import assert from "node:assert/strict";
import { parseAddedTokens } from "../../engine/text/tokenizer.ts";
import { assertRefusal, check, jsonMutations, mutateAll } from "./fuzz.ts";
import { TINY } from "../helpers.ts";

Deno.test("fuzz tokenizer_config.json: refused with exit 1 and one line, or accepted as sound added tokens", () => {
  const text = Deno.readTextFileSync(`${TINY}/tokenizer_config.json`);
  const clean = JSON.parse(text);
  const ref = parseAddedTokens(text);
  check("tokenizer_config", jsonMutations, (ms) => {
    const mutated = JSON.stringify(mutateAll(clean, ms));
    let added;
    try {
      added = parseAddedTokens(mutated);
    } catch (e) {
      return assertRefusal(e, [1]);
    }
    for (const t of added) {
      assert.ok(Number.isSafeInteger(t.id) && t.id >= 0);
      assert.ok(typeof t.content === "string" && t.content.length > 0);
    }
    if (mutated === JSON.stringify(clean)) assert.deepEqual(added, ref);
  });
});
